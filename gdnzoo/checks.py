"""The argument checks every operation's contract is made of, and the two things the dispatcher
derives from an operation's argument table: the overlap check of written tensors and the
signature a verdict is memoized under.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (rank, shape, device,
layout, value) naming the argument, what was expected and what came.
"""
from __future__ import annotations

import functools
import math
import numbers
import types

import torch

IO_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
DT_BIAS_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float64: "fp64"}


def dtype_name(dt) -> str:
    return DTYPE_NAMES.get(dt, str(dt).replace("torch.", ""))


class ProblemBase:
    """What every operation's problem shares: its state dtype's name, and (for the batched
    operations, decode and commit; prefill overrides them) B sequences, the default table
    read at B, no sequence an empty call."""
    batch_name = "B"

    @property
    def state_name(self) -> str:
        return dtype_name(self.state_dtype)

    @property
    def batch(self) -> int:
        """What the default table's ranges are read at: the batch size."""
        return self.B

    @property
    def table_heads(self) -> int | None:
        """The value heads a default-table row measured at other heads is read at (as many
        (sequence, head) pairs; :func:`gdnzoo.tables.read_point`); None: read at ``batch``."""
        return self.HV

    @property
    def empty(self) -> bool:
        """No sequence: the call computes nothing (engines issue empty batches)."""
        return self.B == 0

    def default_tables(self) -> tuple:
        """(key, how it reads) of the default-table row's tables that may serve this call, in
        the order consulted (then ``table``)."""
        return ()


def type_name(x) -> str:
    """``x``'s type for a message: ``numpy.bool`` where the bare name (``bool``) would mislead."""
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def fmt_dtypes(dts) -> str:
    return " or ".join(dtype_name(d) for d in dts)


def need_tensor(name, x, written=False):
    """A dense tensor outside autograd (gdnzoo computes no gradients): one that requires grad
    only where it is read, under ``torch.no_grad()`` (a model's parameters)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type_name(x)}")
    if x.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout "
                        f"{str(x.layout).replace('torch.', '')}")
    need_no_grad(name, x, written)


def need_no_grad(name, x, written=False):
    """``x`` (a tensor) outside autograd: not requiring grad, or only read, under
    ``torch.no_grad()``.  Traceable by dynamo (torch.compile checks it as it traces)."""
    if x.requires_grad and (written or torch.is_grad_enabled()):
        raise ValueError(f"{name}: expected a tensor that does not require grad (gdnzoo "
                         f"computes no gradients), got requires_grad=True: pass {name}.detach(), "
                         f"or call under torch.no_grad() (then only read tensors may)")


def need_rank(name, x, rank, layout):
    if x.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got rank {x.dim()} "
                         f"with shape {tuple(x.shape)}")


def need_shape(name, x, shape, layout):
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} {layout}, got {tuple(x.shape)}")


def need_dtype(name, x, allowed):
    if x.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {fmt_dtypes(allowed)}, got {dtype_name(x.dtype)}")


def need_same_dtype(name, x, other_name, other):
    if x.dtype != other.dtype:
        raise TypeError(f"{name}: expected dtype {dtype_name(other.dtype)} (same as "
                        f"{other_name}), got {dtype_name(x.dtype)}")


def need_last_contiguous(name, x, axis_name):
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name}: expected the {axis_name} axis (last) contiguous (stride 1), "
                         f"got strides {tuple(x.stride())}")


def need_own_memory(name, x):
    """A written tensor whose elements do not share memory: sorted by stride, each dimension
    of size > 1 must step past everything the smaller ones span (so a stride of 0, as in
    ``expand``, is refused).  A contiguous tensor never shares (checked first: the common
    case, one call into torch)."""
    if x.is_contiguous():
        return
    span = 0
    for n, st in sorted(((n, st) for n, st in zip(x.shape, x.stride()) if n > 1),
                        key=lambda d: d[1]):
        if st <= span:
            raise ValueError(f"{name}: it is written, so expected elements that do not share "
                             f"memory, got shape {tuple(x.shape)} with strides "
                             f"{tuple(x.stride())} (internal overlap)")
        span += (n - 1) * st


def need_device(named: dict, dev):
    """Every tensor of ``named`` (None skipped) on ``dev`` (the device of q)."""
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"q: expected a tensor on cpu or cuda, got device {dev}")
    for n, x in named.items():
        if x is not None and x.device != dev:
            raise ValueError(f"{n}: expected device {dev} (the device of q), got {x.device}")


def need_bool(name, x):
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected bool, got {type_name(x)}")


def resolve_scale(scale, K: int) -> float:
    """None or 0 means 1/sqrt(K); else a real number (int, float or a numpy scalar; not a
    bool), or a one-element tensor (read on the host: a device sync for a GPU tensor).
    Negative or non-finite is an error."""
    if scale is None:
        return 1.0 / math.sqrt(K)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"scale: expected a scalar, got a tensor of shape {tuple(scale.shape)}")
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a float or None, got {type_name(scale)}")
    s = float(scale)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"scale: expected a finite value >= 0 (0 or None means 1/sqrt(K)), got {s}")
    return 1.0 / math.sqrt(K) if s == 0.0 else s


# ------------------------------------------------------------------ overlaps

# A call reads every argument and writes its written ones (an Arg's ``written``; the state only
# when updated in place).  No written tensor may share memory with another argument: their byte
# ranges, from the first to one past the last element, must be disjoint.  Ranges are a tensor's
# shape, strides and dtype (fixed by a memoized signature) from its data pointer (changing per
# call), so the dispatcher checks memoized calls from data pointers alone (overlap_probe).

def writers(op, given, inplace: bool) -> list:
    """The written arguments of a call of ``op`` among ``given`` (names present), in table
    order: the state when updated in place, ``new_state`` when distinct."""
    skip = None if op.inplace is None else op.inplace[0 if inplace else 1]
    return [a.name for a in op.args if a.written and a.name in given and a.name != skip]


_PAIRS: dict = {}


def aliasing_pairs(op, given, inplace: bool) -> tuple[tuple[str, str], ...]:
    """(written, other) argument names whose memory must be disjoint, in the order checked:
    each writer against every argument that is not a writer, then the writers pairwise.
    Remembered per (operation, names given, in place): validation and the overlap probe of
    every new signature ask it."""
    key = (op.name, frozenset(given), bool(inplace))
    hit = _PAIRS.get(key)
    if hit is not None and hit[0] is op:
        return hit[1]
    pairs = _aliasing_pairs(op, given, inplace)
    if len(_PAIRS) >= 256:
        _PAIRS.clear()
    _PAIRS[key] = (op, pairs)
    return pairs


def _aliasing_pairs(op, given, inplace: bool) -> tuple[tuple[str, str], ...]:
    ws = writers(op, given, inplace)
    order = [a.name for a in op.args if a.name in given]
    pairs = [(w, r) for w in ws for r in order if r not in ws]
    # two writers: the output names itself first, the state updated in place last, else the
    # earlier argument first
    state = op.inplace[1] if op.inplace and inplace else None
    first = sorted(ws, key=lambda n: (n == state, n != "out", op.index(n)))
    return tuple(pairs + [(w, x) for i, w in enumerate(first) for x in first[i + 1:]])


def byte_span(x) -> int:
    """Bytes from ``x``'s first to one past its last element (0 when empty): fixed by shape,
    strides and dtype, so a memoized signature can check overlaps from data pointers alone."""
    if x.is_contiguous():
        return x.numel() * x.element_size()
    if x.numel() == 0:
        return 0
    last = 0
    for n, st in zip(x.shape, x.stride()):
        last += (n - 1) * st
    return (last + 1) * x.element_size()


def _disjoint(a0: int, sa: int, b0: int, sb: int) -> bool:
    """Byte ranges [a0, a0 + sa) and [b0, b0 + sb) share no byte (an empty one shares none)."""
    return not (sa > 0 and sb > 0 and a0 < b0 + sb and b0 < a0 + sa)


def overlaps(x, y) -> bool:
    return not _disjoint(x.data_ptr(), byte_span(x), y.data_ptr(), byte_span(y))


def check_aliasing(op, named: dict, inplace: bool):
    """Raise ValueError naming the first written argument of ``named`` ({name: tensor or
    None}) whose byte range overlaps another argument's (:func:`aliasing_pairs`)."""
    at = {n: (x.data_ptr(), byte_span(x)) for n, x in named.items() if x is not None}
    dst, src = op.inplace or (None, None)
    for w, r in aliasing_pairs(op, set(at), inplace):
        if not _disjoint(*at[w], *at[r]):
            if (w, r) == (dst, src):
                raise ValueError(f"{dst}: expected a tensor distinct from {src} or {src} "
                                 f"itself, got a different view that overlaps {src}'s memory")
            why = " (it is updated in place)" if w == src else ""
            raise ValueError(f"{w}: expected memory disjoint from {r}{why}: a written tensor "
                             f"may not overlap any other argument, got overlapping byte ranges")


def overlap_probe(op, named: dict, inplace: bool, slots=None):
    """A function of a call's data pointers (a tuple: one per name of ``slots``, default the
    names of ``named``) that returns True when :func:`check_aliasing` would raise for them, for
    every call of the signature of the tensors ``named`` ({name: tensor}; their byte spans are
    bound in it): the dispatcher's per-call check.  A slot named but not in ``named`` (an
    absent argument's 0) is never compared.

    Generated once per shape of the test (the pairs compared and the slots), every pair
    unrolled, the spans bound per signature: the dispatcher runs it only for data pointers it
    has not seen with this signature."""
    span = {n: byte_span(x) for n, x in named.items()}
    pairs = tuple((w, r) for w, r in aliasing_pairs(op, set(span), inplace)
                  if span[w] and span[r])
    code = _probe_code(op.name, pairs, tuple(slots or named))
    # the spans as the one default argument: no closure cells for the garbage collector to
    # walk in every memoized signature
    return types.FunctionType(code, _PROBE_GLOBALS, "probe",
                              (tuple(span[n] for pair in pairs for n in pair),))


_PROBE_GLOBALS: dict = {}


@functools.lru_cache(maxsize=256)
def _probe_code(op_name: str, pairs: tuple, names: tuple):
    """The compiled code of :func:`overlap_probe`'s function for ``pairs`` over the slots
    ``names``: ``probe(ptrs, s)``, ``s`` each pair's two byte spans in turn."""
    tests = [f"-s[{2 * i + 1}] < {r} - {w} < s[{2 * i}]" for i, (w, r) in enumerate(pairs)]
    src = (f"def probe(ptrs, s):\n"
           f"    ({', '.join(names)},) = ptrs\n"
           f"    return {' or '.join(tests) or 'False'}\n")
    scope = {}
    exec(compile(src, f"<gdnzoo {op_name} overlap probe>", "exec"), scope)
    return scope["probe"].__code__


def tensor_signature(t):
    """What a verdict depends on of one tensor: shape, strides, dtype, device, layout, grad,
    and whether it was made under inference mode."""
    return (t.size(), t.stride(), t.dtype, t.device, t.layout, t.requires_grad,
            t.is_inference())


def signature(op, args) -> tuple:
    """Everything an operation's contract decides from, except data pointers, as a hashable key:
    per argument (``op``'s order) its tensor signature, or its value with its type (so that
    ``1 == 1.0 == True`` are told apart); the in-place argument as 1 when it is the state.
    Raises for a non-tensor where a tensor belongs (the caller then validates for the message)."""
    i_dst, i_src = (-1, -1) if op.inplace is None else map(op.index, op.inplace)
    key, grad = [], False
    for i, (a, x) in enumerate(zip(op.args, args)):
        if x is None:
            key.append(None)
        elif i == i_dst and x is args[i_src]:
            key.append(1)
        elif a.tensor:
            key.append(tensor_signature(x))
            grad = grad or x.requires_grad
        else:
            key.append((x, type(x)))
    if grad:                  # a tensor that requires grad is read only under no_grad
        key.append(("grad mode", torch.is_grad_enabled()))
    return tuple(key)


# ------------------------------------------------------------------ gate forms, state layouts

LAYOUTS = ("k-last", "k-first")
GATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# The public functions' paragraph on the other gate form and the state's other layout.
FORMS_DOC = """Gate forms and the state's layout: instead of the raw gates a call may pass FLA's
precomputed ones, ``g`` (the log decay: the token's decay is exp(g); fp32, shaped as ``a``)
and ``beta`` (after the sigmoid; fp32, bf16 or fp16), with A_log, a, dt_bias and b None;
g = -inf is a hard reset (the state is forgotten at that token).  ``allow_neg_eigval``:
with the raw gates only, beta = 2 sigmoid(b), in [0, 2) (a precomputed beta is used as
given).  ``state_layout`` "k-last" (default: [.., HV, V, K], K contiguous) or "k-first"
([.., HV, K, V], V contiguous, as transformers and FLA's ops keep it) applies to every state
argument.  A backend that cannot serve one of them says why (``gdnzoo list``).

"""


def gate_form(A_log, a, dt_bias, b, g, beta, allow_neg_eigval, shape, layout, device) -> bool:
    """Which gate form a call passes: False for the raw gates (A_log, a, dt_bias, b: the
    caller checks them), True for the precomputed ones, checked here: ``g`` (log decay, fp32)
    and ``beta`` (post-sigmoid, any float dtype), both of ``shape`` (``layout`` names it).
    One form, whole; ``allow_neg_eigval`` (a bool) only with the raw ``b``."""
    need_bool("allow_neg_eigval", allow_neg_eigval)
    raw = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b)
    if g is None and beta is None:
        missing = [n for n, x in raw.items() if x is None]
        if missing:
            raise TypeError(f"{missing[0]}: expected a tensor (the raw gates A_log, a, dt_bias "
                            f"and b), or the precomputed gates g and beta instead; got None")
        return False
    given = [n for n, x in raw.items() if x is not None]
    if given:
        raise ValueError(f"{given[0]}: not with the precomputed gates g and beta (pass one "
                         f"form: A_log, a, dt_bias, b or g, beta)")
    if g is None or beta is None:
        raise ValueError(f"{'g' if g is None else 'beta'}: the precomputed gates come as a "
                         f"pair, g (log decay) and beta, got only "
                         f"{'beta' if g is None else 'g'}")
    for name, x, dtypes in (("g", g, (torch.float32,)), ("beta", beta, GATE_DTYPES)):
        need_tensor(name, x)
        need_rank(name, x, len(shape), layout)
        need_shape(name, x, shape, layout)
        need_dtype(name, x, dtypes)
        if x.device != device:
            raise ValueError(f"{name}: expected device {device} (the device of q), got "
                             f"{x.device}")
    if allow_neg_eigval:
        raise ValueError("allow_neg_eigval: only with the raw gate b (beta = 2 sigmoid(b)); a "
                         "precomputed beta is used as given, in [0, 2) if you wish")
    return True


def k_first(state_layout) -> bool:
    """``state_layout``: "k-last" ([.., HV, V, K], K contiguous) or "k-first" ([.., HV, K, V],
    V contiguous)."""
    if not isinstance(state_layout, str) or state_layout not in LAYOUTS:
        raise (ValueError if isinstance(state_layout, str) else TypeError)(
            f"state_layout: expected one of {', '.join(map(repr, LAYOUTS))}, got "
            f"{state_layout!r}")
    return state_layout == "k-first"


def block(HV, V, K, kfirst: bool) -> tuple:
    """A state's per-sequence block, its shape's names and its contiguous axis:
    ((HV, V, K), "HV, V, K", "K") k-last, ((HV, K, V), "HV, K, V", "V") K-first."""
    return ((HV, K, V), "HV, K, V", "V") if kfirst else ((HV, V, K), "HV, V, K", "K")

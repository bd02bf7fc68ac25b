"""The one signature of gdnzoo and its single validation function.

Every backend is called only after :func:`validate` has accepted the inputs, so a
backend never sees a wrong rank, shape, dtype, device or layout.  Validation runs
before any kernel: a rejected call leaves ``state`` untouched.

Shapes::

    q, k      [B, T, H,  K]   fp16 | bf16          K axis contiguous
    v         [B, T, HV, V]   same dtype as q       V axis contiguous
    state     [B, HV, V, K]   fp32 | bf16           K axis contiguous ("k-last"), or a pool
                                                    [P, HV, V, K] with state_indices [B]
    A_log     [HV]            fp32
    a, b      [B, T, HV]      fp16 | bf16
    dt_bias   [HV]            fp32 | bf16
    out       [B, T, HV, V]   dtype of v
    new_state [B, HV, V, K]   dtype of state; None or ``state`` means in place (a pool:
                              [P', HV, V, K], written at new_state_indices)

Every tensor is dense, on cpu or cuda, and does not require grad.  The tensors decode writes
(``out``, ``new_state``, ``state`` in place) share no memory with any other argument nor among
their own elements.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from gdnzoo import pool as pools
from gdnzoo import verify as verifies

IO_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
DT_BIAS_DTYPES = (torch.float32, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float64: "fp64"}


def dtype_name(dt) -> str:
    return DTYPE_NAMES.get(dt, str(dt).replace("torch.", ""))


@dataclass(frozen=True)
class Problem:
    """What a backend needs to know to decide whether it can serve a call."""
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    state_dtype: torch.dtype
    io_dtype: torch.dtype
    device: str                 # "cpu" | "cuda"
    use_qk_l2norm: bool = False
    inplace: bool = True
    cc: tuple | None = None     # compute capability of the device, None on CPU
    pool: bool = False          # state is a pool read through state_indices (gdnzoo.pool)
    verify: str = ""            # gdnzoo.verify: "states", "states+update", "slots", "" none
    intermediate: str = ""      # intermediate_states: "rows" (row n of a contiguous [B, T, HV,
    #                             V, K] buffer, no intermediate_indices), "indexed" (any other)
    pdl: str = ""               # programmatic dependent launch: "wait", "early", "" off

    @property
    def state_name(self) -> str:
        return dtype_name(self.state_dtype)

    def describe(self) -> str:
        return (f"B={self.B} T={self.T} H={self.H} HV={self.HV} K={self.K} V={self.V} "
                f"state={self.state_name} io={dtype_name(self.io_dtype)} device={self.device} "
                f"l2norm={self.use_qk_l2norm} {'in-place' if self.inplace else 'dest-passing'}"
                f"{' pool' if self.pool else ''}{' verify-' + self.verify if self.verify else ''}"
                f"{' pdl-' + self.pdl if self.pdl else ''}")


def type_name(x) -> str:
    """``x``'s type for a message: ``numpy.bool`` where the bare name (``bool``) would mislead."""
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _fmt_dt(dts) -> str:
    return " or ".join(dtype_name(d) for d in dts)


def _need_tensor(name, x):
    """A dense tensor outside autograd (decode computes no gradients)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type_name(x)}")
    if x.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout "
                        f"{str(x.layout).replace('torch.', '')}")
    if x.requires_grad:
        raise ValueError(f"{name}: expected a tensor that does not require grad (decode "
                         f"computes no gradients), got requires_grad=True: pass {name}.detach()")


def _need_rank(name, x, rank, layout):
    if x.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got rank {x.dim()} "
                         f"with shape {tuple(x.shape)}")


def _need_shape(name, x, shape, layout):
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} {layout}, got {tuple(x.shape)}")


def _need_dtype(name, x, allowed):
    if x.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {_fmt_dt(allowed)}, got {dtype_name(x.dtype)}")


def _need_last_contiguous(name, x, axis_name):
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name}: expected the {axis_name} axis (last) contiguous (stride 1), "
                         f"got strides {tuple(x.stride())}")


def _need_own_memory(name, x):
    """A written tensor whose elements do not share memory: sorted by stride, each dimension
    of size > 1 must step past everything the smaller ones span (so a stride of 0, as in
    ``expand``, is refused)."""
    span = 0
    for n, st in sorted(((n, st) for n, st in zip(x.shape, x.stride()) if n > 1),
                        key=lambda d: d[1]):
        if st <= span:
            raise ValueError(f"{name}: it is written, so expected elements that do not share "
                             f"memory, got shape {tuple(x.shape)} with strides "
                             f"{tuple(x.stride())} (internal overlap)")
        span += (n - 1) * st


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


# Programmatic dependent launch (decode's ``pdl``): the kernel may start while the kernel
# before it runs.  "wait": it waits for that kernel before any load; "early": it loads the
# state (and its slot indices, A_log, dt_bias) first and waits before q, k, v, a, b.  The levels
# are the kernels' PDL constants.
PDL_LEVELS = {"off": 0, "wait": 1, "early": 2}
PDL_ENV = "GDNZOO_PDL"


def resolve_pdl(pdl, env=None) -> str:
    """decode's ``pdl`` as Problem.pdl ("" off, "wait", "early"): None means ``env`` (the
    GDNZOO_PDL variable's value; None or empty: off).  Raises naming the argument or variable."""
    name = "pdl"
    if pdl is None:
        if not env:
            return ""
        pdl, name = env, PDL_ENV
    if not isinstance(pdl, str):
        raise TypeError(f"pdl: expected None or one of {', '.join(map(repr, PDL_LEVELS))}, "
                        f"got {type_name(pdl)}")
    if pdl not in PDL_LEVELS:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, PDL_LEVELS))}, "
                         f"got {pdl!r}")
    return "" if pdl == "off" else pdl


def validate(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
             use_qk_l2norm=False, state_indices=None, new_state_indices=None,
             null_slot=None, intermediate_states=None, intermediate_indices=None,
             update_state=True, num_accepted_tokens=None, pdl=None,
             pdl_env=None) -> tuple[Problem, float]:
    """Check every argument of :func:`gdnzoo.decode`; return the problem and the resolved scale.
    ``pdl_env``: the GDNZOO_PDL variable's value, which a ``pdl`` of None means.

    Raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (rank, shape, device, layout,
    value) naming the argument, what was expected and what came.
    """
    named = dict(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b)
    for n, x in named.items():
        _need_tensor(n, x)
    if out is not None:
        _need_tensor("out", out)
    if new_state is not None:
        _need_tensor("new_state", new_state)

    _need_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    _need_rank("k", k, 4, "[B, T, H, K]")
    _need_shape("k", k, (B, T, H, K), "[B, T, H, K] (same as q)")
    _need_rank("v", v, 4, "[B, T, HV, V]")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [B={B}, T={T}, HV, V] (B, T as q), got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if B < 1 or T < 1 or H < 1 or K < 1 or HV < 1 or V < 1:
        raise ValueError(f"q/v: every dimension must be >= 1, got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if HV % H != 0:
        raise ValueError(f"v: expected HV divisible by H (HV % H == 0), got HV={HV}, H={H}")
    pooled = state_indices is not None
    if pooled:
        pools.validate(B, HV, V, K, q.device, state, new_state, state_indices,
                       new_state_indices, null_slot, T)
    else:
        pools.no_pool_args(new_state_indices, null_slot)
        _need_rank("state", state, 4, "[B, HV, V, K]")
        _need_shape("state", state, (B, HV, V, K), "[B, HV, V, K]")
    _need_rank("A_log", A_log, 1, "[HV]")
    _need_shape("A_log", A_log, (HV,), "[HV]")
    _need_rank("a", a, 3, "[B, T, HV]")
    _need_shape("a", a, (B, T, HV), "[B, T, HV]")
    _need_rank("dt_bias", dt_bias, 1, "[HV]")
    _need_shape("dt_bias", dt_bias, (HV,), "[HV]")
    _need_rank("b", b, 3, "[B, T, HV]")
    _need_shape("b", b, (B, T, HV), "[B, T, HV]")

    _need_dtype("q", q, IO_DTYPES)
    for n in ("k", "v"):
        if named[n].dtype != q.dtype:
            raise TypeError(f"{n}: expected dtype {dtype_name(q.dtype)} (same as q), "
                            f"got {dtype_name(named[n].dtype)}")
    _need_dtype("a", a, IO_DTYPES)
    _need_dtype("b", b, IO_DTYPES)
    _need_dtype("A_log", A_log, (torch.float32,))
    _need_dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    _need_dtype("state", state, STATE_DTYPES)

    if out is not None:
        _need_rank("out", out, 4, "[B, T, HV, V]")
        _need_shape("out", out, (B, T, HV, V), "[B, T, HV, V]")
        if out.dtype != v.dtype:
            raise TypeError(f"out: expected dtype {dtype_name(v.dtype)} (same as v), "
                            f"got {dtype_name(out.dtype)}")
    inplace = new_state is None or new_state is state
    if not inplace:
        if not pooled:
            _need_rank("new_state", new_state, 4, "[B, HV, V, K]")
            _need_shape("new_state", new_state, (B, HV, V, K), "[B, HV, V, K]")
        if new_state.dtype != state.dtype:
            raise TypeError(f"new_state: expected dtype {dtype_name(state.dtype)} (same as state), "
                            f"got {dtype_name(new_state.dtype)}")

    dev = q.device
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"q: expected a tensor on cpu or cuda, got device {dev}")
    tensors = dict(named, out=out, new_state=None if inplace else new_state)
    for n, x in tensors.items():
        if x is not None and x.device != dev:
            raise ValueError(f"{n}: expected device {dev} (the device of q), got {x.device}")

    _need_last_contiguous("q", q, "K")
    _need_last_contiguous("k", k, "K")
    _need_last_contiguous("v", v, "V")
    _need_last_contiguous("state", state, "K")
    if out is not None:
        _need_last_contiguous("out", out, "V")
    if not inplace:
        _need_last_contiguous("new_state", new_state, "K")
    if out is not None:
        _need_own_memory("out", out)
    if not pooled:                       # a pool's slots are checked apart by pools.validate
        _need_own_memory(*(("state", state) if inplace else ("new_state", new_state)))
    ver = verifies.validate(B, T, HV, V, K, dev, state, new_state, state_indices,
                            new_state_indices, intermediate_states, intermediate_indices,
                            update_state, num_accepted_tokens)
    check_aliasing(q, k, v, state, A_log, a, dt_bias, b, out, new_state, state_indices,
                   new_state_indices, intermediate_states, intermediate_indices,
                   num_accepted_tokens)

    s = resolve_scale(scale, K)
    if not isinstance(use_qk_l2norm, bool):
        raise TypeError(f"use_qk_l2norm: expected bool, got {type_name(use_qk_l2norm)}")
    level = resolve_pdl(pdl, pdl_env)
    cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    p = Problem(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state.dtype, io_dtype=q.dtype,
                device=dev.type, use_qk_l2norm=use_qk_l2norm, inplace=inplace, cc=cc,
                pool=pooled, verify=verifies.problem_form(ver),
                intermediate=verifies.layout(ver, B, T), pdl=level)
    return p, s


# ------------------------------------------------------------------ overlaps

# decode reads every argument and writes ``out`` and ``new_state`` (``state`` itself in place).
# No written tensor may share memory with another argument: their byte ranges, from the first
# to one past the last element, must be disjoint.  Ranges are a tensor's shape, strides and
# dtype (fixed by a memoized signature) from its data pointer (changing per call), so decode's
# memoized calls check them from data pointers alone (:func:`overlap_probe`).
READ = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "state_indices",
        "new_state_indices", "intermediate_indices", "num_accepted_tokens")


def aliasing_pairs(given, out: bool, inplace: bool) -> list[tuple[str, str]]:
    """(written, read) argument names whose memory must be disjoint, in the order checked;
    ``given``: the names of the arguments present."""
    writers = ["state" if inplace else "new_state"] + (["out"] if out else []) + \
        (["intermediate_states"] if "intermediate_states" in given else [])
    pairs = [(w, r) for w in writers for r in READ if r in given and r != w]
    if out and not inplace:
        pairs.append(("out", "new_state"))
    if "intermediate_states" in given:
        pairs += [(w, "intermediate_states") for w in writers[:-1]]
    return pairs


def check_aliasing(q, k, v, state, A_log, a, dt_bias, b, out, new_state, state_indices=None,
                   new_state_indices=None, intermediate_states=None, intermediate_indices=None,
                   num_accepted_tokens=None):
    """Raise ValueError naming the first written argument whose byte range overlaps another
    argument's (:func:`aliasing_pairs`)."""
    named = dict(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, out=out,
                 new_state=new_state, state_indices=state_indices,
                 new_state_indices=new_state_indices, intermediate_states=intermediate_states,
                 intermediate_indices=intermediate_indices,
                 num_accepted_tokens=num_accepted_tokens)
    inplace = new_state is None or new_state is state
    given = {n for n, x in named.items() if x is not None}
    for w, r in aliasing_pairs(given, out is not None, inplace):
        if _overlaps(named[w], named[r]):
            if (w, r) == ("new_state", "state"):
                raise ValueError("new_state: expected a tensor distinct from state or state "
                                 "itself, got a different view that overlaps state's memory")
            why = " (it is updated in place)" if w == "state" else ""
            raise ValueError(f"{w}: expected memory disjoint from {r}{why}: a written tensor "
                             f"may not overlap any other argument, got overlapping byte ranges")


# decode's per-call check reads the data pointers of these arguments (0 for an absent one) into
# a tuple: the first 10 for a dense call, 12 for a pool call, all 15 for a
# verify call.
POINTERS = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "out", "new_state",
            "state_indices", "new_state_indices", "intermediate_states", "intermediate_indices",
            "num_accepted_tokens")


def overlap_probe(named, inplace: bool, slots: int):
    """A function of a call's data pointers (a tuple: the first ``slots`` of :data:`POINTERS`)
    that returns True when :func:`check_aliasing` would raise for them, for every call of the
    signature of the tensors ``named`` ({name: tensor or None}; their byte spans are constants
    in it): decode's per-call check.

    Generated once per signature, every pair unrolled: decode runs it only for data pointers
    it has not seen with this signature."""
    span = {n: byte_span(x) for n, x in named.items() if x is not None}
    pairs = [(w, r) for w, r in aliasing_pairs(set(span), named.get("out") is not None, inplace)
             if span[w] and span[r]]
    tests = [f"-{span[r]} < {r} - {w} < {span[w]}" for w, r in pairs]
    src = (f"def probe(ptrs):\n    {', '.join(POINTERS[:slots])} = ptrs\n"
           f"    return {' or '.join(tests) or 'False'}\n")
    scope = {}
    exec(compile(src, "<gdnzoo overlap probe>", "exec"), scope)
    return scope["probe"]


def _sig(t):
    return (t.size(), t.stride(), t.dtype, t.device, t.layout, t.requires_grad)


def _opt(t):
    return None if t is None else _sig(t)


def signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
              state_indices=None, new_state_indices=None, null_slot=None,
              intermediate_states=None, intermediate_indices=None, update_state=True,
              num_accepted_tokens=None):
    """Everything :func:`validate` decides from, except data pointers, as a hashable key.

    Two calls with equal signatures get the same verdict, so a cached ``(Problem, scale)``
    may be reused; the overlap check (:func:`overlap_probe`) still runs per call.  Values that
    compare equal across types (``1 == 1.0 == True``) are told apart by their types.  Raises
    for non-tensors (the caller then runs the full :func:`validate` for its message).
    """
    return (_sig(q), _sig(k), _sig(v), _sig(state), _sig(A_log), _sig(a), _sig(dt_bias), _sig(b),
            None if out is None else _sig(out),
            0 if new_state is None else (1 if new_state is state else _sig(new_state)),
            scale, type(scale), use_qk_l2norm, type(use_qk_l2norm),
            None if state_indices is None and new_state_indices is None and null_slot is None
            else (_opt(state_indices), _opt(new_state_indices), null_slot, type(null_slot)),
            (_opt(intermediate_states), _opt(intermediate_indices), update_state,
             type(update_state), _opt(num_accepted_tokens)))


def byte_span(x) -> int:
    """Bytes from ``x``'s first to one past its last element (0 when empty): fixed by shape,
    strides and dtype, so a memoized signature can check overlaps from data pointers alone."""
    if x.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(x.shape, x.stride())) + 1) * x.element_size()


def _overlaps(x, y) -> bool:
    sx, sy = byte_span(x), byte_span(y)
    a0, b0 = x.data_ptr(), y.data_ptr()
    return sx > 0 and sy > 0 and a0 < b0 + sy and b0 < a0 + sx

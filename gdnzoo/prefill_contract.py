"""The prefill's contract: its problem record, the one ``validate`` every call passes through,
and the call record backends receive.

Shapes (T tokens of N sequences packed on one axis; sequence i is tokens
``cu_seqlens[i]:cu_seqlens[i+1]``)::

    q, k        [T, H,  K]   fp16 | bf16          K axis contiguous
    v           [T, HV, V]   same dtype as q       V axis contiguous
    state       [N, HV, V, K] fp32 | bf16, or None (zeros); or a pool [P, HV, V, K] with
                state_indices [N]
    A_log       [HV]         fp32
    a, b        [T, HV]      fp16 | bf16
    dt_bias     [HV]         fp32 | bf16
    cu_seqlens  [N + 1]      int32 | int64, on q's device
    out         [T, HV, V]   dtype of q
    new_state   [N, HV, V, K] dtype of state (fp32 when state is None); None or ``state``:
                in place (a pool: [P', HV, V, K], written at new_state_indices)
    checkpoints [R, HV, V, K] dtype of the state written, R >= T // checkpoint_every; sequence
                n's rows from checkpoint_offsets(cu_seqlens, checkpoint_every)[n]
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import torch

from gdnzoo import pool as pools
from gdnzoo.checks import (DT_BIAS_DTYPES, FORMS_DOC, INDEX_DTYPES, IO_DTYPES, STATE_DTYPES,
                           ProblemBase, block, check_aliasing, dtype_name, gate_form, k_first,
                           need_bool, need_device, need_dtype, need_last_contiguous, need_own_memory,
                           need_rank, need_same_dtype, need_shape, need_tensor, resolve_scale)
from gdnzoo.contract import resolve_pdl
from gdnzoo.operation import PREFILL

PUBLIC_DOC = """The Gated Delta Net prefill of N sequences packed on one token axis; returns
``(out, new_state)``.

Sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]`` (zero-length sequences are legal).
Each runs the decode step's recurrence over its tokens in order, from its initial state (or
zeros), in fp32; token t's output reads the state after token t; the final state is written.
Per token t of a sequence and value head h (q/k head ``h // (HV // H)``)::

    g    = exp(-exp(A_log[h]) * softplus(a[t,h] + dt_bias[h]))
    beta = sigmoid(b[t,h])
    S    = g * S                       # S: the sequence's state [V, K] of head h
    u    = beta * (v[t,h] - S @ k)
    S    = S + outer(u, k)
    o    = scale * (S @ q)

Shapes: q, k [T, H, K] and v [T, HV, V] (bf16 or fp16, last axis contiguous); a, b [T, HV];
A_log [HV] fp32; dt_bias [HV] (fp32 or bf16); ``cu_seqlens`` [N+1] int32/int64 on q's
device; ``state`` [N, HV, V, K] (fp32 or bf16, K contiguous: "k-last"), or None for zeros;
out [T, HV, V] in q's dtype.  HV must be a multiple of H.

``new_state`` None or ``state``: in place; a distinct ``new_state`` [N, HV, V, K] receives
the final states and ``state`` is only read; with ``state=None`` and no ``new_state`` one is
allocated (fp32).  ``out`` None allocates ``torch.empty_like(v)``.  Written tensors may not
overlap any other argument.  ``scale`` None or 0 means 1/sqrt(K).  ``use_qk_l2norm`` (a bool)
normalizes q and k first.  ``algo`` names a backend (``gdnzoo.list_backends(op="prefill")``);
None: the ``ALGO`` environment variable, else this GPU's default table, else a fallback order.

State pools (serving engines): with ``state_indices`` ([N] int32/int64), ``state`` is a
pool [P, HV, V, K] (each slot's [HV, V, K] block contiguous, any ``stride(0)``) and sequence
n reads slot ``state_indices[n]`` and writes slot ``new_state_indices[n]`` (default: the
same) of ``new_state`` (default: the same pool).  A negative index, ``null_slot`` or an index
>= P is padding: zeros in ``out`` for that sequence's tokens, no state read or written.
``has_initial_state`` ([N] bool, with or without a pool): False starts sequence n from
zeros without reading its state (vLLM's convention); its final state is still written.

State checkpoints (prefix caching): ``checkpoints`` [R, HV, V, K] (K-first: [R, HV, K, V];
the dtype of the state written: ``state``'s, else ``new_state``'s, else fp32; its contiguous
axis as the state's) receives each sequence's state after every ``checkpoint_every`` tokens
(an int, a positive multiple of 64; required with ``checkpoints``).  Sequence n of length L_n
has ``L_n // checkpoint_every`` checkpoints (a length that is a multiple ends on one, equal to
its final state; a shorter tail gets none), packed in sequence order: its m-th (the state
after its first m * checkpoint_every tokens, m >= 1) is row ``off[n] + m - 1``, ``off[n]`` the
sum of ``L_i // checkpoint_every`` over i < n (FlashInfer's convention;
``gdnzoo.prefill_contract.checkpoint_offsets`` computes ``off`` on the device, and backends
derive it there: no host sync).  R >= T // checkpoint_every rows are required (what any split
of T tokens can need, checkable without reading the lengths); rows past the last checkpoint
are not written.  A padded sequence of a pool (its read slot is padding) writes no checkpoint:
its rows keep what they held.  Backends that cannot write checkpoints say why
(``gdnzoo list``).

""" + FORMS_DOC + """\
Programmatic dependent launch (``pdl``, as decode's; None: the ``GDNZOO_PDL`` environment
variable, unset means "off"): the kernels may start while the kernel before them in the
stream still runs, hiding their launches.  For prefill "wait" and "early" are the same: the
first kernel waits for the one before it before any load (its inputs, cu_seqlens included,
may all be that kernel's outputs), and the kernels after it wait for it.  Served by
triton-chunk, triton-chunk-bf16 and cuda-chunk on compute capability >= 9.0; results are
bit-identical to "off".

The values of ``cu_seqlens`` (starting at 0, non-decreasing, ending at T) and of the indices
are checked on the host with ``GDNZOO_CHECK_INDICES=1`` (a device sync), and by backends
that read them on the host anyway (pt-reference, pt-compiled); the default path of the
others never syncs (CUDA-graph capturable).

Bad inputs raise ``ValueError`` or ``TypeError`` naming the argument before any kernel runs,
so every argument is untouched.
"""


@dataclass(frozen=True)
class Problem(ProblemBase):
    """What a backend needs to know to decide whether it can serve a prefill call."""
    N: int                      # sequences
    T: int                      # tokens, all sequences together
    H: int
    HV: int
    K: int
    V: int
    state_dtype: torch.dtype    # of the state written (fp32 when none is given)
    io_dtype: torch.dtype
    device: str
    use_qk_l2norm: bool = False
    inplace: bool = True
    cc: tuple | None = None
    pool: bool = False          # the state is a pool read through state_indices
    initial: str = "state"      # "state": every sequence starts from its state; "mixed":
    #                             has_initial_state decides; "zeros": state is None
    precomputed: bool = False   # the gates come precomputed (g, beta), not raw (A_log, a, ...)
    neg_eigval: bool = False    # allow_neg_eigval: beta = 2 sigmoid(b), in [0, 2)
    k_first: bool = False       # the states are K-first [.., HV, K, V] (V contiguous)
    checkpoint_every: int = 0   # tokens between state checkpoints (0: no checkpoints)
    pdl: str = ""               # programmatic dependent launch: "wait", "early" (the same
    #                             here), "" off
    op = "prefill"
    batch_name = "T/N"
    table_heads = None          # the prefill table is read at T/N as is, whatever the heads

    @property
    def batch(self) -> int:
        """What the default table's ranges are read at: tokens per sequence (T/N, rounded
        down; at least 1)."""
        return max(1, self.T // max(1, self.N))

    @property
    def empty(self) -> bool:
        """No sequence (zero-length sequences still carry their state to new_state)."""
        return self.N == 0

    def default_tables(self) -> tuple:
        return (("table_pool", " in a state pool"),) * self.pool

    def describe(self) -> str:
        return (f"N={self.N} T={self.T} H={self.H} HV={self.HV} K={self.K} V={self.V} "
                f"state={self.state_name} io={dtype_name(self.io_dtype)} device={self.device} "
                f"l2norm={self.use_qk_l2norm} {'in-place' if self.inplace else 'dest-passing'}"
                f"{' pool' if self.pool else ''} initial={self.initial}"
                f"{' g/beta' if self.precomputed else ''}{' neg-eigval' if self.neg_eigval else ''}"
                f"{' k-first' if self.k_first else ''}"
                f"{f' checkpoints/{self.checkpoint_every}' if self.checkpoint_every else ''}"
                f"{' pdl-' + self.pdl if self.pdl else ''}")


def _index(name, x, N, device):
    """A contiguous [N] int32/int64 tensor on ``device``."""
    pools.index_tensor(name, x, N, device)


def validate(q, k, v, state, A_log=None, a=None, dt_bias=None, b=None, cu_seqlens=None,
             scale=None, *, out=None, new_state=None, use_qk_l2norm=False, state_indices=None,
             new_state_indices=None, has_initial_state=None, null_slot=None, g=None, beta=None,
             allow_neg_eigval=False, state_layout="k-last", checkpoints=None,
             checkpoint_every=None, pdl=None, pdl_env=None) -> tuple[Problem, float]:
    """Check every argument of :func:`gdnzoo.prefill`; return the problem and the resolved
    scale.  ``pdl_env``: the GDNZOO_PDL variable's value, which a ``pdl`` of None means.
    Raises ``TypeError`` or ``ValueError`` naming the argument."""
    if cu_seqlens is None:
        raise TypeError("cu_seqlens: expected a tensor [N + 1] of sequence boundaries, got None")
    for n, x in (("q", q), ("k", k), ("v", v), ("cu_seqlens", cu_seqlens)):
        need_tensor(n, x)
    for n, x in (("state", state), ("out", out), ("new_state", new_state),
                 ("checkpoints", checkpoints)):
        if x is not None:
            need_tensor(n, x, n != "state" or new_state is None or new_state is state)
    need_rank("q", q, 3, "[T, H, K]")
    T, H, K = q.shape
    need_rank("k", k, 3, "[T, H, K]")
    need_shape("k", k, (T, H, K), "[T, H, K] (same as q)")
    need_rank("v", v, 3, "[T, HV, V]")
    if v.shape[0] != T:
        raise ValueError(f"v: expected shape [T={T}, HV, V] (T as q), got {tuple(v.shape)}")
    HV, V = v.shape[1], v.shape[2]
    if H < 1 or K < 1 or HV < 1 or V < 1:
        raise ValueError(f"q/v: every head dimension must be >= 1, got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)}")
    if HV % H:
        raise ValueError(f"v: expected HV divisible by H (HV % H == 0), got HV={HV}, H={H}")
    need_rank("cu_seqlens", cu_seqlens, 1, "[N + 1]")
    if cu_seqlens.shape[0] < 1:
        raise ValueError("cu_seqlens: expected [N + 1] entries (N >= 0 sequences), got none")
    need_dtype("cu_seqlens", cu_seqlens, INDEX_DTYPES)
    if not cu_seqlens.is_contiguous():
        raise ValueError(f"cu_seqlens: expected a contiguous tensor, got strides "
                         f"{tuple(cu_seqlens.stride())}")
    N = cu_seqlens.shape[0] - 1
    dev = q.device
    kf = k_first(state_layout)
    blk, names, axis = block(HV, V, K, kf)
    precomputed = gate_form(A_log, a, dt_bias, b, g, beta, allow_neg_eigval, (T, HV),
                            "[T, HV]", dev)
    if not precomputed:
        for n, x, shape, layout in (("A_log", A_log, (HV,), "[HV]"),
                                    ("a", a, (T, HV), "[T, HV]"),
                                    ("dt_bias", dt_bias, (HV,), "[HV]"),
                                    ("b", b, (T, HV), "[T, HV]")):
            need_tensor(n, x)
            need_rank(n, x, len(shape), layout)
            need_shape(n, x, shape, layout)
        need_dtype("a", a, IO_DTYPES)
        need_dtype("b", b, IO_DTYPES)
        need_dtype("A_log", A_log, (torch.float32,))
        need_dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    need_dtype("q", q, IO_DTYPES)
    need_same_dtype("k", k, "q", q)
    need_same_dtype("v", v, "q", q)

    pooled = state_indices is not None
    inplace = new_state is None or new_state is state
    need_device(dict(k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, g=g,
                     beta=beta, cu_seqlens=cu_seqlens, out=out,
                     new_state=None if inplace else new_state, checkpoints=checkpoints), dev)
    if state is None:
        if pooled or new_state_indices is not None or null_slot is not None:
            name = next(n for n, x in (("state_indices", state_indices),
                                       ("new_state_indices", new_state_indices),
                                       ("null_slot", null_slot)) if x is not None)
            raise ValueError(f"{name}: only with a state pool (state given); got state=None")
        inplace = False
    elif pooled:
        _index("state_indices", state_indices, N, dev)
        pools.validate(N, HV, V, K, dev, state, new_state, state_indices, new_state_indices,
                       null_slot, kfirst=kf)
    else:
        pools.no_pool_args(new_state_indices, null_slot)
        need_rank("state", state, 4, f"[N, {names}]")
        need_shape("state", state, (N, *blk), f"[N, {names}] (N = len(cu_seqlens) - 1)")
    if state is not None:
        need_dtype("state", state, STATE_DTYPES)
        need_last_contiguous("state", state, axis)
    if new_state is not None and not inplace:
        if not pooled:
            need_rank("new_state", new_state, 4, f"[N, {names}]")
            need_shape("new_state", new_state, (N, *blk), f"[N, {names}]")
        if state is not None:
            need_same_dtype("new_state", new_state, "state", state)
        else:
            need_dtype("new_state", new_state, STATE_DTYPES)
        need_last_contiguous("new_state", new_state, axis)
    if has_initial_state is not None:
        need_tensor("has_initial_state", has_initial_state)
        if has_initial_state.dtype != torch.bool:
            raise TypeError(f"has_initial_state: expected dtype bool, got "
                            f"{dtype_name(has_initial_state.dtype)}")
        if tuple(has_initial_state.shape) != (N,):
            raise ValueError(f"has_initial_state: expected shape ({N},) [N], got "
                             f"{tuple(has_initial_state.shape)}")
        if has_initial_state.device != dev:
            raise ValueError(f"has_initial_state: expected device {dev} (the device of q), "
                             f"got {has_initial_state.device}")
        if not has_initial_state.is_contiguous():      # the kernels read flag n at n
            raise ValueError(f"has_initial_state: expected a contiguous tensor, got strides "
                             f"{tuple(has_initial_state.stride())}")
    if out is not None:
        need_rank("out", out, 3, "[T, HV, V]")
        need_shape("out", out, (T, HV, V), "[T, HV, V]")
        need_same_dtype("out", out, "q", q)
        need_last_contiguous("out", out, "V")
        need_own_memory("out", out)
    need_last_contiguous("q", q, "K")
    need_last_contiguous("k", k, "K")
    need_last_contiguous("v", v, "V")
    written = state if inplace else new_state
    if written is not None and not pooled:
        need_own_memory("state" if inplace else "new_state", written)
    sd = state.dtype if state is not None else (
        new_state.dtype if new_state is not None else torch.float32)
    every = _checkpoints(checkpoints, checkpoint_every, T, blk, names, axis, sd)
    check_aliasing(PREFILL, dict(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias,
                                 b=b, g=g, beta=beta, cu_seqlens=cu_seqlens, out=out,
                                 new_state=None if inplace else new_state,
                                 state_indices=state_indices,
                                 new_state_indices=new_state_indices,
                                 has_initial_state=has_initial_state,
                                 checkpoints=checkpoints), inplace)
    s = resolve_scale(scale, K)
    need_bool("use_qk_l2norm", use_qk_l2norm)
    level = resolve_pdl(pdl, pdl_env)
    cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    initial = "zeros" if state is None else "mixed" if has_initial_state is not None else "state"
    return Problem(N=N, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, io_dtype=q.dtype,
                   device=dev.type, use_qk_l2norm=use_qk_l2norm, inplace=inplace, cc=cc,
                   pool=pooled, initial=initial, precomputed=precomputed,
                   neg_eigval=allow_neg_eigval, k_first=kf, checkpoint_every=every,
                   pdl=level), s


CHECKPOINT_MULTIPLE = 64       # checkpoint_every is a multiple of the chunk size


def _checkpoints(checkpoints, every, T, blk, names, axis, state_dtype) -> int:
    """Check ``checkpoints`` and ``checkpoint_every`` (the state's block ``blk``, its shape's
    ``names`` and contiguous ``axis``, the dtype of the state written); return the interval
    (0: no checkpoints)."""
    if checkpoints is None:
        if every is not None:
            raise ValueError(f"checkpoint_every: only with checkpoints (the tensor receiving "
                             f"them), got checkpoint_every={every!r} and checkpoints=None")
        return 0
    if every is None:
        raise TypeError("checkpoint_every: expected an int (tokens between checkpoints, a "
                        "positive multiple of 64) with checkpoints, got None")
    if not isinstance(every, int) or isinstance(every, bool):
        raise TypeError(f"checkpoint_every: expected an int, got {type(every).__name__}")
    if every <= 0 or every % CHECKPOINT_MULTIPLE:
        raise ValueError(f"checkpoint_every: expected a positive multiple of "
                         f"{CHECKPOINT_MULTIPLE} (the chunk size), got {every}")
    need_rank("checkpoints", checkpoints, 4, f"[R, {names}]")
    rows = T // every
    if tuple(checkpoints.shape[1:]) != blk or checkpoints.shape[0] < rows:
        raise ValueError(f"checkpoints: expected shape [R, {names}] = [R, "
                         f"{', '.join(map(str, blk))}] with R >= T // checkpoint_every = "
                         f"{T} // {every} = {rows}, got {tuple(checkpoints.shape)}")
    if checkpoints.dtype != state_dtype:
        raise TypeError(f"checkpoints: expected dtype {dtype_name(state_dtype)} (the dtype of "
                        f"the state written), got {dtype_name(checkpoints.dtype)}")
    need_last_contiguous("checkpoints", checkpoints, axis)
    need_own_memory("checkpoints", checkpoints)
    return every


def checkpoint_offsets(cu_seqlens: torch.Tensor, checkpoint_every: int) -> torch.Tensor:
    """[N + 1] int64 on cu_seqlens' device: sequence n's checkpoints are rows
    ``off[n]:off[n + 1]`` of ``checkpoints`` (``off[n + 1] - off[n] = L_n // checkpoint_every``).
    Device operations only, no host sync."""
    counts = torch.div(cu_seqlens[1:] - cu_seqlens[:-1], checkpoint_every,
                       rounding_mode="floor").long()
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def verdict(args, env_pdl=None) -> tuple[Problem, float]:
    """:func:`validate` of prefill's positional ``args`` (``env_pdl``: reads the GDNZOO_PDL
    variable, asked only when ``pdl`` is None)."""
    named = dict(zip(PREFILL.names, args))
    del named["algo"]
    return validate(**named, pdl_env=env_pdl() if env_pdl is not None and named["pdl"] is None
                    else None)


# ------------------------------------------------------------------ the call record

#: What a prefill backend receives: prefill's arguments by name, validated and resolved
#: (``scale`` a float, ``out`` and ``new_state`` tensors: ``new_state is state`` in place,
#: ``state`` None for zeros, ``algo`` the serving backend, ``null_slot`` an int, -1 for none,
#: ``checkpoints`` None or a tensor with ``checkpoint_every`` its int interval, ``pdl`` the
#: resolved level: "", "wait" or "early"),
#: then the :class:`Problem` and the :class:`gdnzoo.pool.Pool` (None: one state per sequence).
class Call(namedtuple("PrefillCall", PREFILL.names + ("problem", "pool"))):
    __slots__ = ()
    op = "prefill"


def record(args, problem, scale, algo) -> Call:
    """The call record of prefill's positional ``args`` (validated as ``problem``): ``out``
    allocated like v when None, ``new_state`` allocated (fp32) when no state is given."""
    (q, k, v, state, A_log, a, dt_bias, b, cu, _, out, new_state, l2, si, nsi, init, null,
     _, g, beta, neg, layout, ckpt, every, _) = args
    if out is None:
        out = torch.empty_like(v)
    if new_state is None:
        blk = block(problem.HV, problem.V, problem.K, problem.k_first)[0]
        new_state = state if state is not None else torch.empty(
            (problem.N, *blk), dtype=torch.float32, device=v.device)
    null = -1 if null is None else null
    pool = None if si is None else pools.Pool(si, si if nsi is None else nsi, null)
    if pools.checking():
        check_on_host(cu, problem.T)
        if pool is not None:
            pools.check_on_host(pool, state.shape[0], new_state.shape[0], new_state is state)
    return Call(q, k, v, state, A_log, a, dt_bias, b, cu, scale, out, new_state, l2, si, nsi,
                init, null, algo, g, beta, neg, layout, ckpt, every, problem.pdl, problem, pool)


def check_on_host(cu_seqlens, T: int) -> list:
    """The values of ``cu_seqlens`` (a host sync): starting at 0, non-decreasing, ending at T;
    raises ValueError naming the first bad entry.  Returns them as a list."""
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens[0] = {cu[0]}: expected 0")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            raise ValueError(f"cu_seqlens[{i}] = {cu[i]}: expected >= cu_seqlens[{i - 1}] = "
                             f"{cu[i - 1]} (non-decreasing)")
    if cu[-1] != T:
        raise ValueError(f"cu_seqlens[{len(cu) - 1}] = {cu[-1]}: expected T = {T} (the last "
                         f"entry is the number of tokens)")
    return cu

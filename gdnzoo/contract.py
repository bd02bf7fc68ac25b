"""The decode step's contract: its problem record, the one ``validate`` every call passes
through, and the call record backends receive.

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
(``out``, ``new_state``, ``state`` in place, ``intermediate_states``) share no memory with any
other argument nor among their own elements.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import torch

from gdnzoo import pool as pools
from gdnzoo import verify as verifies
from gdnzoo.checks import (DT_BIAS_DTYPES, FORMS_DOC, IO_DTYPES, STATE_DTYPES, ProblemBase, block,
                           check_aliasing, dtype_name, gate_form, k_first, need_device, need_dtype,
                           need_last_contiguous, need_own_memory, need_rank, need_shape,
                           need_tensor, resolve_scale, type_name)
from gdnzoo.operation import DECODE


PUBLIC_DOC = """One Gated Delta Net decode step of T tokens; returns ``(out, new_state)``.

Per sequence n, token t and value head h (q/k head ``h // (HV // H)``), in fp32::

    g    = exp(-exp(A_log[h]) * softplus(a[n,t,h] + dt_bias[h]))
    beta = sigmoid(b[n,t,h])
    S    = g * S                       # S = state[n, h], stored [V, K]
    u    = beta * (v[n,t,h] - S @ k)
    S    = S + outer(u, k)
    o    = scale * (S @ q)

Shapes: q, k [B, T, H, K] and v [B, T, HV, V] (bf16 or fp16, last axis contiguous); state
[B, HV, V, K] (fp32 or bf16, K contiguous); A_log [HV] fp32; a, b [B, T, HV]; dt_bias [HV]
(fp32 or bf16); out [B, T, HV, V] in v's dtype.  HV must be a multiple of H.  Every
tensor is a dense tensor on one device (cpu or cuda) that does not require grad: decode
computes no gradients.

``new_state`` None or ``state``: the state is updated in place; a distinct ``new_state``
receives it and ``state`` is only read (destination passing).  ``out`` None allocates
``torch.empty_like(v)``.
Written tensors (``out``, ``new_state``, ``state`` in place) may not overlap any other
argument (their byte ranges, first to last element, are disjoint) nor themselves (no
stride 0 on a dimension of size > 1); a state that is only read may be expanded.
T >= 1 tokens are applied in order.  ``scale`` None or 0 means 1/sqrt(K); else a real
number >= 0 (not a bool).  ``use_qk_l2norm`` (a bool) normalizes q and k first.  ``algo``
names a backend (:func:`list_backends`); None: the ``ALGO`` environment variable, else
this GPU's measured default table, else a fallback order (:func:`select` says which and
why).

State pools (serving engines): with ``state_indices`` ([B] int32/int64 on q's device),
``state`` is a pool [P, HV, V, K] (each slot's [HV, V, K] block contiguous, any
``stride(0)`` >= HV*V*K) and sequence n reads slot ``state_indices[n]`` and writes its new
state to slot ``new_state_indices[n]`` (default: the same) of ``new_state`` (default: the
same pool).  A negative index is padding, and so is ``null_slot`` (an int; vLLM's null
block: ``null_slot=0``); an index >= P is never dereferenced.  A padded sequence gets
zeros in ``out`` and no state is read or written.  No host sync: CUDA-graph capturable.
``GDNZOO_CHECK_INDICES=1`` checks the indices on the host (see :mod:`gdnzoo.pool`).

Speculative verify (:mod:`gdnzoo.verify`), T draft tokens in one call: with
``intermediate_states`` [S, T_max, HV, V, K] (the state's dtype), the state after token t
of sequence n is stored at ``[intermediate_indices[n], t]`` (default row n; a negative
row or one >= S stores nothing); ``update_state=False`` writes no final state (the pool
stays as it was; :func:`commit` later keeps the accepted step).  vLLM's form:
``state_indices`` of shape [B, T] stores the state after token t in slot
``state_indices[n, t]`` and reads the initial state from column
``num_accepted_tokens[n] - 1`` (default column 0; a count outside 1..T pads the sequence).

""" + FORMS_DOC + """\
Programmatic dependent launch (``pdl``; None: the ``GDNZOO_PDL`` environment variable,
unset means "off"): the kernel may start while the kernel before it in the stream still
runs, hiding its launch.  ``"wait"`` waits for that kernel before any load (always
correct); ``"early"`` loads the state (its slot indices, A_log, dt_bias) before the wait
and q, k, v, a, b after it: correct only when the state's last writer completed before
the kernel right before this one started, which holds whenever a kernel launched without
PDL lies between two steps on the same state (as in every engine's layer).  Served by
fla-recurrent and cuda-v4 on compute capability >= 9.0; results are bit-identical to
``"off"``.

Bad inputs raise ``ValueError`` or ``TypeError`` naming the argument, before any kernel
runs, so every argument is untouched; whether an earlier call was memoized never changes
that.  An explicit algo that is unknown or cannot serve these inputs raises, listing the
valid names and the reason.
"""


@dataclass(frozen=True)
class Problem(ProblemBase):
    """What a backend needs to know to decide whether it can serve a decode call."""
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
    precomputed: bool = False   # the gates come precomputed (g, beta), not raw (A_log, a, ...)
    neg_eigval: bool = False    # allow_neg_eigval: beta = 2 sigmoid(b), in [0, 2)
    k_first: bool = False       # the state is K-first [.., HV, K, V] (V contiguous)
    op = "decode"

    def default_tables(self) -> tuple:
        """(key, how it reads) of the default-table row's tables that may serve this call, in
        the order consulted (then ``table``, measured in place at T = 1)."""
        kfirst = self.k_first and self.T == 1 and not self.pool and not self.verify
        return ((("table_kfirst_dest", " with a K-first state and destination passing"),)
                * (kfirst and not self.inplace)
                + (("table_kfirst", " with a K-first state"),) * kfirst
                + (("table_verify", " in a speculative verify"),) * bool(self.verify)
                + (("table_pool", " in a state pool"),) * self.pool
                + (("table_tokens", f" with {self.T} tokens per call"),) * (self.T > 1)
                + (("table_dest", " with destination passing"),) * (not self.inplace))

    def describe(self) -> str:
        return (f"B={self.B} T={self.T} H={self.H} HV={self.HV} K={self.K} V={self.V} "
                f"state={self.state_name} io={dtype_name(self.io_dtype)} device={self.device} "
                f"l2norm={self.use_qk_l2norm} {'in-place' if self.inplace else 'dest-passing'}"
                f"{' pool' if self.pool else ''}{' verify-' + self.verify if self.verify else ''}"
                f"{' pdl-' + self.pdl if self.pdl else ''}"
                f"{' g/beta' if self.precomputed else ''}{' neg-eigval' if self.neg_eigval else ''}"
                f"{' k-first' if self.k_first else ''}")


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


def validate(q, k, v, state, A_log=None, a=None, dt_bias=None, b=None, scale=None, *, out=None,
             new_state=None, use_qk_l2norm=False, state_indices=None, new_state_indices=None,
             null_slot=None, intermediate_states=None, intermediate_indices=None,
             update_state=True, num_accepted_tokens=None, pdl=None, g=None, beta=None,
             allow_neg_eigval=False, state_layout="k-last", pdl_env=None) -> tuple[Problem, float]:
    """Check every argument of :func:`gdnzoo.decode`; return the problem and the resolved scale.
    ``pdl_env``: the GDNZOO_PDL variable's value, which a ``pdl`` of None means.

    Raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (rank, shape, device, layout,
    value) naming the argument, what was expected and what came.
    """
    inplace = new_state is None or new_state is state
    named = dict(q=q, k=k, v=v, state=state)
    for n, x in named.items():
        need_tensor(n, x, n == "state" and inplace)
    if out is not None:
        need_tensor("out", out, True)
    if new_state is not None:
        need_tensor("new_state", new_state, True)

    need_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    need_rank("k", k, 4, "[B, T, H, K]")
    need_shape("k", k, (B, T, H, K), "[B, T, H, K] (same as q)")
    need_rank("v", v, 4, "[B, T, HV, V]")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [B={B}, T={T}, HV, V] (B, T as q), got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if T < 1 or H < 1 or K < 1 or HV < 1 or V < 1:
        raise ValueError(f"q/v: every dimension but B must be >= 1 (B = 0, an empty batch, is "
                         f"a no-op), got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if HV % H != 0:
        raise ValueError(f"v: expected HV divisible by H (HV % H == 0), got HV={HV}, H={H}")
    dev = q.device
    kf = k_first(state_layout)
    blk, names, axis = block(HV, V, K, kf)
    precomputed = gate_form(A_log, a, dt_bias, b, g, beta, allow_neg_eigval, (B, T, HV),
                            "[B, T, HV]", dev)
    pooled = state_indices is not None
    if pooled:
        pools.validate(B, HV, V, K, q.device, state, new_state, state_indices,
                       new_state_indices, null_slot, T, kf)
    else:
        pools.no_pool_args(new_state_indices, null_slot)
        need_rank("state", state, 4, f"[B, {names}]")
        need_shape("state", state, (B, *blk), f"[B, {names}]")
    if not precomputed:
        for n, x in (("A_log", A_log), ("a", a), ("dt_bias", dt_bias), ("b", b)):
            need_tensor(n, x)
        need_rank("A_log", A_log, 1, "[HV]")
        need_shape("A_log", A_log, (HV,), "[HV]")
        need_rank("a", a, 3, "[B, T, HV]")
        need_shape("a", a, (B, T, HV), "[B, T, HV]")
        need_rank("dt_bias", dt_bias, 1, "[HV]")
        need_shape("dt_bias", dt_bias, (HV,), "[HV]")
        need_rank("b", b, 3, "[B, T, HV]")
        need_shape("b", b, (B, T, HV), "[B, T, HV]")

    need_dtype("q", q, IO_DTYPES)
    for n in ("k", "v"):
        if named[n].dtype != q.dtype:
            raise TypeError(f"{n}: expected dtype {dtype_name(q.dtype)} (same as q), "
                            f"got {dtype_name(named[n].dtype)}")
    if not precomputed:
        need_dtype("a", a, IO_DTYPES)
        need_dtype("b", b, IO_DTYPES)
        need_dtype("A_log", A_log, (torch.float32,))
        need_dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    need_dtype("state", state, STATE_DTYPES)

    if out is not None:
        need_rank("out", out, 4, "[B, T, HV, V]")
        need_shape("out", out, (B, T, HV, V), "[B, T, HV, V]")
        if out.dtype != v.dtype:
            raise TypeError(f"out: expected dtype {dtype_name(v.dtype)} (same as v), "
                            f"got {dtype_name(out.dtype)}")
    if not inplace:
        if not pooled:
            need_rank("new_state", new_state, 4, f"[B, {names}]")
            need_shape("new_state", new_state, (B, *blk), f"[B, {names}]")
        if new_state.dtype != state.dtype:
            raise TypeError(f"new_state: expected dtype {dtype_name(state.dtype)} (same as state), "
                            f"got {dtype_name(new_state.dtype)}")

    gates = dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b, g=g, beta=beta)
    tensors = dict(named, **gates, out=out, new_state=None if inplace else new_state)
    need_device(tensors, dev)

    need_last_contiguous("q", q, "K")
    need_last_contiguous("k", k, "K")
    need_last_contiguous("v", v, "V")
    need_last_contiguous("state", state, axis)
    if out is not None:
        need_last_contiguous("out", out, "V")
    if not inplace:
        need_last_contiguous("new_state", new_state, axis)
    if out is not None:
        need_own_memory("out", out)
    if not pooled:                       # a pool's slots are checked apart by pools.validate
        need_own_memory(*(("state", state) if inplace else ("new_state", new_state)))
    ver = verifies.validate(B, T, HV, V, K, dev, state, new_state, state_indices,
                            new_state_indices, intermediate_states, intermediate_indices,
                            update_state, num_accepted_tokens, kf)
    check_aliasing(DECODE, dict(tensors, state_indices=state_indices,
                                new_state_indices=new_state_indices,
                                intermediate_states=intermediate_states,
                                intermediate_indices=intermediate_indices,
                                num_accepted_tokens=num_accepted_tokens), inplace)

    s = resolve_scale(scale, K)
    if not isinstance(use_qk_l2norm, bool):
        raise TypeError(f"use_qk_l2norm: expected bool, got {type_name(use_qk_l2norm)}")
    level = resolve_pdl(pdl, pdl_env)
    cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    p = Problem(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state.dtype, io_dtype=q.dtype,
                device=dev.type, use_qk_l2norm=use_qk_l2norm, inplace=inplace, cc=cc,
                pool=pooled, verify=verifies.problem_form(ver),
                intermediate=verifies.layout(ver, B, T), pdl=level, precomputed=precomputed,
                neg_eigval=allow_neg_eigval, k_first=kf)
    return p, s


# ------------------------------------------------------------------ the call record

#: What a decode backend receives (:mod:`gdnzoo.call`): decode's arguments by name, validated and
#: resolved (``scale`` a float, ``out`` and ``new_state`` tensors: ``new_state is state`` in
#: place, ``algo`` the backend serving the call, ``null_slot`` an int, -1 for none, ``pdl`` the
#: level of :data:`PDL_LEVELS`), then the :class:`Problem`, the :class:`gdnzoo.pool.Pool` (None:
#: a dense state) and the :class:`gdnzoo.verify.Verify` (None: no verify).
class Call(namedtuple("DecodeCall", DECODE.names + ("problem", "pool", "verify"))):
    __slots__ = ()
    op = "decode"

    def positional(self) -> tuple:
        """(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm): the
        twelve arguments of a backend's positional launch form, where it keeps one."""
        return self[:12]


def verdict(args, env_pdl) -> tuple[Problem, float]:
    """:func:`validate` of decode's positional ``args`` (``env_pdl``: reads the GDNZOO_PDL
    variable, asked only when ``pdl`` is None)."""
    named = dict(zip(DECODE.names, args))
    del named["algo"]
    return validate(**named, pdl_env=env_pdl() if named["pdl"] is None else None)


def record(args, problem, scale, algo) -> Call:
    """The call record of decode's positional ``args`` (already validated as ``problem``):
    ``out`` allocated like v when None (fresh memory overlaps no argument)."""
    (q, k, v, state, A_log, a, dt_bias, b, _, out, new_state, l2, _, si, nsi, null, inter,
     inter_idx, update, acc, _, g, beta, neg, layout) = args
    if out is None:
        out = torch.empty_like(v)
    if new_state is None:
        new_state = state
    null = -1 if null is None else null
    pool = None if si is None else pools.Pool(si, si if nsi is None else nsi, null)
    ver = None if not problem.verify else verifies.Verify(inter, inter_idx, update,
                                                          problem.verify == "slots", acc)
    if (pool is not None or ver is not None) and pools.checking():
        if pool is not None and (ver is None or not ver.per_token):
            pools.check_on_host(pool, state.shape[0], new_state.shape[0], new_state is state)
        if ver is not None:
            verifies.check_on_host(ver, pool, problem.T, state.shape[0], new_state.shape[0])
    return Call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, algo, si, nsi,
                null, inter, inter_idx, update, acc, PDL_LEVELS[problem.pdl or "off"], g, beta,
                neg, layout, problem, pool, ver)

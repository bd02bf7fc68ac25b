"""flash-linear-attention's Gated Delta Rule entry points, computed by gdnzoo.

A code base that imports these two names from FLA switches with one import::

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from gdnzoo.integrations.fla import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

Both take FLA 0.6's arguments, positional order included, and keep its semantics:

- q, k ``[B, T, H, K]`` and v ``[B, T, HV, V]``, HV a multiple of H (q and k at H heads, or
  already repeated to HV heads); with ``cu_seqlens`` ``[N + 1]`` the N sequences are packed on
  one token axis and B must be 1; without it each of the B rows is one sequence.
- ``g`` ``[B, T, HV]`` is the log-space decay, or with ``use_gate_in_kernel=True`` the raw input
  of ``-exp(A_log) * softplus(g + dt_bias)`` (``A_log`` ``[HV]`` required, ``dt_bias`` ``[HV]``
  optional); None means no decay.  ``beta`` ``[B, T, HV]`` is post-sigmoid, or with
  ``use_beta_sigmoid_in_kernel=True`` the logits (``allow_neg_eigval=True``, only then, makes it
  ``2 * sigmoid``); None means ones.
- ``scale`` None means ``K ** -0.5``.  ``use_qk_l2norm_in_kernel`` normalizes q and k first.
- ``initial_state`` ``[N, HV, K, V]`` (K-first), or ``[N, HV, V, K]`` with
  ``state_v_first=True``; any float dtype; only read, never modified.  None starts from zeros.
- Returns ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype, and with
  ``output_final_state=True`` the final state as a new fp32 tensor in the state's layout (else
  None).
- ``chunk_gated_delta_rule`` takes ``use_gate_in_kernel``, ``A_log``, ``dt_bias`` and
  ``chunk_size`` (16, 32 or 64) as keywords, as FLA does; ``cu_seqlens_cpu`` and
  ``chunk_indices`` are accepted and not needed.  Other keywords are ignored, as FLA ignores
  them (transformers passes its own).  The deprecated ``transpose_state_layout`` is read as
  ``state_v_first``, with FLA's warning (and, as FLA, refused beside ``state_v_first=True``).

Both are forward only (gdnzoo computes no gradients) and run wherever gdnzoo runs; a keyword
``algo=`` (not FLA's) names a gdnzoo backend.  The two differ only in their signatures: each call
goes where it is fastest, by its shape, not by its name.  A dense call of at most
:data:`DECODE_MAX_T` tokens per sequence and :data:`DECODE_MAX_WORK` sequences x tokens x value
heads is one :func:`gdnzoo.decode` step of T tokens; a packed call (``cu_seqlens``) or a larger
one is a :func:`gdnzoo.prefill`.

The gates reach gdnzoo in one of its two native forms: the raw form (``use_gate_in_kernel`` and
``use_beta_sigmoid_in_kernel`` both set, g and beta in bf16/fp16: gdnzoo's kernels compute decay
and beta in fp32 from them) or the precomputed form (neither flag set: log decay, post-sigmoid
beta).  A mixed call, one flag set and not the other, or raw gates in fp32, has its missing form
computed in fp32 by torch first (one or two small elementwise kernels) and goes precomputed.

Memory: the final state is written by gdnzoo into a fresh fp32 tensor while ``initial_state`` is
only read (destination passing, no copy of it) when that is fp32 with its last axis contiguous;
any other initial state is first copied to fp32 and that copy updated in place.  Without
``output_final_state`` the state is still written (gdnzoo always writes one), then dropped.

Not served, refused with the reason: per-channel gates ``gk``/``gv`` and a per-channel ``beta``
``[B, T, HV, V]`` (gdnzoo's gate is one scalar per head and token), ``head_first``,
``cp_context`` (context parallelism), and today fp32 q/k/v (gdnzoo's io dtypes are bf16 and
fp16).  Bad input raises ``ValueError`` or ``TypeError`` naming FLA's argument before any
kernel runs.
"""
from __future__ import annotations

import math
import numbers
import warnings
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F

import gdnzoo
from gdnzoo.checks import need_no_grad

__all__ = ["fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule", "DECODE_MAX_T",
           "DECODE_MAX_WORK"]

# A dense call is one decode step of T tokens (the tokens applied in turn, the state kept on
# chip, one launch) while that is the faster route: at most DECODE_MAX_T tokens a sequence and
# at most DECODE_MAX_WORK sequences x tokens x value heads; any other call takes the chunked
# prefill.  The decode step's time grows with its tokens times its (sequence, head) pairs, the
# prefill's starts higher and grows slower.  Measured on an H200 (lab/models_gpu.py --parts
# crossover, eager calls, 4/8, 16/32 and 16/64 heads, B = 1 ... 64, T = 8 ... 256;
# lab/notebook/h200/crossover_2026-11-30/): this rule takes the faster route in 61 of 66 cells
# and is at most 1.10x slower in the others, where T <= 64 alone missed 18 and was up to 7.4x
# slower (16/64, B = 64, T = 64: 5.00 against 0.67 ms; 16/32: 2.54 against 0.35).
DECODE_MAX_T = 128
DECODE_MAX_WORK = 16384

_RAW = (torch.bfloat16, torch.float16)     # the dtypes gdnzoo takes raw gates (a, b) in,
_BETA = (torch.float32, torch.bfloat16, torch.float16)   # a precomputed beta in,
_DT_BIAS = (torch.float32, torch.bfloat16)               # and dt_bias in
# gdnzoo names some tensors otherwise: its message is re-worded with FLA's name
_FLA_NAME = {"state": "initial_state", "a": "g", "b": "beta"}


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, *, algo=None, **kwargs):
    """FLA 0.6's ``fused_recurrent_gated_delta_rule`` on gdnzoo (see the module docstring);
    returns ``(o, final_state)``."""
    state_v_first = _legacy_keywords(state_v_first, kwargs)
    _no_channel_gates(gk, gv)
    return run(q, k, v, g, beta, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
               use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, algo)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                           chunk_indices=None, cp_context=None, *, algo=None, **kwargs):
    """FLA 0.6's ``chunk_gated_delta_rule`` on gdnzoo (see the module docstring); returns
    ``(o, final_state)``."""
    state_v_first = _legacy_keywords(state_v_first, kwargs)
    if cp_context is not None:
        raise ValueError("cp_context: context parallelism is not served by gdnzoo; use FLA")
    _no_channel_gates(kwargs.get("gk"), kwargs.get("gv"))
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in (16, 32, 64) or isinstance(chunk_size, bool):
        raise ValueError(f"chunk_size: expected 16, 32 or 64, got {chunk_size!r}")
    return run(q, k, v, g, beta, scale, initial_state, output_final_state,
               use_qk_l2norm_in_kernel, kwargs.get("use_gate_in_kernel", False),
               kwargs.get("A_log"), kwargs.get("dt_bias"), use_beta_sigmoid_in_kernel,
               allow_neg_eigval, state_v_first, cu_seqlens, algo)


class _Plan(NamedTuple):
    """What the checks of one call signature decided (see :func:`run`)."""
    B: int
    T: int
    HV: int
    V: int
    state: tuple        # the final state's shape: (N, HV, K, V), or (N, HV, V, K) V-first
    decode: bool        # one gdnzoo.decode step; else a gdnzoo.prefill
    raw: bool           # the gates go to gdnzoo raw (A_log, a, dt_bias, b); else precomputed
    scale: float        # gdnzoo's scale (> 0) ...
    sign: int           # ... and the output's sign: FLA's 0 and negative scales


_PLANS = {}             # call signature -> _Plan
_PLANS_MAX = 1024


def run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
        state_v_first, cu_seqlens, algo=None, inplace=False):
    """Both entry points' work, FLA's arguments in order.  ``inplace`` (not FLA's): a fp32
    ``initial_state`` with its last axis contiguous is updated in place and returned as the
    final state, saving a fresh tensor and the caller's copy (for a caller that overwrites the
    initial state with the final one anyway, as transformers' cache does).

    The checks run once per call signature (shapes, dtypes, flags, scale: what they decide
    from); devices, strides, grad and aliasing are gdnzoo's to check, on every call."""
    try:
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, _sig(g), _sig(beta), _sig(initial_state),
               _sig(A_log), _sig(dt_bias), None if cu_seqlens is None else cu_seqlens.shape,
               scale, type(scale), id(output_final_state), id(use_qk_l2norm_in_kernel),
               id(use_gate_in_kernel), id(use_beta_sigmoid_in_kernel), id(allow_neg_eigval),
               id(state_v_first))     # ids: the flags are the bools True/False, not 1/0
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):    # not a tensor, or unhashable: the checks say which
        key = plan = None
    if plan is None:
        plan = _plan(q, k, v, g, beta, scale, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                     use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens)
        if key is not None and len(_PLANS) < _PLANS_MAX:
            _PLANS[key] = plan
    B, T, HV, V = plan.B, plan.T, plan.HV, plan.V
    dev = q.device
    if plan.raw:
        A = A_log if A_log.dtype == torch.float32 else A_log.float()
        bias = _zeros(HV, dev) if dt_bias is None else \
            dt_bias if dt_bias.dtype in _DT_BIAS else dt_bias.float()
        a, b, lg, bt, neg = g, beta, None, None, allow_neg_eigval
    else:
        A = a = bias = b = None
        neg = False
        lg, bt = _precomputed(g, beta, A_log, dt_bias, use_gate_in_kernel,
                              use_beta_sigmoid_in_kernel, allow_neg_eigval, (B, T, HV), dev)
    state, new_state = _states(initial_state, plan.state, dev, plan.decode, inplace)
    layout = "k-last" if state_v_first else "k-first"
    out = torch.empty((B, T, HV, V), dtype=v.dtype, device=v.device)
    try:
        if plan.decode:
            gdnzoo.decode(_last(q), _last(k), _last(v), state, A, a, bias, b, plan.scale,
                          out=out, new_state=new_state, use_qk_l2norm=use_qk_l2norm_in_kernel,
                          algo=algo, g=lg, beta=bt, allow_neg_eigval=neg, state_layout=layout)
        else:               # tokens packed on one axis: views of dense q, k, v and gates
            if cu_seqlens is None:
                cu_seqlens = _uniform_cu_seqlens(B, T, dev)
            a, b, lg, bt = (None if x is None else x.reshape(B * T, HV) for x in (a, b, lg, bt))
            gdnzoo.prefill(*(_last(x.reshape(B * T, *x.shape[2:])) for x in (q, k, v)), state,
                           A, a, bias, b, cu_seqlens, plan.scale, out=out.view(B * T, HV, V),
                           new_state=new_state, use_qk_l2norm=use_qk_l2norm_in_kernel,
                           algo=algo, g=lg, beta=bt, allow_neg_eigval=neg, state_layout=layout)
    except (TypeError, ValueError) as e:
        raise _in_fla_names(e) from None
    if plan.sign <= 0:         # o is linear in scale: FLA's 0 and negative scales, exactly
        out.zero_() if plan.sign == 0 else out.neg_()
    final = state if new_state is None else new_state
    return out, final if output_final_state else None


def _sig(x):
    return None if x is None else (x.shape, x.dtype)


def _plan(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
          use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval,
          state_v_first, cu_seqlens) -> _Plan:
    """Every check of FLA's arguments (raising naming the argument), and the call's plan."""
    for name, flag in (("output_final_state", output_final_state),
                       ("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
                       ("use_gate_in_kernel", use_gate_in_kernel),
                       ("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel),
                       ("allow_neg_eigval", allow_neg_eigval), ("state_v_first", state_v_first)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected bool, got {type(flag).__name__}")
    B, T, H, K, HV, V = _shapes(q, k, v)
    if cu_seqlens is not None:
        _need_tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"cu_seqlens: expected shape [N + 1], got {tuple(cu_seqlens.shape)}")
        if B != 1:
            raise ValueError(f"cu_seqlens: expects the sequences packed on one token axis, q "
                             f"[1, T, H, K], got batch size B={B}")
        N = cu_seqlens.shape[0] - 1
    else:
        N = B
    state = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    if initial_state is not None:
        _need_tensor("initial_state", initial_state)
        if tuple(initial_state.shape) != state:
            raise ValueError(f"initial_state: expected shape {state} "
                             f"[N, {'HV, V, K' if state_v_first else 'HV, K, V'}] (N = "
                             f"{'len(cu_seqlens) - 1' if cu_seqlens is not None else 'B'}), "
                             f"got {tuple(initial_state.shape)}")
        _need_float("initial_state", initial_state)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True (beta is "
                         "then 2 * sigmoid of the logits)")
    scale, sign = _scale(scale, K)
    raw = _check_gates(g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                       (B, T, HV))
    decode = cu_seqlens is None and 0 < T <= DECODE_MAX_T and B * T * HV <= DECODE_MAX_WORK
    return _Plan(B, T, HV, V, state, decode, raw, scale, sign)


# ------------------------------------------------------------------ the parts

def _legacy_keywords(state_v_first, kwargs):
    """``state_v_first`` after FLA's removed and renamed keywords: ``head_first`` refused,
    ``transpose_state_layout`` (its old name) taken with FLA's warning."""
    if "head_first" in kwargs:
        raise ValueError("head_first: removed from FLA's API; pass q, k, v as [B, T, H, ...]")
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    old = kwargs["transpose_state_layout"]
    if state_v_first:                 # as FLA: the new name and the old one, never both
        raise ValueError("state_v_first: given with the deprecated transpose_state_layout (its "
                         "old name); pass only state_v_first")
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                  DeprecationWarning, stacklevel=3)
    return old


def _no_channel_gates(gk, gv):
    for name, x, axis in (("gk", gk, "K"), ("gv", gv, "V")):
        if x is not None:
            raise ValueError(f"{name}: per-channel decay gates ([B, T, HV, {axis}]) are not "
                             f"served by gdnzoo: the Gated Delta Net's gate is one scalar per "
                             f"head and token (g); use FLA for per-channel gates")


def _need_tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _need_shape(name, x, shape, layout):
    _need_tensor(name, x)
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} {layout}, got {tuple(x.shape)}")


def _need_float(name, x):
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point dtype, got {x.dtype}")


def _shapes(q, k, v):
    """(B, T, H, K, HV, V) of FLA's q, k [B, T, H, K] and v [B, T, HV, V]."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _need_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name}: expected rank 4 [B, T, {'HV, V' if name == 'v' else 'H, K'}]"
                             f", got shape {tuple(x.shape)}")
    B, T, H, K = q.shape
    _need_shape("k", k, (B, T, H, K), "[B, T, H, K] (same as q)")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [B={B}, T={T}, HV, V] (B, T as q), got "
                         f"{tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if H < 1 or K < 1 or V < 1 or HV % H:
        raise ValueError(f"v: expected HV a multiple of H >= 1 and K, V >= 1, got q "
                         f"{tuple(q.shape)}, v {tuple(v.shape)}")
    return B, T, H, K, HV, V


def _scale(scale, K):
    """(gdnzoo's scale, its sign): FLA's None is K ** -0.5; a negative scale is served as its
    magnitude with the output negated, 0 as a zero output."""
    if scale is None:
        return K ** -0.5, 1
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    s = float(scale)
    if s != s or abs(s) == float("inf"):
        raise ValueError(f"scale: expected a finite number, got {s}")
    return (abs(s) if s else 1.0), (s > 0) - (s < 0)


def _check_gates(g, beta, A_log, dt_bias, gate_in, beta_in, shape) -> bool:
    """Check the gate arguments; True when they go to gdnzoo raw: both flags set, g and beta
    bf16/fp16 (gdnzoo's raw a and b), else they go precomputed (:func:`_precomputed`)."""
    layout = "[B, T, HV]"
    if g is not None:
        _need_shape("g", g, shape, layout)
        _need_float("g", g)
    elif gate_in:
        raise ValueError("g: required with use_gate_in_kernel=True (the raw gate input)")
    if beta is not None:
        _need_tensor("beta", beta)
        if beta.dim() == 4:
            raise ValueError("beta: a per-channel beta [B, T, HV, V] is not served by gdnzoo "
                             "(one beta per head and token, [B, T, HV]); use FLA")
        _need_shape("beta", beta, shape, layout)
        _need_float("beta", beta)
    if gate_in:
        if A_log is None:
            raise ValueError("A_log: required with use_gate_in_kernel=True")
        _need_shape("A_log", A_log, shape[-1:], "[HV]")
        _need_float("A_log", A_log)
        if dt_bias is not None:
            _need_shape("dt_bias", dt_bias, shape[-1:], "[HV]")
            _need_float("dt_bias", dt_bias)
    return gate_in and beta_in and g.dtype in _RAW and beta is not None and beta.dtype in _RAW


def _precomputed(g, beta, A_log, dt_bias, gate_in, beta_in, neg, shape, device):
    """(log decay fp32, beta) for gdnzoo's precomputed form: FLA's own where given so, else
    what FLA's kernels compute from the raw tensors, in fp32, made here (a tensor made from
    ones that require grad would be refused under the name g or beta: the ones given are
    checked here, under their own names)."""
    if torch.is_grad_enabled():         # (under no_grad nothing read is refused)
        for name, x in (("g", g), ("beta", beta)) + ((("A_log", A_log), ("dt_bias", dt_bias))
                                                      if gate_in else ()):
            if x is not None:
                need_no_grad(name, x)
    if gate_in:
        bias = 0.0 if dt_bias is None else dt_bias.float()
        lg = -torch.exp(A_log.float()) * F.softplus(g.float() + bias)
    elif g is None:
        lg = torch.zeros(shape, dtype=torch.float32, device=device)
    else:
        lg = g if g.dtype == torch.float32 else g.float()
    if beta is None:
        fill = (2.0 if neg else 1.0) / (1.0 + math.exp(-1.0)) if beta_in else 1.0
        bt = torch.full(shape, fill, dtype=torch.float32, device=device)
    elif beta_in:
        bt = torch.sigmoid(beta.float())
        if neg:
            bt.mul_(2.0)
    else:
        bt = beta if beta.dtype in _BETA else beta.float()
    return lg, bt


def _states(initial_state, shape, device, decode, inplace):
    """(state, new_state) for gdnzoo: the final state lands in a fresh fp32 tensor, or in
    ``initial_state`` itself with ``inplace``; ``initial_state`` is never written otherwise."""
    h0 = initial_state
    if h0 is None:
        if decode:        # gdnzoo's decode reads a state: zeros, updated in place
            return torch.zeros(shape, dtype=torch.float32, device=device), None
        return None, torch.empty(shape, dtype=torch.float32, device=device)
    if h0.dtype == torch.float32 and h0.stride(-1) == 1:
        if inplace:
            return h0, None
        return h0, torch.empty(shape, dtype=torch.float32, device=device)
    return h0.to(torch.float32, memory_format=torch.contiguous_format, copy=True), None


def _last(x):
    """``x`` with its last axis contiguous, as gdnzoo reads it (a copy only when not)."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


@lru_cache(maxsize=64)
def _uniform_cu_seqlens(B, T, device):
    """[0, T, 2T, ..., B*T] (int32) on ``device``: a dense batch as B packed sequences.  Cached
    per shape (gdnzoo only reads it)."""
    return torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device) if T else \
        torch.zeros(B + 1, dtype=torch.int32, device=device)


@lru_cache(maxsize=16)
def _zeros(n, device):
    """A zero dt_bias [n] (fp32) on ``device``, cached (gdnzoo only reads it)."""
    return torch.zeros(n, dtype=torch.float32, device=device)


def _in_fla_names(e):
    """gdnzoo's ValueError/TypeError ``e`` with the argument it names in FLA's words."""
    msg = str(e)
    name, sep, rest = msg.partition(":")
    if sep and name in _FLA_NAME:
        msg = f"{_FLA_NAME[name]}:{rest}"
    if msg.startswith("q: expected dtype") and "fp32" in msg:
        msg += " (gdnzoo serves bf16 and fp16 q, k, v; fp32 inputs are not served yet)"
    return type(e)(msg)

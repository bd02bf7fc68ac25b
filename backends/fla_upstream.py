"""fla-upstream: flash-linear-attention 0.6.0's gated delta rule kernels, the peer: its fused
recurrent kernel for decode and its chunked pipeline for prefill.

Prefill: FLA's public ``chunk_gated_delta_rule`` on the tokens as a batch of one with
``cu_seqlens``, the raw gates in its kernels (``use_gate_in_kernel``, ``A_log``, ``dt_bias``,
``use_beta_sigmoid_in_kernel``) and ``state_v_first=True``; it reads ``cu_seqlens`` on the host
(a sync) and returns a fresh fp32 final state, which is copied into ``new_state``.  It has no
slot indices and no per-sequence ``has_initial_state``: those calls are refused.

Decode:

FLA's ``fused_recurrent_gated_delta_rule`` (``fla.ops.gated_delta_rule``) takes the raw gates:
with ``use_gate_in_kernel=True`` it computes ``g = -exp(A_log) * softplus(a + dt_bias)`` per step
inside its Triton kernel (``a`` is passed as its ``g`` argument), with
``use_beta_sigmoid_in_kernel=True`` it applies ``sigmoid(b)`` in the kernel, and
``state_v_first=True`` (0.6.0's name; ``transpose_state_layout`` is the deprecated alias) reads
and writes our k-last ``[B, HV, V, K]`` state.  So no gate kernel runs outside.  Its l2norm is
``x / sqrt(sum(x*x) + 1e-6)``, the same as ours.

Two ways to call it (``GDNZOO_FLA_PATH`` picks one for :func:`run`, read at each call):

``kernel`` (default)
    FLA's own Triton kernel ``fused_recurrent_gated_delta_rule_fwd_kernel`` launched directly,
    as serving engines integrate it: ``h0`` = ``state``, ``ht`` = ``new_state`` (the same tensor
    when in place), ``o`` = ``out``.  One launch, same grid and launch options as FLA's wrapper
    (BV = 8, num_warps = 1, num_stages = 3).  Tiles are disjoint and each program loads its tile
    before storing it, so in place is safe.  Timed cold like every other backend.
``api``
    The public function.  It allocates ``o`` and an fp32 final state every call; :func:`run`
    then copies them into ``out`` and ``new_state`` (two extra copy kernels, plus a cast for a
    bf16 state), so honours the contract at a cost.  :func:`api_call` is the bare public call
    with nothing around it: what a comparison "as its API allocates" times (its
    writes land in buffers the caching allocator hands back every call, so in L2: flattered).

The kernel path needs every tensor contiguous; a non-contiguous input is copied (``.contiguous()``,
one copy kernel each) and a non-contiguous ``out``/``new_state`` is computed in a contiguous
buffer and copied back.  Contiguous tensors, the normal case, cost nothing extra.
"""
from __future__ import annotations

import contextlib
import os

import torch

from gdnzoo.backends import _peer_checks

PATH_ENV = "GDNZOO_FLA_PATH"


def available(device):
    return _peer_checks.available(("fla", "triton"),
                                  "flash-linear-attention (fla-core 0.6.0) and triton",
                                  "fla-upstream is launched on CUDA only",
                                  "flash-linear-attention fused_recurrent_gated_delta_rule, "
                                  "state_v_first=True")


def supports(problem):
    ok, why = _peer_checks.on_cuda(problem, "fla-upstream runs only on CUDA devices")
    if ok and problem.op == "prefill" and problem.initial == "mixed":
        return False, ("FLA's chunk_gated_delta_rule takes one initial state per sequence and no "
                       "has_initial_state: zero the rows first")
    return ok, why


def path() -> str:
    choice = os.environ.get(PATH_ENV, "kernel")
    if choice not in ("kernel", "api"):
        raise ValueError(f"{PATH_ENV}: expected 'kernel' or 'api', got {choice!r}")
    return choice


def allocates_state() -> bool:
    """True when calls go through FLA's public API, whose freshly allocated new-state buffer
    is handed back by the caching allocator every call, so its writes land warm in L2."""
    return path() == "api"


def run(call, *, config=None):
    if call.op == "prefill":
        prefill(call)
    else:
        (run_api if path() == "api" else run_kernel)(*call.positional())


def prefill(c):
    """FLA's chunked prefill on a prefill call record (dense states; see the module
    docstring)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    o, ht = chunk_gated_delta_rule(
        c.q[None], c.k[None], c.v[None], g=c.a[None], beta=c.b[None], scale=c.scale,
        initial_state=c.state, output_final_state=True, use_qk_l2norm_in_kernel=c.use_qk_l2norm,
        use_gate_in_kernel=True, A_log=c.A_log, dt_bias=c.dt_bias,
        use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=c.cu_seqlens.long())
    c.out.copy_(o[0])
    c.new_state.copy_(ht)


def api_call(q, k, v, state, A_log, a, dt_bias, b, scale, use_qk_l2norm):
    """FLA's public function alone; returns its own freshly allocated ``(o, final_state fp32)``."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    return fused_recurrent_gated_delta_rule(
        q, k, v, g=a, beta=b, scale=scale, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm, use_gate_in_kernel=True, A_log=A_log,
        dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True)


def run_api(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm):
    o, ht = api_call(q, k, v, state, A_log, a, dt_bias, b, scale, use_qk_l2norm)
    out.copy_(o)
    new_state.copy_(ht)


def _dense(x):
    return x if x.is_contiguous() else x.contiguous()


def run_kernel(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm):
    import triton
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel

    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BK = triton.next_power_of_2(K)
    BV = min(8, triton.next_power_of_2(V))
    NV = triton.cdiv(V, BV)
    inplace = new_state is state
    h0 = _dense(state)
    ht = h0 if inplace else _dense(new_state)
    o = _dense(out)
    # Triton launches on the current device; FLA's input_guard switches to q's, so do we.
    # (CPU tensors only reach here under TRITON_INTERPRET=1, in tests.)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        fused_recurrent_gated_delta_rule_fwd_kernel[(NV * B * HV,)](
            q=_dense(q), k=_dense(k), v=_dense(v), g=_dense(a), gk=None, gv=None, beta=_dense(b),
            A_log=A_log, dt_bias=dt_bias, o=o, h0=h0, ht=ht, cu_seqlens=None, scale=scale, T=T,
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV,
            IS_BETA_HEADWISE=True, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm,
            APPLY_BETA_SIGMOID=True, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=True,
            num_warps=1, num_stages=3)
    if o is not out:
        out.copy_(o)
    if ht is not new_state:
        new_state.copy_(ht)

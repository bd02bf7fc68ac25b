"""The math of the decode step (see :func:`gdnzoo.decode`) in readable PyTorch: the test oracle,
and the ``pt-reference`` backend.

Vectorized over batch and heads, tokens applied in order.  All arithmetic in fp32 by default;
tests run it in float64 (``compute_dtype=torch.float64``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gates(A_log, a, dt_bias, b, compute_dtype=torch.float32):
    """Decay g in (0, 1) and write strength beta, both [B, T, HV]."""
    A = A_log.to(compute_dtype)
    x = a.to(compute_dtype) + dt_bias.to(compute_dtype)
    g = torch.exp(-torch.exp(A) * F.softplus(x, beta=1.0, threshold=20.0))
    beta = torch.sigmoid(b.to(compute_dtype))
    return g, beta


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def reference_decode(q, k, v, state, A_log, a, dt_bias, b, scale: float, out, new_state,
                     use_qk_l2norm: bool = False, compute_dtype=torch.float32):
    """Write ``out`` [B,T,HV,V] and ``new_state`` [B,HV,V,K] (which may be ``state`` itself)."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    g, beta = gates(A_log, a, dt_bias, b, compute_dtype)
    # GVA: value head h reads q/k head h // (HV // H), as repeat_interleave gives.
    qx = q.to(compute_dtype).repeat_interleave(HV // H, dim=2)       # [B,T,HV,K]
    kx = k.to(compute_dtype).repeat_interleave(HV // H, dim=2)
    if use_qk_l2norm:
        qx, kx = l2norm(qx), l2norm(kx)
    vx = v.to(compute_dtype)
    S = state.to(compute_dtype)                                       # [B,HV,V,K], a copy
    for t in range(T):
        S = S * g[:, t, :, None, None]                                # 1) decay first
        sk = torch.einsum("bhvk,bhk->bhv", S, kx[:, t])               # 2) read k from decayed S
        u = beta[:, t, :, None] * (vx[:, t] - sk)
        S = S + u[..., None] * kx[:, t, :, None, :]                   # 3) rank-1 update
        o = scale * torch.einsum("bhvk,bhk->bhv", S, qx[:, t])        # 4) output from updated S
        out[:, t].copy_(o)
    new_state.copy_(S)
    return out, new_state


def reference_pool_decode(q, k, v, state, A_log, a, dt_bias, b, scale: float, out, new_state,
                          use_qk_l2norm: bool = False, pool=None, compute_dtype=torch.float32,
                          step=None):
    """The pool form (:mod:`gdnzoo.pool`): gather the read slots, decode them as a dense batch
    (with ``step``, a dense decode of the one signature; default :func:`reference_decode` in
    ``compute_dtype``), zero the outputs of padded sequences, write the new states to their
    write slots.  All slots are read before any is written.  One host sync (the scatter's row
    selection)."""
    from gdnzoo import pool as pools
    P, PN = state.shape[0], new_state.shape[0]
    dense, rd, wr = pools.gathered(state, pool, P, PN)
    dense_new = torch.empty(dense.shape, dtype=new_state.dtype, device=dense.device)
    if step is None:
        reference_decode(q, k, v, dense, A_log, a, dt_bias, b, scale, out, dense_new,
                         use_qk_l2norm, compute_dtype)
    else:
        step(q, k, v, dense, A_log, a, dt_bias, b, scale, out, dense_new, use_qk_l2norm)
    out.masked_fill_(~rd[:, None, None, None], 0)
    pools.scatter(new_state, dense_new, pool, wr)
    return out, new_state


def reference_outputs(x, use_qk_l2norm=False, compute_dtype=torch.float64, pool=None,
                      new_pool=None):
    """Fresh (out [B,T,HV,V], new_state) in ``compute_dtype`` for an
    :class:`gdnzoo.inputs.Inputs`; float64 by default, the oracle of tests and benchmarks.
    With ``pool`` (a :class:`gdnzoo.pool.Pool`), ``x.state`` is a pool and new_state is the
    whole pool after the call: a float64 copy of ``new_pool`` (default ``x.state``, in place)
    with the written slots replaced."""
    if pool is not None:
        B, T = x.q.shape[:2]
        HV, V = x.v.shape[2], x.v.shape[3]
        out = torch.empty(B, T, HV, V, dtype=compute_dtype, device=x.q.device)
        target = (x.state if new_pool is None else new_pool).to(compute_dtype, copy=True)
        src = target if new_pool is None else x.state
        reference_pool_decode(x.q, x.k, x.v, src, x.A_log, x.a, x.dt_bias, x.b, x.scale, out,
                              target, use_qk_l2norm, pool, compute_dtype)
        return out, target
    B, T = x.q.shape[:2]
    HV, V = x.v.shape[2], x.v.shape[3]
    out = torch.empty(B, T, HV, V, dtype=compute_dtype, device=x.q.device)
    new_state = torch.empty(x.state.shape, dtype=compute_dtype, device=x.q.device)
    reference_decode(*x.args(), out, new_state, use_qk_l2norm, compute_dtype=compute_dtype)
    return out, new_state


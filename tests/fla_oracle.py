"""FLA 0.6's documented Gated Delta Rule semantics in float64, token by token: the oracle of the
FLA entry points and the transformers hook.  Written from FLA's docstrings (K-first state,
[B, T, H, K] inputs, packed sequences with cu_seqlens), not from gdnzoo's reference."""
from __future__ import annotations

import torch
import torch.nn.functional as F

F64 = torch.float64


def fla_oracle(q, k, v, g=None, beta=None, scale=None, initial_state=None,
               use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None,
               dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
               state_v_first=False, cu_seqlens=None):
    """(o [B, T, HV, V], final states [N, HV, K, V] or [N, HV, V, K]) in float64, on q's
    device."""
    B, T, H, K = q.shape
    dev = q.device
    HV, V = v.shape[2], v.shape[3]
    qx, kx = (x.to(F64).repeat_interleave(HV // H, dim=2) for x in (q, k))
    if use_qk_l2norm_in_kernel:
        qx, kx = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (qx, kx))
    vx = v.to(F64)
    scale = K ** -0.5 if scale is None else scale
    if g is None:
        lg = torch.zeros(B, T, HV, dtype=F64, device=dev)
    elif use_gate_in_kernel:
        bias = 0.0 if dt_bias is None else dt_bias.to(F64)
        lg = -torch.exp(A_log.to(F64)) * F.softplus(g.to(F64) + bias)
    else:
        lg = g.to(F64)
    bt = torch.ones(B, T, HV, dtype=F64, device=dev) if beta is None else beta.to(F64)
    if use_beta_sigmoid_in_kernel:
        bt = torch.sigmoid(bt) * (2.0 if allow_neg_eigval else 1.0)
    if cu_seqlens is None:
        spans = [(n, 0, T) for n in range(B)]
    else:
        cu = cu_seqlens.tolist()
        spans = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=F64, device=dev)
    finals = []
    for i, (n, start, end) in enumerate(spans):
        if initial_state is None:
            S = torch.zeros(HV, K, V, dtype=F64, device=dev)
        else:
            S = initial_state[i].to(F64)
            S = S.transpose(-1, -2) if state_v_first else S
        for t in range(start, end):
            S = S * torch.exp(lg[n, t])[:, None, None]
            kt = kx[n, t]
            u = bt[n, t][:, None] * (vx[n, t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt[:, :, None] * u[:, None, :]
            o[n, t] = scale * torch.einsum("hk,hkv->hv", qx[n, t], S)
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    return o, torch.stack(finals) if finals else torch.zeros(0, HV, K, V, dtype=F64, device=dev)


def state_error(state, ref) -> float:
    """Relative RMS error ||state - ref|| / ||ref|| in float64."""
    ref = ref.to(F64)
    return float((state.to(F64) - ref).norm() / ref.norm().clamp_min(1e-300))

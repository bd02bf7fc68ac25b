"""Test helpers: run a backend on NaN-poisoned outputs and compare with the float64 reference."""
from __future__ import annotations

import torch

from gdnzoo.compare import check_close
from gdnzoo.reference import reference_decode


def reference64(x, use_qk_l2norm):
    """Float64 reference output [B,T,HV,V] and new state [B,HV,V,K] for inputs ``x``."""
    B, T, _, _ = x.q.shape
    HV, V = x.v.shape[2], x.v.shape[3]
    out = torch.empty(B, T, HV, V, dtype=torch.float64, device=x.q.device)
    st = torch.empty(x.state.shape, dtype=torch.float64, device=x.q.device)
    reference_decode(*x.args(), out, st, use_qk_l2norm, compute_dtype=torch.float64)
    return out, st


def rel_err(x, ref):
    x = x.to(torch.float64)
    ref = ref.to(torch.float64)
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def assert_matches(out, new_state, ref_out, ref_state, state_dtype, what=""):
    """Tight checks (relative Frobenius error) plus SPEC section 2's elementwise rule."""
    assert torch.isfinite(out.float()).all(), f"{what}: output has NaN/Inf (unwritten elements?)"
    assert torch.isfinite(new_state.float()).all(), f"{what}: new_state has NaN/Inf"
    # fp32 state: fp32 math gives ~1e-6; bf16 state: one rounding to bf16 (2^-9 relative).
    st_tol = 1e-4 if state_dtype == torch.float32 else 8e-3
    e_s = rel_err(new_state, ref_state)
    e_o = rel_err(out, ref_out)
    assert e_s < st_tol, f"{what}: new_state relative error {e_s:.2e} >= {st_tol:.0e}"
    assert e_o < 1e-2, f"{what}: output relative error {e_o:.2e} >= 1e-2"
    for name, t, r in (("output", out, ref_out), ("new_state", new_state, ref_state)):
        ok, ma, mr, nb = check_close(t, r)
        assert ok, f"{what}: {name} fails SPEC rule: {nb} elements, max abs {ma:.2e} rel {mr:.2e}"

"""Test helpers: run a backend on NaN-poisoned outputs and compare with the float64 reference."""
from __future__ import annotations

import torch

from gdnzoo.compare import check_close, relative_error, strict_tol


def assert_matches(out, new_state, ref_out, ref_state, state_dtype, what=""):
    """Tight checks (relative Frobenius error, gdnzoo.compare.STRICT_TOL) plus SPEC section 2's
    elementwise rule.  fp32 state: fp32 math gives ~1e-6; bf16 state: one rounding to bf16."""
    assert torch.isfinite(out.float()).all(), f"{what}: output has NaN/Inf (unwritten elements?)"
    assert torch.isfinite(new_state.float()).all(), f"{what}: new_state has NaN/Inf"
    st_tol, out_tol = strict_tol("state", state_dtype), strict_tol("out")
    e_s = relative_error(new_state, ref_state)
    e_o = relative_error(out, ref_out)
    assert e_s < st_tol, f"{what}: new_state relative error {e_s:.2e} >= {st_tol:.0e}"
    assert e_o < out_tol, f"{what}: output relative error {e_o:.2e} >= {out_tol:.0e}"
    for name, t, r in (("output", out, ref_out), ("new_state", new_state, ref_state)):
        ok, ma, mr, nb = check_close(t, r)
        assert ok, f"{what}: {name} fails SPEC rule: {nb} elements, max abs {ma:.2e} rel {mr:.2e}"

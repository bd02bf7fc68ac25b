"""The correctness rule of SPEC section 2 (the FlashInfer-Bench contest's own rule).

An output is correct when it has the expected shape and dtype, holds no NaN or Inf, and no
element has both ``|x - y| > atol`` and ``|x - y| / (|y| + 1e-8) > rtol``.  Errors are computed
in fp32 on both sides, as flashinfer-bench's ``compute_error_stats`` does (a float64 oracle is
rounded to fp32 first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

REL_EPS = 1e-8


class Closeness(NamedTuple):
    ok: bool
    max_abs: float
    max_rel: float
    n_bad: int


@dataclass
class Verdict:
    """Full result of one comparison; ``reason`` is empty when ``ok``."""
    ok: bool
    max_abs: float
    max_rel: float
    n_bad: int
    numel: int
    reason: str = ""

    def closeness(self) -> Closeness:
        return Closeness(self.ok, self.max_abs, self.max_rel, self.n_bad)


def compare(out: torch.Tensor, ref: torch.Tensor, *, atol: float = 1e-2, rtol: float = 1e-2,
            dtype: torch.dtype | None = None) -> Verdict:
    """Compare ``out`` with ``ref`` under the contest rule.

    ``dtype`` is the dtype ``out`` must have; None checks no dtype, so that ``ref`` may be a
    float64 oracle.  A shape or dtype mismatch, or a non-finite element, fails with
    ``n_bad = -1`` and infinite errors.
    """
    n = out.numel()
    if tuple(out.shape) != tuple(ref.shape):
        return Verdict(False, float("inf"), float("inf"), -1, n,
                       f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    if dtype is not None and out.dtype != dtype:
        return Verdict(False, float("inf"), float("inf"), -1, n,
                       f"dtype {out.dtype}, expected {dtype}")
    if n == 0:
        return Verdict(True, 0.0, 0.0, 0, 0)
    x = out.detach().to(torch.float32)
    y = ref.detach().to(device=x.device, dtype=torch.float32)
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(torch.isinf(x).sum())
        return Verdict(False, float("inf"), float("inf"), -1, n,
                       f"{n_nan} NaN and {n_inf} Inf elements")
    err = (x - y).abs()
    rel = err / (y.abs() + REL_EPS)
    bad = (err > atol) & (rel > rtol)
    n_bad = int(bad.sum())
    max_abs, max_rel = float(err.max()), float(rel.max())
    reason = ""
    if n_bad:
        i = int(torch.argmax(torch.where(bad, err, torch.zeros_like(err))))
        reason = (f"{n_bad}/{n} elements off by more than atol={atol:g} and rtol={rtol:g} "
                  f"(worst at flat index {i}: got {float(x.flatten()[i]):.6g}, "
                  f"expected {float(y.flatten()[i]):.6g})")
    return Verdict(n_bad == 0, max_abs, max_rel, n_bad, n, reason)


def check_close(out: torch.Tensor, ref: torch.Tensor, atol: float = 1e-2, rtol: float = 1e-2,
                dtype: torch.dtype | None = None) -> Closeness:
    """``(ok, max_abs, max_rel, n_bad)`` under the contest rule; see :func:`compare`."""
    return compare(out, ref, atol=atol, rtol=rtol, dtype=dtype).closeness()


# ------------------------------------------------------------------ the strict (relative) rule

#: Relative Frobenius error bounds every gdnzoo gate uses on top of the SPEC rule (the test suite
#: and ``gdnzoo bench``): with realistic input magnitudes the elementwise rule alone passes an
#: output of zeros or a state that was never updated, a relative error does not.  fp32 state:
#: fp32 math lands near 1e-6; bf16 state: one rounding to bf16 (2^-9 relative) per element.
STRICT_TOL = {"out": 1e-2, "state": {torch.float32: 1e-4, torch.bfloat16: 8e-3}}


def strict_tol(what: str, state_dtype: torch.dtype | None = None) -> float:
    """The :data:`STRICT_TOL` bound for ``"out"``, or for ``"state"`` of ``state_dtype``."""
    if what == "out":
        return STRICT_TOL["out"]
    if what == "state":
        try:
            return STRICT_TOL["state"][state_dtype]
        except KeyError:
            raise ValueError(f"strict_tol: no state bound for {state_dtype}") from None
    raise ValueError(f"strict_tol: expected 'out' or 'state', got {what!r}")


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref||_F / ||ref||_F`` in float64 (0 when both are zero, inf when only ref is).

    NaN or Inf in ``x`` give NaN or Inf, which fail every ``<`` bound.
    """
    a = x.detach().to(torch.float64)
    b = ref.detach().to(device=a.device, dtype=torch.float64)
    num, den = float((a - b).norm()), float(b.norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den

"""The one correctness gate: every test, ``gdnzoo bench``, ``check`` and ``tune`` and every lab
script judges a call with :func:`judge` (or runs it with :func:`gated_call`).

Two rules, both required, for the output and the new state:

* the contest rule (FlashInfer-Bench's own, :func:`compare`): the expected shape and dtype, no
  NaN or Inf, and no element with both ``|x - y| > atol`` and ``|x - y| / (|y| + 1e-8) > rtol``
  (1e-2 each).  Errors are computed in fp32 on both sides, as flashinfer-bench's
  ``compute_error_stats`` does (a float64 oracle is rounded to fp32 first);
* the strict rule (:data:`STRICT_TOL`): the relative Frobenius error ``||x - y|| / ||y||`` below
  1e-2 for the output and 1e-4 (fp32) / 8e-3 (bf16) for the state.  With realistic magnitudes
  the elementwise rule alone passes an output of zeros or a state that was never updated.

:func:`gated_call` also fills ``out`` (and, with destination passing, ``new_state``) with NaN
first, so an unwritten element fails, and checks that destination passing left ``state`` and
that no call changed q, k, v, a, b, A_log or dt_bias.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

REL_EPS = 1e-8


@dataclass
class Verdict:
    """Full result of one comparison; ``reason`` is empty when ``ok``."""
    ok: bool
    max_abs: float
    max_rel: float
    n_bad: int
    numel: int
    reason: str = ""


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


# ------------------------------------------------------------------ the strict (relative) rule

#: Relative Frobenius error bounds every gdnzoo gate uses on top of the contest rule (the test suite
#: and ``gdnzoo bench``): with realistic input magnitudes the elementwise rule alone passes an
#: output of zeros or a state that was never updated, a relative error does not.  fp32 state:
#: fp32 math lands near 1e-6; bf16 state: one rounding to bf16 (2^-9 relative) per element.
STRICT_TOL = {"out": 1e-2, "state": {torch.float32: 1e-4, torch.bfloat16: 8e-3}}

#: The state bound of a backend whose registry entry says it rounds its states (``rounds_state``:
#: FLA's and FlashInfer's chunked prefill hold their intermediate states in bf16 whatever the
#: state's dtype, measured 3e-3 to 4e-3 relative at 8k tokens on an H200): the bf16 state's
#: bound on any state; their errors are reported as measured, never hidden.
PEER_STATE_TOL = STRICT_TOL["state"][torch.bfloat16]


def state_tol_of(name: str, op: str) -> float | None:
    """The state bound that backend ``name`` of ``op`` is judged with: :data:`PEER_STATE_TOL`
    where its registry entry has ``rounds_state``, else None (the strict bound of the state's
    dtype; also for names that are not backends, such as the bench's ``auto``)."""
    from gdnzoo import registry
    spec = registry.load_registry().op(op).backends.get(name)
    return PEER_STATE_TOL if spec is not None and spec.rounds_state else None


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


# ------------------------------------------------------------------ the gate

@dataclass
class Judgement:
    """Both rules on the output and the new state; ``reasons`` is empty when ``ok``."""
    out: Verdict
    state: Verdict
    rel_err_out: float
    rel_err_state: float
    reasons: list

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def n_bad(self) -> int:
        return max(self.out.n_bad, 0) + max(self.state.n_bad, 0)


def judge(out, new_state, ref_out, ref_state, *, out_dtype=None, state_dtype=None,
          atol: float = 1e-2, rtol: float = 1e-2, state_tol: float | None = None) -> Judgement:
    """The contest rule and the strict rule on ``out`` and ``new_state`` against references of
    any float dtype; ``out_dtype`` / ``state_dtype``: the dtypes they must have (default:
    their own).  The strict state bound is that of ``state_dtype``, or ``state_tol`` (the
    peers' :data:`PEER_STATE_TOL`)."""
    state_dtype = state_dtype or new_state.dtype
    vo = compare(out, ref_out, atol=atol, rtol=rtol, dtype=out_dtype)
    vs = compare(new_state, ref_state, atol=atol, rtol=rtol, dtype=state_dtype)
    eo, es = relative_error(out, ref_out), relative_error(new_state, ref_state)
    to = strict_tol("out")
    ts = strict_tol("state", state_dtype) if state_tol is None else state_tol
    reasons = [f"out: {vo.reason}"] * (not vo.ok) + [f"new_state: {vs.reason}"] * (not vs.ok)
    if vo.ok and not eo < to:
        reasons.append(f"out: relative error {eo:.3g} >= {to:g}")
    if vs.ok and not es < ts:
        reasons.append(f"new_state: relative error {es:.3g} >= {ts:g}")
    return Judgement(vo, vs, eo, es, reasons)


def gated_call(fn, x, *, dest: bool, use_qk_l2norm: bool = False, ref=None,
               atol: float = 1e-2, rtol: float = 1e-2, state_tol: float | None = None,
               **kwargs) -> tuple:
    """Run ``fn`` (a function with an operation's public signature, such as
    ``gdnzoo.get(name)`` or ``gdnzoo.get(name, op="prefill")``) once on the inputs ``x``
    (:class:`gdnzoo.inputs.Inputs` or :class:`gdnzoo.inputs.PrefillInputs`) and judge it.

    The state passed is a copy of ``x.state``; ``out`` and, with ``dest``, a distinct
    ``new_state`` are filled with NaN first.  ``kwargs`` go to ``fn`` as they are.  ``ref``:
    (out, state) references (default: the float64 reference of ``x``).  Returns
    ``(judgement, out, new_state)``; the judgement also fails when destination passing changed
    the state or the call changed another input.
    """
    ref_out, ref_state = ref if ref is not None else x.reference(use_qk_l2norm)
    state = None if x.state is None else x.state.clone()
    names = [n for n in x.inputs() if getattr(x, n) is not None]
    before = {n: getattr(x, n).clone() for n in names}
    out = torch.full(tuple(ref_out.shape), float("nan"), dtype=x.v.dtype, device=x.v.device)
    new_state = None
    if dest:
        new_state = torch.full(tuple(ref_state.shape), float("nan"),
                               dtype=torch.float32 if state is None else state.dtype,
                               device=x.v.device)
    args = x.args()
    out, new_state = fn(*args[:3], state, *args[4:], out=out, new_state=new_state,
                        use_qk_l2norm=use_qk_l2norm, **kwargs)
    j = judge(out, new_state, ref_out, ref_state, out_dtype=x.v.dtype,
              state_dtype=new_state.dtype, atol=atol, rtol=rtol, state_tol=state_tol)
    if dest and state is not None and not torch.equal(state, x.state):
        j.reasons.append("state: modified by a destination-passing call")
    j.reasons += [f"{n}: modified by the call" for n in names
                  if not torch.equal(getattr(x, n), before[n])]
    return j, out, new_state

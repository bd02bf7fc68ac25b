"""``gdnzoo check``: every backend on the contest's 54-workload batch mix, PASS/FAIL per backend.

Each backend is called destination-passing, as the contest's evaluator calls a solution: ``out``
and ``new_state`` preallocated (filled with NaN here, so an unwritten element fails), ``state``
only read.  Output and new state are judged against the fp32 reference (the contest's reference
computes in fp32 and returns bf16 output) by the gate (:mod:`gdnzoo.gate`: the contest's
elementwise rule and the relative-error bound), and ``state`` must come back unmodified.
"""
from __future__ import annotations

import sys
import traceback
from collections import defaultdict

import torch


WORKLOAD_SETS = ("contest",)


def add_check_args(p):
    p.add_argument("--workloads", choices=WORKLOAD_SETS, default="contest",
                   help="workload set (contest: 54 workloads, B = 1x10 4x8 8x7 16x7 32x7 48x7 64x8)")
    p.add_argument("--algo", default=None,
                   help="comma-separated backend names, or 'all' (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda if present, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--atol", type=float, default=1e-2)
    p.add_argument("--rtol", type=float, default=1e-2)


def _names(algo):
    from gdnzoo.bench import entries
    return entries.named(None if algo is None or str(algo).strip() == "" else algo,
                         entries.backends, command="gdnzoo check")


def _reference(x, device):
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2], x.v.shape[3]
    from gdnzoo.reference import reference_decode
    ref_out = torch.empty(B, T, HV, V, dtype=x.v.dtype, device=device)
    ref_state = torch.empty_like(x.state)
    reference_decode(*x.args(), ref_out, ref_state, False, compute_dtype=torch.float32)
    return ref_out, ref_state


def check_backend(name, workloads, device, atol=1e-2, rtol=1e-2):
    """Run one backend over ``workloads`` [(i, B, inputs, ref_out, ref_state)], each call judged
    by the gate (gdnzoo.gate: both rules, NaN-prefilled outputs, state untouched).

    Returns ``(status, reason, rows)``: status PASS | FAIL | SKIP, rows one dict per workload run.
    """
    import dataclasses

    import gdnzoo
    from gdnzoo import gate
    from gdnzoo.bench import entries
    from gdnzoo.contract import validate

    ok, why = entries.available(name, device)
    if not ok:
        return "SKIP", why, []
    call = gdnzoo.get(name)
    rows, skipped = [], []
    for i, B, x, ref_out, ref_state in workloads:
        p = dataclasses.replace(validate(*x.args())[0], inplace=False)
        ok, why = entries.can_serve(name, p)
        if not ok:
            skipped.append((B, why))
            continue
        row = dict(workload=i, B=B, ok=False, out_abs=float("nan"), out_rel=float("nan"),
                   state_abs=float("nan"), state_rel=float("nan"), reason="")
        try:
            j, _, _ = gate.gated_call(call, x, dest=True, ref=(ref_out, ref_state), atol=atol,
                                      rtol=rtol)
        except Exception as e:  # a crash is a FAIL of this backend, not of the check
            row["reason"] = f"raised {type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
            rows.append(row)
            continue
        row.update(ok=j.ok, out_abs=j.out.max_abs, out_rel=j.out.max_rel,
                   state_abs=j.state.max_abs, state_rel=j.state.max_rel, reason=j.reason)
        rows.append(row)
    if not rows:
        return "SKIP", skipped[0][1] if skipped else "no workloads", rows
    status = "PASS" if all(r["ok"] for r in rows) else "FAIL"
    reason = next((f"B={r['B']} workload {r['workload']}: {r['reason']}" for r in rows if not r["ok"]), "")
    if skipped:
        reason = (reason + "; " if reason else "") + f"{len(skipped)} workloads skipped: {skipped[0][1]}"
    return status, reason, rows


def _per_batch(rows):
    by = defaultdict(list)
    for r in rows:
        by[r["B"]].append(r)
    for B in sorted(by):
        rs = by[B]
        yield (B, sum(r["ok"] for r in rs), len(rs), max(r["out_abs"] for r in rs),
               max(r["state_abs"] for r in rs))


def cmd_check(args) -> int:
    from gdnzoo.inputs import DTYPES, contest_workloads
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    if getattr(args, "workloads", "contest") != "contest":
        print(f"error: --workloads: unknown set {args.workloads!r} (known: contest)", file=sys.stderr)
        return 2
    try:
        names = _names(getattr(args, "algo", None))
    except SystemExit as e:                 # an unknown name (said on stderr): exit status 2
        return e.code
    atol, rtol = getattr(args, "atol", 1e-2), getattr(args, "rtol", 1e-2)
    sd = getattr(args, "state_dtype", "fp32") or "fp32"
    seed = getattr(args, "seed", 0) or 0
    wl = []
    for i, B, x in contest_workloads(seed=seed, device=device, state_dtype=DTYPES[sd]):
        wl.append((i, B, x) + _reference(x, device))
    print(f"gdnzoo check: {len(wl)} contest workloads (B mix {sorted(set(w[1] for w in wl))}), "
          f"{sd} state, device {device}, seed {seed}, destination-passing, "
          f"gate: fail where abs>{atol:g} and rel>{rtol:g}, or a relative error past gdnzoo.gate's "
          f"bounds, vs fp32 reference")
    results = {}
    for name in names:
        status, reason, rows = check_backend(name, wl, device, atol, rtol)
        results[name] = (status, reason, rows)
        print(f"  {name:<14} {status}" + (f"  ({reason})" if reason else ""), flush=True)
    print(f"\n{'backend':<14} {'B':>4} {'pass':>7} {'max|d| out':>11} {'max|d| state':>13}")
    for name, (status, reason, rows) in results.items():
        for B, n_ok, n, oa, sa in _per_batch(rows):
            print(f"{name:<14} {B:>4} {n_ok:>3}/{n:<3} {oa:>11.2e} {sa:>13.2e}")
    print()
    for name, (status, reason, rows) in results.items():
        n_ok = sum(r["ok"] for r in rows)
        print(f"{status:<5} {name:<14} {n_ok}/{len(rows)} workloads" + (f"  {reason}" if status != "PASS" and reason else ""))
    return 1 if any(s == "FAIL" for s, _, _ in results.values()) else 0

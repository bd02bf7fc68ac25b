"""``gdnzoo check``: every backend on the contest's workloads, PASS/FAIL per backend.

``--op decode`` (default): the 54-workload batch mix of ``gdn_decode_qk4_v8_d128_k_last``.
``--op prefill``: the prefill mix of ``gdn_prefill_qk4_v8_d128_k_last`` (q/k ``[T, 4, 128]``,
v ``[T, 8, 128]`` bf16, an fp32 k-last state per sequence, int64 ``cu_seqlens``, no l2norm,
scale 1/sqrt(128)): :data:`gdnzoo.inputs.CONTEST_PREFILL_MIX`, each workload with its state,
and the first ones again with ``state=None`` (the definition's state is optional).

Each backend is called destination-passing, as the contest's evaluator calls a solution: ``out``
and ``new_state`` preallocated (filled with NaN here, so an unwritten element fails), ``state``
only read.  Output and new state are judged against the fp32 reference (the contest's reference
computes in fp32 and returns bf16 output) by the gate (:mod:`gdnzoo.gate`: the contest's
elementwise rule and the relative-error bound), and ``state`` must come back unmodified.
"""
from __future__ import annotations

import sys
import dataclasses
import importlib
import traceback
from collections import defaultdict

import torch

import gdnzoo
from gdnzoo import gate, operation, registry
from gdnzoo.bench import args as A, entries


WORKLOAD_SETS = ("contest",)
NOTHING_CHECKED = "nothing was checked: every backend named was skipped (above, with the reason)"


def add_check_args(p):
    p.add_argument("--op", choices=("decode", "prefill"), default="decode",
                   help="the operation (default decode)")
    p.add_argument("--workloads", choices=WORKLOAD_SETS, default="contest",
                   help="workload set (contest: decode 54 workloads, B = 1x10 4x8 8x7 16x7 32x7 "
                        "48x7 64x8; prefill the sequence mixes of gdnzoo.inputs."
                        "CONTEST_PREFILL_MIX)")
    p.add_argument("--algo", type=A.names, default=None,
                   help="comma-separated backend names, or 'all' (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda if present, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--atol", type=A.non_negative_float, default=1e-2,
                   help="the elementwise rule's absolute bound (default 0.01)")
    p.add_argument("--rtol", type=A.non_negative_float, default=1e-2,
                   help="the elementwise rule's relative bound (default 0.01)")


def _reference(x, device):
    from gdnzoo.reference import reference_decode
    ref_out = torch.empty(*x.q.shape[:2], *x.v.shape[2:], dtype=x.v.dtype, device=device)
    ref_state = torch.empty_like(x.state)
    reference_decode(*x.args(), ref_out, ref_state, False, compute_dtype=torch.float32)
    return ref_out, ref_state


def check_backend(name, workloads, device, atol=1e-2, rtol=1e-2, op="decode"):
    """Run one backend of ``op`` over ``workloads`` [(i, label, inputs, ref_out, ref_state)],
    each call judged by the gate (gdnzoo.gate: both rules, NaN-prefilled outputs, state
    untouched).  ``label``: the batch size B of a decode workload, the sequence mix of a
    prefill one.

    Returns ``(status, reason, rows)``: status PASS | FAIL | SKIP, rows one dict per workload run.
    """
    ok, why = registry.availability(name, device, op)
    if not ok:
        return entries.skip_status(why), why, []
    call = gdnzoo.get(name, op)
    rows, skipped = [], []
    for i, label, x, ref_out, ref_state in workloads:
        contract = importlib.import_module(f"gdnzoo.{operation.get(x.op).contract}")
        problem = dataclasses.replace(contract.validate(*x.args())[0], inplace=False)
        ok, why = registry.can_serve(name, problem)
        if not ok:
            skipped.append((label, why))
            continue
        row = dict(workload=i, B=label, ok=False, out_abs=float("nan"), out_rel=float("nan"),
                   state_abs=float("nan"), state_rel=float("nan"), reason="")
        try:
            j, _, _ = gate.gated_call(call, x, dest=True, ref=(ref_out, ref_state), atol=atol,
                                      rtol=rtol, state_tol=gate.state_tol_of(name, op))
            row.update(ok=j.ok, out_abs=j.out.max_abs, out_rel=j.out.max_rel,
                       state_abs=j.state.max_abs, state_rel=j.state.max_rel, reason=j.reason)
        except Exception as e:  # a crash is a FAIL of this backend, not of the check
            row["reason"] = f"raised {type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        rows.append(row)
    if not rows:
        return "SKIP", skipped[0][1] if skipped else "no workloads", rows
    status = "PASS" if all(r["ok"] for r in rows) else "FAIL"
    what = "B=" if op == "decode" else "mix "
    reason = next((f"{what}{r['B']} workload {r['workload']}: {r['reason']}" for r in rows
                   if not r["ok"]), "")
    if skipped:
        reason = (reason + "; " if reason else "") + f"{len(skipped)} workloads skipped: {skipped[0][1]}"
    return status, reason, rows


def prefill_workloads(seed, device, no_state=3):
    """The contest prefill mix with its states, then its first ``no_state`` workloads with
    ``state=None``: [(i, label, inputs, fp32 out, fp32 final states)]."""
    from gdnzoo.inputs import CONTEST_PREFILL_MIX, contest_prefill_workloads
    n = len(CONTEST_PREFILL_MIX)
    out = []
    for state in (True, False):
        for i, lengths, x in contest_prefill_workloads(seed=seed, device=device, state=state):
            if not state and i >= no_state:
                break
            label = (f"{len(lengths)}x{lengths[0]}" if len(set(lengths)) == 1 else
                     f"{len(lengths)} ragged") + ("" if state else ", no state")
            out.append((i + (0 if state else n), label, x)
                       + tuple(x.reference(compute_dtype=torch.float32)))
    return out


def cmd_check(args) -> int:
    from gdnzoo.inputs import DTYPES, contest_workloads
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    op = args.op
    note = A.drop_env_pdl("gdnzoo check")
    if note:
        print(f"note: {note}")
    try:
        names = entries.named(args.algo, lambda: entries.backends(op), op, command="gdnzoo check")
    except SystemExit as e:                 # an unknown name (said on stderr): exit status 2
        return e.code
    atol, rtol, sd, seed = args.atol, args.rtol, args.state_dtype, args.seed
    if op == "prefill" and sd != "fp32":
        print("error: --state-dtype: the contest's prefill state is fp32", file=sys.stderr)
        return 2
    # the backends that cannot run here are said first: none left, no reference is computed
    here = {n: registry.availability(n, device, op) for n in names}
    if not any(ok for ok, _ in here.values()):
        for n, (_, why) in here.items():
            print(f"{entries.skip_status(why):<5} {n:<14} 0/0 workloads  {why}")
        print(NOTHING_CHECKED, file=sys.stderr)
        return 1
    if op == "prefill":
        wl = prefill_workloads(seed, device)
        head = (f"gdnzoo check --op prefill: {len(wl)} contest prefill workloads (H=4, HV=8, "
                f"K=V=128, bf16 q/k/v, int64 cu_seqlens, no l2norm; "
                f"{sum(w[2].q.shape[0] for w in wl)} tokens in all; the first ones also with "
                f"state=None), fp32 state")
        key, w, ref = "mix", 18, "the fp32 per-token reference"
    else:
        wl = [(i, B, x) + _reference(x, device)
              for i, B, x in contest_workloads(seed=seed, device=device, state_dtype=DTYPES[sd])]
        head = (f"gdnzoo check: {len(wl)} contest workloads (B mix "
                f"{sorted(set(w[1] for w in wl))}), {sd} state")
        key, w, ref = "B", 4, "fp32 reference"
    print(f"{head}, device {device}, seed {seed}, destination-passing, gate: fail where "
          f"abs>{atol:g} and rel>{rtol:g}, or a relative error past gdnzoo.gate's bounds, vs "
          f"{ref}", flush=True)
    results = {}
    for name in names:
        results[name] = status, reason, rows = check_backend(name, wl, device, atol, rtol, op)
        print(f"  {name:<14} {status}" + (f"  ({reason})" if reason else ""), flush=True)
    print(f"\n{'backend':<14} {key:>{w}} {'pass':>7} {'max|d| out':>11} {'max|d| state':>13}")
    for name, (status, reason, rows) in results.items():
        by = defaultdict(list)
        for r in rows:
            by[r["B"]].append(r)
        for label in (sorted(by) if all(isinstance(b, int) for b in by) else by):
            rs = by[label]
            print(f"{name:<14} {label!s:>{w}} {sum(r['ok'] for r in rs):>3}/{len(rs):<3} "
                  f"{max(r['out_abs'] for r in rs):>11.2e} "
                  f"{max(r['state_abs'] for r in rs):>13.2e}")
    print()
    for name, (status, reason, rows) in results.items():
        print(f"{status:<5} {name:<14} {sum(r['ok'] for r in rows)}/{len(rows)} workloads"
              + (f"  {reason}" if status != "PASS" and reason else ""))
    if all(not rows for _, _, rows in results.values()):
        print(NOTHING_CHECKED, file=sys.stderr)
        return 1
    return 1 if any(s in ("FAIL", "ERROR") for s, _, _ in results.values()) else 0

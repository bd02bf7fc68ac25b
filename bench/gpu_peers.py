"""Correctness of the two peer backends on a GPU (no timing here; `gdnzoo bench` times).

    python -m gdnzoo.bench.gpu_peers          # results under $OUT (default /tmp/out)

Checks fi-baseline and fla-upstream (both its paths: FLA's Triton kernel launched on our buffers,
and FLA's public function + copies; ``GDNZOO_FLA_PATH``) against the float64 reference:
contest geometry (H, HV) = (4, 8) with B in {1, 4, 16, 64, 512}, fp32 and bf16 state,
in-place and destination-passing, l2norm off and on; then (16, 32) and (16, 64) at B in {1, 64}
(both state dtypes and l2norm settings, both modes); then, informational, fi-baseline at T = 2, 4
called directly (the registry caps it at T = 1 until this passes).  Outputs are NaN-prefilled;
PASS means SPEC section 2's rule on output and new state, and ``state`` untouched when
destination-passing.  Prints fi-baseline's first-call (JIT compile) times.  A time guard skips
remaining cases after ``GDNZOO_PEERS_BUDGET_S`` seconds (default 170).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from gdnzoo.compare import relative_error
from gdnzoo.reference import reference_outputs

CONTEST = [((4, 8), B) for B in (1, 4, 16, 64, 512)]
OTHER = [((16, 32), B) for B in (1, 64)] + [((16, 64), B) for B in (1, 64)]


def one_case(call, x, l2, dps, ref=None):
    """Run ``call(args, out, new_state, l2)`` once on NaN-prefilled outputs; return a result row."""
    import torch

    from gdnzoo.compare import compare
    ro, rs = ref if ref is not None else reference_outputs(x, l2)
    state = x.state.clone()
    before = state.clone()
    out = torch.full(ro.shape, float("nan"), dtype=x.v.dtype, device=x.q.device)
    ns = torch.full_like(state, float("nan")) if dps else state
    args = (x.q, x.k, x.v, state) + x.args()[4:]
    call(args, out, ns, l2)
    if x.q.is_cuda:
        torch.cuda.synchronize()
    vo, vs = compare(out, ro), compare(ns, rs)
    untouched = (not dps) or torch.equal(state, before)
    why = "; ".join([f"output: {vo.reason}"] * (not vo.ok) + [f"new_state: {vs.reason}"] * (not vs.ok)
                    + ["state modified in destination-passing mode"] * (not untouched))
    return dict(ok=vo.ok and vs.ok and untouched, out_abs=vo.max_abs, state_abs=vs.max_abs,
                out_relfro=relative_error(out, ro), state_relfro=relative_error(ns, rs), reason=why)


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or "/tmp/out")
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    if not torch.cuda.is_available():
        print("no CUDA device; nothing to check")
        return 0
    import gdnzoo
    from gdnzoo import registry
    from gdnzoo.contract import validate
    from gdnzoo.inputs import make_inputs
    budget = float(os.environ.get("GDNZOO_PEERS_BUDGET_S", "170"))
    t_start = time.time()
    avail = {b.name: b for b in gdnzoo.list_backends()}
    rows = []

    def via_registry(name, path=None):
        fn = gdnzoo.get(name)

        def call(args, out, ns, l2):
            if path:
                os.environ["GDNZOO_FLA_PATH"] = path
            fn(*args, out=out, new_state=ns, use_qk_l2norm=l2)
        return call

    def fi_direct(args, out, ns, l2):
        q, k, v, state, A_log, a, dt_bias, b, scale = args
        p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=ns,
                        use_qk_l2norm=l2)
        mod = registry.backend_module("fi-baseline")
        ok, why = mod.supports(p)
        if not ok:
            raise ValueError(why)
        mod.run(q, k, v, state, A_log, a, dt_bias, b, s, out, ns, l2)

    subjects = [("fi-baseline", "fi-baseline", via_registry("fi-baseline")),
                ("fla-upstream", "fla-upstream[kernel]", via_registry("fla-upstream", "kernel")),
                ("fla-upstream", "fla-upstream[api]", via_registry("fla-upstream", "api"))]
    live = []
    for name, label, call in subjects:
        if name not in avail or not avail[name].available:
            why = avail[name].reason if name in avail else "not registered"
            rows.append(dict(backend=label, case="all", status="SKIP", reason=why))
            print(f"SKIP {label}: {why}", flush=True)
        else:
            live.append((name, label, call))
    for (H, HV), B in CONTEST + OTHER:
        for sd in ("fp32", "bf16"):
            x = make_inputs(B=B, T=1, H=H, HV=HV, state_dtype=sd, device="cuda", seed=B * 7 + H)
            for l2 in (False, True):
                ref = None
                for name, label, call in live:
                    for dps in (False, True):
                        case = f"H={H} HV={HV} B={B} T=1 {sd} l2={int(l2)} {'dps' if dps else 'inplace'}"
                        row = dict(backend=label, case=case, H=H, HV=HV, B=B, T=1, state=sd,
                                   l2norm=l2, dps=dps)
                        if time.time() - t_start > budget:
                            rows.append(dict(row, status="SKIP", reason="time budget spent"))
                            continue
                        p, _ = validate(*x.args(), use_qk_l2norm=l2)
                        ok, why = registry.can_serve(name, p)
                        if not ok:
                            rows.append(dict(row, status="SKIP", reason=why))
                            continue
                        if ref is None:
                            ref = reference_outputs(x, l2)
                        try:
                            r = one_case(call, x, l2, dps, ref)
                            rows.append(dict(row, status="PASS" if r.pop("ok") else "FAIL", **r))
                        except Exception as e:
                            traceback.print_exc()
                            rows.append(dict(row, status="FAIL", reason=f"raised {type(e).__name__}: {e}"))
                        if rows[-1]["status"] != "PASS":
                            print(f"{rows[-1]['status']:<4} {label:<21} {case}  {rows[-1].get('reason', '')}", flush=True)
            del x, ref
        print(f"done H={H} HV={HV} B={B} at {time.time() - t_start:.0f} s", flush=True)

    if avail.get("fi-baseline") and avail["fi-baseline"].available:
        for T in (2, 4):
            for sd in ("fp32", "bf16"):
                case = f"H=4 HV=8 B=4 T={T} {sd} l2=0 inplace (direct, past the registry's max_T)"
                row = dict(backend="fi-baseline", case=case, H=4, HV=8, B=4, T=T, state=sd,
                           l2norm=False, dps=False, informational=True)
                if time.time() - t_start > budget:
                    rows.append(dict(row, status="SKIP", reason="time budget spent"))
                    continue
                x = make_inputs(B=4, T=T, state_dtype=sd, device="cuda", seed=T)
                try:
                    r = one_case(fi_direct, x, False, False)
                    rows.append(dict(row, status="PASS" if r.pop("ok") else "FAIL", **r))
                except Exception as e:
                    traceback.print_exc()
                    rows.append(dict(row, status="FAIL", reason=f"raised {type(e).__name__}: {e}"))
                print(f"{rows[-1]['status']:<4} fi-baseline (T>1)     {case}  {rows[-1].get('reason', '')}", flush=True)

    compile_s = {}
    try:
        compile_s = dict(registry.backend_module("fi-baseline").compile_seconds)
    except Exception as e:
        compile_s = {"error": f"{type(e).__name__}: {e}"}
    (out_dir / "peers_check.json").write_text(json.dumps(
        dict(rows=rows, fi_compile_seconds=compile_s, gpu=torch.cuda.get_device_name(),
             torch=torch.__version__, seconds=time.time() - t_start), indent=2, default=str))

    print(f"\n== peers correctness on {torch.cuda.get_device_name()} ({time.time() - t_start:.0f} s) ==")
    summary = {}
    for r in rows:
        key = (r["backend"], r.get("state", "-"), "T>1" if r.get("informational") else "T=1")
        s = summary.setdefault(key, {"PASS": 0, "FAIL": 0, "SKIP": 0})
        s[r["status"]] += 1
    print(f"{'backend':<22} {'state':<5} {'T':<4} {'PASS':>5} {'FAIL':>5} {'SKIP':>5}")
    for (b, sd, t), s in summary.items():
        print(f"{b:<22} {sd:<5} {t:<4} {s['PASS']:>5} {s['FAIL']:>5} {s['SKIP']:>5}")
    fails = [r for r in rows if r["status"] == "FAIL"]
    for r in fails[:12]:
        print(f"FAIL {r['backend']} {r['case']}: {r.get('reason', '')[:160]}")
    skips = sorted({(r["backend"], r.get("reason", "")) for r in rows if r["status"] == "SKIP"})
    for b, why in skips[:8]:
        print(f"SKIP {b}: {why[:150]}")
    if isinstance(compile_s, dict) and compile_s:
        print("fi-baseline first call per variant (cold JIT compile or disk-cache load), s:")
        for k, v in list(compile_s.items())[:10]:
            print(f"  {v:7.2f}  {k}" if isinstance(v, float) else f"  {k}: {v}")
    print(f"results: {out_dir / 'peers_check.json'}")
    return 1 if any(r["status"] == "FAIL" and not r.get("informational") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

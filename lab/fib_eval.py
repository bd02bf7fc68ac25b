"""Run packed gdnzoo Solutions through flashinfer-bench's own Benchmark (GPU script).

    python3 -m lab.fib_eval        # results under $OUT (default /tmp/out)

Builds a tiny local trace set: the definition ``gdn_decode_qk4_v8_d128_k_last`` (axes, inputs and
outputs as the contest publishes them; the reference ``run`` written here from gdnzoo.reference),
and workloads for B in {1, 4, 16, 64}, twice each: ``random`` inputs (flashinfer-bench draws
them with plain ``torch.randn``) and ``seeded`` inputs from ``gdnzoo.inputs.make_inputs`` stored as
safetensors (realistic magnitudes, like the contest's captured tensors).  Packs the backends in
``GDNZOO_FIB_ALGOS`` (default pt-reference, fla-recurrent, cuda-v4; those available), runs
``flashinfer_bench.bench.Benchmark(trace_set, BenchmarkConfig(...)).run_all()`` and prints each
solution's status and latency per workload; writes ``$OUT/fib_eval.{log,json}``.

Caveat printed with the table: flashinfer-bench 0.1.2 times with CUDA events around each call
after a ``torch.cuda.synchronize()`` inside the loop and clones every argument after flushing L2
(its pre-CUPTI ``do_bench``; issue #195), so its latencies include launch overhead and read a
freshly written (L2-warm) state: they are not comparable with ``gdnzoo bench``.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from pathlib import Path

from gdnzoo.bench.fib_definition import DEF_NAME, definition_dict
from lab import harness

BATCHES = (1, 4, 16, 64)
DEFAULT_ALGOS = ("pt-reference", "fla-recurrent", "cuda-v4")


def build_trace_set(root: Path, algos, seed=0):
    """Write definition, workloads and packed solutions under ``root``; return (packed, skipped)."""
    import safetensors.torch as st

    import gdnzoo
    from gdnzoo.bench.pack import build_solution
    from gdnzoo.inputs import make_inputs

    (root / "definitions" / "gdn").mkdir(parents=True, exist_ok=True)
    (root / "definitions" / "gdn" / f"{DEF_NAME}.json").write_text(json.dumps(definition_dict(), indent=2))
    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")
    lines = []
    blob = root / "blob" / "workloads" / "gdn" / DEF_NAME
    blob.mkdir(parents=True, exist_ok=True)
    for B in BATCHES:
        uid = f"random-b{B}"
        inputs = {n: dict(type="random") for n in names}
        inputs["scale"] = dict(type="scalar", value=0.08838834764831843)
        lines.append(dict(definition=DEF_NAME, workload=dict(axes=dict(batch_size=B), inputs=inputs, uuid=uid)))
        uid = f"seeded-b{B}"
        x = make_inputs(B=B, seed=seed * 100 + B)
        path = blob / f"{DEF_NAME}_{uid}.safetensors"
        st.save_file({n: getattr(x, n).contiguous() for n in names}, str(path))
        rel = str(path.relative_to(root))
        inputs = {n: dict(type="safetensors", path=rel, tensor_key=n) for n in names}
        inputs["scale"] = dict(type="scalar", value=float(x.scale))
        lines.append(dict(definition=DEF_NAME, workload=dict(axes=dict(batch_size=B), inputs=inputs, uuid=uid)))
    (root / "workloads" / "gdn").mkdir(parents=True, exist_ok=True)
    (root / "workloads" / "gdn" / f"{DEF_NAME}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))

    avail = {b.name: b for b in gdnzoo.list_backends()}
    packed, skipped = {}, {}
    (root / "solutions" / "gdn").mkdir(parents=True, exist_ok=True)
    for a in algos:
        if a not in avail or not avail[a].available:
            skipped[a] = avail[a].reason if a in avail else "unknown backend"
            continue
        try:
            sol = build_solution(a)
        except Exception as e:
            skipped[a] = f"pack failed: {type(e).__name__}: {e}"
            continue
        (root / "solutions" / "gdn" / f"{sol['name']}.json").write_text(json.dumps(sol, indent=2))
        packed[sol["name"]] = a
    return packed, skipped


def main(lab):
    out = lab.out
    try:
        import flashinfer_bench  # noqa: F401
        from flashinfer_bench.bench import Benchmark, BenchmarkConfig
        from flashinfer_bench.data import TraceSet
    except Exception as e:
        lab.log(f"flashinfer-bench is not importable here ({type(e).__name__}: {e}); nothing to do.")
        return
    import torch
    if not torch.cuda.is_available():
        lab.log("no CUDA device: flashinfer-bench's runner needs one; nothing to do.")
        return
    algos = [a.strip() for a in os.environ.get("GDNZOO_FIB_ALGOS", ",".join(DEFAULT_ALGOS)).split(",") if a.strip()]
    root = Path(tempfile.mkdtemp(prefix="fib_traceset_", dir=out))
    os.environ.setdefault("FIB_CACHE_PATH", str(Path(tempfile.gettempdir()) / "gdnzoo_fib_cache"))
    t0 = time.time()
    packed, skipped = build_trace_set(root, algos)
    for a, why in skipped.items():
        lab.log(f"SKIP {a}: {why}")
    if not packed:
        lab.log("no solution could be packed; nothing to run")
        return
    rows, err = [], None
    try:
        ts = TraceSet.from_path(str(root))
        cfg = BenchmarkConfig(warmup_runs=10, iterations=50, num_trials=3, timeout_seconds=120,
                              log_dir=str(Path(tempfile.gettempdir()) / "gdnzoo_fib_logs"))
        bench = Benchmark(ts, cfg)
        try:
            res = bench.run_all(dump_traces=True)
        finally:
            bench.close()
        for tr in res.traces.get(DEF_NAME, []):
            ev = tr.evaluation
            perf, corr = ev.performance, ev.correctness
            rows.append(dict(algo=packed.get(tr.solution, tr.solution), solution=tr.solution,
                             workload=tr.workload.uuid, B=tr.workload.axes.get("batch_size"),
                             status=ev.status.value,
                             latency_us=perf.latency_ms * 1e3 if perf else None,
                             ref_latency_us=perf.reference_latency_ms * 1e3 if perf else None,
                             speedup_vs_ref=perf.speedup_factor if perf else None,
                             max_abs=corr.max_absolute_error if corr else None,
                             max_rel=corr.max_relative_error if corr else None,
                             hardware=ev.environment.hardware, libs=ev.environment.libs,
                             log_tail=(ev.log or "")[-2000:] if ev.status.value != "PASSED" else ""))
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    lab.results.update(definition=DEF_NAME, packed=packed, skipped=skipped, error=err, rows=rows,
                       trace_set=str(root), seconds=time.time() - t0)
    rows.sort(key=lambda r: (r["algo"], r["workload"].split("-")[0], r["B"] or 0))
    lab.log(f"\nflashinfer-bench {getattr(flashinfer_bench, '__version__', '?')} on "
            f"{torch.cuda.get_device_name()}: {DEF_NAME}, {len(rows)} evaluations in "
            f"{time.time() - t0:.0f} s")
    lab.log(f"{'algo':<14} {'workload':<12} {'status':<20} {'latency us':>11} {'ref us':>9} "
            f"{'max abs':>9}")
    for r in rows:
        lat = f"{r['latency_us']:.1f}" if r["latency_us"] is not None else "-"
        ref = f"{r['ref_latency_us']:.1f}" if r["ref_latency_us"] is not None else "-"
        ma = f"{r['max_abs']:.1e}" if r["max_abs"] is not None else "-"
        lab.log(f"{r['algo']:<14} {r['workload']:<12} {r['status']:<20} {lat:>11} {ref:>9} {ma:>9}")
    lab.log("note: flashinfer-bench 0.1.2 times with CUDA events, a synchronize() before every "
            "call and arguments cloned after the L2 flush (pre-CUPTI do_bench, issue #195): "
            "latencies include launch overhead and an L2-warm state; compare backends only within "
            "this table.")
    if err:
        lab.log(f"ERROR: {err}")
        lab.failed.append("flashinfer-bench")


if __name__ == "__main__":
    harness.run("fib_eval", main)

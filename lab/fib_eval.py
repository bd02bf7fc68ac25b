"""Run packed gdnzoo Solutions through flashinfer-bench's own Benchmark (GPU script).

    python3 -m lab.fib_eval                 # decode; results under $OUT (default /tmp/out)
    python3 -m lab.fib_eval --op prefill    # prefill; $OUT/fib_eval_prefill.{log,json}

Builds a tiny local trace set for one operation's contest definition (axes, inputs and outputs
as the contest publishes them; the reference ``run`` written here, :mod:`gdnzoo.bench.
fib_definition`), packs the backends in ``GDNZOO_FIB_ALGOS`` (default: for decode pt-reference,
fla-recurrent, cuda-v4; for prefill pt-reference, triton-chunk, fla-upstream, fi-baseline; those
available), runs ``flashinfer_bench.bench.Benchmark(trace_set, BenchmarkConfig(...)).run_all()``
and prints each solution's status and latency per workload; writes ``$OUT/fib_eval.{log,json}``
(prefill: ``fib_eval_prefill.*``).

Decode (``gdn_decode_qk4_v8_d128_k_last``): workloads for B in {1, 4, 16, 64}, twice each:
``random`` inputs (flashinfer-bench draws them with plain ``torch.randn``) and ``seeded`` inputs
from ``gdnzoo.inputs.make_inputs`` stored as safetensors (realistic magnitudes, like the
contest's captured tensors); warmup 10, 50 iterations, 3 trials (the contest's decode settings).

Prefill (``gdn_prefill_qk4_v8_d128_k_last``): one workload per sequence mix of
``gdnzoo.inputs.contest_prefill_workloads`` (one 8192-token prompt ... a ragged mix with a
zero-length sequence), every input from safetensors: ``random`` would draw cu_seqlens from
[-1024, 1024) and unit-variance k, whose delta rule diverges over long sequences.  The state is
always given (flashinfer-bench 0.1.2 generates every input; it cannot pass state=None); warmup
1, 5 iterations, 3 trials (the contest's prefill settings).  The safetensors go under the
system temp directory, not $OUT (tens of MB).

Caveat printed with the table: flashinfer-bench 0.1.2 times with CUDA events around each call
after a ``torch.cuda.synchronize()`` inside the loop and clones every argument after flushing L2
(its pre-CUPTI ``do_bench``; issue #195), so its latencies include launch overhead and read a
freshly written (L2-warm) state: they are not comparable with ``gdnzoo bench``.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
from pathlib import Path

from gdnzoo.bench.fib_definition import DEFINITIONS
from lab import harness

BATCHES = (1, 4, 16, 64)
DEFAULT_ALGOS = {"decode": ("pt-reference", "fla-recurrent", "cuda-v4"),
                 "prefill": ("pt-reference", "triton-chunk", "fla-upstream", "fi-baseline")}
# flashinfer-bench's BenchmarkConfig per operation (the contest's settings)
SETTINGS = {"decode": dict(warmup_runs=10, iterations=50, num_trials=3, timeout_seconds=120),
            "prefill": dict(warmup_runs=1, iterations=5, num_trials=3, timeout_seconds=600)}
NAMES = {"decode": ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"),
         "prefill": ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens")}


def _stored(root: Path, path: Path, x, names) -> dict:
    """The workload inputs of ``x``'s tensors ``names``, saved to ``path`` (under ``root``),
    and its scale."""
    import safetensors.torch as st
    st.save_file({n: getattr(x, n).contiguous() for n in names}, str(path))
    rel = str(path.relative_to(root))
    inputs = {n: dict(type="safetensors", path=rel, tensor_key=n) for n in names}
    inputs["scale"] = dict(type="scalar", value=float(x.scale))
    return inputs


def _decode_workloads(root: Path, blob: Path, def_name: str, seed: int):
    """(axes, inputs, uuid) of the decode workloads; writes their safetensors under ``blob``."""
    from gdnzoo.inputs import make_inputs
    names = NAMES["decode"]
    for B in BATCHES:
        inputs = {n: dict(type="random") for n in names}
        inputs["scale"] = dict(type="scalar", value=0.08838834764831843)
        yield dict(batch_size=B), inputs, f"random-b{B}"
        uid = f"seeded-b{B}"
        x = make_inputs(B=B, seed=seed * 100 + B)
        inputs = _stored(root, blob / f"{def_name}_{uid}.safetensors", x, names)
        yield dict(batch_size=B), inputs, uid


def _prefill_workloads(root: Path, blob: Path, def_name: str, seed: int):
    """(axes, inputs, uuid) of the prefill workloads; writes their safetensors under ``blob``."""
    from gdnzoo.inputs import contest_prefill_workloads
    names = NAMES["prefill"]
    for i, lengths, x in contest_prefill_workloads(seed=seed):
        N, T = len(lengths), int(sum(lengths))
        uid = f"seeded-n{N}-t{T}-{i}"
        inputs = _stored(root, blob / f"{def_name}_{uid}.safetensors", x, names)
        yield dict(total_seq_len=T, num_seqs=N, len_cu_seqlens=N + 1), inputs, uid


def build_trace_set(root: Path, algos, seed=0, op="decode"):
    """Write ``op``'s definition, workloads and packed solutions under ``root``; return
    (packed, skipped)."""
    import gdnzoo
    from gdnzoo.bench.pack import build_solution

    def_name, definition = DEFINITIONS[op]
    (root / "definitions" / "gdn").mkdir(parents=True, exist_ok=True)
    (root / "definitions" / "gdn" / f"{def_name}.json").write_text(json.dumps(definition(), indent=2))
    blob = root / "blob" / "workloads" / "gdn" / def_name
    blob.mkdir(parents=True, exist_ok=True)
    make = _decode_workloads if op == "decode" else _prefill_workloads
    lines = [dict(definition=def_name, workload=dict(axes=axes, inputs=inputs, uuid=uid))
             for axes, inputs, uid in make(root, blob, def_name, seed)]
    (root / "workloads" / "gdn").mkdir(parents=True, exist_ok=True)
    (root / "workloads" / "gdn" / f"{def_name}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))

    avail = {b.name: b for b in gdnzoo.list_backends(op=op)}
    packed, skipped = {}, {}
    (root / "solutions" / "gdn").mkdir(parents=True, exist_ok=True)
    for a in algos:
        if a not in avail or not avail[a].available:
            skipped[a] = avail[a].reason if a in avail else f"unknown {op} backend"
            continue
        try:
            sol = build_solution(a, op=op)
        except Exception as e:
            skipped[a] = f"pack failed: {type(e).__name__}: {e}"
            continue
        (root / "solutions" / "gdn" / f"{sol['name']}.json").write_text(json.dumps(sol, indent=2))
        packed[sol["name"]] = a
    return packed, skipped


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=sorted(DEFINITIONS), default="decode",
                    help="which contest definition to evaluate (default decode)")
    return ap.parse_args(argv)


def main(lab, op="decode"):
    out = lab.out
    def_name = DEFINITIONS[op][0]
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
    chosen = os.environ.get("GDNZOO_FIB_ALGOS", ",".join(DEFAULT_ALGOS[op]))
    algos = [a.strip() for a in chosen.split(",") if a.strip()]
    root = Path(tempfile.mkdtemp(prefix=f"fib_traceset_{op}_",
                                 dir=out if op == "decode" else None))
    os.environ.setdefault("FIB_CACHE_PATH", str(Path(tempfile.gettempdir()) / "gdnzoo_fib_cache"))
    t0 = time.time()
    packed, skipped = build_trace_set(root, algos, op=op)
    for a, why in skipped.items():
        lab.log(f"SKIP {a}: {why}")
    if not packed:
        lab.log("no solution could be packed; nothing to run")
        return
    rows, err = [], None
    try:
        ts = TraceSet.from_path(str(root))
        cfg = BenchmarkConfig(**SETTINGS[op],
                              log_dir=str(Path(tempfile.gettempdir()) / "gdnzoo_fib_logs"))
        bench = Benchmark(ts, cfg)
        try:
            res = bench.run_all(dump_traces=True)
        finally:
            bench.close()
        for tr in res.traces.get(def_name, []):
            ev = tr.evaluation
            perf, corr = ev.performance, ev.correctness
            axes = tr.workload.axes
            rows.append(dict(algo=packed.get(tr.solution, tr.solution), solution=tr.solution,
                             workload=tr.workload.uuid, B=axes.get("batch_size"),
                             N=axes.get("num_seqs"), T=axes.get("total_seq_len"),
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
    lab.results.update(definition=def_name, packed=packed, skipped=skipped, error=err, rows=rows,
                       trace_set=str(root), seconds=time.time() - t0)
    rows.sort(key=lambda r: (r["algo"], r["workload"].split("-")[0], r["B"] or 0, r["T"] or 0,
                             r["N"] or 0))
    lab.log(f"\nflashinfer-bench {getattr(flashinfer_bench, '__version__', '?')} on "
            f"{torch.cuda.get_device_name()}: {def_name}, {len(rows)} evaluations in "
            f"{time.time() - t0:.0f} s")
    w = 12 if op == "decode" else 22
    lab.log(f"{'algo':<14} {'workload':<{w}} {'status':<20} {'latency us':>11} {'ref us':>11} "
            f"{'max abs':>9}")
    for r in rows:
        lat = f"{r['latency_us']:.1f}" if r["latency_us"] is not None else "-"
        ref = f"{r['ref_latency_us']:.1f}" if r["ref_latency_us"] is not None else "-"
        ma = f"{r['max_abs']:.1e}" if r["max_abs"] is not None else "-"
        lab.log(f"{r['algo']:<14} {r['workload']:<{w}} {r['status']:<20} {lat:>11} {ref:>11} {ma:>9}")
    lab.log("note: flashinfer-bench 0.1.2 times with CUDA events, a synchronize() before every "
            "call and arguments cloned after the L2 flush (pre-CUPTI do_bench, issue #195): "
            "latencies include launch overhead and an L2-warm state; compare backends only within "
            "this table.")
    if err:
        lab.log(f"ERROR: {err}")
        lab.failed.append("flashinfer-bench")


if __name__ == "__main__":
    _op = parse_args().op
    harness.run("fib_eval" if _op == "decode" else f"fib_eval_{_op}", lambda lab: main(lab, _op))

"""NVBench (the ``cuda-bench`` package) as a second opinion on kernel time.

Runs in a subprocess (``python -m gdnzoo.bench.nvbench_xcheck SPEC OUT``) because NVBench's
registry of benchmarks is process-global and its runner owns the process while it measures.
Each cell the sweep timed correctly becomes one NVBench benchmark: the raw launcher on NVBench's
stream, rotating over the same state sets; NVBench flushes L2 before each cold sample.  The
reported figure is NVBench's cold GPU time (median when present, else mean).
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from gdnzoo.bench import clocks, entries
from gdnzoo.bench.pipeline import Cell, get_mode
from gdnzoo.contract import validate
from gdnzoo.inputs import make_inputs


def _name(c):
    return f"{c['backend']}|B={c['B']}|{c['state_dtype']}|{c['mode']}"


def cross_check(rows, args, timeout_per_cell=4.0):
    """Extra rows (clock 'nvbench') for every cell that passed on the kernel clock, and a note."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bench") is None:
        return [], "nvbench cross-check skipped: cuda-bench (NVBench Python) not installed"
    if not torch.cuda.is_available():
        return [], "nvbench cross-check skipped: no CUDA device"
    cells = {_name(r["cell"].__dict__): r["cell"] for r in rows if r["clock"] == "kernel"
             and r["status"] == "PASS" and r["cell"].backend != "floor" and r.get("samples")}
    if not cells:
        return [], "nvbench cross-check: no correct kernel-clock cells to check"
    with tempfile.TemporaryDirectory() as d:
        spec, out = Path(d) / "spec.json", Path(d) / "nvbench.json"
        spec.write_text(json.dumps(dict(seed=args.seed, cells=[c.__dict__ for c in cells.values()])))
        try:
            p = subprocess.run([sys.executable, "-m", "gdnzoo.bench.nvbench_xcheck", str(spec), str(out)],
                               capture_output=True, text=True,
                               timeout=60 + timeout_per_cell * 3 * len(cells))
        except subprocess.TimeoutExpired:
            return [], "nvbench cross-check: timed out"
        if not out.is_file():
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            return [], f"nvbench cross-check failed (rc {p.returncode}): {' | '.join(tail)}"
        res = parse(json.loads(out.read_text()))
    extra = [dict(cell=c, clock="nvbench", status="PASS", note="n/a (no NVBench result)")
             if (v := res.get(name)) is None else
             dict(cell=c, clock="nvbench", status="PASS", note=v["stat"], median_us=v["us"],
                  p20_us=float("nan"), p80_us=float("nan"), n=v["n"],
                  method="NVBench cold GPU time (L2 flushed per sample)")
             for name, c in cells.items()]
    return extra, f"nvbench cross-check: {len(res)}/{len(cells)} cells measured"


def parse(doc):
    """{benchmark name: {us, n, stat}} from an NVBench JSON file."""
    out = {}
    for b in doc.get("benchmarks", []):
        for st in b.get("states", []):
            if st.get("is_skipped"):
                continue
            summ = {s["tag"]: dat.get("value") for s in st.get("summaries") or []
                    for dat in s.get("data", []) if dat.get("name") == "value"}
            for tag, stat in (("nv/cold/time/gpu/median", "median"), ("nv/cold/time/gpu/mean", "mean")):
                if summ.get(tag) is not None:
                    us = float(summ[tag]) * 1e6
                    if math.isfinite(us):
                        out[b["name"]] = dict(us=us, n=int(float(summ.get("nv/cold/sample_size", 0) or 0)),
                                              stat=f"NVBench cold {stat}")
                    break
    return out


def _bench(c, seed):
    cell = Cell(**dict(c, keys=tuple(map(tuple, c.get("keys", ())))))

    def fn(state):
        inp = make_inputs(B=cell.B, T=cell.T, H=cell.H, HV=cell.HV, K=cell.K, V=cell.V,
                          state_dtype=cell.state_dtype, device="cuda", seed=seed)
        out = torch.empty(cell.B, cell.T, cell.HV, cell.V, dtype=inp.v.dtype, device="cuda")
        validate(*inp.args(), out=out, use_qk_l2norm=cell.l2norm)
        rot = clocks.Rotation(inp.state, dest=cell.mode != "inplace")
        raw = entries.raw(cell.backend)
        torch.cuda.synchronize()
        total = get_mode("dense").bytes_moved(cell)
        state.add_global_memory_reads(total // 2)
        state.add_global_memory_writes(total - total // 2)

        def launch(lc):
            stream = torch.cuda.ExternalStream(lc.get_stream().addressof())
            st, ns = rot.next()
            with torch.cuda.stream(stream):
                entries.launch(raw, inp, st, out, ns, cell.l2norm)
        state.exec(launch)
    return fn


def run_benchmarks(argv):
    import cuda.bench as nb
    spec = json.loads(Path(argv[1]).read_text())
    for c in spec["cells"]:
        nb.register(_bench(c, spec.get("seed", 0))).set_name(_name(c))
    nb.run_all_benchmarks([argv[0], "--json", argv[2], "--no-batch", "--min-samples", "50",
                           "--max-noise", "2", "--timeout", "3", "--quiet"])


if __name__ == "__main__":
    run_benchmarks(sys.argv)

"""cuda-chunk's prep kernel as committed at a git revision, other copies (``--extra``), the
working tree's with named edits (``--variants``; ``--edits FILE`` adds its ``EDITS``) and the
working tree's, side by side: per cell, whether each writes the first's workspace (bit for bit,
else the largest difference over the largest element), and each kernel's median time alone
(CUPTI records, the variants in turn over four rounds).  Dense, raw gates, K = V = 128,
"bf16x3" (or ``--precision bf16``).  The edits here:

    bf16mma  with "bf16" (one bf16 part stored), the block substitution's and M = P T's products
             of bf16 parts only (one mma instead of three, no lo parts)

``--errors``: each variant's whole call (cuda-chunk-bf16 with ``--precision bf16``, else
cuda-chunk) against float64 instead of the timing: relative RMS of outputs and final states.

On a GPU with cupy, from the repository root:

    python -m lab.prep_ab --rev HEAD --cells 4/8:1x8192,16/32:8x1024
    python -m lab.prep_ab --rev '' --variants bf16mma --precision bf16 --cells 16/32:8x1024
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _cuda_chunk_prep as prep      # noqa: E402
from gdnzoo.backends import _triton_launch as tlaunch     # noqa: E402
from gdnzoo.backends import triton_chunk as tc            # noqa: E402
from gdnzoo.bench.clocks import kernel_times              # noqa: E402
from gdnzoo.inputs import make_prefill_inputs             # noqa: E402
from lab.source_edits import edited, load                 # noqa: E402

EDITS = {
    "bf16mma": [(
        "    mma(d, a.lo, bh[0], bh[1]);\n    mma(d, a.hi, bl[0], bl[1]);\n",
        "    if (!GDN_STORE3) {\n        mma(d, a.hi, bh[0], bh[1]);\n        return;\n    }\n"
        "    mma(d, a.lo, bh[0], bh[1]);\n    mma(d, a.hi, bl[0], bl[1]);\n")]}


def at_rev(rev: str):
    """(source path, SMEM) of the prep kernel at ``rev`` (the source written to a temporary
    file; its includes still come from backends/)."""
    show = lambda f: subprocess.run(["git", "show", f"{rev}:{f}"], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "cuda_chunk_prep.cu"
    path.write_text(show("backends/cuda_chunk_prep.cu"))
    expr = re.search(r"^SMEM = (.+)$", show("backends/_cuda_chunk_prep.py"), re.M).group(1)
    return path, eval(expr, {"CHUNK": prep.CHUNK, "HEAD_DIM": prep.HEAD_DIM})


def cell_inputs(cell: str):
    """The dense prefill inputs of a cell "H/HV:NxL" on the GPU (seed 0)."""
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    n, L = map(int, mix.split("x"))
    return make_prefill_inputs([L] * n, H=H, HV=HV, device="cuda", seed=0)


def run(variant, x, mats, vecs, c, heads=None):
    prep.SOURCE, prep.SMEM = variant
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x.A_log, x.a, x.dt_bias, x.b, None,
                                                          None)
    prep.launch(x.q, x.k, ga, gb, A_log, dt_bias, x.cu_seqlens, mats, vecs, x.scale, True,
                gates, c, heads=heads)


def blocks_per_sm(variant) -> int:
    """The driver's occupancy answer for a variant's kernel at 128 threads and its SMEM."""
    import ctypes
    defs = tuple(sorted(dict(GDN_GATES=0, GDN_A_DT=1, GDN_B_DT=1, GDN_ALOG_DT=0, GDN_DTB_DT=0,
                             GDN_NEG=0, GDN_PDL=0, GDN_STORE3=1, GDN_HEADS=1).items()))
    func = prep.cuda_build.get_kernel(variant[0], prep.NAME, defs, torch.cuda.current_device(),
                                      variant[1]).func
    n = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), ctypes.c_void_p(func), 128, ctypes.c_size_t(variant[1]))
    return n.value


def diff(w, first):
    """True when workspace ``w`` is ``first`` bit for bit, else the largest difference of its
    rows (mats) and of its factors (vecs), each over that part's largest element."""
    if torch.equal(w[0].view(torch.int32), first[0].view(torch.int32)):
        return True
    def part(a, b):             # entries NaN in both (a "bf16" workspace's unused half) skipped
        a, b = a.float(), b.float()
        keep = ~(torch.isnan(a) & torch.isnan(b))
        a, b = a[keep], b[keep]
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    return f"mats {part(w[1], first[1]):.1e} vecs {part(w[2], first[2]):.1e}"


def errors(variants, cells, precision):
    """Each variant's whole prefill call against float64 (relative RMS of outputs and states)."""
    import gdnzoo
    from lab.prefill_gpu import make, oracle
    from lab.harness import rel
    from lab.wgmma_chain import parse
    algo = "cuda-chunk-bf16" if precision == "bf16" else "cuda-chunk"
    for cell in cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        o64, s64 = oracle(x, True)
        line = []
        for name, v in variants.items():
            prep.SOURCE, prep.SMEM = v
            out, ns = torch.empty_like(x["out"]), torch.empty_like(x["new_state"])
            gdnzoo.prefill(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                           x["b"], x["cu"], out=out, new_state=ns, use_qk_l2norm=True, algo=algo)
            torch.cuda.synchronize()
            line.append(f"{name} out {rel(out, o64):.3e} state {rel(ns, s64):.3e}")
        print(f"{cell:16s} {algo}: " + " | ".join(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", default="HEAD", help="'' for none (a GPU host's .git may be stale)")
    ap.add_argument("--cells", default="4/8:1x8192,16/32:8x1024,4/8:64x64,16/32:1x8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--extra", default="", help="more variants, PATH.cu:SMEM,...")
    ap.add_argument("--precision", default="bf16x3", choices=prep.PRECISIONS)
    ap.add_argument("--heads", type=int, default=0, help="value heads a CTA (0: the pick)")
    ap.add_argument("--variants", default="", help=f"the tree's edited copies: {list(EDITS)}")
    ap.add_argument("--edits", help="a Python file whose EDITS dict adds variants")
    ap.add_argument("--errors", action="store_true", help="each variant's call's errors instead")
    a = ap.parse_args()
    if a.edits:
        EDITS.update(load(a.edits))
    variants = {a.rev: at_rev(a.rev)} if a.rev else {}
    for e in filter(None, a.extra.split(",")):
        path, smem = e.rsplit(":", 1)
        variants[Path(path).stem] = (Path(path).resolve(), int(smem))
    variants["tree"] = (prep.SOURCE, prep.SMEM)
    for v in filter(None, a.variants.split(",")):
        if v in variants:
            raise SystemExit(f"variant {v!r}: the name of a column already (rename the edit)")
        variants[v] = (edited(prep.SOURCE, EDITS, v), prep.SMEM)
    if a.errors:
        return errors(variants, a.cells, a.precision)
    c, heads = tc.normalize(dict(precision=a.precision)), a.heads or None
    torch.zeros(1, device="cuda")                  # a context before the driver calls
    print("blocks an SM: " + ", ".join(f"{n} {blocks_per_sm(v)}" for n, v in variants.items()))
    print(f"{'cell':16s} " + " ".join(f"{n[:12]:>12s}" for n in variants)
          + "  each / the first; the same workspace as the first")
    for cell in a.cells.split(","):
        x = cell_inputs(cell)
        T, HV = x.q.shape[0], x.v.shape[1]
        ws = {}
        for name, v in variants.items():
            w = torch.full((tc.workspace_numel(T, HV),), float("nan"), device="cuda")
            mats, vecs = tc._workspace(w, T, HV, c, x.q.device)
            run(v, x, mats, vecs, c, heads)
            ws[name] = (w, mats, vecs)
        first = next(iter(ws.values()))
        same = [diff(w, first) for w in ws.values()][1:]
        times = {name: [] for name in variants}
        for _ in range(4):
            for name, v in variants.items():
                _, mats, vecs = ws[name]
                t, _ = kernel_times(lambda i: run(v, x, mats, vecs, c, heads), max(a.reps // 4, 1),
                                    warmup=1)
                times[name].extend(t)
        med = [statistics.median(t) for t in times.values()]
        print(f"{cell:16s} " + " ".join(f"{m:10.1f}us" for m in med) + "  "
              + " ".join(f"{m / med[0]:.3f}" for m in med[1:]) + f"  {same}", flush=True)


if __name__ == "__main__":
    main()

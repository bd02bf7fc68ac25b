"""Where a chunk's time goes in cuda-chunk-bf16's chain kernel: a copy of
``backends/cuda_chunk_chain.cu`` whose chain warpgroup (thread 0) and outputs warpgroup
(thread 128) write clock64 marks at each step of every chunk (the first 64 chunks of the first
1024 CTAs; the copy is made here, in a temporary folder), launched once per cell after a warm
launch.  Prints each step's mean cycles over every chunk but a CTA's first (it fills the
pipeline) and last.  The marks change the code a little: a breakdown, not a timing.  On an H100/H200
with cupy:

    python -m lab.chain_marks --cells 16/32:8x1024,4/8:1x8192
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _cuda_chunk_chain as chain    # noqa: E402
from gdnzoo.backends import triton_chunk as tc            # noqa: E402
from lab.clock_marks import clear, read_u64                      # noqa: E402
from lab.wgmma_chain import config, make, parse, workspace  # noqa: E402

CTAS, CHUNKS, SLOTS = 1024, 64, 10
MARK = (f"__device__ unsigned long long gdn_marks[{CTAS * CHUNKS * SLOTS}];\n"
        "#define GDN_MARK(who, k) do { if (tid == (who) && blockIdx.x < " f"{CTAS}"
        f" && jc < {CHUNKS}) gdn_marks[(blockIdx.x * {CHUNKS} + jc) * {SLOTS} + (k)] = "
        "clock64(); } while (0)\n")
# (the line a mark follows, its indent telling the chain's loop (8) from the outputs' (12);
# the mark; which occurrence of the line, 0 the first)
ANCHORS = [
    ("        const int s = (int)(jc % STAGES), b = (int)(jc & 1);", "GDN_MARK(0, 0)", 0),
    ("        wait_bar(smem_u32(&sm.full[s]), (unsigned)((jc / STAGES) & 1));", "GDN_MARK(0, 1)", 0),
    ("        pin(X);", "GDN_MARK(0, 2)", 0),
    ("        pin(X);", "GDN_MARK(0, 3)", 1),
    ("        pin(S);", "GDN_MARK(0, 4)", 0),
    ("            const int s = (int)(jc % STAGES), b = (int)(jc & 1);", "GDN_MARK(128, 5)", 0),
    ("            wait_bar(smem_u32(&sm.hfull[b]), (unsigned)((jc >> 1) & 1));",
     "GDN_MARK(128, 6)", 0),
    ("            pin(Y);", "GDN_MARK(128, 7)", 0),
    ("            pin(Y);", "GDN_MARK(128, 8)", 1),
]


def marked_source() -> Path:
    out, seen = [], {}
    for line in chain.SOURCE.read_text().split("\n"):
        out.append(line)
        if line.startswith('#include "wgmma.cuh"'):
            out.append(MARK)
        n = seen.get(line, 0)
        for anchor, mark, occ in ANCHORS:
            if line == anchor and occ == n:
                out.append(" " * (len(line) - len(line.lstrip())) + mark + ";")
        seen[line] = n + 1
    missing = [m for a, m, o in ANCHORS if not any(m in x for x in out)]
    if missing:
        raise SystemExit(f"anchors not found for {missing}: the kernel changed")
    path = Path(tempfile.mkdtemp()) / "cuda_chunk_chain_marks.cu"
    path.write_text("\n".join(out))
    return path


STEPS = ("chain: wait inputs", "X = S0 k^T (+ S0 out)", "R, V' = R T^T", "S update",
         "to next chunk", "outputs: wait S0, R", "Y = S0 q^T", "O += R M^T",
         "store, to next")


def breakdown(m):
    """(CTAs counted, the mean period, each step's mean) from marks [CTAs, chunks, slots]: a
    chunk counts when it is neither a CTA's first nor its last (chunk 0 fills the pipeline;
    the last has no next), whatever the number of chunks each CTA ran."""
    has = m[:, :, 0] > 0
    use = has[:, :-1] & has[:, 1:]
    use[:, 0] = False
    cur, nxt = m[:, :-1][use], m[:, 1:][use]            # [chunks counted, slots]
    c, o = cur[:, :5], cur[:, 5:9]
    steps = [*np.diff(c, axis=1).mean(0), (nxt[:, 0] - c[:, 4]).mean(),
             *np.diff(o, axis=1).mean(0), (nxt[:, 5] - o[:, 3]).mean()]
    return int(use.any(1).sum()), float((nxt[:, 0] - c[:, 0]).mean()), steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="16/32:8x1024,4/8:1x8192")
    a = ap.parse_args()
    chain.SOURCE = marked_source()
    print(f"{'cell':14s} {'CTAs':>5s} {'period':>7s} " + " ".join(f"{s:>12.12s}" for s in STEPS))
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        cfg = config(x)
        ws, mats, vecs = workspace(x, cfg)
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                  x["b"], x["cu"], None, x["out"], x["new_state"], True, config=cfg,
                  workspace=ws)
        args = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, x["out"], x["state"],
                x["new_state"])
        chain.launch(*args)                                # compiles, warms
        torch.cuda.synchronize()
        mod = [k for key, k in chain.cuda_build._kernels.items()
               if key[1] == str(chain.SOURCE)][0]
        clear(mod.module, "gdn_marks")
        chain.launch(*args)
        m = read_u64(mod.module, "gdn_marks").reshape(CTAS, CHUNKS, SLOTS).astype(np.int64)
        ctas, period, steps = breakdown(m)
        print(f"{cell:14s} {ctas:5d} {period:7.0f} " + " ".join(f"{v:12.0f}" for v in steps),
              flush=True)


if __name__ == "__main__":
    main()

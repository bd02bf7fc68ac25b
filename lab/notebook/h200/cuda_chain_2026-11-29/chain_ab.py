"""Where cuda-chunk's sequential kernel spends its time, by ablation: each variant compiles a
patched copy of ``backends/cuda_chunk_chain.cu`` (timing only: most variants compute something
else) and times the kernel alone after cuda-chunk's prep (torch.profiler records, medians).
From the repository root, on a GPU with cupy:

    python -m lab.chain_ab --cells 4/8:1x8192 --precisions bf16x3,bf16 --variants base,no_mma

Variants: base; no_mma (every mma.sync dropped: loads, ldmatrix, exchanges and barriers left);
no_load (the chunk loads after the first dropped: products on stale operands); no_sync (the two
barriers inside a chunk dropped); cs1, cs2, cs4 (clusters of at most 1, 2, 4 CTAs instead of
8); stages3 (three chunk buffers); rows32 (32 state rows a CTA).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _cuda_chunk_chain as chain    # noqa: E402
from lab.chain_cuda import CELLS                           # noqa: E402
from lab.chunk_ablate import kernel_medians                # noqa: E402
from lab.chunk_prep_cuda import cell_inputs                # noqa: E402
from lab.prefill_gpu import ours                           # noqa: E402

SRC = chain.SOURCE.read_text()
INCLUDE = '#include "gdn_chunk_mma.cuh"\n'
# name -> (source substitutions, stages, block_v[, cluster size cap])
VARIANTS = {
    "base": ([], 2, 16),
    "cs1": ([], 2, 16, 1),
    "cs2": ([], 2, 16, 2),
    "cs4": ([], 2, 16, 4),
    "no_mma": ([(INCLUDE, INCLUDE + "#define mma(d, a, b0, b1) ((void)0)\n")], 2, 16),
    "no_load": ([("            if (jn < n_chunks)\n", "            if (jn < 0)\n"),
                 ("        mbar_wait(&st.full,", "        if (j == 0) mbar_wait(&st.full,")], 2, 16),
    "no_sync": ([("        __syncthreads();                        // R complete\n", ""),
                 ("        __syncthreads();                        // V'^T complete\n", "")],
                2, 16),
    "stages3": ([], 3, 16),
    "rows32": ([], 2, 32),
}


def patched(subs) -> Path:
    src = SRC
    for old, new in subs:
        assert old in src, old
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "cuda_chunk_chain.cu"
    path.write_text(src)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--precisions", default="bf16x3,bf16")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    for cell in args.cells.split(","):
        x = cell_inputs(cell)
        for prec in args.precisions.split(","):
            line = []
            for name in args.variants.split(","):
                subs, stages, bv, *cs = VARIANTS[name]
                chain.CLUSTER_MAX = cs[0] if cs else 8
                if chain.smem_bytes(bv, prec, stages) > 227 * 1024:
                    line.append(f"{name} (no room)")
                    continue
                chain.SOURCE, chain.STAGES = patched(subs), stages
                cfg = dict(prep="cuda", chain="cuda", precision=prec, block_v=bv)
                t = kernel_medians(ours(x, True, config=cfg), args.reps)["state"]
                line.append(f"{name} {t:.1f}")
            print(f"{cell:14s} {prec:6s} chain us: " + "  ".join(line), flush=True)


if __name__ == "__main__":
    main()

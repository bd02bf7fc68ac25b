"""Where one CTA of cuda-chunk's prep kernel spends its time: a copy of
``backends/cuda_chunk_prep.cu`` with clock64 marks written by thread 0 after each phase's
barrier (``GDN_MARK(k)`` into ``__device__ unsigned long long gdn_marks[]``, ten a CTA; the
copy is made here, in a temporary folder) launched once per cell; prints each phase's mean
cycles over the CTAs that ran a chunk, and a CTA's whole latency.  The marks change the code a
little (fewer registers): a breakdown, not a timing.  On a GPU with cupy:

    python -m lab.prep_marks --cells 4/8:1x8192,16/32:8x1024
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

from gdnzoo.backends import _cuda_chunk_prep as prep      # noqa: E402
from gdnzoo.backends import triton_chunk as tc            # noqa: E402
from lab.clock_marks import clear, read_u64                      # noqa: E402
from lab.prep_ab import cell_inputs, run                  # noqa: E402

MARK = ("__device__ unsigned long long gdn_marks[1 << 16];\n#define GDN_MARK(k) do { if "
        "(threadIdx.x == 0 && blockIdx.x < 6000) gdn_marks[blockIdx.x * 10 + (k)] = clock64(); "
        "} while (0)\n")


def marked_source() -> Path:
    """The prep kernel with GDN_MARK(0..8): at entry, after each of its CTA-wide barriers but
    the block substitution's own (mark 5 after that loop instead), and at the end."""
    lines = prep.SOURCE.read_text().split("\n")
    out, barrier = [], 0
    for line in lines:
        if line.strip() == "// M = P T, rows [16 w, 16 w + 16): only the blocks at or below the diagonal":
            out.append("    GDN_MARK(5);")
        out.append(line)
        if line.startswith('#include "gdn_common.cuh"'):
            out.append(MARK)
        elif line.strip() == "const int g = lane >> 2, t4 = lane & 3;":
            out.append("    GDN_MARK(0);")
        elif line.strip().startswith("__syncthreads();"):
            barrier += 1
            if line.startswith("    __syncthreads();"):            # not the loop's own
                out.append(f"    GDN_MARK({barrier});")
        elif line.strip() == "v[4 * T_all] = expf(GL);":
            out.append("    }\n    GDN_MARK(8);\n    {")
    path = Path(tempfile.mkdtemp()) / "cuda_chunk_prep_marks.cu"
    path.write_text("\n".join(out))
    return path


PHASES = ("loads+gates", "l2norm+kk/qk", "A,P", "diag inverse", "block subst", "M=PT",
          "stage rows", "store")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smem", type=int, default=prep.SMEM)
    ap.add_argument("--cells", default="4/8:1x8192,16/32:8x1024")
    a = ap.parse_args()
    variant = (marked_source(), a.smem)
    print(f"{'cell':14s} {'CTAs':>5s} {'all':>7s} " + " ".join(f"{p[:12]:>12s}" for p in PHASES))
    for cell in a.cells.split(","):
        x = cell_inputs(cell)
        T, HV = x.q.shape[0], x.v.shape[1]
        mats, vecs = tc._workspace(None, T, HV, tc.normalize(None), x.q.device)
        run(variant, x, mats, vecs)                    # compiles, warms
        torch.cuda.synchronize()
        mod = [k for key, k in prep.cuda_build._kernels.items() if key[1] == str(variant[0])][0]
        clear(mod.module, "gdn_marks")
        run(variant, x, mats, vecs)
        m = read_u64(mod.module, "gdn_marks")[:60000].reshape(-1, 10)[:, :9].astype(np.int64)
        ran = m[(m[:, 8] > m[:, 0]) & (m[:, 1] > 0)]
        d = np.diff(ran, axis=1)
        print(f"{cell:14s} {len(ran):5d} {np.mean(ran[:, 8] - ran[:, 0]):7.0f} "
              + " ".join(f"{v:12.0f}" for v in d.mean(0)), flush=True)


if __name__ == "__main__":
    main()

"""Where one CTA of cuda-chunk's prep kernel spends its time: a copy of
``backends/cuda_chunk_prep.cu`` (made here, in a temporary folder) whose thread 0 writes clock64
marks (``GDN_MARK(k)`` into ``__device__ unsigned long long gdn_marks[]``) between its phases,
launched by the product call (``gdnzoo.prefill``, cuda-chunk-bf16: its heads a CTA and register
cap) after a warm call.  Prints each phase's mean cycles over the CTAs that ran a chunk, and a
CTA's whole span.  With several value heads a CTA the phases inside the heads' loop are the
last head's, and "G, A and P" also holds the heads before it.  The marks change the code a
little: a breakdown, not a timing.  On a GPU with cupy:

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

import gdnzoo                                             # noqa: E402
from gdnzoo.backends import _cuda_chunk_prep as prep      # noqa: E402
from lab.clock_marks import clear, read_u64               # noqa: E402
from lab.prefill_gpu import make                          # noqa: E402
from lab.wgmma_chain import parse                         # noqa: E402

CTAS, SLOTS = 16384, 12
MARK = (f"__device__ unsigned long long gdn_marks[{CTAS * SLOTS}];\n"
        "#define GDN_MARK(k) do { if (threadIdx.x == 0 && blockIdx.x < " f"{CTAS}"
        f") gdn_marks[blockIdx.x * {SLOTS} + (k)] = clock64(); }} while (0)\n")
# (a line of the kernel met once, the phase that ends there: its mark goes before the line,
# or after it where the name starts with "+")
ANCHORS = [
    ("    const int HV = (int)p.HV, N = (int)p.N, groups = HV / GDN_HEADS;", "entry"),
    ("    if (t0 >= eos) return;", "+sequence search"),
    ("    asm volatile(\"cp.async.wait_all;\" ::: \"memory\");", "copies issued, gates"),
    ("    __syncthreads();", "+q, k landed"),
    ("    const float scale = (float)p.scale;", "norms, k k^T, q k^T"),
    ("        // the diagonal block D_w = (I + A_ww)^-1: lane c (c < 16) forms its column c",
     "G, A and P"),
    ("        // the blocks below: block row r a step, warp c < r forms T_rc", "diagonal blocks"),
    ("        // M = P T, rows [16 w, 16 w + 16): only the blocks at or below the diagonal",
     "T's blocks below"),
    ("        // the stored rows: row i = column i of T, then of M (\"bf16x3\": hi parts, then lo",
     "M = P T"),
    ("            const float G = sm.G[tid], GL = sm.G[C_ - 1], eG = expf(G);",
     "rows staged and stored"),
    ("    }                                // the group's heads", "factors stored"),
]


def marked_source() -> Path:
    lines = prep.SOURCE.read_text().split("\n")
    for a, _ in ANCHORS:
        if lines.count(a) != 1:
            raise SystemExit(f"anchor not met once ({lines.count(a)}): {a.strip()!r}")
    out = []
    for line in lines:
        marks = [(k, n) for k, (a, n) in enumerate(ANCHORS) if line == a]
        indent = " " * max(len(line) - len(line.lstrip()), 4)
        out += [f"{indent}GDN_MARK({k});" for k, n in marks if not n.startswith("+")]
        out.append(line)
        out += [f"{indent}GDN_MARK({k});" for k, n in marks if n.startswith("+")]
        if line.startswith('#include "gdn_common.cuh"'):
            out.append(MARK)
    path = Path(tempfile.mkdtemp()) / "cuda_chunk_prep_marks.cu"
    path.write_text("\n".join(out))
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="4/8:1x8192,16/32:8x1024")
    a = ap.parse_args()
    prep.SOURCE = marked_source()
    n = len(ANCHORS)
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        args = (x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"])
        gdnzoo.prefill(*args, cu_seqlens=x["cu"], algo="cuda-chunk-bf16")    # compiles, warms
        torch.cuda.synchronize()
        # the marked kernels compiled so far (one per define set): the call's is the one marked
        mods = [k.module for key, k in prep.cuda_build._kernels.items()
                if key[1] == str(prep.SOURCE)]
        for mod in mods:
            clear(mod, "gdn_marks")
        gdnzoo.prefill(*args, cu_seqlens=x["cu"], algo="cuda-chunk-bf16")
        m = max((read_u64(mod, "gdn_marks") for mod in mods), key=lambda a: int((a > 0).sum()))
        m = m.reshape(CTAS, SLOTS)[:, :n].astype(np.int64)
        ran = m[(m > 0).all(1)]
        print(f"{cell}: {len(ran)} CTAs ran a chunk (of {int((m[:, 0] > 0).sum())} marked); "
              f"a CTA's span {np.mean(ran[:, -1] - ran[:, 0]):.0f} cycles", flush=True)
        for (_, name), v in zip(ANCHORS[1:], np.diff(ran, axis=1).mean(0)):
            print(f"    {name.lstrip('+'):28s} {v:8.0f}", flush=True)


if __name__ == "__main__":
    main()

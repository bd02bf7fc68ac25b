"""triton-chunk's sequential kernel against cuda-chunk's (``backends/cuda_chunk_chain.cu``), both
after cuda-chunk's prep kernel on the same inputs: each one's relative RMS error (output and
final state) against float64, their difference, and each kernel's median time (torch.profiler
records).  Dense, raw gates, K = V = 128, C = 64.  From the repository root, on a GPU with cupy:

    python -m lab.chain_cuda --cells 4/8:1x8192,16/32:8x1024 --precisions bf16x3,bf16
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.chunk_ablate import kernel_medians                # noqa: E402
from lab.chunk_prep_cuda import cell_inputs, rel          # noqa: E402
from lab.prefill_gpu import oracle, ours                   # noqa: E402

CELLS = "4/8:1x8192,4/8:8x1024,4/8:16x256,4/8:ragged,16/32:1x8192,16/32:8x1024,2/8:1x8192"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--precisions", default="bf16x3,bf16")
    ap.add_argument("--chains", default="triton,cuda")
    ap.add_argument("--block-v", type=int, default=0)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-oracle", action="store_true")
    args = ap.parse_args()
    for cell in args.cells.split(","):
        x = cell_inputs(cell)
        ref = None if args.no_oracle else oracle(x, True)
        for prec in args.precisions.split(","):
            got = {}
            for chain in args.chains.split(","):
                cfg = dict(prep="cuda", chain=chain, precision=prec, segments=1,
                           block_v=args.block_v)
                call = ours(x, True, config=cfg)
                x["out"].fill_(float("nan"))
                x["new_state"].fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                got[chain] = (x["out"].clone(), x["new_state"].clone())
                err = "" if ref is None else (f"float64: out {rel(got[chain][0], ref[0]):.2e} "
                                              f"state {rel(got[chain][1], ref[1]):.2e}")
                t = kernel_medians(call, args.reps)
                print(f"{cell:14s} {prec:6s} chain {chain:6s} prep {t['prep']:8.1f} us  "
                      f"chain {t['state']:8.1f} us  {err}", flush=True)
            if len(got) == 2:
                (o1, s1), (o2, s2) = got.values()
                print(f"{cell:14s} {prec:6s} cuda vs triton: out {rel(o2, o1):.2e} "
                      f"state {rel(s2, s1):.2e} nan {int(torch.isnan(o2).sum())}/"
                      f"{int(torch.isnan(s2).sum())}", flush=True)


if __name__ == "__main__":
    main()

"""Each kernel of a prefill call, median of torch.profiler records: cuda-chunk (the automatic
choice on Hopper: CUDA prep, Triton "bf16x3" chain) beside cuda-chunk-bf16, one process, at the
cells of ``split_edits.py``'s chain A/B.  From the repository root, on a GPU:

    python lab/notebook/h200/chain_split_prec_2026-12-01/kernels.py 4/8:1x8192,16/32:8x1024
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import gdnzoo                                                        # noqa: E402
from lab.harness import profiled                                     # noqa: E402
from lab.prefill_gpu import make                                     # noqa: E402
from lab.wgmma_chain import parse                                    # noqa: E402

for cell in (sys.argv[1] if len(sys.argv) > 1 else "4/8:1x8192,16/32:8x1024").split(","):
    H, HV, lens = parse(cell)
    x = make(lens, H, HV, seed=0)
    for algo in ("cuda-chunk", "cuda-chunk-bf16"):
        def call(a=algo):
            gdnzoo.prefill(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                           x["b"], x["cu"], out=x["out"], new_state=x["new_state"],
                           use_qk_l2norm=True, algo=a)
        by = profiled(call, reps=20)
        parts = {n[:40]: statistics.median(t) for n, t in by.items()}
        total = sum(parts.values())
        print(f"{cell:14s} {algo:16s} sum of medians {total:7.1f} us | "
              + " | ".join(f"{n} {t:.1f}" for n, t in parts.items()), flush=True)

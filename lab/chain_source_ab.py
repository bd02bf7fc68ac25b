"""cuda-chunk-bf16 with the tree's chain kernel against an older source of it (``--before``: a
copy of ``backends/cuda_chunk_chain.cu`` taking the tree's parameters), whole calls side by
side.  On a GPU:

    git show <commit>:backends/cuda_chunk_chain.cu > lab/_before.cu
    python3 -m lab.chain_source_ab --before lab/_before.cu --cells "16,32:8x1024;4,8:1x8192"

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps) and its outputs and states against the first variant's, the first's errors
against float64.  Cells as ``lab.prefill_gpu.lens_of`` reads them.
"""
from __future__ import annotations

from pathlib import Path

from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.harness import patch
from lab.prefill_gpu import ab_cells


def main():
    ab_cells(__doc__, lambda a: {"tree": patch(chain),
                                 "before": patch(chain, SOURCE=Path(a.before))},
             cells="16,32:8x1024",
             more_args=lambda ap: ap.add_argument("--before", required=True))


if __name__ == "__main__":
    main()

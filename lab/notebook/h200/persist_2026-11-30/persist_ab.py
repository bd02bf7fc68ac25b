"""cuda-chunk-bf16's solo chain form taking its tasks in rounds (a grid of two CTAs an SM, the
next task's first inputs copied in during the last chunks of the one before) against one task
a CTA, same kernel, and against the kernel before the change (its source in ``--before``, one
task a CTA), whole calls side by side.  On a GPU:

    git show <commit>:backends/cuda_chunk_chain.cu > /tmp/chain_before.cu
    python3 -m lab.persist_ab --before /tmp/chain_before.cu --cells "16,64:16x256;16,32:8x1024"

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps) and its outputs and states against the first variant's (all three the same
bits), the first's errors against float64.  Cells as ``lab.prefill_gpu.lens_of`` reads them.
"""
from __future__ import annotations

from pathlib import Path

from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.harness import patch
from lab.prefill_gpu import ab_cells


def one_task(tasks, n_sm):
    return tasks


def variants(a):
    v = {"rounds": patch(chain), "one-task": patch(chain, solo_ctas=one_task)}
    if a.before:
        v["before"] = patch(chain, solo_ctas=one_task, SOURCE=Path(a.before))
    return v


def main():
    ab_cells(__doc__, variants, cells="16,64:16x256",
             more_args=lambda ap: ap.add_argument("--before", default=None))


if __name__ == "__main__":
    main()

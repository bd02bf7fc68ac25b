"""cuda-chunk-bf16 with its CUDA chain launched as the CUDA prep's programmatic dependent
("after", the tree) against plain stream order ("plain": the prep without its trigger, the chain
a plain launch waiting for nothing), whole calls side by side.  On a GPU:

    python3 -m lab.pdl_after_prep_ab --cells "4,8:1x8192;16,32:8x1024;16,32:16x256"

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps), outputs and states compared bit for bit with the first variant's, the first's
errors against float64. Cells as ``lab.prefill_gpu.lens_of`` reads them ("H,HV:ragged",
"H,HV:NxL").
"""
from __future__ import annotations

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _cuda_chunk_prep as prep
from lab.harness import patch
from lab.prefill_gpu import ab_cells

LAUNCH, LAUNCHER = chain.launch, prep.launcher


def plain():
    """Both launches with the dependent launch taken out; returns the undo."""
    undo = [patch(chain, launch=lambda *a, **kw: LAUNCH(*a, **{**kw, "after_prep": False}))(),
            patch(prep, launcher=lambda *a, **kw: LAUNCHER(*a, **{**kw, "trigger": False}))()]
    return lambda: [u() for u in undo]


def main():
    ab_cells(__doc__, lambda a: {"after": patch(chain), "plain": plain})


if __name__ == "__main__":
    main()

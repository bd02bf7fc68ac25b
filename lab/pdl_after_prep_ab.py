"""cuda-chunk-bf16 with its CUDA chain launched as the CUDA prep's programmatic dependent
("after", the tree) against plain stream order ("plain": the prep without its trigger, the chain
a plain launch waiting for nothing), whole calls side by side.  On a GPU:

    python3 -m lab.pdl_after_prep_ab --cells "4,8:1x8192;16,32:8x1024;16,32:16x256"

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps), outputs and states compared bit for bit with the first variant's, the first's
errors against float64.  Cells as ``lab.chain_order_ab``'s ("H,HV:ragged", "H,HV:NxL").
"""
from __future__ import annotations

import argparse

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _cuda_chunk_prep as prep
from lab.chain_order_ab import lens_of
from lab.harness import patch, side_by_side
from lab.prefill_gpu import make, oracle, prefill_call

LAUNCH, LAUNCHER = chain.launch, prep.launcher


def plain():
    """Both launches with the dependent launch taken out; returns the undo."""
    undo = [patch(chain, launch=lambda *a, **kw: LAUNCH(*a, **{**kw, "after_prep": False}))(),
            patch(prep, launcher=lambda *a, **kw: LAUNCHER(*a, **{**kw, "trigger": False}))()]
    return lambda: [u() for u in undo]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="4,8:1x8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for cell in a.cells.split(";"):
        heads, mix = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make(lens_of(mix), H, HV, seed=0)
        o64, s64 = oracle(x, True)
        med = side_by_side(cell, prefill_call(x), {"after": patch(chain),
                                                   "plain": plain}, a.rounds, a.reps, o64, s64)
        print(f"{cell}: plain / after {med['plain'] / med['after']:.3f}x", flush=True)


if __name__ == "__main__":
    main()

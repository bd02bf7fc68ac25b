"""cuda-chunk-bf16's chain kernel as committed before (``--before FILE``: its source) against the
tree's, and the tree's with another rule for its solo form, whole calls side by side.  On a GPU:

    python3 -m lab.chain_order_ab --before .gpu/chain_before.cu --cells "4,8:ragged;4,8:256x16"

Variants: "before" (that source, the product's ``pick_solo``), "tree" (the tree's source, the
same rule), "rule2" (the tree's source, the solo form only past two waves of the 185 KB form's
CTAs).  Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep
kernel; median of --reps), its outputs and states compared bit for bit with the first's, and
the first's errors against float64.  A cell is "H,HV:ragged" (the bench's ragged mix),
"H,HV:NxL" or "H,HV:len+len+...".
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.mode_prefill import RAGGED
from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.harness import patch, side_by_side
from lab.prefill_gpu import make, oracle, prefill_call

PRODUCT_RULE, TREE = chain.pick_solo, chain.SOURCE


def lens_of(mix: str) -> list:
    if mix == "ragged":
        return list(RAGGED)
    if "x" in mix:
        n, L = map(int, mix.split("x"))
        return [L] * n
    return [int(s) for s in mix.split("+")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the chain kernel's source before")
    ap.add_argument("--cells", default="4,8:ragged")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    variants = {"before": (Path(a.before).resolve(), PRODUCT_RULE),
                "tree": (TREE, PRODUCT_RULE),
                "rule2": (TREE, lambda grid, n_sm: grid > 2 * n_sm)}
    for cell in a.cells.split(";"):
        heads, mix = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make(lens_of(mix), H, HV, seed=0)
        o64, s64 = oracle(x, True)
        side_by_side(cell, prefill_call(x), {n: patch(chain, SOURCE=src, pick_solo=rule)
                                             for n, (src, rule) in variants.items()},
                     a.rounds, a.reps, o64, s64)


if __name__ == "__main__":
    main()

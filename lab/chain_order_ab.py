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

from pathlib import Path

from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.harness import patch
from lab.prefill_gpu import ab_cells

PRODUCT_RULE, TREE = chain.pick_solo, chain.SOURCE


def main():
    def variants(a):
        rules = {"before": (Path(a.before).resolve(), PRODUCT_RULE), "tree": (TREE, PRODUCT_RULE),
                 "rule2": (TREE, lambda grid, n_sm: grid > 2 * n_sm)}
        return {n: patch(chain, SOURCE=src, pick_solo=rule) for n, (src, rule) in rules.items()}
    ab_cells(__doc__, variants, cells="4,8:ragged", more_args=lambda ap: ap.add_argument(
        "--before", required=True, help="the chain kernel's source before"))


if __name__ == "__main__":
    main()

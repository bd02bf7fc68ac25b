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
import statistics
from pathlib import Path

import torch

import gdnzoo
from bench.mode_prefill import RAGGED
from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.harness import event_times_us
from lab.prefill_gpu import make, oracle

PRODUCT_RULE, TREE = chain.pick_solo, chain.SOURCE


def lens_of(mix: str) -> list:
    if mix == "ragged":
        return list(RAGGED)
    if "x" in mix:
        n, L = map(int, mix.split("x"))
        return [L] * n
    return [int(s) for s in mix.split("+")]


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def product_call(x):
    """A cuda-chunk-bf16 call on the inputs of :func:`lab.prefill_gpu.make` (from a copy of the
    state, into the inputs' out and new_state), as a closure."""
    state = x["state"].clone()

    def call():
        return gdnzoo.prefill(x["q"], x["k"], x["v"], state, x["A_log"], x["a"], x["dt_bias"],
                              x["b"], x["cu"], out=x["out"], new_state=x["new_state"],
                              use_qk_l2norm=True, algo="cuda-chunk-bf16")
    return call


def side_by_side(cell, call, variants, rounds, reps, o64, s64):
    """Per round each variant in turn (``variants``: name -> a function setting it up and
    returning one that undoes it): ``call()``'s outputs and states against the first's (whose
    errors against float64 are printed), its GPU span (median of ``reps``).  Prints and returns
    {name: median span}."""
    first, same, spans = None, {}, {name: [] for name in variants}
    for _ in range(rounds):
        for name, setup in variants.items():
            undo = setup()
            try:
                out, new = (t.clone() for t in call())
                torch.cuda.synchronize()
                if first is None:
                    first = (out, new)
                    print(f"{cell} errors vs float64: out {rel(out, o64):.3e} state "
                          f"{rel(new, s64):.3e}", flush=True)
                same[name] = torch.equal(out, first[0]) and torch.equal(new, first[1])
                spans[name].append(statistics.median(event_times_us(call, reps, ahead=400_000)))
            finally:
                undo()
    med = {n: statistics.median(v) for n, v in spans.items()}
    print(f"{cell}: " + ", ".join(f"{n} {m:.1f} us" for n, m in med.items())
          + "; bit for bit as the first: " + ", ".join(f"{n} {s}" for n, s in same.items())
          + "; rounds " + "; ".join(f"{n} " + " ".join(f"{t:.1f}" for t in v)
                                  for n, v in spans.items()), flush=True)
    return med


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

        def setter(src, rule):
            def setup():
                chain.SOURCE, chain.pick_solo = src, rule

                def undo():
                    chain.SOURCE, chain.pick_solo = TREE, PRODUCT_RULE
                return undo
            return setup
        side_by_side(cell, product_call(x), {n: setter(*v) for n, v in variants.items()},
                     a.rounds, a.reps, o64, s64)


if __name__ == "__main__":
    main()

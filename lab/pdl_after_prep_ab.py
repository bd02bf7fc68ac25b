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
import statistics

import torch

import gdnzoo
from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _cuda_chunk_prep as prep
from lab.chain_order_ab import lens_of, rel
from lab.harness import event_times_us
from lab.prefill_gpu import make, oracle

LAUNCH, LAUNCHER = chain.launch, prep.launcher


def plain(on: bool):
    """The product's launches (on) or both with the dependent launch taken out."""
    if on:
        chain.launch, prep.launcher = LAUNCH, LAUNCHER
    else:
        chain.launch = lambda *a, **kw: LAUNCH(*a, **{**kw, "after_prep": False})
        prep.launcher = lambda *a, **kw: LAUNCHER(*a, **{**kw, "trigger": False})


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

        def call(state=x["state"].clone()):
            return gdnzoo.prefill(x["q"], x["k"], x["v"], state, x["A_log"], x["a"],
                                  x["dt_bias"], x["b"], x["cu"], out=x["out"],
                                  new_state=x["new_state"], use_qk_l2norm=True,
                                  algo="cuda-chunk-bf16")
        first, same, spans = None, {}, {"after": [], "plain": []}
        for _ in range(a.rounds):
            for name in spans:
                plain(name == "after")
                try:
                    out, new = (t.clone() for t in call())
                    torch.cuda.synchronize()
                    if first is None:
                        first = (out, new)
                        print(f"{cell} errors vs float64: out {rel(out, o64):.3e} state "
                              f"{rel(new, s64):.3e}", flush=True)
                    same[name] = torch.equal(out, first[0]) and torch.equal(new, first[1])
                    spans[name].append(statistics.median(
                        event_times_us(call, a.reps, ahead=400_000)))
                finally:
                    plain(True)
        med = {n: statistics.median(v) for n, v in spans.items()}
        print(f"{cell}: " + ", ".join(f"{n} {m:.1f} us" for n, m in med.items())
              + f" ({med['plain'] / med['after']:.3f}x); bit for bit: "
              + ", ".join(f"{n} {s}" for n, s in same.items()) + "; rounds "
              + "; ".join(f"{n} " + " ".join(f"{t:.1f}" for t in v) for n, v in spans.items()),
              flush=True)


if __name__ == "__main__":
    main()

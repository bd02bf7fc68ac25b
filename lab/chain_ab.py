"""Variants of cuda-chunk-bf16's chain kernel beside it: copies of ``backends/cuda_chunk_chain.cu``
with named text edits (made here, in a temporary folder), each launched on the product call's
workspace: whether its outputs and states are bit-identical to the product chain's (else their
errors against float64), then each kernel alone (torch.profiler medians), with and without the
outputs warpgroup.  The variants:

    (none kept: each measured one is an EDITS file in its notebook folder, e.g.
    lab/notebook/h200/chain_experiments_2026-11-30/hoist.py)

``--solo``: the product's two forms side by side, "product" the 185 KB form (one CTA an SM),
"solo" the one-warpgroup form (two CTAs an SM); EDITS variants named solo* launch the solo form.

``--before FILE``: an older kernel source's solo form beside ("before-solo"; its parameters
must be the tree's).

``--edits FILE``: more variants, the ``EDITS`` dict of a Python file (each a list of (old, new)
text pairs).  On an sm_90 GPU with cupy, from the repository root:

    python -m lab.chain_ab --edits lab/notebook/h200/chain_experiments_2026-11-30/hoist.py \\
        --variants hoist --cells 16/32:8x1024,16/32:16x256,4/8:1x8192
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import triton_chunk as tc
from lab.prefill_gpu import make, oracle
from lab.source_edits import edited, load
from lab.harness import rel
from lab.wgmma_chain import config, medians, parse, workspace

EDITS: dict = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="16/32:8x1024,16/32:16x256,4/8:1x8192")
    ap.add_argument("--variants", default="", help="names of EDITS (from --edits)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--edits", help="a Python file whose EDITS dict adds variants")
    ap.add_argument("--solo", action="store_true",
                    help="also the product's one-warpgroup form (launch(..., solo=True))")
    ap.add_argument("--before", help="an older chain source: its solo form beside")
    a = ap.parse_args()
    if a.edits:
        EDITS.update(load(a.edits))
    product = chain.SOURCE
    # name -> (source, launch keywords)
    sources = {"product": (product, {"solo": False}),
               **{v: (edited(product, EDITS, v), {"solo": v.startswith("solo")})
                  for v in filter(None, a.variants.split(","))}}
    if a.solo:
        sources["solo"] = (product, {"solo": True})
    if a.before:
        sources["before-solo"] = (Path(a.before), {"solo": True})
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        ws, mats, vecs = workspace(x, config(x))
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True,
                  config=dict(precision="bf16", prep="cuda", chain="cuda", segments=1),
                  workspace=ws)
        o64, s64 = oracle(x, True)
        out, ns = torch.empty_like(x["out"]), torch.empty_like(x["new_state"])
        args = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)
        calls = {}
        for name, (src, kw) in sources.items():
            chain.SOURCE = src
            out.fill_(float("nan"))
            ns.fill_(float("nan"))
            chain.launch(*args, **kw)
            torch.cuda.synchronize()
            same = torch.equal(out, x["out"]) and torch.equal(ns, x["new_state"])
            print(f"{cell:14s} {name:10s} bit-identical to the product: {same} | out "
                  f"{rel(out, o64):.3e} state {rel(ns, s64):.3e}", flush=True)
            for no_out in (False, True):
                def call(s=src, o=no_out, kw=kw):
                    chain.SOURCE = s
                    chain.launch(*args, no_out=o, **kw)
                calls[f"{name}{' no-out' if no_out else ''}"] = call
        t = medians(calls, a.reps)
        chain.SOURCE = product
        print(f"{cell:14s} chain alone (us): " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)


if __name__ == "__main__":
    main()

"""The segmented form's output pass (cp_out_kernel) at other warp counts, whole calls side by
side (cuda-chunk-bf16; the pass is launched with 4 warps).  On a GPU:

    python3 -m lab.cp_out_ab --cells "4,8:1x8192;2,8:1x32768" --warps 2,8

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps), outputs and states compared bit for bit with the first variant's.  Cells as
``lab.chain_order_ab``'s; only cells cut into segments run the pass.
"""
from __future__ import annotations

import argparse

from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends._triton_chunk_cp import cp_out_kernel
from lab.chain_order_ab import lens_of
from lab.harness import patch, side_by_side
from lab.prefill_gpu import make, oracle, prefill_call

LAUNCH = tc._LAUNCH


def with_warps(n: int):
    """tc._LAUNCH with the output pass's num_warps replaced by ``n``."""
    def launch(kernel, grid0, tensors, rest, **kw):
        if kernel is cp_out_kernel:
            kw = {**kw, "num_warps": n}
        return LAUNCH(kernel, grid0, tensors, rest, **kw)
    return launch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="4,8:1x8192")
    ap.add_argument("--warps", default="2,8")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for cell in a.cells.split(";"):
        heads, mix = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make(lens_of(mix), H, HV, seed=0)
        o64, s64 = oracle(x, True)
        variants = {"w4": patch(tc)}
        variants.update({f"w{n}": patch(tc, _LAUNCH=with_warps(int(n)))
                         for n in a.warps.split(",")})
        med = side_by_side(cell, prefill_call(x), variants, a.rounds, a.reps, o64, s64)
        print(f"{cell}: " + ", ".join(f"{n} / w4 {m / med['w4']:.3f}x" for n, m in med.items()),
              flush=True)


if __name__ == "__main__":
    main()

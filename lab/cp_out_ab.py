"""The segmented form's output pass (cp_out_kernel) at other warp counts, whole calls side by
side (--algo, default cuda-chunk-bf16; the pass is launched with 4 warps).  On a GPU:

    python3 -m lab.cp_out_ab --cells "4,8:1x8192;2,8:1x32768" --warps 2,8

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps), outputs and states compared bit for bit with the first variant's.  Cells as
``lab.prefill_gpu.lens_of`` reads them; only cells cut into segments run the pass.
"""
from __future__ import annotations

from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends._triton_chunk_cp import cp_out_kernel
from lab.harness import patch
from lab.prefill_gpu import ab_cells

LAUNCH = tc._LAUNCH


def with_warps(n: int):
    """tc._LAUNCH with the output pass's num_warps replaced by ``n``."""
    def launch(kernel, grid0, args, **kw):
        if kernel is cp_out_kernel:
            kw = {**kw, "num_warps": n}
        return LAUNCH(kernel, grid0, args, **kw)
    return launch


def main():
    ab_cells(__doc__, lambda a: {"w4": patch(tc), **{
        f"w{n}": patch(tc, _LAUNCH=with_warps(int(n))) for n in a.warps.split(",")}},
        more_args=lambda ap: ap.add_argument("--warps", default="2,8"))


if __name__ == "__main__":
    main()

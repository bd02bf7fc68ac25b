"""The warpgroup MMA's rate on this GPU in the chain kernel's shapes (``lab/wgmma_rate.cu``):
each mode's TFLOP/s at 1-3 CTAs (one warpgroup each) an SM, a batch waited for before the next
or one batch in flight.  On an sm_90 GPU with cupy:

    python3 -m lab.wgmma_rate
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build

SRC = Path(__file__).with_name("wgmma_rate.cu")
# mode: (name, FLOP a batch of one warpgroup)
MODES = {0: ("8 x m64n64k16 rs", 8 * 2 * 64 * 64 * 16),
         1: ("8 x m64n128k16 rs", 8 * 2 * 64 * 128 * 16),
         2: ("16 x m64n64k16 rs, 2 acc", 16 * 2 * 64 * 64 * 16),
         3: ("8 x m64n64k16 ss", 8 * 2 * 64 * 64 * 16),
         4: ("8 x m64n128k16 ss", 8 * 2 * 64 * 128 * 16),
         5: ("4 x m64n128k16 rs", 4 * 2 * 64 * 128 * 16)}
ITERS = 512


def rate(mode, wait, per_sm, dev=0):
    n_sm = cuda_build.sm_count(dev)
    smem = (228 * 1024) // per_sm - 2048
    func = cuda_build.get_kernel(SRC, "wgmma_rate", (("ITERS", ITERS), ("MODE", mode),
                                                    ("WAIT", wait)), dev, smem).func
    grid = n_sm * per_sm
    out = torch.empty(grid * 128, device="cuda")
    ptr = ctypes.c_void_p(out.data_ptr())
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(ptr))     # the parameters' addresses
    def go():
        cuda_build.launch_raw(func, grid, 128, dev, ctypes.addressof(argv), smem)
    go()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for _ in range(5):
        ev[0].record()
        go()
        ev[1].record()
        torch.cuda.synchronize()
        times.append(ev[0].elapsed_time(ev[1]) * 1e-3)
    t = sorted(times)[2]
    return grid * ITERS * MODES[mode][1] / t / 1e12, t * 1e6


def main():
    torch.zeros(1, device="cuda")              # the context the driver loads the module into
    print(f"{torch.cuda.get_device_name()}: TFLOP/s (us) by mode, wait, CTAs an SM")
    for mode, (name, _) in MODES.items():
        cells = []
        for wait in (0, 1):
            for per_sm in (1, 2, 3):
                tf, us = rate(mode, wait, per_sm)
                cells.append(f"w{wait} x{per_sm}: {tf:6.1f} ({us:6.1f})")
        print(f"{name:28s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()

"""Which shared-memory layouts and descriptor offsets make Hopper's wgmma (m64n64k16, bf16, no
swizzle) compute A B^T, and whether its accumulators lie as assumed (``wgmma_probe.cu`` says how).
Every combination of (core-matrix strides along the outer and the K index) x (descriptor's
leading and stride byte offsets taken as those strides, or swapped), for A and for B, with B
K-major (GDN_BT 0) and N-major (GDN_BT 1).  On an sm_90 GPU with cupy, from the repository root:

    python -m lab.wgmma_probe
"""
from __future__ import annotations

import ctypes
import itertools
import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build

SOURCE = Path(__file__).with_name("wgmma_probe.cu")
PARAMS = struct.Struct("<3Q8q")
PLACES = ((256, 128), (128, 256))      # (outer stride, K stride) of the core matrices, bytes


def variants():
    """(placement, descriptor (lbo, sbo), name) of one operand."""
    for outer, inner in PLACES:
        for swap in (False, True):
            lbo, sbo = (outer, inner) if swap else (inner, outer)
            yield (outer, inner), (lbo, sbo), f"place(outer {outer}, K {inner}) lbo {lbo} sbo {sbo}"


def main():
    dev = torch.cuda.current_device()
    g = torch.Generator().manual_seed(0)
    A = torch.randn(64, 16, generator=g).to(torch.bfloat16).cuda()
    B = torch.randn(64, 16, generator=g).to(torch.bfloat16).cuda()          # [N, K]
    want = A.float() @ B.float().T
    for bt in (0, 1):
        func = cuda_build.get_kernel(SOURCE, "wgmma_probe", (("GDN_BT", bt),),
                                     dev).func
        Bin = B if bt == 0 else B.T.contiguous()                            # BT 1: [K, N]
        good = []
        for (pa, da, na), (pb, db, nb) in itertools.product(variants(), variants()):
            D = torch.full((64, 64), float("nan"), device="cuda")
            params = ctypes.create_string_buffer(PARAMS.pack(
                A.data_ptr(), Bin.data_ptr(), D.data_ptr(), *pa, *da, *pb, *db))
            argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
            cuda_build.launch_raw(func, 1, 128, dev, ctypes.addressof(argv))
            torch.cuda.synchronize()
            err = float((D - want).abs().max())
            line = f"BT={bt} A {na} | B {nb}: max |err| {err:.3g}"
            print(line, flush=True)
            if err < 1e-3:
                good.append(line)
        print(f"== BT={bt}: {len(good)} combination(s) reproduce A B^T", flush=True)
        for line in good:
            print("   " + line, flush=True)


if __name__ == "__main__":
    main()

"""TMA tensor copies with 128-byte swizzle into wgmma's B operand (``tma_probe.cu`` says how):
the tensor map made through the driver (cuTensorMapEncodeTiled by ctypes), the placement of the
copied tiles checked against the swizzle rule, then which descriptor (LBO, SBO) reproduce the
product, K-major (X = S0 k^T's form) and MN-major (the update's form).  On an sm_90 GPU with
cupy, from the repository root:

    python -m lab.tma_probe
"""
from __future__ import annotations

import ctypes
import itertools
import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends._tma import tensor_map

SOURCE = Path(__file__).with_name("tma_probe.cu")
SMEM = 100 * 1024


def swizzled(B: torch.Tensor) -> torch.Tensor:
    """The two [64, 64] boxes of B [64, 128] as 128-byte swizzle places them: in each row r,
    16-byte piece c holds the row's logical piece c ^ (r % 8)."""
    boxes = []
    for b in range(2):
        tile = B[:, 64 * b: 64 * b + 64].reshape(64, 8, 8)
        r = torch.arange(64).view(64, 1)
        src = torch.arange(8).view(1, 8) ^ (r % 8)
        boxes.append(torch.gather(tile, 1, src.unsqueeze(-1).expand(64, 8, 8).to(tile.device)))
    return torch.stack(boxes).reshape(-1)


def main():
    dev = torch.cuda.current_device()
    g = torch.Generator().manual_seed(0)
    A = torch.randn(64, 16, generator=g).to(torch.bfloat16).cuda()
    B = torch.randn(64, 128, generator=g).to(torch.bfloat16).cuda()
    tmap = tensor_map(B.data_ptr(), (128, 64), (B.stride(0) * 2,), (64, 64))
    vals = (16, 128, 1024, 2048, 8192)
    for mode in (0, 1):
        func = cuda_build.get_kernel(SOURCE, "tma_probe", (("GDN_MODE", mode),), dev,
                                     SMEM).func
        nn = 64 if mode == 0 else 128
        steps = (0, 1, 5) if mode == 0 else (0, 1, 3)
        good = {}
        placed = None
        for lbo, sbo in itertools.product(vals, vals):
            for s in steps:
                Braw = torch.zeros(2 * 64 * 64, dtype=torch.bfloat16, device="cuda")
                D = torch.full((64, nn), float("nan"), device="cuda")
                params = ctypes.create_string_buffer(
                    tmap + struct.pack("<3Q3q", A.data_ptr(), Braw.data_ptr(), D.data_ptr(),
                                       lbo, sbo, s) + bytes(16))
                argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
                cuda_build.launch_raw(func, 1, 128, dev, ctypes.addressof(argv), SMEM)
                torch.cuda.synchronize()
                if placed is None:
                    placed = bool(torch.equal(Braw, swizzled(B)))
                    print(f"mode {mode}: TMA placement as the 128-byte swizzle rule says: {placed}",
                          flush=True)
                if mode == 0:
                    want = A.float() @ B[:, 16 * s: 16 * s + 16].float().T
                else:
                    want = A.float() @ B[16 * s: 16 * s + 16, :].float()
                err = float((D - want).abs().max())
                good.setdefault((lbo, sbo), []).append(err < 1e-3)
        ok = [k for k, v in good.items() if all(v)]
        print(f"== mode {mode} ({'K-major' if mode == 0 else 'MN-major'}): (LBO, SBO) right for "
              f"every k-step tried {steps}: {ok}", flush=True)
        partial = [k for k, v in good.items() if any(v) and not all(v)]
        if partial:
            print(f"   right for some k-steps only: {partial}", flush=True)


if __name__ == "__main__":
    main()

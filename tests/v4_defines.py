"""The -D constants of one cuda-v4 variant, by keyword, for the compile-only tests (nvcc)."""
from __future__ import annotations

import torch

from gdnzoo.backends import _cuda_build as cuda_build

F32, BF16 = torch.float32, torch.bfloat16
OPTIONAL = ("IDX64", "INTER", "UPDATE", "CHUNK", "AHEAD", "HSC", "PDL")   # left out while None
# (PDL: 0)


def v4_defines(sd=F32, io=BF16, K=128, l2=False, V=128, T=1, HV=8, GVA=2, W=2, RW=2, LPR=16,
               VEC16=1, HINT=0, FAST=1, DENSE=1, CHAIN=0, SMEM=0, QKS=0, POOL=0, **optional):
    """q/k/v/a/b of dtype ``io``, dt_bias fp32; the launch and switch constants as named."""
    unknown = set(optional) - set(OPTIONAL)
    if unknown:
        raise TypeError(f"unknown cuda-v4 switches {sorted(unknown)}")
    d = dict(v=V, t=T, hv=HV, gva=GVA, w=W, rw=RW, lpr=LPR, vec16=VEC16, hint=HINT,
             fastgate=FAST, dense=DENSE, chain=CHAIN, smem=SMEM, qks=QKS, pool=POOL)
    d.update({n.lower(): v for n, v in optional.items() if v is not None and (n != "PDL" or v)})
    return cuda_build.defines(sd, io, io, io, F32, K, l2, **d)

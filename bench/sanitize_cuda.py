"""Run each CUDA backend once per case, for compute-sanitizer (from the repo root):

    compute-sanitizer --tool memcheck  python3 bench/sanitize_cuda.py
    compute-sanitizer --tool racecheck python3 bench/sanitize_cuda.py

Cases: cuda-v1 and cuda-v4, B in {1, 64}, fp32 and bf16 state, in place and destination-passing,
T=2 with the L2 norm (and for cuda-v4 T=1 in place, T=4 destination-passing and bf16 T=8 in
place: each launch table's rows), plus a misaligned state (cuda-v4's element-load variant), a strided q (runtime strides), V=96
(partial row blocks), B=48 at T=1 (the table's shared-memory staging) and other cuda-v4 launch
shapes / cache hints / fast gates / FMA chains / staging / shared and split q and k.  Prints one line per case and a max
error vs the fp32 reference.
"""
from __future__ import annotations

import torch

from gdnzoo.backends import cuda_v1, cuda_v4
from gdnzoo.inputs import make_inputs
from gdnzoo.reference import reference_decode


def one(mod, B, sd, inplace, V=128, misalign=False, strided=False, T=2, **kw):
    x = make_inputs(B=B, T=T, H=4, HV=8, K=128, V=V, state_dtype=sd, device="cuda", seed=B)
    if strided:         # q as a view into a wider buffer: not dense, runtime strides
        wide = torch.zeros(B, T, 4, 256, dtype=x.q.dtype, device="cuda")
        wide[..., :128].copy_(x.q)
        x.q = wide[..., :128]
    state = x.state.clone()
    if misalign:
        buf = torch.empty(state.numel() + 1, dtype=sd, device="cuda")
        state = buf[1:].view(x.state.shape)
        state.copy_(x.state)
    out = torch.empty(B, T, 8, V, dtype=x.v.dtype, device="cuda")
    ns = state if inplace else torch.empty_like(state)
    mod.run(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, True, **kw)
    ro = torch.empty(B, T, 8, V, dtype=torch.float32, device="cuda")
    rs = torch.empty(x.state.shape, dtype=torch.float32, device="cuda")
    reference_decode(*x.args(), ro, rs, True)
    torch.cuda.synchronize()
    return max(float((out.float() - ro).abs().max()), float((ns.float() - rs).abs().max()))


def main():
    for name, mod in (("cuda-v1", cuda_v1), ("cuda-v4", cuda_v4)):
        for B in (1, 64):
            for sd in (torch.float32, torch.bfloat16):
                for inplace in (True, False):
                    err = one(mod, B, sd, inplace)
                    print(f"{name} B={B} {sd} {'in-place' if inplace else 'dest'}: max err {err:.2e}")
        err = one(mod, 4, torch.bfloat16, True, V=96)
        print(f"{name} V=96 bf16: max err {err:.2e}")
    # cuda-v4's tables by T: the cases above (T=2) take the T=2 rows; T=1 in place and T=4
    # destination passing take the other two tables' rows, bf16 T=8 its own.
    for B in (1, 64):
        for sd, T, inplace in ((torch.float32, 1, True), (torch.float32, 4, False),
                               (torch.bfloat16, 1, True), (torch.bfloat16, 4, False),
                               (torch.bfloat16, 8, True)):
            err = one(cuda_v4, B, sd, inplace, T=T)
            print(f"cuda-v4 B={B} T={T} {sd} {'in-place' if inplace else 'dest'}: max err {err:.2e}")
    for sd in (torch.float32, torch.bfloat16):      # the table's staged shapes (T=1, B*HV=384)
        for inplace in (True, False):
            err = one(cuda_v4, 48, sd, inplace, T=1)
            print(f"cuda-v4 B=48 T=1 {sd} {'in-place' if inplace else 'dest'}: max err {err:.2e}")
    err = one(cuda_v4, 4, torch.float32, True, misalign=True)
    print(f"cuda-v4 misaligned fp32: max err {err:.2e}")
    for sd in (torch.float32, torch.bfloat16):
        err = one(cuda_v4, 4, sd, False, strided=True)
        print(f"cuda-v4 strided q (runtime strides) {sd}: max err {err:.2e}")
    # Other lane splits, cache hints, fast gates, FMA chains and shared-memory staging (W, RW,
    # LPR, HINT, FAST[, CHAIN[, SMEM[, QKS]]]); staging serves T=1 only, so those run with T=1
    # (shared q/k without staging runs at T=2: both token buffers).
    for sd, cfg in ((torch.float32, (4, 4, 8, 3, 1)), (torch.float32, (1, 8, 16, 1, 0)),
                    (torch.bfloat16, (2, 4, 8, 3, 1)), (torch.bfloat16, (8, 16, 16, 2, 0)),
                    (torch.float32, (4, 1, 4, 0, 1, 4)), (torch.bfloat16, (4, 2, 16, 0, 1, 32)),
                    (torch.float32, (2, 8, 8, 2, 1, 0, 1)), (torch.bfloat16, (4, 4, 8, 2, 1, 0, 1)),
                    (torch.bfloat16, (4, 2, 8, 2, 1, 0, 0, 1)), (torch.float32, (8, 2, 16, 3, 1, 0, 0, 1)),
                    (torch.bfloat16, (4, 4, 8, 2, 1, 0, 1, 1)), (torch.float32, (1, 2, 16, 0, 1, 0, 0, 2)),
                    (torch.bfloat16, (4, 4, 8, 2, 1, 0, 1, 2))):
        for inplace in (True, False):
            err = one(cuda_v4, 4, sd, inplace, V=96, config=cfg,
                      T=1 if len(cfg) > 6 and cfg[6] else 2)
            print(f"cuda-v4 V=96 {sd} config {cfg} {'in-place' if inplace else 'dest'}: max err {err:.2e}")


if __name__ == "__main__":
    main()

"""Run each CUDA backend once per case, for compute-sanitizer (from the repository root):

    compute-sanitizer --tool memcheck  python3 -m lab.sanitize_cuda
    compute-sanitizer --tool racecheck python3 -m lab.sanitize_cuda

Cases: cuda-v1 and cuda-v4, B in {1, 64}, fp32 and bf16 state, in place and destination
passing, T=2 with the L2 norm (and for cuda-v4 T=1 in place, T=4 destination passing and bf16 T=8
in place: each of its row sets on this GPU), V=96 (partial row blocks), B=48 at T=1 (staged
rows), a misaligned state (cuda-v4's element-load variant), a strided q (runtime strides) and
other cuda-v4 launch configs (cache hints, fast gates, FMA chains, staging, shared and split q
and k).  Each case is judged by the gate (gdnzoo.gate); one line per case.
"""
from __future__ import annotations

import torch

from gdnzoo import gate
from gdnzoo.backends import cuda_v1, cuda_v4
from gdnzoo.inputs import make_inputs
from lab import harness

F32, BF16 = torch.float32, torch.bfloat16


def misaligned(run):
    """``run`` on a copy of the state one element off 16-byte alignment."""
    def call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, **kw):
        buf = torch.empty(state.numel() + 1, dtype=state.dtype, device=state.device)
        st = buf[1:].view(state.shape)
        st.copy_(state)
        run(q, k, v, st, A_log, a, dt_bias, b, scale, out, st if new_state is state else new_state,
            l2, **kw)
        if new_state is state:
            state.copy_(st)
    return call


def one(lab, name, run, B, sd, inplace, V=128, T=2, strided=False, **kw):
    x = make_inputs(B=B, T=T, H=4, HV=8, K=128, V=V, state_dtype=sd, device="cuda", seed=B)
    if strided:         # q as a view into a wider buffer: not dense, runtime strides
        wide = torch.zeros(B, T, 4, 256, dtype=x.q.dtype, device="cuda")
        wide[..., :128].copy_(x.q)
        x.q = wide[..., :128]
    j, _, _ = gate.gated_call(lambda *a: run(*a, **kw), x, dest=not inplace, use_qk_l2norm=True)
    torch.cuda.synchronize()
    what = (f"{name} B={B} T={T} V={V} {'fp32' if sd == F32 else 'bf16'} "
            f"{'in-place' if inplace else 'dest'}{' strided q' if strided else ''} {kw or ''}")
    lab.log(f"{'PASS' if j.ok else 'FAIL'} {what}: max err out {j.out.max_abs:.2e} "
            f"state {j.state.max_abs:.2e} {j.reason}")
    lab.results.setdefault("cases", []).append(dict(case=what, ok=j.ok, reason=j.reason))


def cases(lab):
    for name, mod in (("cuda-v1", cuda_v1), ("cuda-v4", cuda_v4)):
        for B in (1, 64):
            for sd in (F32, BF16):
                for inplace in (True, False):
                    one(lab, name, mod.run, B, sd, inplace)
        one(lab, name, mod.run, 4, BF16, True, V=96)
    # cuda-v4's row sets by T: the cases above (T=2) take the T=2 rows; T=1 in place and T=4
    # destination passing the other sets' rows, bf16 T=8 its own.
    for B in (1, 64):
        for sd, T, inplace in ((F32, 1, True), (F32, 4, False), (BF16, 1, True), (BF16, 4, False),
                               (BF16, 8, True)):
            one(lab, "cuda-v4", cuda_v4.run, B, sd, inplace, T=T)
    for sd in (F32, BF16):                  # the staged rows (T=1, B*HV=384)
        for inplace in (True, False):
            one(lab, "cuda-v4", cuda_v4.run, 48, sd, inplace, T=1)
    one(lab, "cuda-v4 misaligned", misaligned(cuda_v4.run), 4, F32, True)
    for sd in (F32, BF16):
        one(lab, "cuda-v4", cuda_v4.run, 4, sd, False, strided=True)
    # Other lane splits, cache hints, fast gates, FMA chains and staging (W, RW, LPR, HINT, FAST[,
    # CHAIN[, SMEM[, QKS]]]); staging serves T=1 only, so those run with T=1 (shared q/k without
    # staging runs at T=2: both token buffers).
    for sd, cfg in ((F32, (4, 4, 8, 3, 1)), (F32, (1, 8, 16, 1, 0)), (BF16, (2, 4, 8, 3, 1)),
                    (BF16, (8, 16, 16, 2, 0)), (F32, (4, 1, 4, 0, 1, 4)), (BF16, (4, 2, 16, 0, 1, 32)),
                    (F32, (2, 8, 8, 2, 1, 0, 1)), (BF16, (4, 4, 8, 2, 1, 0, 1)),
                    (BF16, (4, 2, 8, 2, 1, 0, 0, 1)), (F32, (8, 2, 16, 3, 1, 0, 0, 1)),
                    (BF16, (4, 4, 8, 2, 1, 0, 1, 1)), (F32, (1, 2, 16, 0, 1, 0, 0, 2)),
                    (BF16, (4, 4, 8, 2, 1, 0, 1, 2))):
        for inplace in (True, False):
            one(lab, "cuda-v4", cuda_v4.run, 4, sd, inplace, V=96,
                T=1 if len(cfg) > 6 and cfg[6] else 2, config=cfg)


def main(lab):
    lab.part("cases", cases, lab)
    n = lab.results.get("cases", [])
    lab.log(f"{sum(c['ok'] for c in n)}/{len(n)} cases passed the gate")
    if not all(c["ok"] for c in n):
        lab.failed.append("gate")


if __name__ == "__main__":
    harness.run("sanitize_cuda", main)

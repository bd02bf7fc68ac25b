"""Run each CUDA backend once per case, for compute-sanitizer (from the repository root):

    compute-sanitizer --tool memcheck  python3 -m lab.sanitize_cuda
    compute-sanitizer --tool racecheck python3 -m lab.sanitize_cuda

Cases: cuda-v1 and cuda-v4, B in {1, 64}, fp32 and bf16 state, in place and destination
passing, T=2 with the L2 norm (and for cuda-v4 T=1 in place, T=4 destination passing and bf16 T=8
in place: each of its row sets on this GPU), V=96 (partial row blocks), B=48 at T=1 (staged
rows), a misaligned state (cuda-v4's element-load variant), a strided q (runtime strides) and
other cuda-v4 launch configs (cache hints, fast gates, FMA chains, staging, shared and split q
and k).  With programmatic dependent launch (cuda-v4 ``pdl`` 1 wait-first, 2 state-early; needs
compute capability >= 9.0, else skipped): the dense cases at B in {1, 64}, staged and shared or
split q/k configs, and right behind a producer kernel of q, k, v: a pool with padding and
separate write slots, and the verify forms (intermediate states at indexed rows, per-token
slots with accepted counts).  Each case is judged by the gate (gdnzoo.gate); one line per case.
"""
from __future__ import annotations

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.contract import PDL_LEVELS
from gdnzoo.backends import cuda_v1, cuda_v4
from gdnzoo.inputs import make_inputs
from gdnzoo.pool import Pool
from gdnzoo.reference import reference_outputs, reference_verify_outputs
from gdnzoo.verify import Verify
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
    log_case(lab, what, j)


def log_case(lab, what, j):
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


def produced(x):
    """x's q, k, v rewritten by a torch kernel (launched without PDL) right before the decode,
    so a PDL launch overlaps a kernel that writes what it reads."""
    for name in ("q", "k", "v"):
        t = getattr(x, name)
        torch.mul(t.clone(), 1, out=t)


def pool_case(lab, pdl, B, sd):
    """A pool (slots B..2B-1 read, 2B..3B-1 written, sequence 1 padded)."""
    x = make_inputs(B=B, T=2, H=4, HV=8, K=128, V=128, state_dtype=sd, device="cuda", seed=B)
    P = 3 * B + 1
    pool = (torch.randn(P, *x.state.shape[1:], device="cuda") * 0.05).to(sd)
    read = torch.arange(B, 2 * B, dtype=torch.int32, device="cuda")
    read[1] = -1
    write = torch.arange(2 * B, 3 * B, dtype=torch.int32, device="cuda")
    x.state = pool
    ref_out, ref_pool = reference_outputs(x, True, pool=Pool(read, write, -1))
    out = torch.full(ref_out.shape, float("nan"), dtype=x.v.dtype, device="cuda")
    produced(x)
    gdnzoo.decode(*x.args(), out=out, use_qk_l2norm=True, algo="cuda-v4", state_indices=read,
                  new_state_indices=write, pdl=pdl)
    torch.cuda.synchronize()
    log_case(lab, f"cuda-v4 pdl={pdl} pool B={B} {'fp32' if sd == F32 else 'bf16'}",
             gate.judge(out, pool, ref_out, ref_pool, state_dtype=sd))


def verify_case(lab, pdl, form, sd):
    """Verify at T=4, B=16: intermediate states at indexed rows (one row out of range) with
    the final store on a dense state, or per-token slots with accepted counts."""
    B, T = 16, 4
    x = make_inputs(B=B, T=T, H=4, HV=8, K=128, V=128, state_dtype=sd, device="cuda", seed=T)
    kw = {}
    if form == "states":
        inter = torch.zeros(B + 1, T, *x.state.shape[1:], dtype=sd, device="cuda")
        rows = torch.randperm(B + 1, device="cuda")[:B]
        rows[0] = B + 5
        ver, p = Verify(inter, rows, True, False, None), None
        kw = dict(intermediate_states=inter, intermediate_indices=rows)
    else:
        x.state = (torch.randn(B * T + 1, *x.state.shape[1:], device="cuda") * 0.05).to(sd)
        slots = torch.randperm(B * T, device="cuda").view(B, T) + 1
        accepted = torch.randint(1, T + 1, (B,), device="cuda")
        ver, p = Verify(None, None, True, True, accepted), Pool(slots, slots, -1)
        kw = dict(state_indices=slots, num_accepted_tokens=accepted)
    ref_out, ref_state, ref_inter = reference_verify_outputs(x, ver, True, p)
    out = torch.full(ref_out.shape, float("nan"), dtype=x.v.dtype, device="cuda")
    produced(x)
    gdnzoo.decode(*x.args(), out=out, use_qk_l2norm=True, algo="cuda-v4", pdl=pdl, **kw)
    torch.cuda.synchronize()
    what = f"cuda-v4 pdl={pdl} verify {form} B={B} T={T} {'fp32' if sd == F32 else 'bf16'}"
    log_case(lab, what, gate.judge(out, x.state, ref_out, ref_state, state_dtype=sd))
    if ref_inter is not None:
        log_case(lab, what + " intermediate", gate.judge(out, ver.states, ref_out, ref_inter,
                                                          state_dtype=sd))


def pdl_cases(lab):
    if torch.cuda.get_device_capability() < (9, 0):
        lab.log("PDL cases skipped: programmatic dependent launch needs compute capability "
                ">= 9.0")
        return
    for pdl in ("wait", "early"):
        level = PDL_LEVELS[pdl]
        for B in (1, 64):
            for sd in (F32, BF16):
                for inplace in (True, False):
                    one(lab, "cuda-v4", cuda_v4.run, B, sd, inplace, pdl=level)
        for sd, cfg, T in ((F32, (2, 8, 8, 2, 1, 0, 1), 1), (BF16, (4, 4, 8, 2, 1, 0, 1, 2), 1),
                           (BF16, (4, 2, 8, 2, 1, 0, 0, 1), 2)):
            one(lab, "cuda-v4", cuda_v4.run, 4, sd, False, V=96, T=T, config=cfg, pdl=level)
        for sd in (F32, BF16):
            pool_case(lab, pdl, 64, sd)
            for form in ("states", "slots"):
                verify_case(lab, pdl, form, sd)


def main(lab):
    lab.part("cases", cases, lab)
    lab.part("pdl cases", pdl_cases, lab)
    n = lab.results.get("cases", [])
    lab.log(f"{sum(c['ok'] for c in n)}/{len(n)} cases passed the gate")
    if not all(c["ok"] for c in n):
        lab.failed.append("gate")


if __name__ == "__main__":
    harness.run("sanitize_cuda", main, needs_cuda=True)

"""A prototype, not in the product: triton-chunk's chain as one product a chunk.

triton-chunk's sequential kernel runs, per chunk, seven dependent MMAs in three groups on its
state tile (S0 k^T, R T^T, the update; bf16 splits and layout round trips between them).
Substituting R = v^T diag(beta) - S0 k^T diag(bk) into the update and the outputs gives, with
operators free of the state (the module docstring of backends/_triton_chunk_kernel.py has the
symbols; T^T and M^T are the prep kernel's stored rows),

    S'  = S0 A + U,      A  = e^{G_last} I - k^T diag(bk) T^T diag(fk) k      [K, K]
                         U  = v^T diag(beta) T^T diag(fk) k                   [V, K]
    O^T = S0 Q' + V',    Q' = q^T diag(fq) - k^T diag(bk) M^T                 [K, C]
                         V' = v^T diag(beta) M^T                              [V, C]

so the chain is one [BV, K] x [K, K] product a chunk and the outputs one more beside it.  A
middle form (timed beside it) keeps A factored, S A = e^{G_last} S - (S k^T diag(bk)) Z with
Z = T^T diag(fk) k [C, K]: two dependent products a chunk (the product's chain has three
groups), half A's bytes.  Here the operators are formed in float64 by torch from the
product's prep kernel (its workspace), one sequence only, and :func:`onestep_kernel` runs the
chain; the question for a GPU is whether that kernel alone beats the product's sequential
kernel alone (both timed by ``--time``), at what error.  The operators cost memory the product does not spend (A and Q'
in bf16 hi/lo parts, U and V' in fp32: ~4x triton-chunk's workspace).

    TRITON_INTERPRET=1 python -m lab.chunk_onestep --check          # CPU: K = V = 64
    python -m lab.chunk_onestep --check --time --geom 4/8 --tokens 8192   # a GPU: both forms
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends._triton_chunk_kernel import dot, split_bf16
from gdnzoo.backends._triton_decode_kernel import INTERPRETED, bind_interpreted
from gdnzoo.inputs import make_prefill_inputs

F64 = torch.float64


def operators(x, cfg=None) -> dict:
    """The operators of the one sequence of ``x`` (packed from token 0): A [n, HV, K, K], Z
    [n, HV, C, K] and Q' [n, HV, K, C] as bf16 (hi, lo) pairs; U [n, HV, V, K], V' [n, HV, V,
    C], bk [n, HV, C] and e^{G_last} [n, HV] fp32; n chunks; the config."""
    T, H, K = x.q.shape
    HV, V = x.v.shape[1:]
    c = tc.resolve(cfg, 1, HV, V, x.q.device, tokens=T)
    C = c.chunk
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x.A_log, x.a, x.dt_bias, x.b, None,
                                                          None)
    mats, vecs = tc._workspace(None, T, HV, c, x.q.device)
    tc.launch_prep(x.q, x.k, ga, gb, A_log, dt_bias, x.cu_seqlens, mats, vecs,
                   float(x.scale or K ** -0.5), True, gates, c)
    n = -(-T // C)
    pad = n * C - T
    NP = 2 if c.precision == "bf16x3" else 1
    m = mats.view(T, HV, 2, NP, C).to(F64)
    mT = m[:, :, :, 0] + (m[:, :, :, 1] if NP == 2 else 0)          # [T, HV, 2, C]
    mT = torch.nn.functional.pad(mT, (0, 0, 0, 0, 0, 0, 0, pad))     # rows past T: zero
    TT = mT[:, :, 0].view(n, C, HV, C).permute(0, 2, 1, 3)           # [n, HV, C(r), C]: T^T
    MT = mT[:, :, 1].view(n, C, HV, C).permute(0, 2, 1, 3)
    vv = torch.nn.functional.pad(vecs.view(HV, 5, T).to(F64), (0, pad))
    vv = vv.view(HV, 5, n, C).permute(2, 0, 1, 3)                    # [n, HV, 5, C]
    beta, bk, fq, fk = vv[:, :, 0], vv[:, :, 1], vv[:, :, 2], vv[:, :, 3]
    glast = vv[:, :, 4, 0]                                           # [n, HV]
    rep = HV // H

    def rows(t):                                                     # [n, HV, C, D]
        t = torch.nn.functional.pad(t.to(F64), (0, 0, 0, 0, 0, pad))
        t = t.view(n, C, t.shape[1], t.shape[2]).permute(0, 2, 1, 3)
        return t.repeat_interleave(rep, 1) if t.shape[1] != HV else t
    k, q, v = rows(x.k), rows(x.q), rows(x.v)
    kT = k.transpose(-1, -2)                                         # [n, HV, K, C]
    kb = kT * bk[:, :, None, :]                                      # k^T diag(bk)
    fkk = fk[:, :, :, None] * k                                      # diag(fk) k
    vb = v.transpose(-1, -2) * beta[:, :, None, :]                   # v^T diag(beta)
    Z = TT @ fkk
    A = glast[:, :, None, None] * torch.eye(K, dtype=F64, device=k.device) - kb @ Z
    Qp = q.transpose(-1, -2) * fq[:, :, None, :] - kb @ MT

    def parts(t):
        hi = t.to(torch.bfloat16)
        return hi.contiguous(), (t - hi.to(F64)).to(torch.bfloat16).contiguous()
    return dict(A=parts(A), Z=parts(Z), Q=parts(Qp), U=(vb @ Z).float().contiguous(),
                Vp=(vb @ MT).float().contiguous(), bk=bk.float().contiguous(),
                glast=glast.float().contiguous(), n=n, config=c)


@triton.jit
def onestep_kernel(A_hi, A_lo, U, Q_hi, Q_lo, Vp, out, state, new_state, n_chunks, T_all,
                   so_t, so_h, k, sk_t, sk_h, bk, glast, H: tl.constexpr, HV: tl.constexpr,
                   K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                   STAGES: tl.constexpr, FACTORED: tl.constexpr):
    """One program per (value head, V tile of BV rows): the state tile through every chunk,
    S <- S A_j + U_j (``FACTORED``: A_hi, A_lo hold Z, and S A = g S - (S k^T diag(bk)) Z),
    the outputs O^T = S Q'_j + V'_j of the state before chunk j."""
    pid = tl.program_id(0)
    i_hv = pid // (V // BV)
    rows_v = (pid % (V // BV)) * BV + tl.arange(0, BV)
    kk = tl.arange(0, K)
    cc = tl.arange(0, C)
    h = tl.load(state + i_hv * V * K + rows_v[:, None] * K + kk[None, :])
    if INTERPRETED:
        j = 0
        while j < n_chunks:
            h = onestep(h, j, A_hi, A_lo, U, Q_hi, Q_lo, Vp, out, T_all, so_t, so_h, i_hv, rows_v,
                        kk, cc, k, sk_t, sk_h, bk, glast, H, HV, K, V, C, FACTORED)
            j += 1
    else:
        for j in tl.range(0, n_chunks, num_stages=STAGES):
            h = onestep(h, j, A_hi, A_lo, U, Q_hi, Q_lo, Vp, out, T_all, so_t, so_h, i_hv, rows_v,
                        kk, cc, k, sk_t, sk_h, bk, glast, H, HV, K, V, C, FACTORED)
    tl.store(new_state + i_hv * V * K + rows_v[:, None] * K + kk[None, :], h)


@triton.jit
def onestep(h, j, A_hi, A_lo, U, Q_hi, Q_lo, Vp, out, T_all, so_t, so_h, i_hv, rows_v, kk, cc,
            k, sk_t, sk_h, bk, glast, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
            V: tl.constexpr, C: tl.constexpr, FACTORED: tl.constexpr):
    base = (j * HV + i_hv).to(tl.int64)
    pq = base * K * C + kk[:, None] * C + cc[None, :]
    h_hi, h_lo = split_bf16(h)
    q_hi = tl.load(Q_hi + pq)
    o = dot(h_hi, q_hi, dot(h_hi, tl.load(Q_lo + pq), dot(h_lo, q_hi)))
    o += tl.load(Vp + base * V * C + rows_v[:, None] * C + cc[None, :])
    t = j * C + cc
    tl.store(out + t[None, :] * so_t + i_hv * so_h + rows_v[:, None], o.to(out.dtype.element_ty),
             mask=(t < T_all)[None, :])
    if FACTORED:
        kr = tl.load(k + t[:, None] * sk_t + (i_hv // (HV // H)) * sk_h + kk[None, :],
                     mask=(t < T_all)[:, None], other=0.0)
        x = dot(h_hi, tl.trans(kr), dot(h_lo, tl.trans(kr)))          # S k^T    [BV, C]
        x_hi, x_lo = split_bf16(x * tl.load(bk + base * C + cc)[None, :])
        pz = base * C * K + cc[:, None] * K + kk[None, :]
        z_hi = tl.load(A_hi + pz)
        h = tl.load(glast + base) * h - dot(x_hi, z_hi, dot(x_hi, tl.load(A_lo + pz),
                                                             dot(x_lo, z_hi)))
    else:
        pa = base * K * K + kk[:, None] * K + kk[None, :]
        a_hi = tl.load(A_hi + pa)
        h = dot(h_hi, a_hi, dot(h_hi, tl.load(A_lo + pa), dot(h_lo, a_hi)))
    return h + tl.load(U + base * V * K + rows_v[:, None] * K + kk[None, :])


if INTERPRETED:
    bind_interpreted(globals())


def run_onestep(x, ops, block_v=16, warps=8, stages=2, factored=False):
    T, HV, V = x.v.shape
    H, K = x.q.shape[1:]
    out = torch.empty_like(x.v)
    new = torch.empty_like(x.state)
    a_hi, a_lo = ops["Z" if factored else "A"]
    onestep_kernel[(HV * (V // block_v),)](
        a_hi, a_lo, ops["U"], *ops["Q"], ops["Vp"], out, x.state, new, ops["n"], T,
        out.stride(0), out.stride(1), x.k, x.k.stride(0), x.k.stride(1), ops["bk"],
        ops["glast"], H, HV, K, V, ops["config"].chunk, block_v, stages, int(factored),
        num_warps=warps)
    return out, new


def rel(got, want):
    return float((got.double() - want).norm() / want.norm())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--geom", default="2/4")
    p.add_argument("--tokens", type=int, default=0, help="one sequence (default: 200 on CPU)")
    p.add_argument("--dim", type=int, default=0, help="K = V (default: 64 on CPU, else 128)")
    p.add_argument("--block-v", type=int, default=16)
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--check", action="store_true", help="errors against float64, beside triton-chunk's")
    p.add_argument("--time", action="store_true", help="each sequential kernel alone (GPU)")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
    H, HV = map(int, a.geom.split("/"))
    D = a.dim or (128 if dev == "cuda" else 64)
    T = a.tokens or (8192 if dev == "cuda" else 200)
    x = make_prefill_inputs([T], H=H, HV=HV, K=D, V=D, device=dev, seed=0)
    ops = operators(x)
    mib = {f: sum(t.numel() * t.element_size() for t in (*ops[f], *ops["Q"], ops["U"], ops["Vp"]))
           / 2**20 for f in ("A", "Z")}
    print(f"{H}/{HV} 1x{T} K=V={D}: {ops['n']} chunks, operators {mib['A']:.0f} MiB "
          f"(factored {mib['Z']:.0f} MiB)")
    forms = {"one step a chunk": False, "factored (two steps)": True}
    if a.check:
        ref_out, ref_state = x.reference(use_qk_l2norm=True)
        p_out, p_new = torch.empty_like(x.v), torch.empty_like(x.state)
        tc.launch(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale,
                  p_out, p_new, True)
        line = [f"triton-chunk: out {rel(p_out, ref_out):.3e} state {rel(p_new, ref_state):.3e}"]
        for name, factored in forms.items():
            out, new = run_onestep(x, ops, a.block_v, a.warps, a.stages, factored)
            line.append(f"{name}: out {rel(out, ref_out):.3e} state {rel(new, ref_state):.3e}")
        print("  " + "   ".join(line))
    if a.time:
        c = ops["config"]
        gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x.A_log, x.a, x.dt_bias, x.b,
                                                              None, None)
        mats, vecs = tc._workspace(None, T, HV, c, x.q.device)
        p_out, p_new = torch.empty_like(x.v), torch.empty_like(x.state)
        calls = {"triton-chunk sequential kernel": lambda: tc.launch_state(
            x.q, x.k, x.v, x.cu_seqlens, mats, vecs, p_out, x.state, p_new, c)}
        for name, factored in forms.items():
            calls[name] = lambda factored=factored: run_onestep(x, ops, a.block_v, a.warps,
                                                                a.stages, factored)
        tc.launch_prep(x.q, x.k, ga, gb, A_log, dt_bias, x.cu_seqlens, mats, vecs,
                       float(x.scale or D ** -0.5), True, gates, c)
        for name, f in calls.items():
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as pr:
                for _ in range(a.reps):
                    f()
                torch.cuda.synchronize()
            ts = [e.time_range.elapsed_us() for e in pr.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA
                  and ("chunk_state" in e.name or "onestep" in e.name)]
            print(f"  {name}: {statistics.median(ts):.1f} us (median of {len(ts)})")


if __name__ == "__main__":
    main()

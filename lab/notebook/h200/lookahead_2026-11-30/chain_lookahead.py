"""A reformulated chain for cuda-chunk-bf16, its numerics only (CPU, no kernel): each chunk's
X = S0 k^T formed from the chunk before instead of from the updated state,

    X_c = e^(G_last, c-1) (S0_{c-1} k_c^T) + (V'^T diag(fk))_{c-1} (k_{c-1} k_c^T),

so a chunk's chain of dependent products shortens from three (X, V'^T, the update) to two
(V'^T, then the correction of the next X), the update and the next S0 k^T leaving the critical
path (lab/notebook/h200/chain_anatomy_2026-11-30/session.log, section 3).  Its roundings
differ from triton-chunk's chain (S0 rounded to bf16 a chunk earlier, k_{c-1} k_c^T rounded to
bf16), so it cannot be bit-identical; this asks whether its errors against float64 stay those of
the chain as it is.  Both chains are emulated with the kernel's bf16 operands (every product's
operands rounded to bf16, fp32 sums) on the workspace the prep would write ("bf16": T^T and M^T
rounded to bf16), against lab.prefill_gpu's float64 token-by-token oracle; "exact" runs the
same algebra with no rounding (a check of the emulation: ~1e-6).

    python lab/notebook/h200/lookahead_2026-11-30/chain_lookahead.py \\
        --cells 4/8:1x8192,16/32:2x1024 --seeds 0,1
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.prefill_reference import LOG_DECAY_MIN, chunked_sequence
from lab.prefill_gpu import gates64, make, oracle

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
C = 64


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


def prep(q, k, gam, beta, scale, rq, rk, rnd):
    """The workspace of one chunk, every head at once: T^T, M^T (rounded by ``rnd``) and the
    factors beta, beta rk e^G, scale rq e^G, rk e^(G_last - G), e^G_last.  q, k [HV, C, K]
    (bf16 values), gam (the log decay), beta, rq, rk [HV, C]."""
    G = gam.double().cumsum(-1)
    dec = torch.exp(G[:, :, None] - G[:, None, :]).tril()
    kk = k.double() @ k.double().transpose(-1, -2)
    qk = q.double() @ k.double().transpose(-1, -2)
    rk64, rq64, b64 = rk.double(), rq.double(), beta.double()
    A = (kk * dec * (b64 * rk64)[:, :, None] * rk64[:, None, :]).tril(-1)
    eye = torch.eye(C, dtype=F64).expand_as(A)
    T = torch.linalg.solve_triangular(eye + A, eye, upper=False)
    P = qk * dec * (scale * rq64)[:, :, None] * rk64[:, None, :]
    M = P @ T
    eG, GL = torch.exp(G), G[:, -1:]
    f = [b64, b64 * rk64 * eG, scale * rq64 * eG, rk64 * torch.exp(GL - G), torch.exp(GL)]
    return rnd(T.float()), rnd(M.float()), [x.float() for x in f]


def chain(x, lookahead: bool, exact: bool, neg: bool = False):
    """Outputs [T, HV, V] and final states [N, HV, V, K] of the chunked chain, through
    :func:`gdnzoo.prefill_reference.chunked_sequence` with this chain as its chunk step (raw q
    and k: the kernel's products take them so, their norms as factors); ``lookahead``: X of
    chunk c from chunk c - 1; ``neg``: beta = 2 sigmoid(b) (allow_neg_eigval)."""
    rnd = (lambda t: t) if exact else (lambda t: t.to(BF16).float())

    def step_of_a_sequence():
        prev = []                                                  # the chunk before

        def step(S, q, k, v, lg, beta, scale):
            qc, kc = q.transpose(0, 1), k.transpose(0, 1)           # [HV, C, K]
            vc = v.permute(1, 2, 0)                                 # [HV, V, C]
            rq = torch.rsqrt((qc * qc).sum(-1) + 1e-6)
            rk = torch.rsqrt((kc * kc).sum(-1) + 1e-6)
            Tb, Mb, (f0, f1, f2, f3, f4) = prep(qc, kc, lg.clamp_min(LOG_DECAY_MIN).T, beta.T,
                                                scale, rq, rk, rnd)
            sa = rnd(S)
            if lookahead and prev:
                sa_p, va_p, kp, g_p = prev
                X = g_p[:, :, None] * (sa_p @ kc.transpose(-1, -2)) \
                    + va_p @ rnd(kp @ kc.transpose(-1, -2))
            else:
                X = sa @ kc.transpose(-1, -2)                       # [HV, V, C]
            R = vc * f0[:, None, :] - X * f1[:, None, :]
            ra = rnd(R)
            va = rnd((ra @ Tb.transpose(-1, -2)) * f3[:, None, :])
            O = (sa @ qc.transpose(-1, -2)) * f2[:, None, :] + ra @ Mb.transpose(-1, -2)
            prev[:] = (sa, va, kc, f4)
            return O.permute(2, 0, 1), f4[:, :, None] * S + va @ kc
        return step

    return per_sequence(x, step_of_a_sequence, neg)


def per_sequence(x, step_of, neg=False):
    """(outputs, final states) of every sequence of ``x`` by
    :func:`gdnzoo.prefill_reference.chunked_sequence`, each with the chunk step ``step_of()``
    gives (one per sequence: a step may keep the chunk before)."""
    cu = x["cu"].tolist()
    out = torch.zeros(x["v"].shape, dtype=F32)
    final = torch.zeros(x["state"].shape, dtype=F32)
    for n in range(len(cu) - 1):
        b, e = cu[n], cu[n + 1]
        out[b:e], final[n] = chunked_sequence(
            x["q"][b:e], x["k"][b:e], x["v"][b:e], x["state"][n].float(), x["A_log"],
            x["a"][b:e], x["dt_bias"], x["b"][b:e], x["q"].shape[2] ** -0.5, False,
            step_of(), neg=neg)
    return out, final


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="4/8:1x8192,16/32:2x1024")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--neg", action="store_true", help="beta = 2 sigmoid(b) (allow_neg_eigval)")
    a = ap.parse_args()
    print(f"{'cell':14s} {'seed':>4s} {'form':10s} {'out':>9s} {'state':>9s}   (relative RMS "
          f"against float64)")
    for cell in a.cells.split(","):
        geom, mix = cell.split(":")
        H, HV = map(int, geom.split("/"))
        n, L = map(int, mix.split("x"))
        for seed in map(int, a.seeds.split(",")):
            x = {k: t.cpu() for k, t in make([L] * n, H, HV, seed=seed).items()}
            beta = torch.sigmoid(x["b"].double()) * (2.0 if a.neg else 1.0)
            o64, s64 = (t.cpu() for t in oracle(x, True, gates=(gates64(x)[0], beta)))
            for form, la, ex in (("exact", False, True), ("as now", False, False),
                                 ("lookahead", True, False), ("exact la", True, True)):
                o, s = chain(x, la, ex, a.neg)
                o = o if ex else o.to(BF16)
                print(f"{cell:14s} {seed:4d} {form:10s} {rel(o, o64):9.3e} {rel(s, s64):9.3e}",
                      flush=True)


if __name__ == "__main__":
    main()

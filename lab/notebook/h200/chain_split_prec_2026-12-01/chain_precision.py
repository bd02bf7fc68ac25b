"""Which operands of cuda-chunk-bf16's chain products must be split (hi + lo bf16 pairs) for its
state to meet the strict fp32 bound (1e-4 relative)?  CPU emulation, chain_lookahead's algebra."""
from __future__ import annotations
import importlib.util
import sys
import time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.prefill_reference import LOG_DECAY_MIN
from lab.prefill_gpu import make, oracle

_spec = importlib.util.spec_from_file_location(
    "chain_lookahead", Path(__file__).resolve().parent.parent / "lookahead_2026-11-30"
    / "chain_lookahead.py")
LOOKAHEAD = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(LOOKAHEAD)
F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
C = 64

def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())

def b16(t):
    return t.to(BF16).float()

def split(t):
    hi = b16(t)
    return hi, b16(t - hi)

def mm(a, b, sa, sb):
    """a @ b with bf16 operands (fp32 sums); sa/sb: split that operand into hi + lo."""
    A = split(a) if sa else (b16(a), None)
    B = split(b) if sb else (b16(b), None)
    r = A[0] @ B[0]
    if A[1] is not None:
        r = r + A[1] @ B[0]
    if B[1] is not None:
        r = r + A[0] @ B[1]
    return r

def prep(q, k, gam, beta, scale, rq, rk):
    """chain_lookahead.py's prep with no rounding (the products here round per operand)."""
    return LOOKAHEAD.prep(q, k, gam, beta, scale, rq, rk, lambda t: t)


def chain(x, s0, r, tm, va):
    def step(S, q, k, v, lg, beta, scale):
        qc, kc = q.transpose(0, 1), k.transpose(0, 1)
        vc = v.permute(1, 2, 0)
        rq = torch.rsqrt((qc * qc).sum(-1) + 1e-6)
        rk = torch.rsqrt((kc * kc).sum(-1) + 1e-6)
        Tm, Mm, (f0, f1, f2, f3, f4) = prep(qc, kc, lg.clamp_min(LOG_DECAY_MIN).T, beta.T, scale, rq, rk)
        X = mm(S, kc.transpose(-1, -2), s0, False)
        R = vc * f0[:, None, :] - X * f1[:, None, :]
        V = mm(R, Tm.transpose(-1, -2), r, tm) * f3[:, None, :]
        O = mm(S, qc.transpose(-1, -2), s0, False) * f2[:, None, :] + mm(R, Mm.transpose(-1, -2), r, tm)
        return O.permute(2, 0, 1), f4[:, :, None] * S + mm(V, kc, va, False)
    return LOOKAHEAD.per_sequence(x, lambda: step)

cells = sys.argv[1].split(",") if len(sys.argv) > 1 else ["4/8:1x2048"]
forms = {"none (as now)": (0, 0, 0, 0), "S0": (1, 0, 0, 0), "S0+va": (1, 0, 0, 1),
         "S0+va+R": (1, 1, 0, 1), "S0+va+R+TM": (1, 1, 1, 1), "R+TM": (0, 1, 1, 0),
         "S0+R+TM": (1, 1, 1, 0), "va+R+TM": (0, 1, 1, 1)}
for cell in cells:
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    n, L = map(int, mix.split("x"))
    for seed in (0,):
        x = {k: t.cpu() for k, t in make([L] * n, H, HV, seed=seed, device="cpu").items()} if "device" in make.__code__.co_varnames else {k: t.cpu() for k, t in make([L] * n, H, HV, seed=seed).items()}
        t0 = time.time()
        o64, s64 = (t.cpu() for t in oracle(x, True))
        print(f"{cell} oracle {time.time()-t0:.0f}s", flush=True)
        for name, f in forms.items():
            o, s = chain(x, *f)
            print(f"{cell:12s} {name:16s} out {rel(o.to(BF16), o64):.3e} out32 {rel(o, o64):.3e} state {rel(s, s64):.3e}", flush=True)

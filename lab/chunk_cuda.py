"""triton-chunk's sequential kernel against its CUDA form (``lab/chunk_cuda.cu``) on one
workspace: the prep kernel runs once, then each sequential kernel reads what it wrote.  Prints
per cell and variant the kernel's median time (torch.profiler records) and the errors of out
and the final state against float64 (and the two kernels' difference).  Dense, fp32 state,
K = V = 128, C = 64.  From the repository root, on a GPU with cupy:

    python -m lab.chunk_cuda --cells 4/8:1x8192,16/32:8x1024 --variants triton,cuda1,cuda2
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _triton_launch as tlaunch      # noqa: E402
from gdnzoo.backends import triton_chunk as tc             # noqa: E402
from lab.prefill_gpu import make, oracle                   # noqa: E402

SRC = (ROOT / "lab" / "chunk_cuda.cu").read_text()
C, K = 64, 128
# name -> (row groups of 16 state rows, warps a row group, bf16x3 products, the triton
# config's precision); "triton*" is triton-chunk's own sequential kernel
VARIANTS = {"triton": (0, 0, 1, "bf16x3"), "triton_bf16": (0, 0, 0, "bf16")}
for _rg in (1, 2):
    for _wk in (4, 8):
        _n = f"cuda{_rg}" + ("w8" if _wk == 8 else "")
        VARIANTS[_n] = (_rg, _wk, 1, "bf16x3")
        VARIANTS[_n + "_bf16"] = (_rg, _wk, 0, "bf16")
MIXES = {"ragged": [1000, 37, 64, 129, 1, 3000, 0, 65]}


def smem_bytes(rg, p3):
    mw = 4 * C if p3 else 2 * C
    stage = 2 * C * (K + 8) * 2 + C * (mw + 8) * 2 + C * 16 * rg * 2 + 5 * C * 4
    return 2 * stage + rg * (2 * 16 * (K + 8) * 2 + 2 * 2 * 16 * 72 * 2 + C * 16 * 2)


_FN = {}


def cuda_fn(rg, wk, p3, sb, flags=()):
    import cupy as cp
    key = (rg, wk, p3, sb, flags)
    if key not in _FN:
        name = f"chunk_state_cuda<{rg}, {wk}, {p3}, {sb}>"
        opts = ("-std=c++17",) + tuple(f"-DABL_{f.upper()}" for f in flags)
        mod = cp.RawModule(code=SRC, options=opts, name_expressions=[name])
        fn = mod.get_function(name)
        fn.max_dynamic_shared_size_bytes = smem_bytes(rg, p3)
        _FN[key] = fn
    return _FN[key]


def cuda_state(x, mats, vecs, T_all, rg, wk, p3, state, new_state, flags=()):
    q, k, v, out = x["q"], x["k"], x["v"], x["out"]
    T, H, _ = q.shape
    HV, V = v.shape[1], v.shape[2]
    cu = x["cu"].to(torch.int64)
    N = cu.shape[0] - 1
    for t in (q, k, v, out):
        assert t.stride(-1) == 1 and t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0
    sb = int(new_state.dtype == torch.bfloat16)
    fn = cuda_fn(rg, wk, p3, sb, flags)
    ss = state.stride() if state is not None else (0, 0, 0, 0)
    sn = new_state.stride()
    P = np.uint64
    I = np.int64
    args = (P(q.data_ptr()), P(k.data_ptr()), P(v.data_ptr()), P(cu.data_ptr()),
            P(mats.data_ptr()), P(vecs.data_ptr()), P(out.data_ptr()),
            P(state.data_ptr() if state is not None else 0), P(new_state.data_ptr()),
            I(T_all), np.int32(N), np.int32(H), np.int32(HV), np.int32(V),
            I(q.stride(0)), I(q.stride(1)), I(k.stride(0)), I(k.stride(1)),
            I(v.stride(0)), I(v.stride(1)), I(out.stride(0)), I(out.stride(1)),
            *map(I, ss), *map(I, sn))
    fn((N * HV * (V // (16 * rg)),), (32 * wk * rg,), args, shared_mem=smem_bytes(rg, p3))


def prep(x, precision):
    """The prep kernel into a fresh workspace: (mats, vecs, T_all, resolved config)."""
    q = x["q"]
    T, HV, V = q.shape[0], x["v"].shape[1], x["v"].shape[2]
    N = x["cu"].shape[0] - 1
    c = tc.resolve(dict(precision=precision, segments=1), N, HV, V, q.device, tokens=T)
    mats, vecs = tc._workspace(None, max(T, 1), HV, c, q.device)
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                          x["b"], None, None)
    tc.launch_prep(q, x["k"], ga, gb, A_log, dt_bias, x["cu"], mats, vecs, K ** -0.5,
                   True, gates, c)
    return mats.clone(), vecs.clone(), max(T, 1), c


def kernel_median(call, reps, key):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    ts = [e.time_range.elapsed_us() for e in prof.events()
          if e.device_type == torch.autograd.DeviceType.CUDA and key in e.name]
    return statistics.median(ts) if ts else float("nan")


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="4/8:1x8192,16/32:8x1024")
    ap.add_argument("--variants", default="triton,cuda1,cuda2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--oracle", action="store_true", help="errors against float64 too")
    ap.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args()
    sdt = torch.float32 if args.state_dtype == "fp32" else torch.bfloat16
    for cell in args.cells.split(","):
        geom, mix = cell.split(":")
        H, HV = map(int, geom.split("/"))
        if mix in MIXES:
            lens = MIXES[mix]
        else:
            n, L = map(int, mix.split("x"))
            lens = [L] * n
        x = make(lens, H, HV, seed=0, state_dtype=sdt)
        ref = oracle(x, True) if args.oracle else None
        preps = {}
        base = None
        for name in args.variants.split(","):
            # "cuda1:noload+nomma": the kernel compiled with timing ablations (ABL_* in the .cu)
            vname, _, fl = name.partition(":")
            flags = tuple(f for f in fl.split("+") if f)
            rg, wk, p3, prec = VARIANTS[vname]
            if prec not in preps:
                preps[prec] = prep(x, prec)
            mats, vecs, T_all, c = preps[prec]
            ns = torch.full_like(x["new_state"], float("nan"))
            x["out"].fill_(float("nan"))
            if rg == 0:
                def call():
                    tc.launch_state(x["q"], x["k"], x["v"], x["cu"], mats, vecs, x["out"],
                                    x["state"], ns, c)
                key = "chunk_state_kernel"
            else:
                def call():
                    cuda_state(x, mats, vecs, T_all, rg, wk, p3, x["state"], ns, flags)
                key = "chunk_state_cuda"
            call()
            torch.cuda.synchronize()
            out = x["out"].clone()
            line = f"{cell:16s} {name:12s}"
            bad = bool(torch.isnan(out).any() or torch.isnan(ns).any())
            if base is None:
                base = (out, ns.clone())
            else:
                line += f" vs first: out {rel(out, base[0]):.2e} state {rel(ns, base[1]):.2e}"
            if ref is not None:
                line += f" float64: out {rel(out, ref[0]):.2e} state {rel(ns, ref[1]):.2e}"
            t = kernel_median(call, args.reps, key)
            line += f" | {t:8.1f} us" + ("  NaN LEFT" if bad else "")
            if rg == 0:
                line += f" (block_v {c.block_v}, warps {c.warps})"
            print(line, flush=True)


if __name__ == "__main__":
    main()

"""The warpgroup-MMA chain prototype (``wgmma_chain.cu``) against triton-chunk's sequential kernel
with "bf16" products, on one workspace: errors against float64 and against the Triton chain,
then each chain kernel alone (torch.profiler records, medians).  On an sm_90 GPU with cupy,
from the repository root:

    python -m lab.wgmma_chain                               # the default cells
    python -m lab.wgmma_chain --cells 4/8:1x8192 --reps 50
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import triton_chunk as tc
from lab.prefill_gpu import make, oracle
from lab.tma_probe import tensor_map

SOURCE = Path(__file__).with_name("wgmma_chain.cu")
NAME = "gdn_wgmma_chain"
PARAMS = struct.Struct("<5Q7q")     # after the four tensor maps; the struct is padded to 64
ROWS, C, K = 64, 64, 128
STAGE = -(-(2 * C * K * 2 + 3 * C * C * 2 + 4 * C * 4 + 16) // 1024) * 1024
# two stages, two handover buffers (S0 and R in bf16), two output buffers, the barriers
SMEM = 2 * STAGE + 2 * (ROWS * K + ROWS * C) * 2 + 2 * C * 64 * 2 + 1024
THREADS = 288
CELLS = "2/4:1000+64+0+130+7,4/8:1x8192,16/32:1x8192,16/32:8x1024,4/8:16x256"
_sized: set = set()


def kernel(state0: bool, dev: int, no_out: bool = False):
    defs = (("GDN_SMEM", SMEM), ("GDN_STATE0", int(state0)), *((("GDN_NO_OUT", 1),) * no_out))
    kern = cuda_build.get_kernel(SOURCE, NAME, defs, dev)
    if defs not in _sized:
        from cupy_backends.cuda.api import driver
        driver.funcSetAttribute(kern.func, 8, SMEM)     # max dynamic shared memory
        _sized.add(defs)
    return kern.func


def maps(x, mats, out):
    """The five tensor maps: k and q [T, H, K], the workspace rows [T, HV, 2 C], v and ``out``
    [T, HV, V]; boxes of [64 tokens, 1 head, 64 columns]."""
    q, k, v = x["q"], x["k"], x["v"]
    T, H, Kd = q.shape
    HV, V = v.shape[1], v.shape[2]
    box = (64, 1, 64)
    return b"".join((
        tensor_map(k.data_ptr(), (Kd, H, T), (k.stride(1) * 2, k.stride(0) * 2), box),
        tensor_map(q.data_ptr(), (Kd, H, T), (q.stride(1) * 2, q.stride(0) * 2), box),
        tensor_map(mats.data_ptr(), (2 * C, HV, T), (2 * C * 2, HV * 2 * C * 2), box),
        tensor_map(v.data_ptr(), (V, HV, T), (v.stride(1) * 2, v.stride(0) * 2), box),
        tensor_map(out.data_ptr(), (V, HV, T), (out.stride(1) * 2, out.stride(0) * 2), box)))


def launch(x, mats, vecs, out, new_state, tmaps=None, no_out=False):
    q, v, cu, state = x["q"], x["v"], x["cu"], x["state"]
    T, H, _ = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    dev = q.device.index or 0
    body = (tmaps or maps(x, mats, out)) + PARAMS.pack(
        cu.data_ptr(), vecs.data_ptr(), out.data_ptr(), state.data_ptr(), new_state.data_ptr(),
        N, T, out.stride(0), out.stride(1), H, HV, V)
    params = ctypes.create_string_buffer(body + bytes(-len(body) % 64))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    cuda_build.launch_raw(kernel(True, dev, no_out), N * HV * (V // ROWS), THREADS, dev,
                          ctypes.addressof(argv), SMEM)


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def medians(calls: dict, reps: int) -> dict:
    """{name: median kernel time in us} of each call alone, torch.profiler records (every
    record of the call summed per repetition)."""
    res = {}
    for name, call in calls.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                call()
            torch.cuda.synchronize()
        times = [e.time_range.elapsed_us() for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA]
        res[name] = statistics.median(times) if len(times) == reps else float("nan")
    return res


def parse(cell):
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    if "x" in mix:
        n, L = map(int, mix.split("x"))
        return H, HV, [L] * n
    return H, HV, [int(s) for s in mix.split("+")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-out", action="store_true",
                    help="also time the chain without its outputs (GDN_NO_OUT; timing only)")
    args = ap.parse_args()
    print(f"# smem {SMEM} bytes a CTA", flush=True)
    for cell in args.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        T = sum(lens)
        cfg = tc.resolve(dict(precision="bf16"), len(lens), HV, x["v"].shape[2],
                         x["q"].device, tokens=T)._replace(segments=1)
        ws = tc.workspace_for(max(T, 1), HV, cfg)
        mats, vecs = tc._workspace(ws, max(T, 1), HV, cfg, x["q"].device)
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True, config=cfg, workspace=ws)
        ref_out, ref_state = x["out"].clone(), x["new_state"].clone()
        out = torch.full_like(x["out"], float("nan"))
        ns = torch.full_like(x["new_state"], float("nan"))
        launch(x, mats, vecs, out, ns)
        torch.cuda.synchronize()
        o64, s64 = oracle(x, True)
        line = (f"{cell:22s} triton bv{cfg.block_v}: out {rel(ref_out, o64):.3e} state "
                f"{rel(ref_state, s64):.3e} | wgmma: out {rel(out, o64):.3e} state "
                f"{rel(ns, s64):.3e} | wgmma vs triton: out {rel(out, ref_out):.2e} "
                f"state {rel(ns, ref_state):.2e} nan {int(out.isnan().sum() + ns.isnan().sum())}")
        print(line, flush=True)
        if T < 4096:
            continue
        tm = maps(x, mats, out)         # built once: the timed calls are the kernel's
        calls = {
            "triton": lambda: tc.launch_state(x["q"], x["k"], x["v"], x["cu"], mats, vecs,
                                              x["out"], x["state"], x["new_state"], cfg),
            "wgmma": lambda: launch(x, mats, vecs, out, ns, tm),
        }
        if args.no_out:
            calls["wgmma, no outputs (timing only)"] = lambda: launch(x, mats, vecs, out, ns, tm,
                                                                      no_out=True)
        t = medians(calls, args.reps)
        print(f"{cell:22s} chain alone (us): triton bv{cfg.block_v} w{cfg.warps} "
              f"{t.pop('triton'):.1f} | " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)


if __name__ == "__main__":
    main()

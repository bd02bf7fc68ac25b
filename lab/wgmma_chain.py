"""The warpgroup-MMA chain prototype (``wgmma_chain.cu``) against triton-chunk's sequential kernel
with "bf16" products, on one workspace: errors against float64 and against the Triton chain,
then each chain kernel alone (torch.profiler records, medians); with ``--cases``, the state
forms (bf16 states, K-first in place, pools with padding and has_initial_state, separate write
slots, checkpoints, PDL) against triton-chunk called with the same arguments.  On an sm_90 GPU
with cupy, from the repository root:

    python -m lab.wgmma_chain                               # the default cells
    python -m lab.wgmma_chain --cases --cells 4/8:1x8192    # the state forms, then one cell
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
from lab.harness import inlined, profiled

SOURCE = Path(__file__).with_name("wgmma_chain.cu")   # built through lab.harness.inlined
NAME = "gdn_wgmma_chain"
# after the five tensor maps: 9 pointers, then 23 integers; the struct is padded to 64 bytes
PARAMS = struct.Struct("<9Q23q")
ROWS, C, K = 64, 64, 128
STAGE = -(-(2 * C * K * 2 + 3 * C * C * 2 + 4 * C * 4 + 16) // 1024) * 1024
# two stages, two handover buffers (S0 and R in bf16), two output buffers, the barriers
SMEM = 2 * STAGE + 2 * (ROWS * K + ROWS * C) * 2 + 2 * C * 64 * 2 + 1024
THREADS = 288
CELLS = "2/4:1000+64+0+130+7,4/8:1x8192,16/32:1x8192,16/32:8x1024,4/8:16x256"
_sized: set = set()


def kernel(defs: tuple, dev: int):
    defs = (("GDN_SMEM", SMEM), *defs)
    kern = cuda_build.get_kernel(inlined(SOURCE), NAME, defs, dev)
    if defs not in _sized:
        from cupy_backends.cuda.api import driver
        driver.funcSetAttribute(kern.func, 8, SMEM)     # max dynamic shared memory
        _sized.add(defs)
    return kern.func


def maps(q, k, v, mats, out):
    """The five tensor maps: k and q [T, H, K], the workspace rows [T, HV, 2 C], v and ``out``
    [T, HV, V]; boxes of [64 tokens, 1 head, 64 columns]."""
    T, H, Kd = q.shape
    HV, V = v.shape[1], v.shape[2]
    box = (64, 1, 64)
    return b"".join((
        tensor_map(k.data_ptr(), (Kd, H, T), (k.stride(1) * 2, k.stride(0) * 2), box),
        tensor_map(q.data_ptr(), (Kd, H, T), (q.stride(1) * 2, q.stride(0) * 2), box),
        tensor_map(mats.data_ptr(), (2 * C, HV, T), (2 * C * 2, HV * 2 * C * 2), box),
        tensor_map(v.data_ptr(), (V, HV, T), (v.stride(1) * 2, v.stride(0) * 2), box),
        tensor_map(out.data_ptr(), (V, HV, T), (out.stride(1) * 2, out.stride(0) * 2), box)))


def launch(q, k, v, cu, mats, vecs, out, state, new_state, *, state_indices=None,
           new_state_indices=None, null_slot=-1, has_initial_state=None, k_first=False,
           checkpoints=None, checkpoint_every=None, pdl=False, no_out=False, tmaps=None):
    """The chain kernel with triton-chunk's ``launch_state`` arguments (``new_state`` always
    given; ``state`` None: zeros)."""
    from gdnzoo.backends import _triton_launch as tlaunch
    T, H, _ = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    dev = q.device.index or 0
    pool, idx, new_idx, init, src, ss = tc._read_slots(cu, state, new_state, state_indices,
                                                       new_state_indices, has_initial_state,
                                                       k_first)
    ckpt = new_state if checkpoints is None else checkpoints
    code = cuda_build.DTYPE_CODE
    defs = dict(GDN_STATE0=int(state is not None), GDN_POOL=pool,
                GDN_HAS_INIT=int(has_initial_state is not None),
                GDN_CKPT=int(checkpoints is not None), GDN_PDL=int(pdl),
                GDN_S_DT=code[src.dtype], GDN_NS_DT=code[new_state.dtype],
                GDN_C_DT=code[ckpt.dtype], GDN_CU64=int(cu.dtype == torch.int64),
                GDN_IDX64=int(idx.dtype == torch.int64),
                GDN_NIDX64=int(new_idx.dtype == torch.int64), GDN_NO_OUT=int(no_out))
    func = kernel(tuple(sorted(defs.items())), dev)
    body = (tmaps or maps(q, k, v, mats, out)) + PARAMS.pack(
        cu.data_ptr(), vecs.data_ptr(), out.data_ptr(), src.data_ptr(), new_state.data_ptr(),
        idx.data_ptr(), new_idx.data_ptr(), init.data_ptr(), ckpt.data_ptr(),
        N, T, out.stride(0), out.stride(1), H, HV, V, *ss,
        *tlaunch.state_strides(new_state, k_first), *tlaunch.state_strides(ckpt, k_first),
        src.shape[0], new_state.shape[0], null_slot, checkpoint_every or 1)
    params = ctypes.create_string_buffer(body + bytes(-len(body) % 64))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    grid = N * HV * (V // ROWS)
    if pdl:
        from gdnzoo.backends._pdl_launch import PdlConfig
        cuda_build.launch_raw_pdl(PdlConfig(grid, THREADS, SMEM), func, dev,
                                  ctypes.addressof(argv))
    else:
        cuda_build.launch_raw(func, grid, THREADS, dev, ctypes.addressof(argv), SMEM)


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def medians(calls: dict, reps: int) -> dict:
    """{name: median kernel time in us} of each call alone (one kernel a call; NaN when the
    records do not come one a call)."""
    res = {}
    for name, call in calls.items():
        times = [t for v in profiled(call, reps).values() for t in v]
        res[name] = statistics.median(times) if len(times) == reps else float("nan")
    return res


def parse(cell):
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    if "x" in mix:
        n, L = map(int, mix.split("x"))
        return H, HV, [L] * n
    return H, HV, [int(s) for s in mix.split("+")]


def workspace(x, cfg):
    T, HV = x["q"].shape[0], x["v"].shape[1]
    ws = tc.workspace_for(max(T, 1), HV, cfg)
    return ws, *tc._workspace(ws, max(T, 1), HV, cfg, x["q"].device)


def config(x):
    T, N = x["q"].shape[0], x["cu"].shape[0] - 1
    return tc.resolve(dict(precision="bf16"), N, x["v"].shape[1], x["v"].shape[2],
                      x["q"].device, tokens=T)._replace(segments=1)


def both(x, kw_ref, kw_ours, pdl=False):
    """triton-chunk (precision "bf16") with ``kw_ref``, then the chain kernel on its workspace
    with ``kw_ours`` (the same arguments on separate copies)."""
    cfg = config(x)
    ws, mats, vecs = workspace(x, cfg)
    tc.launch(x["q"], x["k"], x["v"], kw_ref.pop("state"), x["A_log"], x["a"], x["dt_bias"],
              x["b"], x["cu"], None, kw_ref.pop("out"), kw_ref.pop("new_state"), True,
              config=cfg, workspace=ws, **kw_ref)
    launch(x["q"], x["k"], x["v"], x["cu"], mats, vecs, kw_ours.pop("out"),
           kw_ours.pop("state"), kw_ours.pop("new_state"), pdl=pdl, **kw_ours)
    torch.cuda.synchronize()


def same(name, pairs):
    """One line: the largest difference of each (what, ours, Triton's) pair, NaNs compared as
    equal where both are NaN."""
    parts = []
    for what, a, b in pairs:
        nan_a, nan_b = a.isnan(), b.isnan()
        diff = float((a.double() - b.double()).abs().nan_to_num(0.0).max()) if a.numel() else 0.0
        parts.append(f"{what} max|diff| {diff:.2e}"
                     + ("" if torch.equal(nan_a, nan_b) else " NaN PLACES DIFFER"))
    print(f"{name:34s} " + " | ".join(parts), flush=True)


def cases():
    """The state forms, each against triton-chunk with the same arguments."""
    lens = [300, 64, 0, 200, 129]
    x = make(lens, 2, 4, seed=3)
    T, HV = x["q"].shape[0], 4
    dev = x["q"].device
    nan = float("nan")

    def outs():
        return torch.full_like(x["out"], nan)

    # dense bf16 state, destination passing (and the same launched with PDL)
    st = x["state"].to(torch.bfloat16)
    for pdl in (False, True):
        ref = dict(state=st, out=outs(), new_state=torch.full_like(st, nan))
        ours = dict(state=st, out=outs(), new_state=torch.full_like(st, nan))
        both(x, dict(ref), dict(ours), pdl)
        same(f"bf16 state{', PDL' if pdl else ''}", [("out", ours["out"], ref["out"]),
                                                     ("state", ours["new_state"],
                                                      ref["new_state"])])
    # K-first fp32 state in place
    kf = x["state"].transpose(-1, -2).contiguous()
    ref = dict(state=kf.clone(), out=outs())
    ours = dict(state=kf.clone(), out=outs())
    ref["new_state"], ours["new_state"] = ref["state"], ours["state"]
    both(x, dict(ref, k_first=True), dict(ours, k_first=True))
    same("K-first in place", [("out", ours["out"], ref["out"]),
                              ("state", ours["state"], ref["state"])])
    # a pool in place: padding by -1 and null_slot, has_initial_state, int32 indices
    pool = torch.randn(7, HV, 128, 128, device=dev) * 0.05
    idx = torch.tensor([3, -1, 5, 0, 6], dtype=torch.int32, device=dev)
    init = torch.tensor([True, True, False, True, True], device=dev)
    kw = dict(state_indices=idx, null_slot=6, has_initial_state=init)
    ref = dict(state=pool.clone(), out=outs())
    ours = dict(state=pool.clone(), out=outs())
    ref["new_state"], ours["new_state"] = ref["state"], ours["state"]
    both(x, dict(ref, **kw), dict(ours, **kw))
    same("pool in place, padding", [("out", ours["out"], ref["out"]),
                                    ("pool", ours["state"], ref["state"])])
    # separate write slots in a bf16 pool, int64 indices
    wpool = torch.full((9, HV, 128, 128), nan, device=dev).to(torch.bfloat16)
    widx = torch.tensor([8, 2, 1, -1, 4], dtype=torch.int64, device=dev)
    kw = dict(state_indices=idx.long(), new_state_indices=widx)
    ref = dict(state=pool, out=outs(), new_state=wpool.clone())
    ours = dict(state=pool, out=outs(), new_state=wpool.clone())
    both(x, dict(ref, **kw), dict(ours, **kw))
    same("separate write slots, bf16", [("out", ours["out"], ref["out"]),
                                        ("pool", ours["new_state"], ref["new_state"])])
    # checkpoints every 128 tokens (lengths that do and do not end on one), no initial state
    ck_r = torch.full((T // 128, HV, 128, 128), nan, device=dev)
    ck_o = ck_r.clone()
    ref = dict(state=None, out=outs(), new_state=torch.full_like(x["state"], nan))
    ours = dict(state=None, out=outs(), new_state=torch.full_like(x["state"], nan))
    both(x, dict(ref, checkpoints=ck_r, checkpoint_every=128),
         dict(ours, checkpoints=ck_o, checkpoint_every=128))
    same("checkpoints, no initial state", [("out", ours["out"], ref["out"]),
                                           ("state", ours["new_state"], ref["new_state"]),
                                           ("checkpoints", ck_o, ck_r)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS, help="H/HV:mix list, or none")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-out", action="store_true",
                    help="also time the chain without its outputs (GDN_NO_OUT; timing only)")
    ap.add_argument("--cases", action="store_true",
                    help="first the state forms against triton-chunk with the same arguments")
    args = ap.parse_args()
    print(f"# smem {SMEM} bytes a CTA", flush=True)
    if args.cases:
        cases()
    for cell in (c for c in args.cells.split(",") if c not in ("", "none")):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        T = sum(lens)
        out = torch.full_like(x["out"], float("nan"))
        ns = torch.full_like(x["new_state"], float("nan"))
        ref = dict(state=x["state"], out=x["out"], new_state=x["new_state"])
        both(x, dict(ref), dict(state=x["state"], out=out, new_state=ns))
        o64, s64 = oracle(x, True)
        cfg = config(x)
        line = (f"{cell:22s} triton bv{cfg.block_v}: out {rel(x['out'], o64):.3e} state "
                f"{rel(x['new_state'], s64):.3e} | wgmma: out {rel(out, o64):.3e} state "
                f"{rel(ns, s64):.3e} | wgmma vs triton: out {rel(out, x['out']):.2e} "
                f"state {rel(ns, x['new_state']):.2e} nan "
                f"{int(out.isnan().sum() + ns.isnan().sum())}")
        print(line, flush=True)
        if T < 4096:
            continue
        ws, mats, vecs = workspace(x, cfg)
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True, config=cfg, workspace=ws)
        tm = maps(x["q"], x["k"], x["v"], mats, out)   # built once: the timed calls are kernels
        args_ours = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)
        calls = {
            "triton": lambda: tc.launch_state(x["q"], x["k"], x["v"], x["cu"], mats, vecs,
                                              x["out"], x["state"], x["new_state"], cfg),
            "wgmma": lambda: launch(*args_ours, tmaps=tm),
        }
        if args.no_out:
            calls["wgmma, no outputs (timing only)"] = lambda: launch(*args_ours, tmaps=tm,
                                                                      no_out=True)
        t = medians(calls, args.reps)
        print(f"{cell:22s} chain alone (us): triton bv{cfg.block_v} w{cfg.warps} "
              f"{t.pop('triton'):.1f} | " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)


if __name__ == "__main__":
    main()

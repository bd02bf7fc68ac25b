"""Segmented chains, CUDA against Triton, buffer by buffer: the outputs (obuf, bf16 since
the segments keep them so; fp32 when the notebook's first runs were made) and final tiles
(fbuf) of cuda-chunk-bf16's GDN_SEG chain kernel and triton-chunk's cp_chain_kernel on one
workspace, max |diff| by role, sequence and segment; ``--time``: the CUDA chain kernel alone
at 1, 2, 3, 4 segments, with and without its outputs.  On an sm_90 GPU:

    python -m lab.seg_debug [--time 4,8:8192]
"""
from __future__ import annotations

import statistics
import sys

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends._triton_chunk_cp import cp_chain_kernel
from lab.harness import profiled
from lab.prefill_gpu import make
from lab.wgmma_chain import config, workspace


def diff(a, b):
    """|a - b|, zero where both are NaN (never written), 99 where one is."""
    both = a.isnan() & b.isnan()
    return (a - b).abs().nan_to_num(99.0).masked_fill(both, 0.0)


def run(lens, S, with_state, seed=0, kfirst_pool=False):
    """``pool``: a k-first pool of 6 slots, slots [4, 1, -1, 5], null slot 5, has_initial_state
    [1, 0, 1, 1] (four sequences)."""
    x = make(lens, 2, 4, seed=seed)
    cfg = config(x)
    ws, mats, vecs = workspace(x, cfg)
    tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
              x["cu"], None, x["out"], x["new_state"], True, config=cfg, workspace=ws)
    q, k, v, cu = x["q"], x["k"], x["v"], x["cu"]
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    state = x["state"] if with_state else None
    kw = {}
    if kfirst_pool:
        state = (torch.randn(6, HV, V, K, device=v.device) * 0.05).transpose(-1, -2)
        state = state.contiguous()
        kw = dict(state_indices=torch.tensor([4, 1, -1, 5], dtype=torch.int32, device=v.device),
                  has_initial_state=torch.tensor([True, False, True, True], device=v.device))
    pool, idx, new_idx, init, src, ss = tlaunch.chain_slots(
        cu, state, x["new_state"] if state is None else state, kw.get("state_indices"), None,
        kw.get("has_initial_state"), kfirst_pool)
    null = 5 if kfirst_pool else -1
    zero_row = torch.zeros(V, dtype=v.dtype, device=v.device)
    bufs = []
    for kind in ("triton", "cuda"):
        # bf16, as triton-chunk's segments keep them with "bf16" products and bf16 outputs
        obuf = torch.full((2, T, HV, V), float("nan"), dtype=torch.bfloat16, device=v.device)
        fbuf = torch.full((2, N, S, HV, V, K), float("nan"), device=v.device)
        if kind == "cuda":
            chain.launch(q, k, v, cu, mats, vecs, obuf, state, fbuf, segments=S, null_slot=null,
                         k_first=kfirst_pool, **kw)
        else:
            cp_chain_kernel[((2 * S - 1) * N * HV * (V // cfg.block_v),)](
                q, k, v, zero_row, cu, mats, vecs, obuf, src, fbuf, idx, new_idx, init,
                N, T, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                v.stride(1), *ss, src.shape[0], src.shape[0], null, H, HV, K, V, cfg.chunk,
                cfg.block_v, cfg.precision, S, pool, int(state is not None), int(bool(kw)),
                cfg.stages, cfg.v_ahead, num_warps=cfg.warps, num_stages=cfg.stages)
        torch.cuda.synchronize()
        bufs.append((obuf, fbuf))
    (ot, ft), (oc, fc) = bufs
    print(f"lens {lens} S {S} state {with_state}")
    for role in range(2):
        for n in range(N):
            for s in range(S):
                d = diff(ft[role, n, s], fc[role, n, s])
                print(f"  fbuf role {role} seq {n} seg {s}: max |diff| {float(d.max()):.3e} "
                      f"(nan t {int(ft[role, n, s].isnan().sum())} c "
                      f"{int(fc[role, n, s].isnan().sum())})")
    for role in range(2):
        for n in range(N):
            b, e = int(cu[n]), int(cu[n + 1])
            if e > b:
                d = diff(ot[role, b:e], oc[role, b:e])
                rows = d.amax(dim=(1, 2))
                bad = (rows > 0).nonzero().flatten()
                print(f"  obuf role {role} seq {n}: max |diff| {float(d.max()):.3e}, tokens "
                      f"differing {bad.numel()} first {bad[:3].tolist()}")


def timing(cell, reps=20):
    """``cell``: H,HV:len[xN] (N sequences of len; segments only for N = 1)."""
    heads, mix = cell.split(":")
    H, HV = map(int, heads.split(","))
    n, _, copies = mix.partition("x")
    x = make([int(n)] * int(copies or 1), H, HV, seed=0)
    cfg = config(x)
    ws, mats, vecs = workspace(x, cfg)
    tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
              x["cu"], None, x["out"], x["new_state"], True, config=cfg, workspace=ws)
    T, V, K = x["q"].shape[0], x["v"].shape[2], x["q"].shape[2]
    for S in (1, 2, 3, 4) if not copies else (1,):
        for no_out in (False, True):
            if S == 1:
                obuf, fbuf = x["out"], x["new_state"]
            else:
                obuf = torch.empty(2, T, HV, V, dtype=torch.bfloat16, device="cuda")
                fbuf = torch.empty(2, 1, S, HV, V, K, device="cuda")
            by = profiled(lambda: chain.launch(x["q"], x["k"], x["v"], x["cu"], mats, vecs, obuf,
                                               x["state"], fbuf, segments=S, no_out=no_out),
                          reps)
            t = statistics.median([v for vs in by.values() for v in vs])
            print(f"{cell} segments {S} {'no outputs' if no_out else 'outputs'}: {t:.1f} us",
                  flush=True)


def full_chains(no_ident: bool):
    """The chain kernel with every segment task running its sequence's whole chain (``per`` =
    all chunks): the segmented form's code at the unsegmented form's work (timing only);
    ``no_ident``: no task an identity chain."""
    import tempfile
    from pathlib import Path
    src = chain.SOURCE.read_text()
    edits = [("c0 = bos + j0 * C_;", "(void)j0;"), ("n_chunks = j1 - j0;", "(void)j1;")]
    if no_ident:
        edits.append(("const bool ident = task >= GDN_SEG;", "const bool ident = false;"))
    for old, new in edits:
        assert old in src
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "chain_full.cu"
    path.write_text(src)
    chain.SOURCE = path


def first_tasks(n: int, programs: int):
    """Launch only the first ``n`` tasks of a segmented grid (timing only)."""
    from gdnzoo.backends import _cuda_build as cuda_build
    raw = cuda_build.launch_raw

    def launch_raw(func, grid, *a, **kw):
        raw(func, min(grid, n * programs), *a, **kw)
    cuda_build.launch_raw = launch_raw


if __name__ == "__main__":
    if "--full" in sys.argv:
        full_chains("--no-ident" in sys.argv)
    if "--tasks" in sys.argv:
        first_tasks(int(sys.argv[sys.argv.index("--tasks") + 1]), 16)
    if "--time" in sys.argv:
        for cell in sys.argv[sys.argv.index("--time") + 1].split(";"):
            timing(cell)
        sys.exit()
    for with_state in (False, True):
        run([3000, 70, 0, 1200], 2, with_state)
    run([1000], 2, True)
    run([3000, 70, 0, 1200], 2, True, kfirst_pool=True)

"""A prototype of context parallelism for triton-chunk (dense, fp32 k-last state, K = V): a
sequence's chunks cut into S segments whose chains run side by side, then joined.

Why: one long sequence runs its chunks one after another on N * HV * V / block_v programs (64
at 4/8 heads, half an H200's SMs), 2.5 us a chunk step (lab/notebook/h200/NOTES.md).

How.  The state update of a token is S <- S A_t + beta_t v_t k_t^T with A_t = alpha_t (I -
beta_t k_t k_t^T) [K, K], so over a segment S_end = S_start Phi + Z, where Z is the segment run
from a zero state and Phi = A_1 ... A_L is the same chain run on the identity [K, K] as its
state with v = 0 (the "identity chain").  The identity chain's outputs are Phi_t q_t scale, so
a token's output is o_t = S_start (Phi_t q_t scale) + o^Z_t.  Here:

1. the product's prep kernel, unchanged (its workspace is per token, so any cut at a chunk
   boundary reads it as is);
2. one launch of :func:`cp_state_kernel`: per sequence, segment 0 from the real state, the
   others from zeros, and the identity chain of every segment but the first, each (segment,
   head, V-tile) its own program, outputs and final states into fp32 buffers;
3. in torch: the segments' start states in order (S - 1 products of [V, K] by [K, K] per
   sequence and head) and each later segment's output correction.

Nothing here is in the product.  From the repository root:

    TRITON_INTERPRET=1 python -m lab.chunk_cp --check          # CPU: small shapes vs float64
    python -m lab.chunk_cp --check                             # GPU: K = V = 128
    python -m lab.chunk_cp --time --cells 4/8:1x8192,4/8:1x32768 --segments 1,2,4 --configs 16/8,16/4

Checked on CPU only so far (Triton interpreter, K = V = 64, S = 1..4: the state's error against
float64 as triton-chunk's, S = 1 identical to it); not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton                                                   # noqa: E402
import triton.language as tl                                    # noqa: E402

from gdnzoo.backends import _triton_launch as tlaunch          # noqa: E402
from gdnzoo.backends import triton_chunk as tc                 # noqa: E402
from gdnzoo.backends._triton_chunk_kernel import INTERPRETED, chunk_step  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def cp_state_kernel(q, k, v, zv, cu_seqlens, mats, vecs, obuf, state, fbuf, N, T_all,
                    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, ss_n, ss_h, ss_v, ss_k,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    C: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, S: tl.constexpr,
                    STAGES: tl.constexpr):
    # Task t < S: segment t's real chain; t >= S: segment t - S + 1's identity chain.  The
    # V-tiles of one head neighbour each other (they read the same rows).
    NV: tl.constexpr = V // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    rest = pid // NV
    i_hv = rest % HV
    rest = rest // HV
    i_n = rest % N
    task = rest // N
    real = task < S
    seg = tl.where(real, task, task - S + 1)
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    n_chunks = tl.cdiv(eos - bos, C)
    per = tl.cdiv(n_chunks, S)
    j0 = tl.minimum(seg * per, n_chunks)
    j1 = tl.minimum(j0 + per, n_chunks)
    rows_v = i_v * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    if real:
        h = tl.load(state + i_n * ss_n + i_hv * ss_h + rows_v[:, None] * ss_v
                    + cols[None, :] * ss_k, mask=seg == 0, other=0.0).to(tl.float32)
        vb = v
        svt = sv_t
        svh = sv_h
    else:
        h = (rows_v[:, None] == cols[None, :]).to(tl.float32)     # K == V: the identity rows
        vb = zv                                                   # one zero row, read for all
        svt = sv_t * 0
        svh = sv_h * 0
    role = tl.where(real, 0, 1).to(tl.int64)
    ob = obuf + role * T_all * HV * V                              # [2, T, HV, V] fp32
    rd = i_v >= 0
    if INTERPRETED:
        j = j0
        while j < j1:
            h = chunk_step(h, None, bos + j * C, eos, q, k, vb, mats, vecs, ob, T_all, i_h, i_hv,
                           rows_v, rd, sq_t, sq_h, sk_t, sk_h, svt, svh, HV * V, V, HV, K, C,
                           PREC)
            j += 1
    else:
        for j in tl.range(j0, j1, num_stages=STAGES):
            h = chunk_step(h, None, bos + j * C, eos, q, k, vb, mats, vecs, ob, T_all, i_h, i_hv,
                           rows_v, rd, sq_t, sq_h, sk_t, sk_h, svt, svh, HV * V, V, HV, K, C,
                           PREC)
    # [2, N, S, HV, V, K] fp32: the segment's final state (role 0) or its Phi (role 1)
    fb = fbuf + ((role * N + i_n) * S + seg) * (HV * V * K) + i_hv * (V * K)
    tl.store(fb + rows_v[:, None] * K + cols[None, :], h)


def prefill_cp(x, S: int, config=None, l2: bool = True, stages: tuple | None = None):
    """(out [T, HV, V] in q's dtype, final [N, HV, V, K] fp32) of triton-chunk's math with each
    sequence cut into ``S`` segments.  ``stages``: a list that receives the torch.cuda events
    around the three steps (timing)."""
    q, k, v = x["q"], x["k"], x["v"]
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    assert K == V, "the identity chain's rows are the state's V rows: K == V only"
    cu, state = x["cu"], x["state"]
    N = cu.shape[0] - 1
    c = tc.resolve(config, N, HV, V, q.device)
    C = c.chunk
    scale = 1.0 / math.sqrt(K)
    _, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"], x["b"],
                                                      None, None)
    mats, vecs = tc._workspace(None, max(T, 1), HV, c, q.device)
    mark = (lambda: stages.append(torch.cuda.Event(enable_timing=True)) or stages[-1].record()) \
        if stages is not None else (lambda: None)
    mark()
    tc.launch_prep(q, k, ga, gb, A_log, dt_bias, cu, mats, vecs, scale, l2, 0, c)
    mark()
    obuf = torch.empty(2, T, HV, V, dtype=torch.float32, device=q.device)
    fbuf = torch.empty(2, N, S, HV, V, K, dtype=torch.float32, device=q.device)
    zv = torch.zeros(V, dtype=v.dtype, device=q.device)
    grid = (2 * S - 1) * N * HV * (V // c.block_v)
    cp_state_kernel[(grid,)](
        q, k, v, zv, cu, mats, vecs, obuf, state, fbuf, N, T,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *state.stride(), H, HV, K, V, C, c.block_v, c.precision, S, c.stages,
        num_warps=c.warps, num_stages=c.stages)
    mark()
    out, final = join(obuf, fbuf, cu, S, C)
    mark()
    return out.to(q.dtype), final


def join(obuf, fbuf, cu, S: int, C: int):
    """The segments' start states in order and each later segment's output correction."""
    out = obuf[0].clone()
    Z, Phi = fbuf[0], fbuf[1]                   # [N, S, HV, V, K], [N, S, HV, K, K]
    start = Z[:, 0]                             # the state after segment 0
    bounds = cu.tolist()
    for s in range(1, S):
        for n in range(len(bounds) - 1):
            nc = -(-(bounds[n + 1] - bounds[n]) // C)
            per = -(-nc // S)
            a = bounds[n] + min(s * per, nc) * C
            b = min(bounds[n] + min(s * per + per, nc) * C, bounds[n + 1])
            if b > a:
                out[a:b] += torch.einsum("hvk,thk->thv", start[n], obuf[1, a:b])
        start = torch.matmul(start, Phi[:, s]) + Z[:, s]
    return out, start


def check():
    """Outputs and final states against float64 (lab.prefill_gpu's oracle) and against
    triton-chunk itself, over lengths around the chunk size and several segment counts."""
    from lab.prefill_gpu import make, oracle
    import lab.prefill_gpu as pg
    if DEV == "cpu":
        pg.K = pg.V = 64
    cases = [([130, 64, 0, 200], 1, 2), ([1000], 2, 4), ([333, 64, 65], 2, 2)]
    if DEV == "cuda":
        cases += [([8192], 4, 8), ([3000, 5000], 16, 32)]
    worst = 0.0
    for lens, H, HV in cases:
        x = make(lens, H, HV, seed=len(lens))
        ref_o, ref_s = oracle(x, True)
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True)
        for S in (1, 2, 3, 4):
            o, s = prefill_cp(x, S)
            e = [float((got.double() - want).norm() / want.norm())
                 for got, want in ((o, ref_o), (s, ref_s))]
            d = float((s - x["new_state"].float()).norm() / x["new_state"].float().norm())
            worst = max(worst, e[1])
            print(f"lens {lens} H/HV {H}/{HV} S={S}: out {e[0]:.2e} state {e[1]:.2e} "
                  f"(triton-chunk's state within {d:.1e})", flush=True)
    print(f"worst state error {worst:.2e}")
    return worst


def time_cells(cells, segments, configs, reps):
    """CUDA events around the three steps, medians of ``reps`` calls.  ``configs``: (block_v,
    warps) pairs; 4 warps at 16 rows may let two programs share an SM (the segments and
    identity chains are more programs than SMs past S = 2 at 4/8 heads)."""
    from lab.prefill_gpu import make
    for cell in cells:
        geom, mix = cell.split(":")
        H, HV = map(int, geom.split("/"))
        n, L = map(int, mix.split("x"))
        x = make([L] * n, H, HV, seed=0)
        for bv, warps in configs:
            for S in segments:
                per = []
                for _ in range(reps + 3):
                    ev = []
                    prefill_cp(x, S, config=dict(block_v=bv, warps=warps), stages=ev)
                    torch.cuda.synchronize()
                    per.append([ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(3)])
                med = [statistics.median(p[i] for p in per[3:]) for i in range(3)]
                print(f"{cell:14s} block_v {bv} warps {warps} S={S}: prep {med[0]:7.1f} us  "
                      f"chains {med[1]:7.1f} us  join (torch) {med[2]:7.1f} us", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--cells", default="4/8:1x8192,4/8:1x32768,2/8:1x8192")
    ap.add_argument("--segments", default="1,2,3,4")
    ap.add_argument("--configs", default="16/8,16/4", help="block_v/warps pairs")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if a.check or not a.time:
        check()
    if a.time:
        configs = [tuple(map(int, c.split("/"))) for c in a.configs.split(",")]
        time_cells(a.cells.split(","), [int(s) for s in a.segments.split(",")], configs, a.reps)


if __name__ == "__main__":
    main()

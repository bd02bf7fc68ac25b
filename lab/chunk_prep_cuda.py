"""triton-chunk's prep kernel against cuda-chunk's (``backends/cuda_chunk_prep.cu``): both write a
workspace for the same inputs; prints the two workspaces' difference (T^T and M^T as hi + lo,
the per-token factors), the errors of triton-chunk's sequential kernel run on each against
float64, and each prep kernel's median time (torch.profiler records).  Dense, raw gates,
K = V = 128, C = 64, "bf16x3".  From the repository root, on a GPU with cupy:

    python -m lab.chunk_prep_cuda --cells 4/8:1x8192,16/32:1x8192 [--oracle]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _triton_launch as tlaunch      # noqa: E402
from gdnzoo.backends import triton_chunk as tc             # noqa: E402
from lab.chunk_ablate import kernel_medians                # noqa: E402
from lab.harness import rel                              # noqa: E402
from lab.prefill_gpu import make, oracle                   # noqa: E402

C, K = 64, 128
MIXES = {"ragged": [1000, 37, 64, 129, 1, 3000, 0, 65]}


def prep(x, precision):
    """triton-chunk's prep kernel into a fresh workspace: (mats, vecs, T_all, resolved config)."""
    q = x["q"]
    T, HV, V = q.shape[0], x["v"].shape[1], x["v"].shape[2]
    c = tc.resolve(dict(precision=precision, segments=1), x["cu"].shape[0] - 1, HV, V,
                   q.device, tokens=T)
    mats, vecs = tc._workspace(None, max(T, 1), HV, c, q.device)
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                          x["b"], None, None)
    tc.launch_prep(q, x["k"], ga, gb, A_log, dt_bias, x["cu"], mats, vecs, K ** -0.5, True,
                   gates, c)
    return mats.clone(), vecs.clone(), max(T, 1), c


def cuda_prep(x, mats, vecs, T_all, heads=None):
    """cuda-chunk's prep kernel (backends/cuda_chunk_prep.cu) into (mats, vecs), ``heads`` value
    heads a CTA (None: its pick)."""
    from gdnzoo.backends import _cuda_chunk_prep
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                          x["b"], None, None)
    c = tc.normalize(None)
    _cuda_chunk_prep.launch(x["q"], x["k"], ga, gb, A_log, dt_bias, x["cu"], mats, vecs,
                            K ** -0.5, True, gates, c, heads=heads)


def as_f32(mats, T, HV):
    """[T, HV, 2, C] fp32 (T^T, M^T) from the bf16 hi/lo rows."""
    m = mats.view(T, HV, 2, 2, C).float()
    return m[:, :, :, 0] + m[:, :, :, 1]


def cell_inputs(cell, seed=0):
    """The inputs (lab.prefill_gpu.make) of a cell "H/HV:mix", the mix NxL or one of
    :data:`MIXES`."""
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    lens = MIXES.get(mix) or [int(mix.split("x")[1])] * int(mix.split("x")[0])
    return make(lens, H, HV, seed=seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="4/8:1x8192,16/32:1x8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--oracle", action="store_true")
    ap.add_argument("--heads", default="",
                    help="comma list of value heads a CTA to time beside the pick (each checked "
                         "bit-identical to one head a CTA)")
    args = ap.parse_args()
    for cell in args.cells.split(","):
        x = cell_inputs(cell)
        T, HV = x["q"].shape[0], x["v"].shape[1]
        mats_t, vecs_t, T_all, c = prep(x, "bf16x3")
        mats = torch.full_like(mats_t, float("nan"))
        vecs = torch.full_like(vecs_t, float("nan"))
        cuda_prep(x, mats, vecs, T_all)
        torch.cuda.synchronize()
        mt, mc = as_f32(mats_t, T, HV), as_f32(mats, T, HV)
        vt, vc = vecs_t.view(HV, 5, T), vecs.view(HV, 5, T)
        line = (f"{cell:14s} workspace vs triton: T^T {rel(mc[:, :, 0], mt[:, :, 0]):.2e} "
                f"M^T {rel(mc[:, :, 1], mt[:, :, 1]):.2e} vecs "
                + " ".join(f"{rel(vc[:, i], vt[:, i]):.1e}" for i in range(5))
                + f" nan {int(torch.isnan(mc).sum())}/{int(torch.isnan(vc).sum())}")
        print(line, flush=True)
        if args.oracle:
            ref = oracle(x, True)
            for name, (m_, v_) in (("triton prep", (mats_t, vecs_t)), ("cuda prep", (mats, vecs))):
                ns = torch.full_like(x["new_state"], float("nan"))
                tc.launch_state(x["q"], x["k"], x["v"], x["cu"], m_, v_, x["out"], x["state"],
                                ns, c)
                torch.cuda.synchronize()
                print(f"{cell:14s} {name:12s} then triton's state kernel, float64: out "
                      f"{rel(x['out'], ref[0]):.2e} state {rel(ns, ref[1]):.2e}", flush=True)
        gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                              x["b"], None, None)

        def tprep():
            tc.launch_prep(x["q"], x["k"], ga, gb, A_log, dt_bias, x["cu"], mats_t, vecs_t,
                           K ** -0.5, True, gates, c)
        tt = kernel_medians(tprep, args.reps)["prep"]
        tcu = kernel_medians(lambda: cuda_prep(x, mats, vecs, T_all), args.reps)["prep"]
        print(f"{cell:14s} prep kernel: triton {tt:8.1f} us   cuda {tcu:8.1f} us   "
              f"({tt / tcu:.2f}x)", flush=True)
        gva = HV // x["q"].shape[1]
        heads = [int(h) for h in args.heads.split(",") if h and gva % int(h) == 0]
        if heads:
            one = [torch.full_like(mats, float("nan")), torch.full_like(vecs, float("nan"))]
            cuda_prep(x, *one, T_all, heads=1)
            parts = []
            for h in heads:
                got = [torch.full_like(mats, float("nan")), torch.full_like(vecs, float("nan"))]
                cuda_prep(x, *got, T_all, heads=h)
                torch.cuda.synchronize()
                same = all(torch.equal(a.nan_to_num(0), b.nan_to_num(0))
                           and torch.equal(a.isnan(), b.isnan()) for a, b in zip(got, one))
                t = kernel_medians(lambda: cuda_prep(x, *got, T_all, heads=h), args.reps)["prep"]
                parts.append(f"heads {h}: {t:7.1f} us{'' if same else ' DIFFERS from heads 1'}")
            print(f"{cell:14s} cuda prep " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()

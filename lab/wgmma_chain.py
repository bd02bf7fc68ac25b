"""cuda-chunk-bf16's sequential kernel (``backends/cuda_chunk_chain.cu``, warpgroup MMAs and
TMA) against triton-chunk's with "bf16" products, on one workspace: errors against float64 and
against the Triton chain, then each chain kernel alone (torch.profiler records, medians).  The
state forms against triton-chunk: tests/test_cuda_chunk_chain.py.  On an sm_90 GPU with cupy, from the repository
root:

    python -m lab.wgmma_chain                               # the default cells
    python -m lab.wgmma_chain --no-out --cells 4/8:1x8192   # also the chain without outputs
"""
from __future__ import annotations

import argparse
import statistics

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import triton_chunk as tc
from lab.prefill_gpu import make, oracle
from lab.harness import profiled, rel

CELLS = "2/4:1000+64+0+130+7,4/8:1x8192,16/32:1x8192,16/32:8x1024,4/8:16x256"


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


def both(x, kw_ref, kw_ours):
    """triton-chunk (precision "bf16") with ``kw_ref``, then the chain kernel on its workspace
    with ``kw_ours`` (the same arguments on separate copies)."""
    cfg = config(x)
    ws, mats, vecs = workspace(x, cfg)
    tc.launch(x["q"], x["k"], x["v"], kw_ref.pop("state"), x["A_log"], x["a"], x["dt_bias"],
              x["b"], x["cu"], None, kw_ref.pop("out"), kw_ref.pop("new_state"), True,
              config=cfg, workspace=ws, **kw_ref)
    chain.launch(x["q"], x["k"], x["v"], x["cu"], mats, vecs, kw_ours.pop("out"),
                 kw_ours.pop("state"), kw_ours.pop("new_state"), **kw_ours)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS, help="H/HV:mix list, or none")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-out", action="store_true",
                    help="also time the chain without its outputs (GDN_NO_OUT; timing only)")
    args = ap.parse_args()
    print(f"# smem {chain.SMEM} bytes a CTA", flush=True)
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
        args_ours = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)
        calls = {
            "triton": lambda: tc.launch_state(x["q"], x["k"], x["v"], x["cu"], mats, vecs,
                                              x["out"], x["state"], x["new_state"], cfg),
            "wgmma": lambda: chain.launch(*args_ours),
        }
        if args.no_out:
            calls["wgmma, no outputs (timing only)"] = lambda: chain.launch(*args_ours,
                                                                            no_out=True)
        t = medians(calls, args.reps)
        print(f"{cell:22s} chain alone (us): triton bv{cfg.block_v} w{cfg.warps} "
              f"{t.pop('triton'):.1f} | " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)


if __name__ == "__main__":
    main()

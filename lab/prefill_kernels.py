"""The kernels of one eager gdnzoo.prefill call, each timed alone (torch.profiler records,
medians over calls): where a cell's time goes, kernel by kernel.  On a GPU:

    python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --heads 4,8 --lens 8192
"""
from __future__ import annotations

import argparse
import statistics

import torch

import gdnzoo
from gdnzoo.inputs import make_prefill_inputs
from lab.harness import profiled


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", default="cuda-chunk-bf16,triton-chunk-bf16")
    ap.add_argument("--cells", default="4,8:8192", help="H,HV:len+len+...; several with ';'")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    for cell in args.cells.split(";"):
        heads, lens = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make_prefill_inputs([int(n) for n in lens.split("+")], H=H, HV=HV, device="cuda")
        out, new = torch.empty_like(x.v), torch.empty_like(x.state)
        for algo in args.algo.split(","):
            def call():
                gdnzoo.prefill(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b,
                               x.cu_seqlens, out=out, new_state=new, use_qk_l2norm=True,
                               algo=algo)
            by = profiled(call, args.reps)
            med = {name: statistics.median(t) for name, t in by.items()}
            total = sum(statistics.median(t) * len(t) / args.reps for t in by.values())
            print(f"{cell} {algo}: {total:.1f} us of kernels a call: " + ", ".join(
                f"{name[:40]} {m:.1f} (x{len(by[name]) // args.reps})"
                for name, m in sorted(med.items(), key=lambda kv: -kv[1])), flush=True)


if __name__ == "__main__":
    main()

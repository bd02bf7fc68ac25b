"""Where an eager gdnzoo.prefill call's host time goes (GPU machine): cProfile over back-to-back
calls of each named entry on one cell, the top functions by own time.  ``--vary``: every timed
call a new token count (the last sequence one token shorter each call, as a server's prompts
differ), so each call's signature is new to the dispatcher.

    python3 -m lab.host_prefill --algo cuda-chunk-bf16,triton-chunk-bf16 --lens 8192 [--vary]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

import gdnzoo
from gdnzoo.inputs import make_prefill_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", default="cuda-chunk-bf16,triton-chunk-bf16")
    ap.add_argument("--lens", default="8192", help="sequence lengths, comma-separated")
    ap.add_argument("--heads", default="4,8")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=14, help="functions listed a table")
    ap.add_argument("--vary", action="store_true", help="a new token count every call")
    args = ap.parse_args()
    H, HV = map(int, args.heads.split(","))
    x = make_prefill_inputs([int(n) for n in args.lens.split(",")], H=H, HV=HV, device="cuda")
    out, new = torch.empty_like(x.v), torch.empty_like(x.state)
    T = x.q.shape[0]
    cut = list(range(3 * args.calls + 21)) if args.vary else [0]
    cus = []
    for i in cut:
        cu = x.cu_seqlens.clone()
        cu[-1] -= i
        cus.append(cu)
    for algo in args.algo.split(","):
        step = iter(range(10**9))

        def call():
            i = next(step) % len(cut)
            n = T - cut[i]
            gdnzoo.prefill(x.q[:n], x.k[:n], x.v[:n], x.state, x.A_log, x.a[:n], x.dt_bias,
                           x.b[:n], cus[i], out=out[:n], new_state=new, use_qk_l2norm=True,
                           algo=algo)
        for _ in range(20):
            call()
        host, wall = [], []
        for _ in range(args.calls // 10):       # batches of 10: well inside the launch queue
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host.append((t1 - t0) / 10 * 1e6)
            wall.append((time.perf_counter() - t0) / 10 * 1e6)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        torch.cuda.synchronize()
        print(f"== {algo}{' (a new token count every call)' if args.vary else ''}: "
              f"{statistics.median(host):.0f} us a call on the host (batches of 10, "
              f"no sync), {statistics.median(wall):.0f} with the batch's sync; cProfile top "
              f"by own time:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
        print(f"== {algo}: cProfile top by cumulative time:")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()

"""The kernels of one eager gdnzoo.prefill call, each timed alone (torch.profiler records,
medians over calls), and the call's errors against float64: where a cell's time goes, kernel
by kernel.  On a GPU:

    python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --cells "4,8:8192;16,32:1024+1024"

``--segments 4,8``: each cell again with the segment count of triton-chunk's segmented form
forced (``triton_chunk.pick_segments`` patched; 0: the product's own choice).
"""
from __future__ import annotations

import argparse
import statistics

from gdnzoo.backends import triton_chunk as tc
from lab.harness import profiled, rel
from lab.prefill_gpu import make, oracle, prefill_call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", default="cuda-chunk-bf16,triton-chunk-bf16")
    ap.add_argument("--cells", default="4,8:8192", help="H,HV:len+len+...; several with ';'")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--segments", default="0", help="segment counts forced, 0: the product's")
    args = ap.parse_args()
    product = tc.pick_segments
    for seg in map(int, args.segments.split(",")):
        tc.pick_segments = product if seg == 0 else (lambda *a, s=seg, **k: s)
        tc._resolve_memo.cache_clear()
        run(args, f" segments {seg}" if seg else "")
    tc.pick_segments = product


def run(args, tag):
    for cell in args.cells.split(";"):
        heads, lens = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make([int(n) for n in lens.split("+")], H, HV, seed=0)
        o64, s64 = oracle(x, True)
        for algo in args.algo.split(","):
            call = prefill_call(x, algo)
            out, new = call()
            err = f"out {rel(out, o64):.3e} state {rel(new, s64):.3e}"
            by = profiled(call, args.reps)
            med = {name: statistics.median(t) for name, t in by.items()}
            total = sum(statistics.median(t) * len(t) / args.reps for t in by.values())
            print(f"{cell} {algo}{tag}: {err}; {total:.1f} us of kernels a call: " + ", ".join(
                f"{name[:40]} {m:.1f} (x{len(by[name]) // args.reps})"
                for name, m in sorted(med.items(), key=lambda kv: -kv[1])), flush=True)


if __name__ == "__main__":
    main()

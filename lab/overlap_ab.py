"""cuda-chunk-bf16 with the prep kernel beside the chain kernel (``_cuda_chunk_chain
.pick_overlap``) against the prep before it, whole calls side by side.  On a GPU:

    python3 -m lab.overlap_ab --cells "16,32:8192;8,16:8192" --rounds 4

Per cell and round, each form in turn: a call's GPU span (CUDA events after a sleep kernel
that keeps the host ahead, so host launch gaps stay out; median of --reps), its outputs and
states compared bit for bit with the prep-first form's, and both against float64.  "off" forces
``pick_overlap`` False, "on" True where the product's rule would allow (else the cell says so).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.harness import patch, side_by_side
from lab.prefill_gpu import make, oracle, prefill_call

PRODUCT = chain.pick_overlap


def timeline(fn) -> str:
    """One call's kernels under torch.profiler: name, start after the first's, duration (us)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA))
    t0 = ev[0][0] if ev else 0
    return ", ".join(f"{n[:24]} +{s - t0:.0f} for {e - s:.0f}" for s, e, n in ev)


def gaps_us(fn, reps: int) -> str:
    """Host time from the chain kernel's launch call returning to the prep kernel's launch call
    (median, us), outside and inside a CUPTI kernel-clock session, and the kernel clock."""
    from gdnzoo.backends import _cuda_build as cb
    from gdnzoo.bench import clocks
    import time
    marks, real_raw, real_pdl = [], cb.launch_raw, cb.launch_raw_pdl

    def raw(*a, **kw):
        real_raw(*a, **kw)
        marks.append(("chain", time.perf_counter_ns()))

    def pdl(*a, **kw):
        marks.append(("prep", time.perf_counter_ns()))
        real_pdl(*a, **kw)
    cb.launch_raw, cb.launch_raw_pdl = raw, pdl
    try:
        def gaps():
            g = [(b[1] - a[1]) / 1e3 for a, b in zip(marks, marks[1:])
                 if a[0] == "chain" and b[0] == "prep"]
            marks.clear()
            return f"{statistics.median(g):.1f}" if g else "n/a"
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        plain = gaps()
        samples, method = clocks.kernel_times(lambda i: fn(), reps)
        graph = clocks.graph_times(lambda i: fn(), 4, 10)
        q = sorted(samples)
        return (f"launch gap {plain} us plain, {gaps()} us in the kernel clock's session; "
                f"kernel clock {statistics.median(q):.1f} us (min {q[0]:.1f}, max {q[-1]:.1f}; "
                f"{method}); graph clock {statistics.median(graph):.1f} us")
    finally:
        cb.launch_raw, cb.launch_raw_pdl = real_raw, real_pdl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="16,32:8192", help="H,HV:len+len+...; several with ';'")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algo", default="cuda-chunk-bf16")
    ap.add_argument("--clocks", action="store_true",
                    help="also the bench's kernel clock and the host's launch gaps")
    ap.add_argument("--spread", action="store_true", help="every span sample, sorted")
    ap.add_argument("--cupti-own-clock", action="store_true",
                    help="the kernel clock's CUPTI session without its Python timestamp callback")
    args = ap.parse_args()
    if args.cupti_own_clock:
        from gdnzoo.bench import clocks
        clocks._fine_timestamps = lambda cupti: (cupti.get_timestamp, " (CUPTI's own clock)")
    for cell in args.cells.split(";"):
        heads, lens = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make([int(n) for n in lens.split("+")], H, HV, seed=0)
        o64, s64 = oracle(x, True)
        grid = len(lens.split("+")) * HV * 2
        n_sm = torch.cuda.get_device_properties(0).multi_processor_count
        if not PRODUCT(grid, n_sm, len(lens.split("+"))):
            print(f"{cell}: {grid} chain CTAs, the rule keeps the prep first on {n_sm} SMs; "
                  f"forced on anyway", flush=True)
        call = prefill_call(x, args.algo)
        forms = {"off": lambda g, n, s: False, "on": lambda g, n, s: 0 < g <= n}
        med = side_by_side(cell, call, {n: patch(chain, pick_overlap=r) for n, r in forms.items()},
                           args.rounds, args.reps, o64, s64, spread=args.spread)
        for name, rule in forms.items():
            chain.pick_overlap = rule
            print(f"{cell} {name}: {timeline(call)}", flush=True)
            if args.clocks:
                print(f"{cell} {name}: {gaps_us(call, args.reps)}", flush=True)
        chain.pick_overlap = PRODUCT
        print(f"{cell}: prep first {med['off']:.1f} us, beside {med['on']:.1f} us "
              f"({med['off'] / med['on']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()

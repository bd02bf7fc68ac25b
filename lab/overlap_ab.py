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

import gdnzoo
from gdnzoo.backends import _cuda_chunk_chain as chain
from lab.prefill_gpu import make, oracle

PRODUCT = chain.pick_overlap


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def span_us(fn, reps: int) -> float:
    """Median GPU time of ``fn()`` between two events queued behind a 200 us sleep kernel."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(400_000)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="16,32:8192", help="H,HV:len+len+...; several with ';'")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algo", default="cuda-chunk-bf16")
    args = ap.parse_args()
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
        s0 = x["state"].clone()

        def call():
            return gdnzoo.prefill(x["q"], x["k"], x["v"], s0, x["A_log"], x["a"],
                                  x["dt_bias"], x["b"], x["cu"], out=x["out"],
                                  new_state=x["new_state"], use_qk_l2norm=True, algo=args.algo)
        forms = {"off": lambda g, n, s: False, "on": lambda g, n, s: 0 < g <= n}
        ref = None
        times = {f: [] for f in forms}
        for r in range(args.rounds):
            for name, rule in forms.items():
                chain.pick_overlap = rule
                out, new = (t.clone() for t in call())
                torch.cuda.synchronize()
                if ref is None:
                    ref = (out, new)
                    print(f"{cell} errors vs float64: out {rel(out, o64):.3e} state "
                          f"{rel(new, s64):.3e}", flush=True)
                same = torch.equal(out, ref[0]) and torch.equal(new, ref[1])
                if not same:
                    print(f"{cell} {name} round {r}: NOT bit-identical to the prep-first form: "
                          f"out {rel(out, ref[0]):.3e} state {rel(new, ref[1]):.3e}", flush=True)
                times[name].append(span_us(call, args.reps))
        for name, rule in forms.items():
            chain.pick_overlap = rule
            print(f"{cell} {name}: {timeline(call)}", flush=True)
        chain.pick_overlap = PRODUCT
        med = {f: statistics.median(t) for f, t in times.items()}
        print(f"{cell}: prep first {med['off']:.1f} us, beside {med['on']:.1f} us "
              f"({med['off'] / med['on']:.2f}x); rounds " + "; ".join(
                  f"{f} " + " ".join(f"{t:.1f}" for t in ts) for f, ts in times.items()),
              flush=True)


if __name__ == "__main__":
    main()

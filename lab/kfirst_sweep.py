"""cuda-v4's K-first kernel over its launch shapes (warps W, lanes along K LK, cache hint H) at
each batch size, beside cuda-v4 on a k-last state (its launch table's row), on a GPU: CUDA
events around replays of a CUDA graph of one call on each of rotated input sets (states >= 2x L2
in all), medians of 20; the k-last entry timed first once untimed (the first timing of a
process reads high) and again last; every K-first shape gated against the float64 oracle before
it is timed.  Prints per batch size each shape's time over the k-last time, best first.

    python -m lab.kfirst_sweep --geom 16/32 --state-dtype bf16 [--dest] --batches 1,4,16,64,256
"""
from __future__ import annotations

import itertools
import statistics

import torch

from gdnzoo.backends import _cuda_v4_kfirst as kf
from gdnzoo.backends import cuda_v4
from lab.kfirst_cuda import checked, explicit, record, sets_for
from lab.kfirst_rows import batches, parser, time_us


def klast(dest):
    recs = {}

    def call(x, st, out):
        key = (id(x), id(out))
        if key not in recs:
            recs[key] = record(x, x.state, out, False, dest)
        cuda_v4.run(recs[key])
        return recs[key].out, recs[key].new_state
    return call


def main(argv=None):
    p = parser(__doc__, "1,4,16,64,256")
    p.add_argument("--dest", action="store_true")
    p.add_argument("--warps", default="1,2,4,8")
    p.add_argument("--lanes", default="2,4,8,16")
    p.add_argument("--hints", default="0,3")
    a = p.parse_args(argv)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    size = 4 if sd == torch.float32 else 2
    grid = list(itertools.product(*(map(int, s.split(",")) for s in (a.warps, a.lanes, a.hints))))
    for H, HV, B, n in batches(a):
        sets = sets_for(B, H, HV, sd, n)
        base = klast(a.dest)
        for s in sets:
            base(*s)
        time_us(base, sets)                      # untimed: the process's first timing
        k0 = time_us(base, sets)
        rule = kf.shape(size, B * HV, 128, 128, not a.dest)
        rows = []
        for w, lk, hint in grid:
            if kf.refusal(128, 128, size, w, lk, True):
                continue
            fn = explicit(w, lk, hint, a.dest)
            try:
                checked(f"W{w}:LK{lk}:H{hint}", sets[0][0], True, fn)
            except (AssertionError, ValueError) as e:
                print(f"  W{w}:LK{lk}:H{hint}: FAIL {str(e)[:100]}", flush=True)
                continue
            for s in sets:
                fn(*s)
            rows.append((time_us(fn, sets), w, lk, hint))
        k1 = time_us(base, sets)
        kl = statistics.mean((k0, k1))
        rows.sort()
        head = f"{a.geom} B={B} {a.state_dtype}{' dest' if a.dest else ''}: k-last {k0:.2f} / {k1:.2f}"
        print(head + f"; rule W{rule[0]}:LK{rule[1]}:H{rule[2]}", flush=True)
        print("  " + " | ".join(f"W{w}:LK{lk}:H{h} {t:.2f} ({t / kl:.3f}x)"
                                for t, w, lk, h in rows[:8]), flush=True)
        got = [t for t, w, lk, h in rows if (w, lk, h) == rule]
        if got:
            print(f"  rule {got[0]:.2f} ({got[0] / kl:.3f}x)", flush=True)


if __name__ == "__main__":
    main()

"""Two ``gdnzoo bench`` runs side by side, each cell as a multiple of its own run's floor:

    python3 -m lab.compare_runs OLD/results.json NEW/results.json [--algo cuda-v4,fla-recurrent]
                                [--batch 1,16,512] [--clock kernel] [--bar 0.02]

Prints, per backend, state dtype, mode and B: both medians, both floor multiples and their ratio
(new / old), and flags the cells where the ratio leaves 1 +- ``--bar``; a floor multiple is
only read against the floor of the same run.  No GPU needed.
"""
from __future__ import annotations

import argparse

from gdnzoo.bench.report import read_results
from lab import harness


def cells(path, clock):
    rows, env = read_results(path)
    return {(r["backend"], r["state_dtype"], r["mode"], r["B"]): r for r in rows
            if r["clock"] == clock and r["status"] == "PASS" and r["backend"] != "floor"}, env


def main(lab):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--algo", default=None, help="comma list (default: every backend of both)")
    ap.add_argument("--batch", default=None, help="comma list (default: every B of both)")
    ap.add_argument("--clock", default="kernel")
    ap.add_argument("--bar", type=float, default=0.02)
    args = ap.parse_args()
    old, oenv = cells(args.old, args.clock)
    new, nenv = cells(args.new, args.clock)
    lab.log(f"old: {args.old} (commit {oenv.get('commit')}, {oenv.get('gpu')}); new: {args.new} "
            f"(commit {nenv.get('commit')}, {nenv.get('gpu')}); {args.clock} clock, ratio = new "
            f"x floor / old x floor, flagged past 1 +- {args.bar:g}")
    algos = args.algo.split(",") if args.algo else None
    batches = [int(b) for b in args.batch.split(",")] if args.batch else None
    keys = sorted(set(old) & set(new), key=lambda k: (k[0], k[1], k[2], k[3]))
    keys = [k for k in keys if (algos is None or k[0] in algos) and
            (batches is None or k[3] in batches)]
    lab.log(f"{'backend':14} {'state':5} {'mode':8} {'B':>4} {'old us':>8} {'x floor':>8} "
            f"{'new us':>8} {'x floor':>8} {'ratio':>7}")
    worst = 0.0
    for k in keys:
        o, n = old[k], new[k]
        r = n["x_floor"] / o["x_floor"]
        worst = max(worst, abs(r - 1))
        flag = "  <-- past the bar" if abs(r - 1) > args.bar else ""
        lab.log(f"{k[0]:14} {k[1]:5} {k[2]:8} {k[3]:>4} {o['median_us']:8.2f} {o['x_floor']:8.3f} "
                f"{n['median_us']:8.2f} {n['x_floor']:8.3f} {r:7.3f}{flag}")
    lab.log(f"{len(keys)} cells; largest |ratio - 1| = {worst:.4f}")
    lab.results.update(cells=len(keys), worst=worst)
    if worst > args.bar:
        lab.failed.append("bar")


if __name__ == "__main__":
    harness.run("compare_runs", main)

"""Where a kernel's warps stall, by SASS instruction: reads the CSV of ``ncu -i REPORT --page
source --csv --print-source sass`` and prints the stall samples summed by opcode and the
instructions with the most samples.  On a GPU, from the repository root (no bundle needed):

    ncu --clock-control none -k regex:chunk_state --launch-skip 2 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --import-source yes -o state \
        python3 -m lab.chunk_profile --geom 4/8 --seqs 1x8192
    ncu -i state.ncu-rep --page source --csv --print-source sass > sass.csv
    python -m lab.ncu_sass_top sass.csv [--top 40]

lab/notebook/h200/ncu_state_stalls_2026-11-29.txt is its output for triton-chunk's
sequential kernel.
"""
from __future__ import annotations

import argparse
import csv
import re
from collections import Counter


def number(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args(argv)
    with open(a.csv, newline="") as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("==")
                 and not ln.startswith('"Kernel Name"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        raise SystemExit("no rows")
    cols = list(rows[0])
    src = next(c for c in cols if c.strip().lower() == "source")
    stall = next(c for c in cols if "Warp Stall Sampling (All" in c)
    total = sum(number(r[stall]) for r in rows) or 1.0
    by_op, count = Counter(), Counter()
    for r in rows:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip()).split(" ")[0].split(".")[0]
        by_op[op] += number(r[stall])
        count[op] += 1
    print(f"{len(rows)} instructions, {total:.0f} stall samples ({stall})")
    print("by opcode (share of samples, instructions):")
    for op, n in by_op.most_common(25):
        print(f"  {op:12s} {100 * n / total:5.1f}%  {count[op]}")
    print(f"top {a.top} instructions (index, share, source):")
    order = sorted(range(len(rows)), key=lambda i: -number(rows[i][stall]))[:a.top]
    for i in sorted(order):
        print(f"  {i:5d} {100 * number(rows[i][stall]) / total:5.1f}%  {rows[i][src].strip()[:90]}")


if __name__ == "__main__":
    main()

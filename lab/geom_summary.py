"""The automatic choice against the best entry, per cell, of the `gdnzoo bench` runs in a
folder (one sub-folder of results.json each), kernel clock: a cell counts when the choice is
within one CUPTI tick (32 ns) of its fastest rival (the bench's ``auto_vs_best``: adapters
and state-rounding peers are no rivals).  The choice's time is the ``auto`` entry's where the
mode times one (pool), else the time of the backend its ``auto`` column names.  Used for bench/results/h200/geometries/:

    python3 lab/geom_summary.py DIR
"""
import sys
from pathlib import Path

from gdnzoo.bench.report import read_results

TICK = 0.032
hits = n = 0
for d in sorted(Path(sys.argv[1]).iterdir()):
    if not (d / "results.json").is_file():
        continue
    rows, env = read_results(d / "results.json")
    cells = {}
    for r in rows:
        if r["clock"] == "kernel" and r["status"] == "PASS" and r["backend"] != "floor":
            cells.setdefault((r["state_dtype"], r["mode"], r["B"]), {})[r["backend"]] = r
    misses = []
    for (sd, mode, B), c in sorted(cells.items()):
        named = next(iter(c.values())).get("auto")
        mine = c.get("auto", c.get(named, {}))
        got = mine.get("median_us", float("nan"))
        best = got / mine.get("auto_vs_best", float("nan"))    # the bench's own rivals
        ok = got - best <= TICK
        hits, n = hits + ok, n + 1
        if not ok:
            misses.append(f"{sd} {mode} B={B} auto={named} +{got - best:.2f}")
    print(f"{d.name} (H={rows[0]['H']} HV={rows[0]['HV']}): {len(cells)} cells; misses: "
          + ("; ".join(misses) or "none"))
print(f"auto within one tick of the best: {hits} of {n}")

#!/usr/bin/env bash
# Every `gdnzoo bench` mode at a small size on a GPU (each well under 2 minutes on an H100/H200),
# then one short table per mode: each cell's floor, fastest entry, automatic choice and auto/best,
# and, for the cells the committed runs of this GPU hold (bench/results/<gpu>/), the new median
# over the committed one (the refactored bench must read within 2% of them).
#
#   bash lab/bench_modes_gpu.sh [OUT]          # default OUT: gdnzoo-results/modes
#   MODES="dense pool verify chained" bash lab/bench_modes_gpu.sh OUT   # some of them
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gdnzoo-results/modes}
mkdir -p "$OUT"
FAILED=0

MODES=" ${MODES:-dense dest tokens pool verify chained model} "
run() {                         # run NAME ARGS...: one mode, its console in OUT/NAME.log
  local name=$1; shift
  [[ "$MODES" == *" $name "* ]] || return 0
  local t0=$SECONDS
  timeout 170 gdnzoo bench "$@" --out "$OUT/$name" --no-plots --quiet > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: gdnzoo bench $* -> exit $rc in $((SECONDS - t0)) s ($OUT/$name.log)"
  [ "$rc" -eq 0 ] || FAILED=1
}

V4=cuda-v4,fla-recurrent
run dense   --mode dense   --algo "$V4,pt-reference" --batch 1,64 --state-dtype fp32,bf16 --time-budget 90
run dest    --mode dest    --algo "$V4" --batch 1,64 --state-dtype fp32 --time-budget 60
run tokens  --mode dense   --algo "$V4" --batch 1,64 --tokens 2 --state-dtype fp32 --timing kernel
run pool    --mode pool    --batch 1,64 --state-dtype fp32,bf16 --time-budget 90
run verify  --mode verify  --batch 1,16 --tokens 4 --state-dtype fp32,bf16 --time-budget 90
run chained --mode chained --algo cuda-v4 --batch 1,64 --state-dtype fp32 --time-budget 90
run model   --mode dense   --algo cuda-v4 --model qwen3-next --tp 2 --batch 1,32 --timing kernel

python3 - "$OUT" <<'EOF'
import math, sys
from pathlib import Path
from gdnzoo.bench.report import gpu_slug, read_results

out = Path(sys.argv[1])
KEY = ("backend", "B", "T", "H", "HV", "K", "V", "state_dtype", "mode", "l2norm", "clock")
MAIN = {"dense": "kernel", "dest": "kernel", "pool": "kernel", "verify": "kernel",
        "chained": "chained"}


def ok(r):
    return r["status"] == "PASS" and isinstance(r["median_us"], float) and math.isfinite(r["median_us"])


def committed(gpu):
    """Rows of this GPU's committed runs, by key (the latest file wins)."""
    base = Path("bench/results") / gpu_slug(gpu)
    rows = {}
    names = ["results_434b447.json", "results_6d24af7.json", "results_62a7057.json",
             "results.json", "dest_results_6d24af7.json", "dest_results_62a7057.json",
             "multi_token_t2_results.json", "pool_fineclock/run1_results.json", "pool/results.json",
             "verify/fp32_results.json", "verify/bf16_results.json", "chained/results_fp32.json",
             "chained/results_bf16.json"]
    for n in names:
        if (base / n).is_file():
            for r in read_results(base / n)[0]:
                if ok(r):
                    rows[tuple(r[k] for k in KEY)] = r["median_us"]
    return rows


ratios = []
for run in sorted(p for p in out.iterdir() if (p / "results.json").is_file()):
    rows, env = read_results(run / "results.json")
    old = committed(env.get("gpu") or "cpu")
    bad = [r for r in rows if r["status"] in ("FAIL", "ERROR")]
    print(f"\n== {run.name} ({env.get('gpu')}): {len(rows)} rows, "
          f"{sum(ok(r) for r in rows)} timed, {len(bad)} FAIL/ERROR, "
          f"{sum(r['status'] == 'SKIP' for r in rows)} SKIP")
    for r in bad[:5]:
        print(f"   {r['status']} {r['backend']} [{r['mode']}] B={r['B']}: {r['note'][:100]}")
    cells = {}
    for r in rows:
        if ok(r) and r["clock"] == MAIN.get(r["bench"], "kernel"):
            cells.setdefault((r["state_dtype"], r["mode"], r["T"], r["B"]), []).append(r)
    print(f"   {'state':5} {'form':14} {'T':>2} {'B':>4} {'floor':>8} {'best':>22} "
          f"{'auto':>14} {'auto/best':>9} {'new/committed (entries)':>24}")
    for (sd, form, T, B), rs in sorted(cells.items()):
        fl = next((r["median_us"] for r in rs if r["backend"] == "floor"), float("nan"))
        ent = [r for r in rs if r["backend"] != "floor"]
        best = min(ent, key=lambda r: r["median_us"]) if ent else None
        match = [r["median_us"] / old[tuple(r[k] for k in KEY)] for r in rs
                 if tuple(r[k] for k in KEY) in old]
        ratios += match
        cmp = (f"{min(match):.3f}..{max(match):.3f} ({len(match)})" if match else "-")
        mine = next((r for r in ent if r["backend"] == "auto"), ent[0] if ent else {})
        a = mine.get("auto") or "-"
        ab = mine.get("auto_vs_best")
        print(f"   {sd:5} {form:14} {T:>2} {B:>4} {fl:>8.2f} "
              f"{(best['backend'] + ' ' + format(best['median_us'], '.2f')) if best else '-':>22} "
              f"{a:>14} {format(ab, '.2f') if isinstance(ab, float) and math.isfinite(ab) else '-':>9} "
              f"{cmp:>24}")
if ratios:
    within = sum(abs(x - 1) <= 0.02 for x in ratios)
    print(f"\nagainst the committed runs: {within} of {len(ratios)} matching cells within 2% "
          f"(median ratio {sorted(ratios)[len(ratios) // 2]:.3f}; the floors and peers move "
          f"between leases, compare multiples of the floor where they do)")
EOF
exit $FAILED

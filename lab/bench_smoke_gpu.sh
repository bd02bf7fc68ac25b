#!/usr/bin/env bash
# Every `gdnzoo bench` mode once at one small cell on a GPU (about 5 minutes on an H200 in all),
# for comparing two trees' bench code: each mode's console and results under OUT/<mode>; then
# a list of each results file's columns, clocks, backends and statuses (OUT/structure.txt), which
# two runs must share.  bash lab/bench_smoke_gpu.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gdnzoo-results/smoke}
mkdir -p "$OUT"
run() {                         # run NAME ARGS...
  local name=$1; shift
  local t0=$SECONDS
  timeout 120 gdnzoo bench "$@" --out "$OUT/$name" --no-plots > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s"
}
run dense   --mode dense   --algo cuda-v4,fla-recurrent --batch 64 --state-dtype fp32 --time-budget 20
run dest    --mode dest    --algo cuda-v4,fla-recurrent --batch 64 --state-dtype bf16 --time-budget 20
run pool    --mode pool    --batch 64 --state-dtype bf16 --time-budget 20
run verify  --mode verify  --batch 16 --tokens 4 --state-dtype fp32 --time-budget 20
run chained --mode chained --algo cuda-v4 --batch 64 --state-dtype fp32 --time-budget 20
run prefill --mode prefill --algo cuda-chunk,triton-chunk --mix 8x1024 --form dense,pool --state-dtype fp32 --time-budget 25
run engine  --mode engine-prefill --algo cuda-chunk --mix 8x1024 --state-dtype fp32 --time-budget 25
python3 - "$OUT" > "$OUT/structure.txt" <<'PY'
import json, sys
from pathlib import Path
for p in sorted(Path(sys.argv[1]).glob("*/results.json")):
    d = json.loads(p.read_text())
    cols = d["columns"]
    rows = [dict(zip(cols, r)) for r in d["rows"]]
    what = sorted({(r.get("backend"), r.get("clock"), r.get("mode"), r.get("status")) for r in rows},
                  key=str)
    print(f"== {p.parent.name}: {len(rows)} rows; columns {cols}")
    for w in what:
        print("  ", w)
PY
tar czf "$OUT/results.tgz" -C "$OUT" $(cd "$OUT" && ls -d */ | tr -d /)
grep '^==' "$OUT/structure.txt"

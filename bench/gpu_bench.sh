#!/usr/bin/env bash
# The benchmark on a GPU machine, from the repository root:  OUT=/some/dir bash bench/gpu_bench.sh
# 1) the clock tests (CUPTI, graph and host clocks against work of known cost);
# 2) `gdnzoo bench --algo all` over fp32 and bf16 state (contest geometry H=4 HV=8 K=V=128,
#    B = 1..512, three clocks, cold L2, in place) under a time budget: cells are ordered backend by
#    backend (pt-compiled, slow to compile per shape, last), so a budget cut drops whole cells of
#    the last backends, reported as SKIP.  About 4 minutes on an H100.  Full results (CSV, JSON,
#    plots) in $OUT/bench; the short tables are printed last.  One failing part does not stop the rest.
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-170}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

# gdnzoo.bench lives in bench/ (package-dir mapping): it needs an install, editable is enough.
$PY -c "import gdnzoo.bench.sweep" 2>/dev/null ||
  $PY -m pip install -e . --no-deps --no-build-isolation -q >"$OUT/pip.log" 2>&1 ||
  echo "pip install -e . failed: see $OUT/pip.log" >&2

echo "== clock tests" >&2
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_clocks_gpu.py >"$OUT/test_clocks_gpu.log" 2>&1
echo "clock tests rc=$? (log: $OUT/test_clocks_gpu.log)" >"$OUT/summary.txt"
tail -n 4 "$OUT/test_clocks_gpu.log" >>"$OUT/summary.txt"

echo "== gdnzoo bench fp32,bf16" >&2
timeout $((BUDGET + 60)) $PY -m gdnzoo bench --algo all --state-dtype fp32,bf16 \
    --time-budget "$BUDGET" --quiet --out "$OUT/bench" >"$OUT/bench.txt" 2>"$OUT/bench.err"
echo "bench rc=$? (console: $OUT/bench.txt, stderr: $OUT/bench.err)" >>"$OUT/summary.txt"

cat "$OUT/summary.txt"
echo
grep -v '^wrote:' "$OUT/bench.txt" | head -n 48
tail -n 3 "$OUT/bench.err"

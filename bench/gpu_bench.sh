#!/usr/bin/env bash
# The benchmark on a GPU machine, from the repository root:  OUT=/some/dir bash bench/gpu_bench.sh
# 1) the clock tests (CUPTI, graph and host clocks against work of known cost);
# 2) `gdnzoo bench --algo all` over fp32 and bf16 state (contest geometry H=4 HV=8 K=V=128,
#    B = 1..512, three clocks, cold L2, in place) under a time budget: cells are ordered backend by
#    backend (pt-compiled, slow to compile per shape, last), so a budget cut drops whole cells of
#    the last backends, reported as SKIP.  Budget 240 s of cells, then the floor and the files:
#    about 5 minutes on an H100 (JIT compiles included).  Full results (CSV, JSON, plots) in
#    $OUT/h100-80gb-hbm3 (copy to bench/results/ to commit); short tables printed last.
#    SPLIT=1: one invocation per state dtype ($OUT/<slug>/fp32, .../bf16), merged later by
#    `gdnzoo tune --from A/results.json --from B/results.json`.  One failing part does not stop the rest.
OUT=${OUT:-/tmp/out}
BUDGET=${BUDGET:-240}
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

SLUG=$($PY -c "from gdnzoo.bench.report import gpu_slug; print(gpu_slug())" 2>/dev/null || echo gpu)
if [ "${SPLIT:-0}" = 1 ]; then RUNS="fp32 bf16"; else RUNS="fp32,bf16"; fi
for SD in $RUNS; do
  DIR="$OUT/$SLUG"; [ "${SPLIT:-0}" = 1 ] && DIR="$OUT/$SLUG/$SD"
  echo "== gdnzoo bench $SD -> $DIR" >&2
  timeout $((BUDGET + 150)) $PY -m gdnzoo bench --algo all --state-dtype "$SD" \
      --time-budget "$BUDGET" --quiet --out "$DIR" >"$OUT/bench_$SD.txt" 2>"$OUT/bench_$SD.err"
  echo "bench $SD rc=$? (console: $OUT/bench_$SD.txt, stderr: $OUT/bench_$SD.err)" >>"$OUT/summary.txt"
done

cat "$OUT/summary.txt"
echo
for SD in $RUNS; do
  grep -v '^wrote:' "$OUT/bench_$SD.txt" | head -n 48
  tail -n 3 "$OUT/bench_$SD.err"
done

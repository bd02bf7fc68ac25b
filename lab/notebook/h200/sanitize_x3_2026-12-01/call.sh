#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck over the x3 chain's tests (its dense, pool,
# checkpoint and segmented forms: tests/test_cuda_chunk_chain.py -k x3), then memcheck over
# lab.sanitize_chunk (cuda-chunk's cases).  bash this OUT, from the repository root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
$SAN --version | tail -1 > "$OUT/env.txt"
for tool in memcheck racecheck; do
  t0=$(date +%s)
  timeout 220 $SAN --tool $tool python3 -m pytest -q -p no:cacheprovider -rs \
    tests/test_cuda_chunk_chain.py -k x3 > "$OUT/x3_$tool.log" 2>&1
  echo "$tool x3 tests: exit $? in $(( $(date +%s) - t0 )) s: $(grep -h "passed\|failed" "$OUT/x3_$tool.log" | tail -1) | $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/x3_$tool.log" | tail -1)"
done
t0=$(date +%s)
timeout 150 $SAN --tool memcheck python3 -m lab.sanitize_chunk > "$OUT/chunk_memcheck.log" 2>&1
echo "memcheck lab.sanitize_chunk: exit $? in $(( $(date +%s) - t0 )) s: $(grep -c ^PASS "$OUT/chunk_memcheck.log") PASS, $(grep -c ^FAIL "$OUT/chunk_memcheck.log") FAIL | $(grep -h "ERROR SUMMARY" "$OUT/chunk_memcheck.log" | tail -1)"

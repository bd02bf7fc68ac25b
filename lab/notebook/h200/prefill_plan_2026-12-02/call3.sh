# After the GPU calls: the bound-launcher test on the GPU, then compute-sanitizer memcheck over
# the chain kernel's bit-for-bit tests (every form but "beside", which the sanitizer turns off),
# each through a plan.   bash lab/notebook/h200/prefill_plan_2026-12-02/call3.sh OUT
set -u
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 90 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_triton_chunk.py -k bind \
  > "$OUT/pytest_bind.log" 2>&1; echo "bind test: exit $?: $(tail -1 "$OUT/pytest_bind.log")"
timeout "${SAN_S:-330}" compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider \
  -rfE tests/test_cuda_chunk_chain.py -k "bit_for_bit and not beside" > "$OUT/memcheck.log" 2>&1
echo "memcheck: exit $?: $(grep -h 'ERROR SUMMARY' "$OUT/memcheck.log" | sort | uniq -c | head -3) $(grep -E 'passed|failed' "$OUT/memcheck.log" | tail -1)"

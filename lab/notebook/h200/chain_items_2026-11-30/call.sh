#!/usr/bin/env bash
# Device call: the solo chain on fewer CTAs than items (each CTA taking items in turn), its
# bit-for-bit tests, then lab.chain_ab beside the solo form a CTA an item (this tree and the one
# before, carried as .gpu/chain_head.cu), then compute-sanitizer over the new tests.  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda_chunk_chain.py > "$OUT/pytest_chain.log" 2>&1
echo "chain tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_chain.log")"
grep -h "^FAILED\|^E  " "$OUT/pytest_chain.log" | head -20
n_sm=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")
timeout 300 python3 -m lab.chain_ab --solo --ctas $((2 * n_sm)),$((4 * n_sm)) --before .gpu/chain_head.cu \
  --cells 16/32:16x256,16/64:16x256,16/48:16x256,16/32:8x1024,16/64:8x1024,16/32:64x64 2>&1 \
  | grep -v -i "warn" | tee "$OUT/chain_ab.log"
echo "chain_ab: $((SECONDS - t0)) s"
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool python3 -m pytest -q -p no:cacheprovider \
    tests/test_cuda_chunk_chain.py -k "bit_for_bit and items" > "$OUT/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? in $((SECONDS - t0)) s: $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/sanitizer_$tool.log" | tail -1) | $(tail -1 "$OUT/sanitizer_$tool.log")"
done

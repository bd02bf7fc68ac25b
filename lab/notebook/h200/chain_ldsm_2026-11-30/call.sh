#!/usr/bin/env bash
# Device call: the chain kernel's v reads (form_r) and output staging (store_chunk) by
# transposing matrix loads and stores: the chain's bit-for-bit tests, then whole calls against
# the source before (lab/_before.cu: backends/cuda_chunk_chain.cu at aeb7291, not committed).
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py \
  tests/test_cuda_chunk.py > "$OUT/tests.log" 2>&1
echo "tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -h "^FAILED\|^ERROR" "$OUT/tests.log" | head
timeout 240 python3 -m lab.chain_source_ab --before lab/_before.cu --rounds 3 --reps 10 --cells \
  "${CELLS:-16,32:8x1024;16,64:16x256;16,48:16x256;16,32:16x256;4,8:1x8192;2,8:1x32768;16,48:64x64;4,8:ragged}" \
  2>&1 | grep -v -i warn | tee "$OUT/ab.log" | grep -v "round "
echo "ab: $((SECONDS - t0)) s"

#!/usr/bin/env bash
# The x3 chain cut into segments: the chain tests (the segmented ones against the Triton
# "bf16x3" segments), then lab.x3_ab over segments 1-4 and the product's pick beside the
# Triton chain, with errors against float64.  bash this OUT, from the repo root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$(date +%s)
python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/tests.log")"
grep -E "^FAILED|Error:" "$OUT/tests.log" | head -20
python3 -m lab.x3_ab --errors --segments 1,2,3,4,0 --forms dense,pool \
  --cells 4/8:1x8192,2/8:1x8192,8/16:1x8192,4/8:1x2048,4/8:2x4096,16/32:1x8192,4/8:1x32768,2/8:1x32768,4/8:2x16384 \
  2>&1 | grep -v -i warn | tee "$OUT/segments.log"

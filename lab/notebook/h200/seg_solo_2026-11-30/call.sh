#!/usr/bin/env bash
# Device call: cuda-chunk-bf16 with up to 8 segments in the solo form past one wave of the 185 KB
# form (triton_chunk.pick_cuda_segments): the segmented bit-for-bit tests (2, 3, 4 and 8
# segments, both forms), then lab.seg_solo_ab against the one-wave rule.  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py \
  -k "segment" > "$OUT/tests.log" 2>&1
echo "tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -h "^FAILED\|^ERROR" "$OUT/tests.log" | head
timeout 150 python3 -m lab.seg_solo_ab --rounds 2 --reps 10 --cells \
  "2,8:1x32768;16,32:1x8192;4,8:2x16384;16,32:1x32768" 2>&1 | grep -v -i warn | tee "$OUT/ab.log"
echo "ab: $((SECONDS - t0)) s"

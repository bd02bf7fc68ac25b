#!/usr/bin/env bash
# Device call: cuda-chunk-bf16's solo chain taking its tasks in rounds (two CTAs an SM): the
# chain's bit-for-bit tests (every form; "rounds": three CTAs for every task) and the prep's,
# then lab.persist_ab against one task a CTA and against the kernel before (lab/_before.cu, the
# source at aeb7291, not committed).  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py \
  tests/test_cuda_chunk.py > "$OUT/tests.log" 2>&1
echo "tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -h "^FAILED\|^ERROR" "$OUT/tests.log" | head
timeout 260 python3 -m lab.persist_ab --before lab/_before.cu --rounds 2 --reps 10 --cells \
  "${CELLS:-16,64:16x256;16,48:16x256;16,32:16x256;16,32:8x1024;16,64:8x1024;16,32:ragged;16,48:64x64}" \
  2>&1 | grep -v -i warn | tee "$OUT/ab.log" | grep -v "round "
echo "ab: $((SECONDS - t0)) s"

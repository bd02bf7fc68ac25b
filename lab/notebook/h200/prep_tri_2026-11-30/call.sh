#!/usr/bin/env bash
# Device call: cuda-chunk's prep with the blocks above the diagonal skipped (k k^T, q k^T and
# A, P's columns past a warp's rows; tree) against the prep before (head_prep.cu), both
# precisions, workspaces bit for bit; the whole call's errors; the prep's GPU tests.  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
D=lab/notebook/h200/prep_tri_2026-11-30
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
cells=16/32:8x1024,16/64:8x1024,4/8:1x8192,16/64:16x256,4/8:16x256,16/32:64x64,2/8:1x32768
for prec in bf16 bf16x3; do
  timeout 150 python3 -m lab.prep_ab --rev '' --extra $D/head_prep.cu:53264 --precision $prec \
    --cells $cells 2>&1 | grep -v -i warn | tee -a "$OUT/ab.log"
done
timeout 100 python3 -m lab.prep_ab --rev '' --extra $D/head_prep.cu:53264 --precision bf16 \
  --heads 2 --cells 16/32:8x1024,16/64:8x1024 2>&1 | grep -v -i warn | tee -a "$OUT/ab.log"
timeout 100 python3 -m lab.prep_ab --rev '' --extra $D/head_prep.cu:53264 --precision bf16 \
  --errors --cells 16/32:8x1024,4/8:1x8192 2>&1 | grep -v -i warn | tee -a "$OUT/ab.log"
echo "ab: $((SECONDS - t0)) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk.py \
  tests/test_cuda_chunk_chain.py > "$OUT/tests.log" 2>&1
echo "tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -h "^FAILED\|^ERROR" "$OUT/tests.log" | head

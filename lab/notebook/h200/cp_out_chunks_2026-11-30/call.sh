#!/usr/bin/env bash
# Device call: the segmented form's output pass taking 2 or 4 chunk slots a program
# (triton_chunk.OUT_CHUNKS): the segmented tests (the CUDA chains at 2-8 segments, both forms;
# the Triton segments), lab.cp_out_ab against one slot a program, then the kernels of the
# segmented cells one by one.  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py \
  tests/test_triton_chunk.py -k "segment or raw" > "$OUT/tests.log" 2>&1
echo "tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -h "^FAILED\|^ERROR" "$OUT/tests.log" | head
CELLS="4,8:1x8192;2,8:1x8192;2,8:1x32768;4,8:1x32768"
timeout 200 python3 -m lab.cp_out_ab --warps "" --chunks 2,4 --rounds 2 --reps 10 \
  --cells "$CELLS" 2>&1 | grep -v -i warn | tee "$OUT/ab.log" | grep -v "round "
echo "ab: $((SECONDS - t0)) s"
timeout 100 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 \
  --cells "4,8:8192;2,8:8192;2,8:32768;4,8:32768" 2>&1 | grep -v -i warn | tee "$OUT/kernels.log"
echo "kernels: $((SECONDS - t0)) s"

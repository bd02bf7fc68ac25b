#!/usr/bin/env bash
# The output pass with 64 V columns a program for fp32 operands (the tree's out_columns) against
# 128 (before) and 32: cuda-chunk (x3 chain), triton-chunk (Triton chain, "bf16x3"), and
# cuda-chunk-bf16 at 128 / 64 / 32; then the segment tests.  bash this OUT.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
for algo in cuda-chunk triton-chunk; do
  python3 -m lab.cp_out_ab --algo $algo --warps "" --columns 128,32 --rounds 2 --reps 10 \
    --cells "4,8:1x8192;4,8:1x32768;4,8:1x2048" 2>&1 | grep -v -i warn > "$OUT/cols_$algo.log"
done
python3 -m lab.cp_out_ab --algo cuda-chunk-bf16 --warps "" --columns 64,32 --rounds 2 --reps 10 \
  --cells "4,8:1x8192;2,8:1x32768" 2>&1 | grep -v -i warn > "$OUT/cols_cuda-chunk-bf16.log"
timeout 200 python3 -m pytest -q -n 4 -p no:cacheprovider -rs tests/test_cuda_chunk_chain.py \
  tests/test_triton_chunk.py -k "segment" > "$OUT/tests.log" 2>&1
echo "tests rc $?: $(tail -1 "$OUT/tests.log")"; grep -E "^FAILED|Error:" "$OUT/tests.log" | head
for f in "$OUT"/cols_*.log; do echo "== $f"; grep -E "x$|errors|: product" "$f" | cut -c1-300; done

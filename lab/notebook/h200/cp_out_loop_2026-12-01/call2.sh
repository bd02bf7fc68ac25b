#!/usr/bin/env bash
# The output pass looped over chunks (lab.cp_out_loop, after call 1's compile error: the held
# key's type) against the product's, whole calls of cuda-chunk (x3 chain, fp32 o and w) and
# cuda-chunk-bf16 (in place).  bash this OUT (no bundle).
OUT=${1:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$SECONDS
timeout 260 python3 -m lab.cp_out_loop --algo cuda-chunk --rounds 2 --reps 10 \
  --shapes 4x64,8x64,16x64,4x32,8x32,4x64w8,4x128w8,8x128w8 \
  --cells "4,8:1x8192;4,8:1x32768;2,8:1x8192" 2>&1 | grep -v -i warn > "$OUT/x3.log"
echo "x3 A/B $((SECONDS - t0)) s"
timeout 200 python3 -m lab.cp_out_loop --algo cuda-chunk-bf16 --rounds 2 --reps 10 \
  --shapes 2x128,4x128,4x64,8x64,4x32,4x128w8 \
  --cells "4,8:1x8192;2,8:1x32768;4,8:2x16384" 2>&1 | grep -v -i warn > "$OUT/bf16.log"
echo "bf16 A/B $((SECONDS - t0)) s"
for f in x3 bf16; do echo "== $f"; grep -E "x$|errors|differ|Error" "$OUT/$f.log" | cut -c1-400; done

#!/usr/bin/env bash
# call1's A/B again (its _LAUNCH patch fixed), then the output pass at 8 warps for the x3 chain's
# segments (cuda-chunk) and the bf16 ones (cuda-chunk-bf16).  bash this OUT.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
python3 -m lab.x3_seg0_ab --cells 4/8:1x8192,4/8:1x32768,4/8:1x2048,2/8:1x8192 \
  --forms dense,pool 2>&1 | grep -v -i warn > "$OUT/ab.log"
python3 -m lab.cp_out_ab --algo cuda-chunk --warps 8 --rounds 2 --reps 10 \
  --cells "4,8:1x8192;4,8:1x32768" 2>&1 | grep -v -i warn > "$OUT/cp_out_x3.log"
cut -c1-600 "$OUT/ab.log"; tail -4 "$OUT/cp_out_x3.log"

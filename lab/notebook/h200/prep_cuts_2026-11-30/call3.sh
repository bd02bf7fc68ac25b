#!/usr/bin/env bash
# Device call 3: with the faster prep, (1) segments forced past the one-wave rule (6 and 8
# segments put the chains in the solo form, two CTAs an SM) at one long sequence of 2/8 and 4/8
# heads; (2) value heads a prep CTA at 16/64 and 16/48; (3) 16/32 one long sequence, the prep
# first or beside the chain.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 200 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --segments 0,6,8 \
  --cells "4,8:8192;2,8:8192;4,8:32768;2,8:32768;4,8:16384" > "$OUT/segments.log" 2>&1
for h in 1 2 4; do
  timeout 60 python3 -m lab.prep_ab --rev '' --precision bf16 --heads $h --cells 16/64:8x1024,16/64:16x256,16/64:1x8192 > "$OUT/heads_16_64_$h.log" 2>&1
done
for h in 1 3; do
  timeout 60 python3 -m lab.prep_ab --rev '' --precision bf16 --heads $h --cells 16/48:8x1024,16/48:16x256 > "$OUT/heads_16_48_$h.log" 2>&1
done
timeout 120 python3 -m lab.overlap_ab --cells "16,32:32768;16,32:8192" --rounds 3 > "$OUT/overlap.log" 2>&1
echo "== segments"; grep "us of kernels" "$OUT/segments.log" | cut -c1-260
echo "== heads"; for f in "$OUT"/heads_*.log; do echo "$f"; grep -v "Warn\|warn_once\|blocks an SM\|^cell" "$f"; done
echo "== overlap"; grep -v "Warn\|warn_once" "$OUT/overlap.log" | tail -12
echo "== $((SECONDS - t0)) s"

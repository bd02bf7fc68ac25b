#!/usr/bin/env bash
# Device call: the dependent launch of the chain after the prep at the 64x64 mixes (one chunk a
# chain CTA, thousands of CTAs), lab.pdl_after_prep_ab; then where a call's time goes kernel by
# kernel at the cells still behind FlashInfer (lab.prefill_kernels).  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 240 python3 -m lab.pdl_after_prep_ab --rounds 4 --cells \
  "16,32:64x64;16,64:64x64;16,48:64x64;4,8:64x64;16,32:16x256" \
  2>&1 | grep -v -i "warn" | tee "$OUT/ab.log"
echo "ab: $((SECONDS - t0)) s"
l8=$(printf '1024+%.0s' 1 2 3 4 5 6 7); l16=$(printf '256+%.0s' $(seq 15))
timeout 200 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --cells \
  "16,32:${l8}1024;16,64:${l8}1024;16,64:${l16}256;2,8:32768" 2>&1 | grep -v -i "warn" \
  | tee "$OUT/kernels.log"
echo "kernels: $((SECONDS - t0)) s"

#!/usr/bin/env bash
# Device call: the prep beside a multi-wave chain on the same SMs (lab.coresident_ab), no bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
timeout 300 python3 -m lab.coresident_ab --rounds 3 \
  --cells "16,32:1024x8;16,64:1024x8;16,48:1024x8;16,32:256x16;4,8:1024x8" 2>&1 | tee "$OUT/coresident.log" | grep -v "Warn\|warn_once"

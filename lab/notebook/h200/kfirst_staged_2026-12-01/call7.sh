#!/usr/bin/env bash
# GDN_STAGED = 2 (the new tile stored by bulk copies) against 1, alternating processes, three
# rounds; gated first in every process.  bash this OUT, from the repository root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$SECONDS
for round in 1 2 3; do
  for v in 1 2; do
    for args in "--state-dtype bf16" "--state-dtype bf16 --dest" "--state-dtype fp32"; do
      PYTHONPATH=. timeout 60 python3 lab/notebook/h200/kfirst_staged_2026-12-01/bulk_store_ab.py \
        --variant $v --geom 16/32 --batches 64,256 $args 2>&1 | grep -v -i warn >> "$OUT/ab.log"
    done
  done
  echo "round $round done at $((SECONDS - t0)) s"
done
sort -k2,4 -s "$OUT/ab.log" | grep -v "^Trace\|^  " ; grep -i "error\|Trace" "$OUT/ab.log" | head -5

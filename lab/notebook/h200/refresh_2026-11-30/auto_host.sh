#!/usr/bin/env bash
# The automatic choice's host time beside the named cuda-chunk (gdnzoo.prefill(algo=...) and
# gdnzoo.get's callable, as the bench calls it), three processes in turn, each its own order.
# bash lab/notebook/h200/refresh_2026-11-30/auto_host.sh OUT
set -uo pipefail
OUT=${1:?OUT}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
i=0
for order in auto,get:cuda-chunk,cuda-chunk get:cuda-chunk,cuda-chunk,auto cuda-chunk,auto,get:cuda-chunk; do
  i=$((i + 1))
  timeout 150 python3 -m lab.host_prefill --algo "$order" --engines plain --mixes 64x64,16x256 \
    --calls 300 > "$OUT/auto_host_$i.log" 2>&1
  echo "process $i ($order): exit $?"; sed -n '/^mix /,$p' "$OUT/auto_host_$i.log"
done
timeout 150 python3 -m lab.host_prefill --algo auto,get:cuda-chunk --engines plain --mixes 64x64 \
  --calls 300 --breakdown > "$OUT/auto_breakdown.log" 2>&1
echo "breakdown: exit $?"

#!/usr/bin/env bash
# The x3 segments' rule at shorter sequences (8 chunks a segment or more), the checkpoint tests
# with the K = 128 pool case, then the prefill bench at 4/8 heads (cuda-chunk, the automatic
# choice, beside triton-chunk).  bash this OUT, from the repo root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$(date +%s)
python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_prefill_checkpoints.py \
  tests/test_cuda_chunk_chain.py -k "checkpoints or auto or segments" > "$OUT/tests.log" 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/tests.log")"
grep -E "^FAILED|Error:" "$OUT/tests.log" | head -20
python3 -m lab.x3_ab --segments 1,0 --forms dense \
  --cells 4/8:1x512,4/8:1x1024,2/8:1x1024,4/8:1x4096,4/8:3x2048,8/16:1x2048 \
  2>&1 | grep -v -i warn | tee "$OUT/rule.log"
gdnzoo bench --mode prefill --algo cuda-chunk,triton-chunk --heads 4,8 \
  --mix 1x8192,1x32768,8x1024,16x256,64x64,ragged --form dense,pool --state-dtype fp32 \
  --timing kernel --time-budget 170 --no-plots --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $?"; tr '\r' '\n' < "$OUT/bench.log" | grep -v "s/cell\|warn" | tail -24

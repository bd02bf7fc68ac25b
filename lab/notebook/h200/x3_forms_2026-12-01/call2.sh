#!/usr/bin/env bash
# After the product changes (the checkpoint counters; the x3 chain launched plainly after the
# prep; auto with checkpoints through the rule): the chain tests, the checkpoint tests, then
# the prefill bench of prefill_x3/ again.  bash this OUT, from the repo root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$(date +%s)
python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py \
  tests/test_prefill_checkpoints.py > "$OUT/tests.log" 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/tests.log")"
grep -E "FAILED|Error" "$OUT/tests.log" | head -20
gdnzoo bench --mode prefill --algo cuda-chunk,triton-chunk --heads 16,32 \
  --mix 1x8192,8x1024,16x256,64x64 --form dense,pool --state-dtype fp32 --timing kernel \
  --time-budget 150 --no-plots --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $?"; tail -25 "$OUT/bench.log"

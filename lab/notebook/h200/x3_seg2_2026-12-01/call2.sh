#!/usr/bin/env bash
# The 109 KB x3 segmented form with T^T's lo rows copied once V'^T is done (their own barrier):
# its tests, then whole calls beside "v1" and "old" (edits.py) at 4 and 8 segments.  bash this OUT.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$SECONDS
timeout 120 python3 -m pytest -q -n 4 -p no:cacheprovider -rs tests/test_cuda_chunk_chain.py \
  -k "x3" > "$OUT/tests.log" 2>&1
echo "tests rc $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -E "^FAILED|Error" "$OUT/tests.log" | head -5
timeout 150 python3 -m lab.x3_ab --edits lab/notebook/h200/x3_seg2_2026-12-01/edits.py \
  --variants v1,old --segments 4,8 --forms dense --reps 10 --kernels \
  --cells 4/8:1x8192,4/8:1x32768 2>&1 | grep -v -i warn > "$OUT/ab.log"
echo "ab in $((SECONDS - t0)) s"
sed 's/ | /\n    /g' "$OUT/ab.log" | cut -c1-200

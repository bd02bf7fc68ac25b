#!/usr/bin/env bash
# The product after the change (GDN_X3_PAIR past one wave, eight segments where they fit): the x3
# chain's tests and the rule's tests, then the automatic prefill's kernels at three cells.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$SECONDS
timeout 100 python3 -m pytest -q -n 6 -p no:cacheprovider -rs tests/test_cuda_chunk_chain.py \
  -k "x3 or auto or pair" > "$OUT/tests.log" 2>&1
echo "tests rc $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -E "^FAILED|Error" "$OUT/tests.log" | head -5
timeout 60 python3 -m lab.prefill_kernels --algo cuda-chunk --reps 10 \
  --cells "4,8:8192;2,8:8192;4,8:32768" > "$OUT/kernels.log" 2>&1
echo "kernels rc $? in $((SECONDS - t0)) s"; cut -c1-250 "$OUT/kernels.log" | grep -v -i warn

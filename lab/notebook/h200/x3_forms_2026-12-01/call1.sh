#!/usr/bin/env bash
# The chain tests after the _form_runs refactor, then x3_forms.py (the x3 chain against the
# Triton chain in the dense, pool and checkpoint forms).  bash this OUT, from the repo root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$(date +%s)
python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py \
  > "$OUT/chain_tests.log" 2>&1; echo "chain tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/chain_tests.log")"
python3 lab/notebook/h200/chain_split_prec_2026-12-01/x3_forms.py \
  16/32:1x8192,16/32:8x1024,16/32:16x256,4/8:8x1024 2>&1 | tee "$OUT/x3_forms.log"

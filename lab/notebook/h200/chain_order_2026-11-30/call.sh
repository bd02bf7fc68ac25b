#!/usr/bin/env bash
# Device call (carry .gpu/chain_before.cu, the chain kernel before the longest-first order): the
# whole call before / with the order / with the order and the solo form past two waves, then the
# chain's GPU tests, the prefill matrices on cuda-chunk-bf16 and check --op prefill.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 170 python3 -m lab.chain_order_ab --before .gpu/chain_before.cu --reps 15 --rounds 3 \
  --cells "4,8:ragged;2,8:ragged;16,32:ragged;4,8:16x256;2,8:16x256;4,8:8x1024;16,32:8x1024" > "$OUT/order_ab.log" 2>&1
echo "timing done in $((SECONDS - t0)) s"
( timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py > "$OUT/pytest_chain.log" 2>&1
  echo "chain tests: exit $?: $(tail -1 "$OUT/pytest_chain.log")" > "$OUT/a.sum" ) &
( timeout 200 python3 -m pytest -q -p no:cacheprovider -k "cuda-chunk-bf16" tests/test_prefill.py tests/test_forms.py \
    tests/test_prefill_checkpoints.py tests/test_prefill_graphs.py > "$OUT/pytest_matrices.log" 2>&1
  echo "matrices: exit $?: $(tail -1 "$OUT/pytest_matrices.log")" > "$OUT/b.sum" ) &
( timeout 200 gdnzoo check --op prefill --algo cuda-chunk-bf16 > "$OUT/check.log" 2>&1
  echo "check: exit $?: $(grep -v '^ ' "$OUT/check.log" | tail -1)" > "$OUT/c.sum" ) &
wait
echo "== order"; grep -v "Warn\|warn_once" "$OUT/order_ab.log"
echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -20
cat "$OUT"/*.sum; echo "== $((SECONDS - t0)) s"

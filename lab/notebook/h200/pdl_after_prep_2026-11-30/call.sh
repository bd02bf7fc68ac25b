#!/usr/bin/env bash
# Device call: the CUDA chain as the CUDA prep's programmatic dependent: cuda-chunk-bf16's
# tests and the prefill matrices on it, check --op prefill, then lab.pdl_after_prep_ab (whole
# calls, against plain stream order), then compute-sanitizer memcheck over the chain's
# bit-for-bit tests.  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
run() { local name=$1 secs=$2; shift 2
  ( timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; echo "$name: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/$name.log")" > "$OUT/$name.sum" ) & }
run chain 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py
run matrices 240 python3 -m pytest -q -p no:cacheprovider -k "cuda-chunk" tests/test_prefill.py \
  tests/test_forms.py tests/test_prefill_checkpoints.py tests/test_prefill_graphs.py \
  tests/test_triton_chunk_pdl.py tests/test_pack_prefill.py
run check 200 gdnzoo check --op prefill --algo cuda-chunk-bf16,cuda-chunk
wait
cat "$OUT"/*.sum; grep -h "^FAILED\|^ERROR" "$OUT"/chain.log "$OUT"/matrices.log | head -20
grep -v "^ " "$OUT/check.log" | tail -3
timeout 200 python3 -m lab.pdl_after_prep_ab --cells \
  "4,8:1x8192;2,8:1x32768;16,32:8x1024;16,48:8x1024;16,32:16x256;16,64:16x256;4,8:ragged;4,8:16x256" \
  2>&1 | grep -v -i "warn" | tee "$OUT/ab.log"
echo "ab: $((SECONDS - t0)) s"
timeout 150 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider \
  tests/test_cuda_chunk_chain.py -k bit_for_bit > "$OUT/memcheck.log" 2>&1
echo "compute-sanitizer memcheck: exit $? in $((SECONDS - t0)) s: $(grep -h "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1) | $(tail -1 "$OUT/memcheck.log")"

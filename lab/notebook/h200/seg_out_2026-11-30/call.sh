#!/usr/bin/env bash
# Device call: cuda-chunk-bf16's segmented form writing the chains' outputs into ``out`` (the
# output pass in place, segment 0's programs idle) and Phi in bf16: the chain's and the
# segmented tests, the A/B against the buffers of before (lab.seg_out_ab), a call's kernels,
# compute-sanitizer memcheck over the segmented bit-for-bit tests.  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
run() { local name=$1 secs=$2; shift 2
  ( timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; echo "$name: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/$name.log")" > "$OUT/$name.sum" ) & }
run chain 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py
run segs 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_chunk.py -k "segments or raw"
wait
cat "$OUT"/*.sum; grep -h "^FAILED\|^ERROR" "$OUT"/chain.log "$OUT"/segs.log | head -20
timeout 150 python3 -m lab.seg_out_ab --cells "4,8:1x8192;2,8:1x32768;4,8:1x32768;2,8:1x8192" \
  2>&1 | grep -v -i "warn" | tee "$OUT/ab.log"
echo "ab: $((SECONDS - t0)) s"
timeout 90 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --cells "4,8:8192;2,8:32768" \
  2>&1 | grep -v -i "warn" | tee "$OUT/kernels.log"
timeout 150 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider \
  tests/test_cuda_chunk_chain.py -k "segmented and dense" > "$OUT/memcheck.log" 2>&1
echo "compute-sanitizer memcheck: exit $? in $((SECONDS - t0)) s: $(grep -h "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1) | $(tail -1 "$OUT/memcheck.log")"

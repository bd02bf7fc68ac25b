#!/usr/bin/env bash
# Device call 2 (carry .gpu/prep_before.cu, the prep kernel before this session's edits): the
# prep alone before / now (sep, stm, norm in the tree) / + blkinv, both precisions; errors; the
# call's kernels; then the GPU tests of cuda-chunk and cuda-chunk-bf16, check --op prefill and
# compute-sanitizer over the prep.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
E=lab/notebook/h200/prep_cuts_2026-11-30/edits.py
B=.gpu/prep_before.cu:53264
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
t0=$SECONDS
timeout 200 python3 -m lab.prep_ab --rev '' --extra $B --edits $E --variants blkinv --precision bf16 \
  --cells 4/8:1x8192,16/32:8x1024,16/32:1x8192,16/64:8x1024,16/32:16x256,2/8:1x32768 > "$OUT/ab_bf16.log" 2>&1
timeout 60 python3 -m lab.prep_ab --rev '' --extra $B --edits $E --variants blkinv \
  --cells 4/8:1x8192,16/32:8x1024 > "$OUT/ab_bf16x3.log" 2>&1
timeout 90 python3 -m lab.prep_ab --rev '' --extra $B --edits $E --variants blkinv --precision bf16 --errors \
  --cells 4/8:1x8192,16/32:8x1024,2/8:1x32768 > "$OUT/errors.log" 2>&1
timeout 60 python3 -m lab.prep_ab --rev '' --extra $B --edits $E --variants blkinv --errors \
  --cells 4/8:1x8192,16/32:4x1024 >> "$OUT/errors.log" 2>&1
timeout 80 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 \
  --cells "4,8:8192;16,32:1024+1024+1024+1024+1024+1024+1024+1024;16,64:1024+1024+1024+1024+1024+1024+1024+1024" > "$OUT/kernels.log" 2>&1
echo "timing done in $((SECONDS - t0)) s"
shard() {
  local name=$1 secs=$2; shift 2
  ( timeout "$secs" python3 -m pytest -q -rfE -p no:cacheprovider "$@" > "$OUT/pytest_$name.log" 2>&1
    echo "$name: exit $?: $(tail -1 "$OUT/pytest_$name.log")" > "$OUT/pytest_$name.summary" ) &
}
shard kernels 300 --tb=short tests/test_cuda_chunk.py tests/test_cuda_chunk_chain.py
shard matrices 300 --tb=short -k "cuda-chunk" tests/test_prefill.py tests/test_forms.py \
  tests/test_prefill_checkpoints.py tests/test_prefill_graphs.py tests/test_triton_chunk_pdl.py tests/test_pack_prefill.py
( timeout 200 gdnzoo check --op prefill --algo cuda-chunk-bf16,cuda-chunk > "$OUT/check_prefill.log" 2>&1
  echo "check --op prefill: exit $?" > "$OUT/check.summary" ) &
wait
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool python3 -m pytest -q -p no:cacheprovider \
    tests/test_cuda_chunk.py -k "writes_the_triton_prep and (0 or 3 or 4)" > "$OUT/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $?: $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|passed\|failed" "$OUT/sanitizer_$tool.log" | tail -2 | tr '\n' ' ')" > "$OUT/sanitizer_$tool.summary"
done
echo "== ab bf16"; grep -v "Warn\|warn_once" "$OUT/ab_bf16.log"; echo "== ab bf16x3"; grep -v "Warn\|warn_once" "$OUT/ab_bf16x3.log"
echo "== errors"; cut -c1-330 "$OUT/errors.log"
echo "== kernels"; grep "us of kernels" "$OUT/kernels.log" | cut -c1-300
echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -20
echo "== check"; grep -v "^ " "$OUT/check_prefill.log" | tail -8
echo "== summary ($((SECONDS - t0)) s)"; cat "$OUT"/*.summary

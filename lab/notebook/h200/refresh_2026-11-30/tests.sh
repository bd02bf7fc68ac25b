#!/usr/bin/env bash
# The launchers' GPU tests after ArgsLaunch became a cuda_build.Launch (one device call, the GPU
# bundle staged at /tmp/gd): the prefill kernels' raw launches and the decode PDL launches, two
# shards side by side.  bash lab/notebook/h200/refresh_2026-11-30/tests.sh OUT
set -uo pipefail
OUT=${1:?OUT}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
run() { local n=$1; shift; ( t0=$SECONDS; timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider --tb=short "$@" > "$OUT/pytest_$n.log" 2>&1
  echo "$n: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_$n.log")" > "$OUT/$n.summary" ) & }
run prefill tests/test_triton_chunk.py tests/test_cuda_chunk.py tests/test_cuda_chunk_chain.py tests/test_triton_chunk_pdl.py
run decode tests/test_triton_pdl.py tests/test_cuda_v4_pdl.py tests/test_pdl_shapes.py tests/test_cuda_v4_verify.py tests/test_cuda_v4_tc.py
wait
grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -30
cat "$OUT"/*.summary

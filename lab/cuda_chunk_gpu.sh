# cuda-chunk on a lent GPU: its tests and the prefill matrices that hold it to the reference,
# then gdnzoo bench --mode prefill beside triton-chunk.  OUT: where the logs go.
cd "$(dirname "$0")/.."
python3 -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -1
OUT=${OUT:-/tmp}
if [ -z "$NO_TESTS" ]; then
timeout ${TEST_S:-240} python3 -m pytest -q tests/test_cuda_chunk.py tests/test_triton_chunk_pdl.py \
  tests/test_prefill.py tests/test_prefill_checkpoints.py -k cuda -p no:cacheprovider 2>&1 \
  | grep -E "Error|passed|failed" | tee "$OUT/pytest.log"
timeout ${TEST_S:-240} python3 -m pytest -q tests/test_forms.py -k prefill -p no:cacheprovider 2>&1 \
  | grep -E "Error|passed|failed" | tee -a "$OUT/pytest.log"
fi
# RUNS: ";"-separated argument lists, one bench run each (results under $OUT/run<i>)
RUNS=${RUNS:-"--heads 4,8 --mix 1x8192,8x1024,ragged;--heads 16,32 --mix 1x8192,8x1024,ragged"}
i=0
IFS=';' read -ra R <<< "$RUNS"
for r in "${R[@]}"; do
  i=$((i + 1))
  echo "\$ gdnzoo bench --mode prefill --algo ${ALGOS:-triton-chunk,cuda-chunk} $r --state-dtype fp32 --no-plots --out run$i" | tee -a "$OUT/bench.log"
  gdnzoo bench --mode prefill --algo ${ALGOS:-triton-chunk,cuda-chunk} $r --state-dtype fp32 \
    --no-plots --out "$OUT/run$i" 2>&1 | grep -v -i "warn\|%|" | tee -a "$OUT/bench.log"
done

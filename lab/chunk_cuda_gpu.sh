# lab.chunk_cuda on a lent GPU: correctness at small and ragged cells against float64, then
# the timing cells.  CHECK and TIME (lab.chunk_cuda --cells lists) and VARIANTS pick them.
cd "$(dirname "$0")/.."
python3 -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -1
OUT=${OUT:-/tmp}
CHECK=${CHECK:-4/8:1x256,4/8:ragged,2/8:ragged}
TIME=${TIME:-4/8:1x8192,16/32:1x8192,16/32:8x1024,4/8:16x256}
VARIANTS=${VARIANTS:-triton,cuda1,cuda2,triton_bf16,cuda1_bf16,cuda2_bf16}
python3 -m lab.chunk_cuda --cells "$CHECK" --variants "$VARIANTS" --oracle --reps 3 ${ARGS:-} 2>&1 \
  | grep -v -i warn | tee "$OUT/chunk_cuda_check.log"
python3 -m lab.chunk_cuda --cells "$TIME" --variants "$VARIANTS" --reps 20 ${ARGS:-} 2>&1 \
  | grep -v -i warn | tee "$OUT/chunk_cuda_time.log"

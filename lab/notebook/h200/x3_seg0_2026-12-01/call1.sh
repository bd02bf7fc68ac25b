#!/usr/bin/env bash
# The x3 chain's segment 0 written into out (product) against plain stores ("rows") and the data
# flow before, whole calls; then the chain's GPU tests and the segment tests.  bash this OUT.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
python3 -c "import torch, triton, cupy; print(torch.__version__, torch.version.cuda, triton.__version__, cupy.__version__, torch.cuda.get_device_name())" > "$OUT/env.txt"
t0=$(date +%s)
python3 -m lab.x3_seg0_ab --cells 4/8:1x8192,4/8:1x32768,4/8:1x2048,2/8:1x8192 \
  --forms dense,pool 2>&1 | grep -v -i warn > "$OUT/ab.log"
echo "ab in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 240 python3 -m pytest -q -n 4 -p no:cacheprovider -rs tests/test_cuda_chunk_chain.py \
  tests/test_cuda_chunk.py tests/test_triton_chunk.py -k "cuda or x3 or segment or raw" \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/tests.log")"
grep -E "^FAILED|Error:" "$OUT/tests.log" | head -20
cut -c1-400 "$OUT/ab.log"

# After the review (Prep and Chain on cuda_build.Launch, the plan's form kept by bind): the
# chain kernel's bit-for-bit tests (8 forms, split and solo, against the Triton chain), the
# bound-launcher test and the cuda-chunk prefill matrix on the GPU.
#   bash lab/notebook/h200/prefill_plan_2026-12-02/call4.sh OUT
set -u
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout 230 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_cuda_chunk_chain.py \
  tests/test_triton_chunk.py::test_bind_makes_a_plan_once_a_form_and_launches_every_record \
  tests/test_cuda_chunk.py > "$OUT/pytest_review.log" 2>&1
echo "review tests: exit $?: $(tail -1 "$OUT/pytest_review.log")"
grep -h '^FAILED\|^ERROR' "$OUT/pytest_review.log" | cut -c1-300 | head

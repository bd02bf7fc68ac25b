# The prefill plan (triton_chunk.Plan, bound once per signature) against the tree before it, on
# a GPU: the bits of eager calls in both trees (lab.prefill_bits), the host work of a call in
# alternating processes (lab.host_prefill, ROUNDS rounds), then the CUDA prefill kernels' tests.
#   bash lab/notebook/h200/prefill_plan_2026-12-02/call1.sh OUT    # from the checkout
set -u
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
source "$(dirname "$0")/trees.sh"
git diff --stat HEAD > "$OUT/diff_stat.txt"; git log -1 --format=%H > "$OUT/head.txt"
{
for t in old new; do
  (cd /tmp && PYTHONPATH=/tmp/tree_$t:$ROOT python3 -c \
    "import gdnzoo.backends.triton_chunk as m; print('$t', m.__file__, hasattr(m, 'Plan'))")
done
for t in old new; do
  (cd /tmp && PYTHONPATH=/tmp/tree_$t:$ROOT timeout 200 python3 -m lab.prefill_bits \
    "$OUT/bits_$t.json" > "$OUT/bits_$t.log" 2>&1; echo "bits $t: exit $?")
done
(cd /tmp && PYTHONPATH=$ROOT python3 -m lab.prefill_bits --compare "$OUT/bits_old.json" "$OUT/bits_new.json")
} 2>&1 | tee "$OUT/bits.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do for t in old new; do
  (cd /tmp && PYTHONPATH=/tmp/tree_$t:$ROOT timeout 150 python3 -m lab.host_prefill \
    --algo auto,cuda-chunk-bf16 --engines plain,vllm --mixes 16x256,1x8192 --vary 20 \
    > "$OUT/host_${t}_$r.log" 2>&1)
  echo "== $t round $r (exit $?)"; grep -A22 '^mix ' "$OUT/host_${t}_$r.log"
done; done | tee "$OUT/host_ab.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
timeout "${TEST_S:-240}" python3 -m pytest -q -x -rfE -p no:cacheprovider \
  tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py > "$OUT/pytest_chain.log" 2>&1; echo "chain tests: exit $?: $(tail -1 "$OUT/pytest_chain.log")"
grep -h '^FAILED\|^ERROR' "$OUT"/pytest_*.log | cut -c1-300 | head -20
tar czf /tmp/call1.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/call1.tgz "$OUT/"
echo; cat /dev/null

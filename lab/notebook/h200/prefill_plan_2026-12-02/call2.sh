# call1.sh's host A/B again (its engine rows named the automatic choice "auto", which the
# engine adapters take as a backend name), then the other prefill test files beside each other.
#   bash lab/notebook/h200/prefill_plan_2026-12-02/call2.sh OUT    # from the checkout
set -u
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
source "$(dirname "$0")/trees.sh"
for r in $(seq 1 "${ROUNDS:-2}"); do for t in old new; do
  (cd /tmp && PYTHONPATH=/tmp/tree_$t:$ROOT timeout 120 python3 -m lab.host_prefill \
    --algo cuda-chunk,cuda-chunk-bf16 --engines plain,vllm --mixes 16x256,1x8192 --vary 20 \
    > "$OUT/host_${t}_$r.log" 2>&1)
  echo "== $t round $r (exit $?)"; grep -A22 '^mix ' "$OUT/host_${t}_$r.log"
done; done | tee "$OUT/host_ab.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1
left=$((570 - SECONDS))
for s in "A tests/test_triton_chunk_pdl.py tests/test_prefill_checkpoints.py tests/test_prefill_graphs.py tests/test_check_prefill.py tests/test_triton_chunk.py" \
         "C tests/test_prefill.py tests/test_integrations_prefill.py tests/test_tune_prefill.py"; do
  set -- $s; name=$1; shift
  ( timeout "$left" python3 -m pytest -q -rfE -p no:cacheprovider --tb=short "$@" \
      > "$OUT/pytest_$name.log" 2>&1; echo "$name: exit $?: $(tail -1 "$OUT/pytest_$name.log")" \
      > "$OUT/pytest_$name.summary" ) &
done
wait
grep -h '^FAILED\|^ERROR' "$OUT"/pytest_*.log | cut -c1-300 | head -20
cat "$OUT"/*.summary
tar czf /tmp/call2.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/call2.tgz "$OUT/"

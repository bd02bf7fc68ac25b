#!/usr/bin/env bash
# cuda-v4's K-first kernel with GDN_STAGED in the product: its tests, then the rule's cells
# through gdnzoo.decode (lab.kfirst_cuda: cuda-v4 on a k-last state, the K-first rule,
# fla-recurrent's K-first tile).  bash this OUT, from the repository root.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
t0=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -n 4 tests/test_cuda_v4_kfirst.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -5 | cut -c1-300
for args in "--geom 16/32 --state-dtype bf16" "--geom 16/32 --state-dtype bf16 --dest" \
            "--geom 16/32 --state-dtype fp32" "--geom 16/32 --state-dtype fp32 --dest" \
            "--geom 4/8 --state-dtype bf16 --batches 64,256,1024"; do
  case "$args" in *batches*) b="";; *) b="--batches 16,64,256";; esac
  timeout 60 python3 -m lab.kfirst_cuda $args $b --shapes "" 2>&1 | grep -v -i warn \
    | tee -a "$OUT/rule.log"
done
echo "done in $((SECONDS - t0)) s"

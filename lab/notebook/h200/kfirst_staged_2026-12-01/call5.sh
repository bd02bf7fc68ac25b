#!/usr/bin/env bash
# The staged K-first form on the bench's clocks (thirty-fifth session): the committed K-first
# run's two commands (bench/results/h200/kfirst/) on this tree, the 4/8 heads cells of 64 MB and
# up once, then kfirst_staged.py (the product's call beside the register tile's, one process).
# bash this OUT, from the repository root.  Timing only: nothing else runs beside it.
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
t0=$SECONDS
common="--batch 1,4,16,64,256 --state-dtype fp32,bf16 --mode dense,dest --no-plots"
run() {                     # run NAME SECONDS ARGS...
  local name=$1 secs=$2; shift 2
  timeout "$secs" gdnzoo bench "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? at $((SECONDS - t0)) s"
}
run kfirst 170 --heads 16,32 $common --state-layout k-first --algo cuda-v4,fla-recurrent \
  --time-budget 100
run klast 120 --heads 16,32 $common --algo cuda-v4 --timing kernel --time-budget 60
run kfirst_48 90 --heads 4,8 --batch 256,1024 --state-dtype fp32,bf16 --mode dense,dest \
  --no-plots --state-layout k-first --algo cuda-v4 --timing kernel --time-budget 40
run klast_48 90 --heads 4,8 --batch 256,1024 --state-dtype fp32,bf16 --mode dense,dest \
  --no-plots --algo cuda-v4 --timing kernel --time-budget 40
for d in "" --dest; do
  PYTHONPATH=. timeout 90 python3 lab/notebook/h200/kfirst_staged_2026-12-01/kfirst_staged.py --geom 16/32 \
    --batches 16,64,256 --state-dtype bf16 $d 2>&1 | grep -v -i warn | tee -a "$OUT/ab.log" \
    > /dev/null
done
echo "done in $((SECONDS - t0)) s"
for f in kfirst klast kfirst_48 klast_48; do
  echo "== $f"; grep -v "cell/s\|Warn\|_warn" "$OUT/$f.log" | tail -40 | cut -c1-160
done
echo "== ab"; grep -E "^  [0-9]|us \(" "$OUT/ab.log"
( cd "$OUT" && tar czf /tmp/call5.tgz --exclude=pip.log . && rm -rf ./* && mv /tmp/call5.tgz . )

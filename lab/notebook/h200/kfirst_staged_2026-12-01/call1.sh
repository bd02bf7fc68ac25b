# lab/notebook/h200/kfirst_staged_2026-12-01/call1.sh: the prototype beside cuda-v4 (k-last) and cuda-v4 K-first (the register tile), 16/32 heads
# (measured with the script then at lab/kfirst_staged.py and its prototype kernel; both are in git
# history at 02b68d2; the script beside this file now times the product against the register tile)
OUT=${1:-/tmp/out}; mkdir -p $OUT
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
for args in "--state-dtype bf16" "--state-dtype bf16 --dest" "--state-dtype fp32" "--state-dtype fp32 --dest"; do
  PYTHONPATH=. timeout 120 python3 lab/notebook/h200/kfirst_staged_2026-12-01/kfirst_staged.py --geom 16/32 --batches 1,16,64,256 $args 2>&1 | grep -v -i warn | tee -a $OUT/staged.log
done

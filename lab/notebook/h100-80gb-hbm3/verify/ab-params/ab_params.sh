#!/bin/bash
# A/B of GdnParams layouts on the H100 (verify/ab-params/NOTES in ../NOTES.md): each tree is the
# five files backends/{_cuda_build.py,cuda_v1.py,cuda_v4.py,cuda_v4.cu,gdn_common.cuh} of one
# layout, kept in .devrun/<tree>_hot (old: 34fb248; new3: the commit that adds this file), run
# in the order TREES gives, each through the verify bench at B = 1, 4, T = 2, 4, 8 (kernel clock)
# and the T = 1 bench at B = 1, 4; prints cuda-v4 and floor medians per cell and tree.
# usage: TREES="old new3" ab_params.sh ROUND   (or: ab_params.sh pytest, the GPU tests of new)
mkdir -p /tmp/gd && [ -d /tmp/gd/cupti ] || tar xJf .gpu/partB.tar.xz -C /tmp/gd
export PYTHONPATH=/tmp/gd
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
r=$1
use() { cp .devrun/${1}_hot/* backends/; }
if [ "$r" = pytest ]; then
  use new
  timeout 500 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_v4_verify.py tests/test_cuda_sources.py tests/test_cuda_v4_pdl.py > $OUT/pytest_new.log 2>&1
  tail -3 $OUT/pytest_new.log
  exit
fi
order=${TREES:-"new old"}
for tree in $order; do
  use $tree
  for sd in bf16 fp32; do
    timeout 150 gdnzoo bench --mode verify --algo cuda-v4 --batch 1,4 --tokens 2,4,8 --state-dtype $sd --timing kernel --time-budget 120 --no-plots --quiet --out $OUT/${tree}-r${r}_$sd > $OUT/${tree}-r${r}_${sd}.log 2>&1
  done
  timeout 100 gdnzoo bench --algo cuda-v4 --batch 1,4 --state-dtype fp32,bf16 --mode inplace,dest --timing kernel --time-budget 80 --no-plots --quiet --out $OUT/${tree}-r${r}_t1 > $OUT/${tree}-r${r}_t1.log 2>&1
done
use new3
python3 - <<'PY' > $OUT/summary_$r.txt
import csv, glob, os
out = os.environ["OUT"]
rows = {}
for f in glob.glob(f"{out}/*/results.csv") + glob.glob(f"{out}/*/*results.csv"):
    tree = os.path.basename(os.path.dirname(f))
    for r in csv.DictReader(open(f)):
        if r.get("clock") != "kernel" or r["backend"] not in ("cuda-v4", "floor"): continue
        key = (r["state_dtype"], r["mode"], r["T"], r["B"], r["backend"])
        rows.setdefault(key, {})[tree.split("-r")[0]] = r["median_us"]
for k in sorted(rows):
    v = rows[k]
    o = v.get("old")
    print(*k, *(f"{t}={v[t]}" + (f"({float(v[t]) - float(o):+.3f})" if o and t != "old" else "") for t in sorted(v)))
PY
cd $OUT && tar czf runs_$r.tgz *-r* && rm -rf $(ls -d */) *-r*.log
cat $OUT/summary_$r.txt

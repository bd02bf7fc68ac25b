# Warm host time of gdnzoo.decode, an older tree against this one, alternating processes:
#   git archive REV gdnzoo backends registry.yaml | tar -x -C /tmp/old_src
#   bash lab/host_ab.sh /tmp/old_src > host_ab.txt      # on the GPU machine, from the checkout
# Each line: backend, variant (out given / none), tree, round, median and min µs per call over
# 40 batches of 1000 calls (lab/host_ab.py).  Neither tree needs installing.
set -u
OLD_SRC=$1
ROOT=$PWD
rm -rf /tmp/tree_new /tmp/tree_old && mkdir -p /tmp/tree_new
cp -r gdnzoo backends registry.yaml /tmp/tree_new/ && cp -r "$OLD_SRC" /tmp/tree_old
for t in new old; do ln -sfn ../backends /tmp/tree_$t/gdnzoo/backends; done
for algo in cuda-v4 fla-recurrent; do for variant in none out dest; do
  for r in $(seq 1 "${ROUNDS:-6}"); do for tree in old new; do
    v=$(cd /tmp && PYTHONPATH=/tmp/tree_$tree python3 "$ROOT/lab/host_ab.py" $algo $variant 2>/dev/null)
    echo "$algo $variant $tree $r $v"
  done; done
done; done

# Sourced by call1.sh and call2.sh: the tree before (git's HEAD) and the working tree, each
# importable as gdnzoo from /tmp/tree_old and /tmp/tree_new (neither installed).
rm -rf /tmp/tree_new /tmp/tree_old && mkdir -p /tmp/tree_new /tmp/tree_old
git archive HEAD gdnzoo backends bench registry.yaml | tar -x -C /tmp/tree_old
cp -r gdnzoo backends bench registry.yaml /tmp/tree_new/
for t in new old; do
  ln -sfn ../backends /tmp/tree_$t/gdnzoo/backends; ln -sfn ../bench /tmp/tree_$t/gdnzoo/bench
done

# Host time of gdnzoo's own dispatch, an older tree against this one, on CPU through a no-op
# backend (added to each tree's registry.yaml), alternating processes; no GPU needed:
#   bash lab/host_ab_noop.sh REV > host_ab_noop.txt
# Each line: variant (out none / given / dest), tree, round, median and min µs per call
# (lab/host_ab_noop.py).  The no-op backend has no bound launcher, so this is the face's work
# without what a fast backend saves from decode's pointer reads.
set -eu
REV=$1
ROOT=$PWD
W=$(mktemp -d)
mkdir -p "$W/old" "$W/new"
git archive "$REV" gdnzoo backends registry.yaml | tar -x -C "$W/old"
tar -c gdnzoo backends registry.yaml | tar -x -C "$W/new"
printf 'def available(): return True, "no-op"\ndef supports(p): return True, ""\ndef run(*a, **k): pass\n' > "$W/noop_backend.py"
for t in old new; do
  ln -sfn ../backends "$W/$t/gdnzoo/backends"
  python3 - "$W/$t/registry.yaml" "$W/$t/noop.yaml" <<'PY'
import sys, yaml
reg = yaml.safe_load(open(sys.argv[1]))
reg["backends"].append(dict(name="noop", entry="noop_backend:run", language="python",
                            devices=["cpu", "cuda"], state_dtypes=["fp32", "bf16"], notes="no-op"))
yaml.safe_dump(reg, open(sys.argv[2], "w"), sort_keys=False)
PY
done
for variant in none out dest; do for r in 1 2 3 4; do for tree in old new; do
  v=$(cd "$W" && GDNZOO_REGISTRY="$W/$tree/noop.yaml" PYTHONPATH="$W/$tree:$W" OMP_NUM_THREADS=1 \
      python3 "$ROOT/lab/host_ab_noop.py" $variant 2>/dev/null)
  echo "$variant $tree $r $v"
done; done; done
rm -rf "$W"

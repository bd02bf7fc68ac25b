# lab.chunk_ablate on a lent GPU: compiles each cell's variants in parallel processes, then
# times them one after another.  CELLS and VARIANTS (comma lists) pick a subset.
cd "$(dirname "$0")/.."
python3 -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -1
CELLS=${CELLS:-4/8:1x8192,16/32:8x1024}
VARIANTS=${VARIANTS:-$(python3 -c "import lab.chunk_ablate as a; print(','.join(a.VARIANTS))")}
for c in ${CELLS//,/ }; do
  python3 -m lab.chunk_ablate --cells "$c" --variants "$VARIANTS" --reps 1 > "/tmp/warm_${c//[\/:]/_}.log" 2>&1 &
done
wait
python3 -m lab.chunk_ablate --cells "$CELLS" --variants "$VARIANTS" --reps 20 ${ARGS:-} 2>&1 | grep -v -i warn | tee "${OUT:-/tmp}/ablate.log"

#!/usr/bin/env bash
# ncu's stall samples by SASS instruction of the x3 chain kernel, dense against pool form:
# bash ncu_forms.sh OUT [CELL], from the repository root.
OUT=${1:-/tmp/out}; CELL=${2:-16/32:1x8192}; D=lab/notebook/h200/x3_forms_2026-12-01
for form in dense pool; do
  timeout 200 ncu --clock-control none -k regex:gdn_wgmma_chain --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source yes \
    -o "$OUT/x3_$form" python3 $D/one_call.py $form $CELL > "$OUT/ncu_$form.log" 2>&1
  echo "ncu $form: exit $?"
  ncu -i "$OUT/x3_$form.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$form.csv"
  ncu -i "$OUT/x3_$form.ncu-rep" > "$OUT/details_$form.txt"
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|No Eligible" "$OUT/details_$form.txt"
  python3 -m lab.ncu_sass_top "$OUT/sass_$form.csv" --top 25 > "$OUT/top_$form.txt"
  head -40 "$OUT/top_$form.txt"
done

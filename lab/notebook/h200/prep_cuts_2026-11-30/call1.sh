#!/usr/bin/env bash
# Device call 1: the prep edits timed alone (lab.prep_ab), their whole calls' errors, then
# sep+stm+tree applied to the device copy's kernel and the prep's tests and the chain's run on it.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
E=lab/notebook/h200/prep_cuts_2026-11-30/edits.py
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
CELLS=4/8:1x8192,16/32:8x1024,16/32:1x8192,16/64:8x1024,16/32:16x256
V=sep,stm,tree,sep+stm,sep+stm+tree
timeout 200 python3 -m lab.prep_ab --rev '' --edits $E --variants $V --precision bf16 --cells $CELLS > "$OUT/ab_bf16.log" 2>&1
timeout 60 python3 -m lab.prep_ab --rev '' --edits $E --variants sep,tree,sep+tree --cells 4/8:1x8192,16/32:8x1024 > "$OUT/ab_bf16x3.log" 2>&1
timeout 90 python3 -m lab.prep_ab --rev '' --edits $E --variants sep,stm,tree,sep+stm+tree --precision bf16 --errors --cells 4/8:1x8192,16/32:8x1024,2/8:1x32768 > "$OUT/errors_bf16.log" 2>&1
timeout 60 python3 -m lab.prep_ab --rev '' --edits $E --variants sep,tree,sep+tree --errors --cells 4/8:1x8192,16/32:4x1024 > "$OUT/errors_bf16x3.log" 2>&1
timeout 80 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --cells "4,8:8192;16,32:1024+1024+1024+1024+1024+1024+1024+1024;16,32:32768" > "$OUT/kernels_tree.log" 2>&1
python3 - "$E" <<'PY'
import sys; sys.path.insert(0, ".")
from pathlib import Path
from lab.source_edits import edited, load
p = Path("backends/cuda_chunk_prep.cu")
p.write_text(edited(p, load(sys.argv[1]), "sep+stm+tree").read_text())
PY
timeout 80 python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --cells "4,8:8192;16,32:1024+1024+1024+1024+1024+1024+1024+1024;16,32:32768" > "$OUT/kernels_edited.log" 2>&1
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_chunk.py tests/test_cuda_chunk_chain.py > "$OUT/pytest_edited.log" 2>&1
echo "== ab bf16"; cat "$OUT/ab_bf16.log"; echo "== ab bf16x3"; cat "$OUT/ab_bf16x3.log"
echo "== errors"; cat "$OUT/errors_bf16.log" "$OUT/errors_bf16x3.log" | cut -c1-400
echo "== kernels tree"; grep -v "^ *$" "$OUT/kernels_tree.log" | tail -25
echo "== kernels edited"; grep -v "^ *$" "$OUT/kernels_edited.log" | tail -25
echo "== pytest"; tail -5 "$OUT/pytest_edited.log"

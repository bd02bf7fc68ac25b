#!/usr/bin/env bash
# The output pass looped over chunks (lab.cp_out_loop) against the product's, whole calls of
# cuda-chunk (x3 chain, fp32 o and w) and cuda-chunk-bf16 (in place); the kernels of one call
# each; ncu on the product's pass at 4/8 1x8192 (cuda-chunk).  bash this OUT (no bundle).
OUT=${1:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
t0=$SECONDS
timeout 200 python3 -m lab.cp_out_loop --algo cuda-chunk --rounds 2 --reps 10 \
  --shapes 2x128,4x128,4x64,8x64,16x64 \
  --cells "4,8:1x8192;4,8:1x32768;2,8:1x8192" 2>&1 | grep -v -i warn > "$OUT/x3.log"
echo "x3 A/B $((SECONDS - t0)) s"
timeout 150 python3 -m lab.cp_out_loop --algo cuda-chunk-bf16 --rounds 2 --reps 10 \
  --shapes 2x128,4x128,4x64,8x64 \
  --cells "4,8:1x8192;2,8:1x32768;4,8:2x16384" 2>&1 | grep -v -i warn > "$OUT/bf16.log"
echo "bf16 A/B $((SECONDS - t0)) s"
timeout 80 python3 -m lab.prefill_kernels --algo cuda-chunk,cuda-chunk-bf16 --reps 10 \
  --cells "4,8:8192;2,8:32768" > "$OUT/kernels.log" 2>&1
echo "kernels $((SECONDS - t0)) s"
cat > /tmp/ncu_call.py <<'PY'
import torch
from lab.prefill_gpu import make, prefill_call
x = make([8192], 4, 8, seed=0)
call = prefill_call(x, "cuda-chunk")
for _ in range(4):
    call()
torch.cuda.synchronize()
PY
timeout 120 ncu --clock-control none -k regex:cp_out --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis python3 /tmp/ncu_call.py > "$OUT/ncu_cp_out.log" 2>&1
echo "ncu rc $? $((SECONDS - t0)) s"
grep -E "^    (Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Warp Cycles Per Issued|No Eligible|Stall|Dynamic Shared|Grid Size|Block Size)" "$OUT/ncu_cp_out.log" | cut -c1-110
for f in x3 bf16; do echo "== $f"; grep -E "x$|errors|differ" "$OUT/$f.log" | cut -c1-250; done
grep -E "us|cp_out|chain|prep" "$OUT/kernels.log" | head -30 | cut -c1-200

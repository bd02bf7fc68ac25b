#!/usr/bin/env bash
# Device call: ncu on cuda-chunk-bf16's chain kernel in its solo form (two CTAs an SM), where
# memory may bound it: 16/32 8x1024 and 16/64 16x256 (and the 185 KB form at 4/8 1x8192, one
# wave, for comparison).  No bundle.
set -uo pipefail
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
for cell in "16,32:1024+1024+1024+1024+1024+1024+1024+1024" \
            "16,64:256+256+256+256+256+256+256+256+256+256+256+256+256+256+256+256" "4,8:8192"; do
  timeout 150 ncu --clock-control none -k regex:gdn_wgmma_chain --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_tensor_op_gmma.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_lg_throttle,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_selected \
    python3 -m lab.prefill_kernels --algo cuda-chunk-bf16 --reps 3 --cells "$cell" \
    > "$OUT/ncu_${cell%%:*}_$(echo "$cell" | cut -c7-20 | tr '+' '_').log" 2>&1
  echo "$cell: exit $?"
done
cd "$OUT" && grep -H "Duration\|L2 Cache Throughput\|DRAM Throughput\|Compute (SM)\|gmma_cycles_active\|Registers Per\|Block Limit\|Achieved Occ\|Issue Slots Busy\|stalled_long\|stalled_wait \|stalled_math\|stalled_mio\|stalled_barrier\|lts__t_bytes\|dram__bytes" ncu_*.log | sed 's/  */ /g'
# second call: the traffic probes (traffic.py) beside the product's solo form
#   python3 -m lab.chain_ab --solo --edits lab/notebook/h200/chain_ncu_solo_2026-11-30/traffic.py \
#     --variants solo_q_once,solo_k_half,solo_both --cells 16/32:8x1024,16/64:16x256,16/64:8x1024

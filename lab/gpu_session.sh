#!/usr/bin/env bash
# One GPU session in parts that each fit one 10-minute call (the GPU bundle of FlashInfer, CuTe
# DSL, FLA and vLLM's kernels unpacked at /tmp/gd first; see the developers' notes):
#
#   bash lab/gpu_session.sh tests   OUT  # the decode matrix, check, clocks and a third of the rest
#   bash lab/gpu_session.sh tests-rest OUT  # the decode suite's other two thirds, six shards
#   bash lab/gpu_session.sh prefill OUT  # the prefill tests alone + lab.engine_prefill_gpu
#   bash lab/gpu_session.sh prefill-all OUT  # every prefill test file in four shards side by
#                                        # side, then check --op prefill (about 8 min; the
#                                        # bundle staged for the peers' and engines' cases)
#   bash lab/gpu_session.sh models-tests OUT  # the models' tests + check --op prefill
#   bash lab/gpu_session.sh sweep OUT    # lab.prefill_gpu $SWEEP_ARGS (configs and peers)
#   bash lab/gpu_session.sh timing  OUT  # gdnzoo bench --mode prefill (BUDGET s, default 420;
#                                        # RUNS: ';'-separated argument lists, one run each)
#   bash lab/gpu_session.sh models OUT   # lab.models_gpu (FLA entry points, transformers;
#                                        # MODELS_ARGS, default --io bfloat16: both io dtypes
#                                        # ran past 540 s on an H200)
#   bash lab/gpu_session.sh engine OUT   # gdnzoo bench --mode engine-prefill (ENGINE_ARGS)
#   bash lab/gpu_session.sh pool OUT     # gdnzoo bench --mode pool, both state dtypes (BUDGET s)
#   bash lab/gpu_session.sh verify-tune OUT  # cuda-v4's verify launch rows of this GPU (TUNE_RUNS;
#                                        # no bundle needed), the table files into OUT
#   bash lab/gpu_session.sh kfirst OUT   # tests/test_forms.py + test_tables.py beside
#                                        # lab.models_gpu's correctness, then its decode timing
#   bash lab/gpu_session.sh recurrent OUT  # fla-recurrent's prefill: its GPU tests and the forms'
#                                        # beside check --op prefill, then timed beside
#                                        # triton-chunk (RMIX mixes; no bundle needed)
#   bash lab/gpu_session.sh profile OUT  # ncu on triton-chunk's launches ($PROFILE_CASES), then
#                                        # its GPU tests and the prefill PDL tests (no bundle needed)
#   bash lab/gpu_session.sh segments OUT # triton-chunk's segments (context parallelism): its
#                                        # GPU tests, then lab.chunk_ablate's seg* variants
#                                        # with errors (no bundle needed)
#   bash lab/gpu_session.sh chunk-bf16 OUT  # cuda-chunk-bf16: its tests and the matrices on it,
#                                        # check --op prefill, compute-sanitizer, the chain timed
#                                        # (no bundle needed)
#
# Each part writes its logs into OUT/logs_PART.tgz and prints a short summary last.  Correctness shards run
# side by side (no clock is read in them); the timing part runs alone.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:?usage: gpu_session.sh tests|timing|models OUT}
OUT=${2:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/gd:/tmp/gd/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 ||
  { echo "pip install failed"; tail -5 "$OUT/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
python3 - > "$OUT/env.txt" 2>&1 <<'EOF'
import importlib, torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print("gpu", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
for m in ("flashinfer", "fla", "cupy", "cutlass", "vllm", "transformers"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "not importable:", type(e).__name__, e)
EOF
cat "$OUT/env.txt"

shard() {                   # shard NAME SECONDS ARGS...: pytest in the background, log in OUT
  local name=$1 secs=$2; shift 2
  ( t0=$SECONDS; timeout "$secs" python3 -m pytest -q -rfE -p no:cacheprovider --durations=15 "$@" \
      > "$OUT/pytest_$name.log" 2>&1; rc=$?
    echo "$name: exit $rc in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_$name.log")" \
      > "$OUT/pytest_$name.summary" ) &
}

pack_logs() {                # everything in one archive (a call returns few files)
  local t; t=$(mktemp -d)/logs_$PART.tgz
  tar czf "$t" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$t" "$OUT/"
}
trap pack_logs EXIT

rest_files() {              # rest_files I: every third test file (from the I-th) but the matrix,
                            # the clocks and the files of prefill-all and models-tests
  ls tests/test_*.py | grep -v -x -F -f <(printf 'tests/%s\n' \
    test_matrix.py test_clocks_gpu.py test_prefill.py test_triton_chunk.py \
    test_check_prefill.py test_integrations_fla.py test_integrations_transformers.py test_op.py \
    test_triton_chunk_pdl.py test_prefill_checkpoints.py test_pack_prefill.py \
    test_prefill_graphs.py test_cuda_chunk.py test_cuda_chunk_chain.py \
    test_integrations_prefill.py test_tune_prefill.py test_bench_engine_prefill.py \
    test_fla_recurrent_prefill.py test_forms.py) | awk -v i="$1" '(NR - 1) % 3 == i'
}

case "$PART" in
tests)                      # the decode suite's matrix, check and clocks, and a third of the
                            # rest (about 5 min on an H200); tests-rest: the other two thirds
  shard matrix_ours 520 tests/test_matrix.py -k "cuda-v4 or fla-recurrent or every_available"
  shard matrix_rest 520 tests/test_matrix.py -k "not cuda-v4 and not fla-recurrent"
  mapfile -t part < <(rest_files 2)
  shard rest_2 520 "${part[@]}"
  ( timeout 200 gdnzoo check --algo cuda-v4,fla-recurrent,fi-baseline > "$OUT/check_decode.log" 2>&1
    echo "check (decode): exit $?" > "$OUT/check_decode.summary" ) &
  wait
  timeout 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_clocks_gpu.py \
    > "$OUT/pytest_clocks.log" 2>&1
  echo "clocks: exit $?: $(tail -1 "$OUT/pytest_clocks.log")" > "$OUT/pytest_clocks.summary"
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== summary"; cat "$OUT"/*.summary
  ;;
tests-rest)                 # the rest's other two thirds in six shards (about 7 min on an H200:
                            # beside the matrix shards two thirds stopped at 73% and 86% of 520 s;
                            # alone in six shards they passed in 129-405 s, 2026-11-30)
  mapfile -t files < <(rest_files 0; rest_files 1)
  for i in 0 1 2 3 4 5; do
    part=()
    for ((j = i; j < ${#files[@]}; j += 6)); do part+=("${files[j]}"); done
    shard "rest_$i" 540 "${part[@]}"
  done
  wait
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== summary"; cat "$OUT"/*.summary
  ;;
prefill)                    # the prefill tests alone, then the engines' prefill (about 8 min)
  t0=$SECONDS
  timeout 360 python3 -m pytest -q -rfE -p no:cacheprovider --tb=short tests/test_prefill.py \
    tests/test_triton_chunk.py tests/test_prefill_checkpoints.py \
    tests/test_integrations_prefill.py > "$OUT/pytest_prefill.log" 2>&1
  echo "prefill tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_prefill.log")" \
    > "$OUT/pytest_prefill.summary"
  timeout 150 python3 -m lab.engine_prefill_gpu > "$OUT/engine_prefill.log" 2>&1
  echo "lab.engine_prefill_gpu: exit $?" > "$OUT/engine_prefill.summary"
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== engine prefill"; tail -25 "$OUT/engine_prefill.log"
  echo "== summary"; cat "$OUT"/*.summary
  ;;
models-tests)               # the models' entry points and check --op prefill (up to 9 min:
                            # FLA's first calls compile and autotune for ~4.5 min)
  shard models 540 --tb=short tests/test_integrations_fla.py \
    tests/test_integrations_transformers.py tests/test_op.py tests/test_check_prefill.py
  ( timeout 330 gdnzoo check --op prefill --algo all > "$OUT/check_prefill.log" 2>&1
    echo "check --op prefill: exit $?" > "$OUT/check_prefill.summary" ) &
  wait
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== check --op prefill"; grep -v "^ " "$OUT/check_prefill.log" | tail -30
  echo "== summary"; cat "$OUT"/*.summary
  ;;
sweep)                      # lab.prefill_gpu: triton-chunk's configs and the peers (SWEEP_ARGS),
                            # then triton-chunk's GPU tests when CHUNK_TESTS is set
  timeout ${SWEEP_S:-560} python3 -m lab.prefill_gpu ${SWEEP_ARGS:-} > "$OUT/sweep.log" 2>&1
  echo "lab.prefill_gpu: exit $?"
  if [ -n "${CHUNK_TESTS:-}" ]; then
    t0=$SECONDS
    timeout "$CHUNK_TESTS" python3 -m pytest -q -rfE -p no:cacheprovider --tb=short \
      tests/test_triton_chunk.py tests/test_prefill.py tests/test_prefill_checkpoints.py \
      -k "triton-chunk or test_triton_chunk" > "$OUT/pytest_chunk.log" 2>&1
    echo "triton-chunk tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_chunk.log")"
    grep -h "^FAILED\|^ERROR" "$OUT/pytest_chunk.log" | cut -c1-300 | head -20
  fi
  grep -E "ms, out|FAILS|ERROR" "$OUT/sweep.log" | sed -e 's/triton-chunk default/tc dflt/' \
    -e 's/ prep_warps=4 chunk=64//' -e 's/, host [0-9.]*//' | cut -c1-210 | tail -60
  ;;
timing)                     # gdnzoo bench --mode prefill alone (about 9 min on an H200); RUNS:
                            # ';'-separated argument lists, one run each (bench_prefill_I)
  i=0
  IFS=';' read -ra runs <<< "${RUNS:---time-budget ${BUDGET:-420}}"
  for r in "${runs[@]}"; do
    t0=$SECONDS; i=$((i + 1))
    # shellcheck disable=SC2086  # each run's arguments split on spaces
    timeout 560 gdnzoo bench --mode prefill --state-dtype fp32 --no-plots $r \
      --out "$OUT/bench_prefill_$i" > "$OUT/bench_prefill_$i.log" 2>&1
    echo "gdnzoo bench --mode prefill $r: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/runs.txt"
  done
  for f in "$OUT"/bench_prefill_*.log; do echo "== $f"; grep -A40 "^kernel" "$f" | head -45; done
  cat "$OUT/runs.txt"
  ;;
engine)                     # gdnzoo bench --mode engine-prefill alone (the PDL tests: profile);
  t0=$SECONDS               # ENGINE_ARGS replaces --state-dtype fp32,bf16
  # shellcheck disable=SC2086  # the arguments split on spaces
  timeout 480 gdnzoo bench --mode engine-prefill ${ENGINE_ARGS:---state-dtype fp32,bf16} \
    --no-plots --out "$OUT/bench_engine" > "$OUT/bench_engine.log" 2>&1
  echo "gdnzoo bench --mode engine-prefill: exit $? in $((SECONDS - t0)) s"
  tail -60 "$OUT/bench_engine.log"
  ;;
verify-tune)                # cuda-v4's verify launch rows of this GPU (gdnzoo tune --shapes --mode
                            # verify --write), one search a ';'-separated TUNE_RUNS entry (default:
                            # T = 8, one state dtype a search; then TUNE_RUNS with --tokens 4, then
                            # 2, in later calls), the table files and every search's files into
                            # OUT.  On the H200 (2026-11-30, states-form confirm) one state dtype's
                            # five cells took 155 s warm, both dtypes cold at T = 8 over 270 s.
  i=0
  IFS=';' read -ra runs <<< "${TUNE_RUNS:---tokens 8 --state-dtype fp32;--tokens 8 --state-dtype bf16}"
  for r in "${runs[@]}"; do
    t0=$SECONDS; i=$((i + 1))
    # shellcheck disable=SC2086  # each run's arguments split on spaces
    timeout ${TUNE_S:-270} gdnzoo tune --shapes --algo cuda-v4 --mode verify $r --write \
      --out "$OUT/tune_$i" > "$OUT/tune_$i.log" 2>&1
    echo "gdnzoo tune --shapes --algo cuda-v4 --mode verify $r --write: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/runs.txt"
    grep -A12 "^row sets\|^no row" "$OUT/tune_$i.log" | head -14
  done
  cp backends/tables/*.yaml "$OUT/" 2>/dev/null
  git diff --stat -- backends/tables/ | tail -3
  ;;
pool)                       # gdnzoo bench --mode pool alone: the rows of this GPU's table_pool
  t0=$SECONDS
  timeout 560 gdnzoo bench --mode pool --state-dtype fp32,bf16 --time-budget ${BUDGET:-420} \
    --no-plots --out "$OUT/bench_pool" > "$OUT/bench_pool.log" 2>&1
  echo "gdnzoo bench --mode pool: exit $? in $((SECONDS - t0)) s"
  tail -60 "$OUT/bench_pool.log"
  ;;
models)
  timeout ${MODELS_S:-540} python3 -m lab.models_gpu ${MODELS_ARGS:---io bfloat16} > "$OUT/models_gpu.log" 2>&1
  echo "lab.models_gpu: exit $?"; tail -50 "$OUT/models_gpu.log"
  ;;
kfirst)                     # the state forms' tests (fla-recurrent's K-first tile) beside
                            # lab.models_gpu's correctness part, then its decode timing alone
  shard forms 330 --tb=short tests/test_forms.py tests/test_tables.py
  ( timeout ${MODELS_S:-330} python3 -u -m lab.models_gpu --parts correctness --io bfloat16 \
      > "$OUT/models_correctness.log" 2>&1
    echo "lab.models_gpu correctness: exit $?" > "$OUT/models_correctness.summary" ) &
  wait
  timeout 150 python3 -u -m lab.models_gpu --parts decode --batches 1,4,16,64,256 \
    > "$OUT/models_decode.log" 2>&1
  echo "lab.models_gpu decode: exit $?" > "$OUT/models_decode.summary"
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== models"; tail -25 "$OUT/models_correctness.log"; tail -22 "$OUT/models_decode.log"
  echo "== summary"; cat "$OUT"/*.summary
  ;;
recurrent)                  # fla-recurrent's prefill on a GPU: correctness, then its time
  shard recurrent 300 --tb=short tests/test_fla_recurrent_prefill.py tests/test_forms.py
  shard prefill_recurrent 300 --tb=short tests/test_prefill.py tests/test_prefill_checkpoints.py \
    -k fla-recurrent
  ( timeout 300 gdnzoo check --op prefill --algo fla-recurrent,triton-chunk \
      > "$OUT/check_prefill.log" 2>&1
    echo "check --op prefill: exit $?" > "$OUT/check_prefill.summary" ) &
  wait
  for heads in ${RHEADS:-4,8 16,32}; do
    t0=$SECONDS
    timeout ${RTIME:-130} gdnzoo bench --mode prefill --algo triton-chunk,fla-recurrent \
      --heads "$heads" --mix "${RMIX:-1x8192,8x1024,16x256,64x64,128x32,256x16,ragged}" \
      --state-dtype fp32 --timing kernel --iters 30 --no-plots \
      --out "$OUT/bench_recurrent_${heads/,/_}" > "$OUT/bench_recurrent_${heads/,/_}.log" 2>&1
    echo "bench --heads $heads: exit $? in $((SECONDS - t0)) s" \
      > "$OUT/bench_recurrent_${heads/,/_}.summary"
  done
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== check"; grep -v "^ " "$OUT/check_prefill.log" | tail -12
  for f in "$OUT"/bench_recurrent_*.log; do echo "== $f"; tail -30 "$f"; done
  echo "== summary"; cat "$OUT"/*.summary
  ;;
profile)                    # ncu (counters, stall reasons) on triton-chunk, then its GPU tests
  i=0
  cases='4/8:1x8192:{} 16/64:8x1024:{}'      # H/HV:mix:config (JSON), space-separated
  for c in ${PROFILE_CASES:-$cases}; do
    IFS=: read -r geom seqs cfg <<< "$c"; i=$((i + 1))
    timeout 150 ncu --clock-control none -k regex:chunk_ --launch-skip 4 --launch-count 2 \
      --set full --import-source yes python3 -m lab.chunk_profile --geom "$geom" --seqs "$seqs" \
      --config "$cfg" > "$OUT/ncu_$i.log" 2>&1
    echo "ncu $geom $seqs $cfg: exit $?"
    grep -E "chunk_(prep|state)_kernel|^    (Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|No Eligible)" "$OUT/ncu_$i.log" | cut -c1-120
  done
  t0=$SECONDS
  timeout ${CHUNK_TESTS:-300} python3 -m pytest -q -rfE -p no:cacheprovider --tb=short \
    tests/test_triton_chunk.py tests/test_triton_chunk_pdl.py tests/test_prefill.py \
    tests/test_prefill_checkpoints.py -k "triton-chunk or test_triton_chunk or pdl" \
    > "$OUT/pytest_chunk.log" 2>&1
  echo "triton-chunk + PDL tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_chunk.log")"
  grep -h "^FAILED\|^ERROR" "$OUT/pytest_chunk.log" | cut -c1-300 | head -20
  ;;
segments)                   # triton-chunk's segmented form: GPU tests, then timed with errors
  t0=$SECONDS
  timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider --tb=short tests/test_triton_chunk.py \
    -k "segments or pool or lengths" > "$OUT/pytest_segments.log" 2>&1
  echo "segments tests: exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_segments.log")"
  grep -h "^FAILED\|^ERROR" "$OUT/pytest_segments.log" | cut -c1-300 | head -20
  CELLS=${CELLS:-4/8:1x8192,4/8:1x32768,2/8:1x8192,4/8:2x4096} \
    VARIANTS=${VARIANTS:-base,seg2,seg2w4,seg2w4s2,seg3w4,seg4w4} ARGS=--errors OUT="$OUT" \
    timeout 300 bash lab/chunk_ablate_gpu.sh > "$OUT/ablate_run.log" 2>&1
  echo "lab.chunk_ablate: exit $?"; grep -v "^ *$" "$OUT/ablate.log" | tail -30
  ;;
prefill-all)                # every prefill test file, four shards side by side (about 8 min)
  t0=$SECONDS
  shard A 480 --tb=short tests/test_integrations_transformers.py tests/test_triton_chunk_pdl.py \
    tests/test_prefill_checkpoints.py tests/test_pack_prefill.py tests/test_check_prefill.py \
    tests/test_prefill_graphs.py
  shard B 480 --tb=short tests/test_cuda_chunk.py tests/test_cuda_chunk_chain.py \
    tests/test_triton_chunk.py
  shard C 480 --tb=short tests/test_prefill.py tests/test_integrations_prefill.py
  shard D 480 --tb=short tests/test_tune_prefill.py tests/test_bench_engine_prefill.py \
    tests/test_fla_recurrent_prefill.py tests/test_forms.py    # FLA's own: models-tests
  wait
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -40
  echo "== summary ($((SECONDS - t0)) s)"; cat "$OUT"/*.summary
  ;;
chunk-bf16)                 # cuda-chunk-bf16: its kernel tests and the registry's matrices on it,
  t0=$SECONDS               # compute-sanitizer over the chain tests, then lab.wgmma_chain timed
  shard chain 300 --tb=short tests/test_cuda_chunk_chain.py tests/test_cuda_chunk.py
  shard matrices 400 --tb=short -k "cuda-chunk-bf16" tests/test_prefill.py tests/test_forms.py \
    tests/test_prefill_checkpoints.py tests/test_prefill_graphs.py tests/test_triton_chunk_pdl.py \
    tests/test_pack_prefill.py
  ( timeout 200 gdnzoo check --op prefill --algo cuda-chunk-bf16,triton-chunk-bf16 \
      > "$OUT/check_prefill.log" 2>&1; echo "check --op prefill: exit $?" > "$OUT/check.summary" ) &
  wait
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool $tool python3 -m pytest -q -p no:cacheprovider -rs \
      tests/test_cuda_chunk_chain.py -k bit_for_bit > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $?: $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" \
      "$OUT/sanitizer_$tool.log" | tail -1)" > "$OUT/sanitizer_$tool.summary"
  done
  timeout 120 python3 -m lab.wgmma_chain --no-out > "$OUT/wgmma_timing.log" 2>&1
  echo "lab.wgmma_chain: exit $?" > "$OUT/wgmma.summary"
  echo "== failures"; grep -h "^FAILED\|^ERROR" "$OUT"/pytest_*.log | cut -c1-300 | head -30
  echo "== check"; grep -v "^ " "$OUT/check_prefill.log" | tail -12
  echo "== timing"; grep "chain alone\|vs triton" "$OUT/wgmma_timing.log" | cut -c1-200
  echo "== summary ($((SECONDS - t0)) s)"; cat "$OUT"/*.summary
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac

#!/usr/bin/env bash
# The test command: set up, then run the whole suite, one worker a core.  Without a GPU, Triton
# kernels run through the Triton interpreter, CUDA sources are compiled with nvcc (not run),
# and every GPU-only test is skipped with its reason (shown in the summary).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
# One pytest worker a core (pytest-xdist, in the test extra; TEST_WORKERS overrides), serial
# without it.
workers=()
if "$PY" -c "import xdist" 2>/dev/null; then workers=(-n "${TEST_WORKERS:-auto}"); fi
exec "$PY" -m pytest tests "${workers[@]}" "$@"

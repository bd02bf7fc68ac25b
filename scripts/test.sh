#!/usr/bin/env bash
# The test command: set up, then run the whole suite.  Without a GPU, Triton kernels run
# through the Triton interpreter, CUDA sources are compiled with nvcc (not run), and every
# GPU-only test is skipped with its reason (shown in the summary).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest tests "$@"

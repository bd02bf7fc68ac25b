#!/usr/bin/env bash
# Installs gdnzoo and what its CPU tests need on a fresh machine (no GPU needed).
# On a GPU machine, install the GPU extras too: pip install -e '.[triton,cuda,flashinfer,fla,bench]'.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
# torch first and pinned: an unpinned 'torch' would pull a multi-GB CUDA build on a CPU machine.
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch (CPU build)"
  pip_install "torch==2.13.0" || pip_install torch --index-url https://download.pytorch.org/whl/cpu
fi
# triton 3.6.0 matches the GPU machines; on CPU it runs our Triton kernels through its interpreter.
if ! "$PY" -c "import triton" 2>/dev/null; then
  echo "[setup] installing triton 3.6.0 (interpreter on CPU)"
  pip_install "triton==3.6.0"
fi
echo "[setup] installing gdnzoo (editable) with test extras"
pip_install --no-build-isolation -e ".[test]" 2>/dev/null || pip_install -e ".[test]"
"$PY" -c "import gdnzoo, torch, triton; print(f'[setup] gdnzoo {gdnzoo.__version__}, torch {torch.__version__}, triton {triton.__version__}, cuda={torch.cuda.is_available()}')"

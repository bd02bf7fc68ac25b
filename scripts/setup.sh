#!/usr/bin/env bash
# Installs gdnzoo and what its CPU tests need into the active Python (no GPU needed):
#   torch 2.13.0 if torch is missing: without a GPU its CPU build, from the PyTorch CPU index
#     (falling back to the default index when that index cannot be reached); with a GPU
#     (nvidia-smi lists one) the default index's build (on PyPI: CUDA, with NVIDIA's wheels);
#   triton (TRITON_VERSION, default 3.6.0) if triton is missing: on CPU it runs our Triton
#     kernels through its interpreter;
#   gdnzoo editable from this checkout with numpy, pyyaml and its test extra (pytest,
#   pytest-xdist, transformers).
# On a GPU machine, install the GPU extras too: pip install -e '.[gpu]'.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=torch==2.13.0
TRITON=triton==${TRITON_VERSION:-3.6.0}
CPU_INDEX=https://download.pytorch.org/whl/cpu
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }
# The CPU index answers within 5 s (one retry), or setup takes the default index at once.
cpu_index_reachable() {
  "$PY" - "$CPU_INDEX/torch/" <<'EOF'
import sys, urllib.request
for attempt in range(2):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=5).close()
        sys.exit(0)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
print(f"[setup] the PyTorch CPU index is not reachable ({why})")
sys.exit(1)
EOF
}

# torch first and pinned: from the default index (PyPI) torch is the CUDA build, several GB.
if ! "$PY" -c "import torch" 2>/dev/null; then
  if have_gpu; then
    echo "[setup] installing $TORCH (a GPU is present: the default index's CUDA build)"
    pip_install "$TORCH"
  elif cpu_index_reachable && pip_install --timeout 10 --retries 1 --index-url "$CPU_INDEX" "$TORCH"; then
    echo "[setup] installed $TORCH from the PyTorch CPU index (no GPU here)"
  else
    echo "[setup] installing $TORCH from the default index (no GPU here; PyTorch CPU index failed)"
    pip_install "$TORCH"
  fi
  "$PY" -W ignore -c "import torch; c = torch.version.cuda; print(f'[setup] torch {torch.__version__}: '
            + (f'the CUDA {c} build' if c else 'the CPU build'))"
fi
if ! "$PY" -c "import triton" 2>/dev/null; then
  echo "[setup] installing $TRITON (its interpreter runs the Triton kernels on CPU)"
  pip_install "$TRITON"
fi
echo "[setup] installing gdnzoo (editable) with its test extra: pytest, pytest-xdist, transformers"
pip_install --no-build-isolation -e ".[test]" 2>/dev/null || pip_install -e ".[test]"
"$PY" -c "import gdnzoo, torch, triton; print(f'[setup] gdnzoo {gdnzoo.__version__}, torch {torch.__version__}, triton {triton.__version__}, cuda={torch.cuda.is_available()}')"

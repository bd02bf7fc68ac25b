"""The checks the peer backends (fi-baseline, fla-upstream, vllm-packed) share: whether their
GPU-only library is installed and a CUDA device present, and whether a problem is on CUDA.  Not
a backend itself."""
from __future__ import annotations

import importlib.util

import torch


def available(packages, needs: str, gpu_only: str, ok: str) -> tuple[bool, str]:
    """(False, why) when one of ``packages`` (import names) is missing or there is no CUDA
    device; else (True, ``ok``).  ``needs``: the distributions to install; ``gpu_only``: why a
    GPU is needed."""
    missing = [m for m in packages if importlib.util.find_spec(m) is None]
    if missing:
        return False, f"needs {needs}; not installed: {', '.join(missing)}"
    if not torch.cuda.is_available():
        return False, f"no CUDA device on this machine ({gpu_only})"
    return True, ok


def on_cuda(problem, why: str) -> tuple[bool, str]:
    """(True, "") for a problem on a CUDA device, else (False, ``why``)."""
    return (True, "") if problem.device == "cuda" else (False, why)

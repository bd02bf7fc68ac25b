"""The checks the peer backends (fi-baseline, fla-upstream, vllm-packed) share: whether their
GPU-only library is installed and a CUDA device present, and whether a problem is on CUDA.  Not
a backend itself."""
from __future__ import annotations

import importlib.util
from pathlib import Path

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


def cute_dsl_missing_libs() -> str:
    """Why the installed CuTe DSL (``cutlass``) cannot compile, or "" when it looks whole.

    nvidia-cutlass-dsl ships its compiler as a per-CUDA-toolkit extension,
    ``cutlass/_mlir/_mlir_libs/_cutlass_ir.cu<N>....so``, in a separate wheel
    (nvidia-cutlass-dsl-libs-*); without one, ``import cutlass`` works and every JIT compile
    raises "No CTK flavor installed".  Checked on the files, without importing the DSL (seconds);
    a package laid out otherwise is not judged."""
    spec = importlib.util.find_spec("cutlass")
    for root in (spec.submodule_search_locations or []) if spec else []:
        libs = Path(root) / "_mlir" / "_mlir_libs"
        if libs.is_dir() and not any(libs.glob("_cutlass_ir.cu*")):
            return (f"the CuTe DSL at {root} has no compiler library "
                    f"({libs}/_cutlass_ir.cu<N>*.so): install nvidia-cutlass-dsl with its "
                    f"CUDA flavor, e.g. 'nvidia-cutlass-dsl[cu13]'")
    return ""


def on_cuda(problem, why: str) -> tuple[bool, str]:
    """(True, "") for a problem on a CUDA device, else (False, ``why``)."""
    return (True, "") if problem.device == "cuda" else (False, why)


def on_sm90(problem, what: str) -> tuple[bool, str]:
    """(True, "") for a problem on a CUDA device of compute capability 9.0 or newer (or one whose
    capability is unknown), else (False, why), ``what`` naming the kernel that needs it."""
    if problem.device != "cuda":
        return False, f"{what} runs only on CUDA devices"
    if problem.cc is not None and problem.cc < (9, 0):
        return False, (f"{what} needs SM90+ (Hopper or newer), device is "
                       f"sm_{problem.cc[0]}{problem.cc[1]}")
    return True, ""

"""cuda-v1: the straightforward CUDA C++ kernel (``cuda_v1.cu``), launched through CuPy.

One block per (sequence, value head), one thread per V row holding the row in registers over
all T tokens.  Compiled with NVRTC on first use for the running GPU (gdnzoo/cuda_build.py).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from gdnzoo import cuda_build

SOURCE = Path(__file__).with_name("cuda_v1.cu")
KERNEL = "gdn_decode_v1"
MAX_K = 128          # the state row lives in K registers per thread
MAX_V = 256          # one thread per row; __launch_bounds__(256) in the kernel
MAX_GRID_X = 2**31 - 1

_plans: dict = {}


def available():
    if importlib.util.find_spec("cupy") is None:
        return False, "needs CuPy (pip install cupy-cuda13x or cupy-cuda12x)"
    return True, "CUDA C++ compiled with CuPy's NVRTC at first use"


def supports(problem):
    if problem.device != "cuda":
        return False, f"runs on CUDA GPUs only, got device {problem.device}"
    if problem.cc is not None and tuple(problem.cc) < (8, 0):
        return False, f"needs compute capability >= 8.0 (bf16 conversions), got {problem.cc}"
    if problem.K > MAX_K:
        return False, f"K <= {MAX_K} (a thread keeps its state row of K floats in registers), got K={problem.K}"
    if problem.V > MAX_V:
        return False, f"V <= {MAX_V} (one thread per V row), got V={problem.V}"
    if problem.B * problem.HV > MAX_GRID_X:
        return False, f"B*HV <= {MAX_GRID_X} (one block per sequence and head), got {problem.B * problem.HV}"
    return True, ""


def _plan(q, v, state, a, b, dt_bias, use_qk_l2norm):
    key = (q.get_device(), q.dtype, state.dtype, a.dtype, b.dtype, dt_bias.dtype, q.shape[3],
           v.shape[3], use_qk_l2norm)
    plan = _plans.get(key)
    if plan is None:
        dev, io, sd, ad, bd, dd, K, V, l2 = key
        defs = cuda_build.defines(sd, io, ad, bd, dd, K, l2)
        kern = cuda_build.get_kernel(SOURCE, KERNEL, defs, dev)
        block = (V + 31) // 32 * 32
        plan = _plans[key] = (kern, block, dev)
    return plan


def run(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm):
    kern, block, dev = _plan(q, v, state, a, b, dt_bias, use_qk_l2norm)
    values = cuda_build.param_values(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state)
    cuda_build.launch(kern, q.shape[0] * v.shape[2], block, dev, values)

"""cuda-v4: the latency-optimized CUDA C++ kernel (``cuda_v4.cu``), launched through CuPy.

Each head's V rows are split over several blocks of several warps; the launch shape (warps per
block W, row groups per warp RW) comes from :data:`CONFIG_TABLE` by B*HV and state dtype.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from gdnzoo import cuda_build

SOURCE = Path(__file__).with_name("cuda_v4.cu")
KERNEL = "gdn_decode_v4"
HEAD_DIMS = (32, 64, 128, 256)   # K: whole 16-byte vectors per lane, lane groups dividing 32
MAX_GRID_X = 2**31 - 1
MAX_WARPS = 8                    # __launch_bounds__(256) in the kernel

# (largest B*HV, warps per block W, row groups per warp RW) by state dtype, first match wins.
# A row group is 1 row (fp32, K=128) or 2 rows (bf16, K=128): one 16-byte load per lane.
# Rows per block = W*RW*rows-per-group; blocks per head = ceil(V / rows per block).
# Defaults to be replaced by bench/gpu_cuda.py's H100 sweep (it prints the best per B).
CONFIG_TABLE = {
    torch.float32: ((8, 4, 2), (32, 4, 4), (128, 4, 8), (None, 8, 8)),
    torch.bfloat16: ((8, 4, 1), (32, 4, 2), (128, 4, 4), (None, 8, 4)),
}
CANDIDATES = tuple((w, rw) for w in (1, 2, 4, 8) for rw in (1, 2, 4, 8))

_plans: dict = {}


def available():
    if importlib.util.find_spec("cupy") is None:
        return False, "needs CuPy (pip install cupy-cuda13x or cupy-cuda12x)"
    return True, "CUDA C++ compiled with CuPy's NVRTC at first use"


def rows_per_group(K, state_dtype, vec16=True):
    vec = 16 // cuda_build.ELEM_SIZE[state_dtype] if vec16 else 1
    return 32 // min(32, K // vec)


def pick_config(BHV, state_dtype):
    for hi, w, rw in CONFIG_TABLE[state_dtype]:
        if hi is None or BHV <= hi:
            return w, rw
    raise AssertionError("CONFIG_TABLE needs a last row with no upper bound")


def blocks_per_head(V, w, rw, rpg):
    return -(-V // (w * rw * rpg))


def supports(problem):
    if problem.device != "cuda":
        return False, f"runs on CUDA GPUs only, got device {problem.device}"
    if problem.cc is not None and tuple(problem.cc) < (8, 0):
        return False, f"needs compute capability >= 8.0 (bf16 conversions), got {problem.cc}"
    if problem.K not in HEAD_DIMS:
        return False, (f"K in {HEAD_DIMS} (each row is split into 16-byte vectors over a "
                       f"power-of-two lane group), got K={problem.K}")
    w, rw = pick_config(problem.B * problem.HV, problem.state_dtype)
    rpg = rows_per_group(problem.K, problem.state_dtype, vec16=False)   # the largest grid
    grid = problem.B * problem.HV * blocks_per_head(problem.V, w, rw, rpg)
    if grid > MAX_GRID_X:
        return False, f"grid of {grid} blocks exceeds {MAX_GRID_X} (B*HV={problem.B * problem.HV})"
    return True, ""


def _aligned16(values, es, eio) -> bool:
    """16-byte vectors need every state/new_state/q/k row start 16-byte aligned."""
    qk_ptrs = values[0] | values[1]
    st_ptrs = values[7] | values[8]
    q_n, q_t, q_h, k_n, k_t, k_h = values[10:16]
    s_n, s_h, s_v, ns_n, ns_h, ns_v = values[28:34]
    io = (q_n | q_t | q_h | k_n | k_t | k_h) * eio        # element sizes are powers of two
    st = (s_n | s_h | s_v | ns_n | ns_h | ns_v) * es
    return (qk_ptrs | st_ptrs | io | st) & 15 == 0


def _plan(values, q, state, a, b, dt_bias, use_qk_l2norm, config):
    B, HV, V, K = values[36], values[39], values[40], q.shape[3]
    es = state.element_size()
    aligned = _aligned16(values, es, q.element_size())
    key = (q.get_device(), q.dtype, state.dtype, a.dtype, b.dtype, dt_bias.dtype, B * HV, K, V,
           use_qk_l2norm, aligned, config)
    plan = _plans.get(key)
    if plan is None:
        rpg = rows_per_group(K, state.dtype, aligned)
        if config is None:
            w, rw = pick_config(B * HV, state.dtype)
            rw = min(rw, 32 // rpg)                   # a warp owns at most 32 rows
        else:
            w, rw = config
        if rw * rpg > 32 or not 1 <= w <= MAX_WARPS:
            raise ValueError(f"cuda-v4: launch config W={w}, RW={rw} invalid at K={K} ({rpg} rows per group)")
        defs = cuda_build.defines(state.dtype, q.dtype, a.dtype, b.dtype, dt_bias.dtype, K,
                                  use_qk_l2norm, rw=rw, vec16=aligned)
        kern = cuda_build.get_kernel(SOURCE, KERNEL, defs, key[0])
        bph = blocks_per_head(V, w, rw, rpg)
        plan = _plans[key] = (kern, B * HV * bph, 32 * w, bph, key[0])
    return plan


def run(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, config=None):
    """Backend entry point; ``config=(W, RW)`` overrides the table (benchmark sweeps)."""
    values = cuda_build.param_values(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state)
    kern, grid, block, bph, dev = _plan(values, q, state, a, b, dt_bias, use_qk_l2norm, config)
    cuda_build.launch(kern, grid, block, dev, values[:41] + (bph, 0, values[43]))  # aux0: blocks per head

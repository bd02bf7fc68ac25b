"""cuda-v1: the straightforward CUDA C++ kernel (``cuda_v1.cu``), launched through CuPy.

One block per (sequence, value head), one thread per V row holding the row in registers over
all T tokens.  Compiled with NVRTC on first use for the running GPU (backends/_cuda_build.py).
"""
from __future__ import annotations

from pathlib import Path

from gdnzoo.backends import _cuda_build as cuda_build

available = cuda_build.available

SOURCE = Path(__file__).with_name("cuda_v1.cu")
KERNEL = "gdn_decode_v1"
MAX_K = 128          # the state row lives in K registers per thread
MAX_V = 256          # one thread per row; __launch_bounds__(256) in the kernel
MAX_GRID_X = 2**31 - 1

_binds: dict = {}                # signature -> Bound




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


class Bound:
    """cuda-v1 for one signature: the GdnParams block is packed once, calls patch pointers."""

    def __init__(self, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
        dev, V = q.get_device(), v.shape[3]
        defs = cuda_build.defines(state.dtype, q.dtype, a.dtype, b.dtype, dt_bias.dtype,
                                  q.shape[3], l2)
        kern = cuda_build.get_kernel(SOURCE, KERNEL, defs, dev)
        values = cuda_build.param_values(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                         new_state)
        self.launch = cuda_build.Launch(kern, q.shape[0] * v.shape[2], (V + 31) // 32 * 32, dev,
                                        values)

    def __call__(self, c):
        # GdnParams' HEAD_FIELDS: no index pointers (no pool, no verify)
        self.launch((c.state.data_ptr(), 0, 0, c.q.data_ptr(), c.k.data_ptr(), c.v.data_ptr(),
                     c.a.data_ptr(), c.b.data_ptr(), c.A_log.data_ptr(), c.new_state.data_ptr(),
                     c.out.data_ptr(), c.dt_bias.data_ptr(), 0, 0, 0))


def bind(call, *, config=None):
    """A launcher for every call with this one's shapes, strides, dtypes, scale and mode."""
    key = cuda_build.signature_key(*call.positional())
    bound = _binds.get(key)
    if bound is None:
        if len(_binds) >= 4096:
            _binds.clear()
        bound = _binds[key] = Bound(*call.positional())
    return bound


def run(call, *, config=None):
    bind(call)(call)

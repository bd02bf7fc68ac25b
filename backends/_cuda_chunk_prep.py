"""cuda-chunk's prep kernel (``cuda_chunk_prep.cu``): compiled through CuPy's NVRTC like the
other CUDA backends (:mod:`gdnzoo.backends._cuda_build`), launched in place of triton-chunk's
Triton prep kernel into the same workspace.  One launch per call, one CTA of 128 threads per
(chunk slot, value head): the grid of the Triton kernel.  Nothing here imports cupy at module
import time."""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build

SOURCE = Path(__file__).with_name("cuda_chunk_prep.cu")
NAME = "gdn_chunk_prep"
CHUNK = 64
HEAD_DIM = 128
PRECISIONS = ("bf16x3", "bf16")
# PrepParams: 9 pointers, 16 integers, the scale
PARAMS = struct.Struct("<9Q16qd")
# dynamic shared memory of PrepSmem: q and k tiles (their space reused for the stored rows),
# A/M and T in fp32, four warps' 16 x 16 scratch, four [C] vectors and a total
SMEM = 2 * CHUNK * (HEAD_DIM + 8) * 2 + 2 * CHUNK * 68 * 4 + 4 * 16 * 20 * 4 + 4 * CHUNK * 4 + 16
MAX_DYNAMIC_SHARED = 8            # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

_sized: set = set()


def serves(K: int, io_dtype, precision: str, chunk: int):
    """(ok, reason): what the kernel is written for."""
    if K != HEAD_DIM:
        return False, f"its prep kernel is written for K = {HEAD_DIM}, got K={K}"
    if io_dtype != torch.bfloat16:
        return False, f"its prep kernel reads q and k as bfloat16, got {io_dtype}"
    if precision not in PRECISIONS:
        return False, f"its prep kernel stores the workspace of {PRECISIONS}, got {precision!r}"
    if chunk != CHUNK:
        return False, f"its prep kernel is written for chunk={CHUNK}, got {chunk}"
    return True, ""


def _kernel(defs, device_index: int):
    kern = cuda_build.get_kernel(SOURCE, NAME, defs, device_index)
    if (defs, device_index) not in _sized:
        from cupy_backends.cuda.api import driver
        driver.funcSetAttribute(kern.func, MAX_DYNAMIC_SHARED, SMEM)
        _sized.add((defs, device_index))
    return kern


def launch(q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, scale, l2, gates, c, *,
           neg=False, pdl=False):
    """The prep kernel into the workspace (mats, vecs), with the arguments of triton-chunk's
    ``launch_prep`` (``c`` a resolved Config whose precision and chunk :func:`serves` takes)."""
    T, H, K = q.shape
    HV, N = ga.shape[1], cu_seqlens.shape[0] - 1
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    code = cuda_build.DTYPE_CODE
    defs = tuple(sorted(dict(
        GDN_GATES=int(gates), GDN_A_DT=code[ga.dtype], GDN_B_DT=code[gb.dtype],
        GDN_ALOG_DT=code[A_log.dtype], GDN_DTB_DT=code[dt_bias.dtype], GDN_NEG=int(bool(neg)),
        GDN_PDL=int(bool(pdl)), GDN_STORE3=int(c.precision == "bf16x3")).items()))
    grid = (T // CHUNK + N) * HV
    func = _kernel(defs, dev).func
    # packed per call (the grid and T change with every prompt); the driver copies the block
    params = ctypes.create_string_buffer(PARAMS.pack(
        q.data_ptr(), k.data_ptr(), ga.data_ptr(), gb.data_ptr(), A_log.data_ptr(),
        dt_bias.data_ptr(), cu_seqlens.data_ptr(), mats.data_ptr(), vecs.data_ptr(),
        N, T, q.stride(0), q.stride(1), k.stride(0), k.stride(1), ga.stride(0), ga.stride(1),
        gb.stride(0), gb.stride(1), A_log.stride(0) if A_log.dim() else 0,
        dt_bias.stride(0) if dt_bias.dim() else 0, H, HV, int(bool(l2)),
        int(cu_seqlens.dtype == torch.int64), float(scale)))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    if pdl:
        from gdnzoo.backends._pdl_launch import PdlConfig
        cuda_build.launch_raw_pdl(PdlConfig(grid, 128, SMEM), func, dev, ctypes.addressof(argv))
    else:
        cuda_build.launch_raw(func, grid, 128, dev, ctypes.addressof(argv), SMEM)

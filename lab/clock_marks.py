"""A kernel's clock64 marks read back: the timeline scripts under
``lab/notebook/<gpu>/verify/`` compile a copy of a kernel that writes ``clock64`` values into a
``__device__ unsigned long long`` array, one row per warp, and read it with :func:`read_u64`."""
from __future__ import annotations

import ctypes

import numpy as np
import torch


def read_u64(module, name: str) -> np.ndarray:
    """The whole ``__device__`` array ``name`` of the loaded CUDA module ``module`` (a compiled
    kernel's ``Kernel.module``) as a flat uint64 array, after the device has finished."""
    cu = ctypes.CDLL("libcuda.so.1")
    ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    r = cu.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(int(module)),
                                name.encode())
    if r:
        raise RuntimeError(f"cuModuleGetGlobal({name!r}): CUDA error {r}")
    a = np.zeros(size.value // 8, dtype=np.uint64)
    torch.cuda.synchronize()
    r = cu.cuMemcpyDtoH_v2(a.ctypes.data_as(ctypes.c_void_p), ptr, ctypes.c_size_t(a.nbytes))
    if r:
        raise RuntimeError(f"cuMemcpyDtoH({name!r}): CUDA error {r}")
    return a


def clear(module, name: str) -> None:
    """Zero the whole ``__device__`` array ``name`` of the loaded CUDA module ``module``."""
    cu = ctypes.CDLL("libcuda.so.1")
    ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    r = cu.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(int(module)),
                                name.encode())
    if r or cu.cuMemsetD8_v2(ptr, 0, size):
        raise RuntimeError(f"clearing {name!r}: CUDA error")

"""TMA tensor maps (CUtensorMap, 128 bytes) for the CUDA kernels that copy by TMA: made by the
driver's ``cuTensorMapEncodeTiled`` through ctypes (CuPy does not wrap it), and kept in a small
cache keyed by the map's fields (a prefill call makes five; a warm call with the same tensors
finds them).  Nothing here loads libcuda at import time."""
from __future__ import annotations

import ctypes

BF16, SWIZZLE_128B = 9, 3          # CUtensorMapDataType, CUtensorMapSwizzle
CACHE_SIZE = 256
_libcuda = None
_maps: dict = {}


def _encode(ptr: int, dims, strides, box, swizzle) -> bytes:
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
        _libcuda = lib
    rank = len(dims)
    out = (ctypes.c_ubyte * 128)()
    rc = _libcuda.cuTensorMapEncodeTiled(
        ctypes.byref(out), ctypes.c_int(BF16), ctypes.c_uint32(rank), ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
        (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)), ctypes.c_int(0),
        ctypes.c_int(swizzle), ctypes.c_int(0), ctypes.c_int(0))
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled: CUresult {rc} (dims {dims}, strides "
                           f"{strides}, box {box})")
    return bytes(out)


def tensor_map(ptr: int, dims, strides, box, swizzle=SWIZZLE_128B) -> bytes:
    """The CUtensorMap of a bf16 tensor at ``ptr``: ``dims`` innermost first (dim 0 contiguous),
    ``strides`` the byte strides of dims 1.., ``box`` the box's extent per dim; out-of-bounds
    elements of a box read as zeros and are not written."""
    key = (ptr, tuple(dims), tuple(strides), tuple(box), swizzle)
    tmap = _maps.get(key)
    if tmap is None:
        if len(_maps) >= CACHE_SIZE:
            _maps.clear()
        tmap = _maps[key] = _encode(ptr, dims, strides, box, swizzle)
    return tmap

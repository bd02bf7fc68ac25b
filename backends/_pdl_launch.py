"""Programmatic dependent launch (PDL): ``cuLaunchKernelEx`` with the programmatic stream
serialization attribute, through ctypes on the CUDA driver (CuPy binds no ``cuLaunchKernelEx``).

A kernel launched so may start while the kernel before it in the stream is still running, as
soon as every block of that kernel has executed ``griddepcontrol.launch_dependents`` (or
exited).  The kernel must then execute ``griddepcontrol.wait`` before it reads anything the
kernel before it writes: the wait returns once that kernel has completed and its memory is
visible.  Without the attribute the same kernel is launched as usual and its wait returns at
once.  Captured into a CUDA graph, the attribute becomes a programmatic edge (CUDA >= 12.3).

Nothing here is loaded before the first PDL launch; the driver library is opened once.
"""
from __future__ import annotations

import ctypes
import threading

# cuda.h (CUDA 12): CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _Attribute(ctypes.Structure):
    """CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value union whose first
    int is ``programmaticStreamSerializationAllowed``."""
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("value", ctypes.c_int32), ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("gridDimX", ctypes.c_uint32), ("gridDimY", ctypes.c_uint32),
                ("gridDimZ", ctypes.c_uint32), ("blockDimX", ctypes.c_uint32),
                ("blockDimY", ctypes.c_uint32), ("blockDimZ", ctypes.c_uint32),
                ("sharedMemBytes", ctypes.c_uint32), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("numAttrs", ctypes.c_uint32)]


# A grid launched with PDL pays some 1.2 ns per block on the H100, where a plain launch hides it
# (graphs of back-to-back fp32 decodes at B=256: 158.5 us in fla-recurrent's 131072 blocks of 2
# state rows with PDL against 92.1 without, 158.8 against 91.1 in cuda-v4's; bf16 B=96 in 12288
# blocks of 8 rows: 15.7 against 12.5).  Blocks that move >= 8 KiB of state (read and write) do
# not notice it (with PDL 0.2-0.3 us quicker than without at B = 96..256).  So a PDL launch of
# more than MANY_BLOCKS blocks takes blocks of at least BLOCK_BYTES (:func:`too_small`).
MANY_BLOCKS = 4096
BLOCK_BYTES = 8192


def too_small(blocks: int, block_state_bytes: int) -> bool:
    """Whether a PDL grid of ``blocks`` blocks, each reading and writing ``block_state_bytes``
    of state, should take larger blocks (the note above)."""
    return blocks > MANY_BLOCKS and block_state_bytes < BLOCK_BYTES


assert ctypes.sizeof(_Attribute) == 72 and ctypes.sizeof(_Config) == 56

_lock = threading.Lock()
_launch_ex = None


def _driver_function():
    """cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void**, void**) of libcuda."""
    global _launch_ex
    with _lock:
        if _launch_ex is None:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuLaunchKernelEx
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            _launch_ex = fn
    return _launch_ex


class PdlConfig:
    """A launch configuration (grid, block, shared bytes) with the PDL attribute set, reused by
    every launch of one bound kernel; each thread gets its own copy (the stream is written per
    call)."""

    __slots__ = ("grid", "block", "shared", "_tls")

    def __init__(self, grid: int, block: int, shared: int = 0):
        self.grid, self.block, self.shared = int(grid), int(block), int(shared)
        self._tls = threading.local()

    def _make(self):
        attr = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        cfg = _Config(gridDimX=self.grid, gridDimY=1, gridDimZ=1, blockDimX=self.block,
                      blockDimY=1, blockDimZ=1, sharedMemBytes=self.shared,
                      attrs=ctypes.pointer(attr), numAttrs=1)
        self._tls.c = (cfg, attr, ctypes.addressof(cfg))
        return self._tls.c

    def launch(self, func: int, stream: int, argv_addr: int) -> None:
        """cuLaunchKernelEx of ``func`` on ``stream`` with the parameter array at ``argv_addr``
        (the driver copies the parameters before returning)."""
        try:
            cfg, _, addr = self._tls.c
        except AttributeError:
            cfg, _, addr = self._make()
        cfg.hStream = stream
        err = _driver_function()(addr, func, argv_addr, None)
        if err:
            raise RuntimeError(f"cuLaunchKernelEx with programmatic dependent launch failed: "
                               f"CUDA driver error {err}")

"""Shared plumbing of the two Triton backends (fla-recurrent, fla-tma); not a backend itself.

Availability (GPU or the Triton interpreter) and a thin launch cache.  Triton's own
``kernel[grid](...)`` path re-binds and re-specializes every argument on each call (tens of
microseconds of Python); a decode step is a few microseconds of GPU work, so after the first
call for a given argument signature we call the compiled kernel's launcher directly.

The cache key must cover everything Triton specializes on: dtypes, shapes (constexprs), every
integer argument (Triton specializes ints equal to 1 and multiples of 16) and pointer
alignment (multiples of 16 bytes).  Callers put all of those in their key; calls whose
pointers are not all 16-byte aligned always take Triton's own path.
"""
from __future__ import annotations

import os

import torch


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available(min_cc: tuple[int, int]) -> tuple[bool, str]:
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return False, "the triton package is not installed"
    if interpreter_on():
        return True, "Triton interpreter (TRITON_INTERPRET=1): CPU tensors, slow, for testing"
    if not torch.cuda.is_available():
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run through the Triton interpreter)"
    cc = torch.cuda.get_device_capability()
    if cc < min_cc:
        return False, (f"needs compute capability >= {min_cc[0]}.{min_cc[1]}, "
                       f"this GPU has {cc[0]}.{cc[1]}")
    return True, f"Triton on {torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]})"


def common_supports(problem, head_dims, cpu_max_program_tokens, grid_limit):
    """What both Triton backends refuse: head sizes, CPU without the interpreter or with more
    work than the interpreter does in reasonable time, and grids past one axis."""
    if problem.K not in head_dims or problem.V not in head_dims:
        return False, f"K and V must each be one of {head_dims}, got K={problem.K} V={problem.V}"
    if problem.device == "cpu":
        if not interpreter_on():
            return False, "CPU tensors need the Triton interpreter (set TRITON_INTERPRET=1)"
        work = problem.B * problem.HV * problem.T
        if work > cpu_max_program_tokens:
            return False, (f"on CPU the Triton interpreter is limited to B*HV*T <= "
                           f"{cpu_max_program_tokens} (5-20 ms each), got {work}")
    if problem.B * problem.HV > grid_limit:
        return False, f"B*HV must be <= {grid_limit} (one grid axis), got {problem.B * problem.HV}"
    return True, ""


def loop_count(T: int):
    """A runtime loop bound as the kernel should receive it.

    The Triton 3.6 interpreter hands int arguments to the kernel as 1-element arrays, and
    ``range()`` over one fails under numpy >= 2.3 (int() of a non-0-d array); a 0-d array
    works there.  On the GPU the plain int is passed (Triton specializes T == 1)."""
    if interpreter_on():
        import numpy as np
        return np.array(T, dtype=np.int32)
    return T


def gpu_name(device_index: int) -> str:
    if device_index < 0:
        return "cpu"
    return torch.cuda.get_device_name(device_index)


def _raw_stream_fn():
    fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fn is not None:
        return fn
    return lambda idx: torch.cuda.current_stream(idx).cuda_stream


class FastLaunch:
    """Launch one compiled kernel with a fixed grid, skipping Triton's per-call binding.

    ``args_after_ptrs`` are the positional arguments that follow the pointer arguments
    (scalars and constexprs, in signature order) except the leading float ``scale``, which is
    not specialized and so may change between calls.  ``scratch`` is a device buffer for
    kernels that need global scratch (device-side tensor descriptors); it is kept alive here
    so a CUDA graph that captured its address stays valid.
    """

    def __init__(self, compiled, grid0: int, args_after_scale: tuple, device_index: int,
                 scratch=None):
        self.launcher = compiled.run.launch            # the C launcher, AttributeError if absent
        self.function = compiled.function
        self.meta = compiled.packed_metadata
        self.coop = compiled.run.launch_cooperative_grid
        self.pdl = compiled.run.launch_pdl
        self.grid0 = grid0
        self.tail = tuple(args_after_scale)
        self.dev = device_index
        self.scratch = scratch
        self.scratch_ptr = None if scratch is None else scratch.data_ptr()
        self.stream = _raw_stream_fn()
        needs = compiled.metadata.global_scratch_size
        if needs and scratch is None:
            raise AttributeError("kernel needs global scratch but none was given")

    def __call__(self, ptrs: tuple, scale: float):
        self.launcher(self.grid0, 1, 1, self.stream(self.dev), self.function, self.coop,
                      self.pdl, self.scratch_ptr, None, self.meta, None, None, None,
                      *ptrs, scale, *self.tail)


class Dispatcher:
    """Per-signature launch cache of one Triton backend, behind ``run`` and ``bind``.

    ``first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, key)``
    launches through Triton's own path and returns a :class:`FastLaunch` for later calls with
    the same key, or None to keep Triton's path.  The key is everything Triton specializes on
    except pointer alignment, which is checked on every call (it varies with the buffers).
    """

    def __init__(self, first_call):
        self.first_call = first_call
        self.fast = {}

    @staticmethod
    def key(q, k, v, state, A_log, a, dt_bias, b, out, new_state, use_qk_l2norm):
        return (q.shape, v.shape, q.dtype, a.dtype, b.dtype, dt_bias.dtype, state.dtype,
                q.stride(), k.stride(), v.stride(), a.stride(), b.stride(), A_log.stride(),
                dt_bias.stride(), out.stride(), state.stride(), new_state.stride(),
                bool(use_qk_l2norm), new_state is state, q.get_device())

    @staticmethod
    def pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state):
        """The kernel's pointer arguments in signature order, and whether all are 16-byte
        aligned (Triton specializes on that)."""
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(),
                A_log.data_ptr(), dt_bias.data_ptr(), out.data_ptr(), state.data_ptr(),
                new_state.data_ptr())
        return ptrs, (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6]
                      | ptrs[7] | ptrs[8] | ptrs[9]) & 15 == 0

    def call(self, base, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
        ptrs, aligned = self.pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state)
        key = (base, aligned)
        fast = self.fast.get(key)
        if fast is not None:
            fast(ptrs, float(scale))
            return
        made = self.first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                               l2, key)
        if key[1] and not interpreter_on():       # misaligned calls keep Triton's own path
            self.fast[key] = made

    def run(self, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
        base = self.key(q, k, v, state, A_log, a, dt_bias, b, out, new_state, l2)
        self.call(base, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2)

    def bind(self, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
        """A launcher valid for every call with these shapes, strides, dtypes and mode: what
        gdnzoo.decode's signature guarantees, so the key is computed once, here, and its fast
        launchers are looked up by pointer alignment alone (no per-call hashing of the key)."""
        base = self.key(q, k, v, state, A_log, a, dt_bias, b, out, new_state, l2)
        call, fast, pointers = self.call, self.fast, self.pointers
        slots = {}                                  # 16-byte aligned? -> FastLaunch

        def bound(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
            ptrs, aligned = pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state)
            launch = slots.get(aligned)
            if launch is None:
                launch = fast.get((base, aligned))
                if launch is None:                  # first call of this kind: Triton's path
                    call(base, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2)
                    return
                slots[aligned] = launch
            launch(ptrs, float(scale))
        return bound


class ScratchAllocator:
    """A ``triton.set_allocator`` allocator that remembers what it handed out, so the scratch
    of the first (compiling) launch is reused by every later launch of the same shape."""

    def __init__(self, device_index: int):
        self.dev = device_index
        self.buffer = None

    def __call__(self, size: int, alignment: int, stream):
        if self.buffer is None or self.buffer.numel() < size:
            device = "cpu" if self.dev < 0 else f"cuda:{self.dev}"
            self.buffer = torch.empty(size, dtype=torch.int8, device=device)
        return self.buffer


def launch_with_allocator(allocator, fn):
    """Run ``fn()`` with ``allocator`` installed for Triton's scratch, restoring the caller's."""
    import triton
    from triton.runtime import _allocation
    token = _allocation._allocator.set(allocator) if hasattr(_allocation._allocator, "reset") \
        else None
    if token is None:
        triton.set_allocator(allocator)
    try:
        return fn()
    finally:
        if token is not None:
            _allocation._allocator.reset(token)

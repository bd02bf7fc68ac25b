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

import functools
import itertools
import operator
import os

import torch
from torch import Tensor

from gdnzoo.backends import _cuda_build as cuda_build


def compile_offline(kernel, args, kwargs, arch: int = 90):
    """``kernel`` compiled for sm_``arch`` as ``kernel[grid](*args, **kwargs)`` would compile
    it on such a GPU, without one (Triton's JIT mode only: TRITON_INTERPRET unset or 0); the
    CompiledKernel (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata``).  For the checks that
    read the generated code (tests, lab)."""
    import triton
    from triton.compiler import ASTSource
    target, backend, kwargs, bound, spec, opts = _bind(kernel, args, kwargs, arch)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def triton_specialization(kernel, args, kwargs, arch: int = 90) -> tuple:
    """What Triton's JIT keys ``kernel[grid](*args, **kwargs)``'s compiled kernel by on an
    sm_``arch`` GPU (JIT mode, no GPU needed): each parameter's specialization (type and
    alignment or int class; a constexpr's value) and the options, hashable; two calls with the
    same one run the same compiled kernel."""
    *_, spec, opts = _bind(kernel, args, kwargs, arch)
    return tuple(tuple(x) if isinstance(x, list) else x for x in spec), \
        tuple(sorted((k, repr(v)) for k, v in opts.items()))


def _bind(kernel, args, kwargs, arch):
    """(target, backend, kwargs, bound args, specialization, options) of Triton's binding of a
    call, as JITFunction.run makes them for an sm_``arch`` GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(kwargs, debug=False, instrumentation_mode="")   # what JITFunction.run adds
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    return target, backend, kwargs, bound, spec, opts


def state_strides(x, k_first: bool) -> tuple:
    """(slot, head, V row, K column) strides of a state, pool or checkpoint buffer, k-last
    ``[.., HV, V, K]`` or K-first ``[.., HV, K, V]``."""
    s = x.stride()
    return (s[0], s[1], s[3], s[2]) if k_first else tuple(s)


def prefill_gates(A_log, a, dt_bias, b, g, beta) -> tuple:
    """(GATES, the a and b pointers, A_log, dt_bias) of a prefill kernel's launch: raw gates
    (0), or FLA's precomputed g and beta in the a and b slots (1); A_log and dt_bias are then
    never read, and any valid pointer stands in for them."""
    gates = 0 if g is None else 1
    ga, gb = (a, b) if g is None else (g, beta)
    return (gates, ga, gb, ga if A_log is None or gates else A_log,
            ga if dt_bias is None or gates else dt_bias)


def prefill_slots(cu_seqlens, state_indices, new_state_indices, has_initial_state) -> tuple:
    """(POOL, read-slot, write-slot and has_initial_state pointers) of a prefill kernel's
    launch: POOL 0 dense, 1 the read slots written, 2 separate write slots; ``cu_seqlens``
    stands in for the absent ones (never read)."""
    pool = 0 if state_indices is None else (
        1 if new_state_indices is None or new_state_indices is state_indices else 2)
    idx = state_indices if pool else cu_seqlens
    return (pool, idx, new_state_indices if pool == 2 else idx,
            has_initial_state if has_initial_state is not None else cu_seqlens)


def chain_slots(cu_seqlens, state, new_state, state_indices, new_state_indices,
                has_initial_state, k_first) -> tuple:
    """(pool form, read and write indices, has_initial_state, the state read (``new_state``
    standing in for None), its strides (zeros for None)) of a chunked prefill's sequential
    launch (triton-chunk's and cuda-chunk-bf16's)."""
    pool, idx, new_idx, init = prefill_slots(cu_seqlens, state_indices, new_state_indices,
                                             has_initial_state)
    src = new_state if state is None else state
    ss = state_strides(src, k_first) if state is not None else (0, 0, 0, 0)
    return pool, idx, new_idx, init, src, ss


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# The oldest Triton our kernels are written for (pyproject's triton extra: 3.6 through 3.9): they
# use triton.language.extra.cuda's gdc_launch_dependents / gdc_wait (PDL), which older Tritons
# lack; Triton 3.0 (torch 2.4's pin) failed at import and in the interpreter.
MIN_TRITON = (3, 6)


@functools.lru_cache(maxsize=None)
def triton_version() -> tuple[int, ...] | None:
    """The installed Triton's version as numbers (its leading ones: "3.6.0+git1" is (3, 6, 0)),
    read from its package metadata without importing it; None when there is no triton."""
    import importlib.metadata
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        text = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:      # a copy without metadata: ask it
        import triton
        text = triton.__version__
    nums = []
    for part in text.split("+")[0].split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        nums.append(int(digits))
    return tuple(nums)


def available(min_cc: tuple[int, int], device: str) -> tuple[bool, str]:
    """A Triton backend's answer for ``device``: Triton >= :data:`MIN_TRITON`; on CPU only
    through the interpreter."""
    version = triton_version()
    if version is None:
        return False, "the triton package is not installed"
    if version < MIN_TRITON:
        return False, (f"needs triton >= {'.'.join(map(str, MIN_TRITON))} (pip install "
                       f"'gdnzoo[triton]'), found {'.'.join(map(str, version))}")
    if interpreter_on():
        return True, "Triton interpreter (TRITON_INTERPRET=1): CPU tensors, slow, for testing"
    if device == "cpu":
        return False, "runs on CPU only through the Triton interpreter (set TRITON_INTERPRET=1)"
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


def pdl_supports(problem):
    """Whether a call with programmatic dependent launch (``problem.pdl``) can be served: it
    needs a CUDA GPU of compute capability >= 9.0 (``griddepcontrol``)."""
    if problem.device == "cpu" or interpreter_on():
        return False, ("programmatic dependent launch needs a CUDA GPU; the Triton interpreter "
                       "has none")
    cc = problem.cc or torch.cuda.get_device_capability()
    if tuple(cc) < (9, 0):
        return False, (f"programmatic dependent launch needs compute capability >= 9.0, this "
                       f"GPU has {cc[0]}.{cc[1]}")
    return True, ""


def loop_count(T: int):
    """A runtime loop bound as the kernel should receive it.

    The Triton 3.6 interpreter hands int arguments to the kernel as 1-element arrays, and
    ``range()`` over one fails under numpy >= 2.3 (int() of a non-0-d array); an int32 scalar
    tensor over a 0-d array works there, in ``range()`` and in arithmetic (per-token slots
    address their [B, T] index rows with it).  On the GPU the plain int is passed (Triton
    specializes T == 1)."""
    if interpreter_on():
        import numpy as np
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle
        return tl.tensor(TensorHandle(np.array(T, dtype=np.int32), tl.int32), tl.int32)
    return T


def pool_mode(pool, verify=None) -> int:
    """The kernel's POOL: 0 a dense batch, 1 a pool whose read slots are also written, 2 a pool
    with separate write slots (:class:`gdnzoo.pool.Pool`), 3 verify's per-token slots."""
    if verify is not None and verify.per_token:
        return 3
    return 0 if pool is None else (1 if pool.same_indices else 2)


def index_args(state, pool) -> tuple:
    """The kernel's two index pointer arguments: the pool's read and write indices, or without
    a pool the state twice (a valid pointer the kernel never reads through)."""
    return (state, state) if pool is None else (pool.read, pool.write)


# A call that is no verify call passes None for the kernel's verify pointers and integers:
# Triton compiles None arguments as absent constants, so those instantiations keep the
# parameter list, and so the code, that they had before verify existed.
NO_VERIFY = (None, None, None)


def verify_args(state, verify) -> tuple:
    """The kernel's three verify pointer arguments (intermediate states, their indices, the
    accepted counts): :data:`NO_VERIFY` without a verify, else each tensor, or the state (a
    valid pointer the kernel never reads through) for one the call lacks."""
    if verify is None:
        return NO_VERIFY
    return tuple(state if x is None else x for x in (verify.states, verify.indices,
                                                     verify.accepted))


def verify_mode(verify) -> tuple:
    """The kernel's verify constexprs (INTER, UPDATE, ACC): intermediate states none (0), at
    row n (1) or at the given rows (2); the final state written (1) or not; accepted counts
    given (1) or column 0 read (0)."""
    if verify is None:
        return 0, 1, 0
    inter = 0 if verify.states is None else (1 if verify.indices is None else 2)
    return inter, int(verify.update), int(verify.accepted is not None)


def runtime_args(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool,
                 verify=None) -> tuple:
    """The kernel's arguments from T to si_t (between ``scale`` and the constexprs): T, every
    stride, the pool's read and write slot counts and null slot (0, 0, -1 without a pool), and
    the intermediate states' row count and row and step strides (None without them)."""
    slots = (0, 0, -1) if pool is None else (state.shape[0], new_state.shape[0], pool.null_slot)
    inter = NO_VERIFY if verify is None or verify.states is None else \
        (verify.states.shape[0], *verify.states.stride()[:2])
    return (loop_count(q.shape[1]), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *a.stride(), *b.stride(), A_log.stride(0), dt_bias.stride(0), *out.stride()[:3],
            *state.stride()[:3], *new_state.stride()[:3], *slots, *inter)


def constant_strides(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool) -> bool:
    """Whether the kernel may take its strides from the shapes (DENSE): every tensor
    contiguous; in a pool the per-token tensors, and each slot's block (the slot stride is
    always passed)."""
    if pool is None:
        return cuda_build.dense(q, k, v, state, A_log, a, dt_bias, b, out, new_state)
    HV, V, K = state.shape[1:]
    return (all(t.is_contiguous() for t in (q, k, v, A_log, a, dt_bias, b, out))
            and all(tuple(x.stride()[1:]) == (V * K, K, 1) for x in (state, new_state)))


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

    ``args_after_scale`` are all the positional arguments after the pointers and the float
    ``scale`` (scalars, then every constexpr, defaults included: Triton's launcher parses them
    all), in signature order; ``scale`` is not specialized and so may change between calls.
    ``absent`` are the None pointer arguments between the call's pointers and ``scale`` (the
    verify pointers of a call that is no verify call).  Trailing constexprs left out of
    ``args_after_scale`` take their defaults (Triton's launcher parses every parameter).  A
    kernel compiled with ``launch_pdl`` is launched with programmatic dependent launch
    (Triton's launcher reads ``launch_pdl``).  ``scratch`` is a device buffer for
    kernels that need global scratch (device-side tensor descriptors); it is kept alive here
    so a CUDA graph that captured its address stays valid.
    """

    def __init__(self, compiled, grid0: int, args_after_scale: tuple, device_index: int,
                 scratch=None, absent=()):
        self.launcher = compiled.run.launch            # the C launcher, AttributeError if absent
        self.function = compiled.function
        self.meta = compiled.packed_metadata
        self.coop = compiled.run.launch_cooperative_grid
        self.pdl = compiled.run.launch_pdl
        self.grid0 = grid0
        fn = compiled.src.fn
        given = fn.arg_names.index("scale") + 1 + len(args_after_scale)
        self.tail = tuple(args_after_scale) + tuple(p.default for p in fn.params[given:])
        self.absent = tuple(absent)
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
                      *ptrs, *self.absent, scale, *self.tail)


# C types of Triton's launcher arguments -> struct codes; float scalars are passed as the bits
# of their storage type, which struct packs from the Python float directly.
_CODES = {"CUdeviceptr": "Q", "int8_t": "b", "uint8_t": "B", "int16_t": "h", "uint16_t": "H",
          "int32_t": "i", "uint32_t": "I", "int64_t": "q", "uint64_t": "Q"}
_FLOAT_CODES = {"fp32": "f", "f32": "f", "fp64": "d"}


def launcher_params(compiled):
    """[(name, struct code)] of the kernel parameters in the order Triton's own launcher passes
    them (``argN`` = positional argument N, then ``global_scratch``, ``profile_scratch``), read
    from the launcher source this Triton version generates; None when this is not a launch of
    one grid our :class:`cuda_build.Launch` can make (clusters, cooperative launches,
    tensor-map or tuple arguments).  A PDL launch (``launch_pdl``) has the same parameters."""
    import re
    from triton.backends.nvidia import driver as nvd
    md, src = compiled.metadata, compiled.src
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False):
        return None
    sig = dict(src.signature)
    if any(not isinstance(t, str) or t.startswith(("tensordesc", "nvTmaDesc")) for t in sig.values()):
        return None
    arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(i): val for i, val in getattr(src, "constants", {}).items()}
    text = nvd.make_launcher(constants, sig, getattr(md, "tensordesc_meta", None))
    order = re.search(r"void \*params\[\] = \{([^}]*)\}", text)
    decl = re.search(r"static void _launch\(([^)]*)\)", text)
    if order is None or decl is None:
        return None
    ctype = dict(reversed(d.strip().rsplit(" ", 1)) for d in decl.group(1).split(","))
    types = list(sig.values())
    out = []
    for ref in (x.strip() for x in order.group(1).split(",") if x.strip()):
        name = ref.lstrip("&")
        if name.startswith("arg"):
            ty = types[int(name[3:])]
            code = _FLOAT_CODES.get(ty) or _CODES.get(ctype.get(name))
        else:
            code = "Q" if ctype.get(name) == "CUdeviceptr" else None
        if code is None:
            return None
        out.append((name, code))
    return out


def _launch_params(compiled, scratch_ptr) -> list:
    """:func:`launcher_params` of a kernel a raw launch can make, given the global scratch
    pointer it would pass (None: none); AttributeError otherwise."""
    params = launcher_params(compiled)
    if params is None:
        raise AttributeError("kernel parameters are not laid out as this launcher needs")
    if compiled.metadata.global_scratch_size and scratch_ptr is None:
        raise AttributeError("kernel needs global scratch but none was given")
    return params


def raw_launch(compiled, grid0: int, args: tuple, n_ptrs: int, device_index: int,
               scratch_ptr=None, scale: bool = True):
    """A :class:`gdnzoo.cuda_build.Launch` of a compiled Triton kernel: cuLaunchKernel on a
    prebuilt parameter block, as the CUDA backends launch, where Triton's own C launcher parses
    all ~40 arguments from Python on every call; a kernel compiled with ``launch_pdl`` gets
    cuLaunchKernelEx with programmatic stream serialization, as Triton's launcher gives it
    (``cuda_build.Launch(..., pdl=True)``).  Per call only the ``n_ptrs`` pointers and, with
    ``scale``, the float after them (None arguments between them are absent constants, not
    parameters) are written; every parameter gets an 8-byte slot (the driver reads each one's
    size from the kernel).  Raises AttributeError when the kernel's parameters are not laid out
    so."""
    import struct
    params = _launch_params(compiled, scratch_ptr)
    lead = n_ptrs + int(scale)
    want = [f"arg{i}" for i, x in enumerate(args) if x is not None][:lead]
    if [n for n, _ in params[:lead]] != want or \
            any(c != "Q" for _, c in params[:n_ptrs]) or (scale and params[n_ptrs][1] != "f"):
        raise AttributeError("kernel parameters are not laid out as this launcher needs")
    template = bytearray(8 * len(params))
    for i, (name, code) in enumerate(params):
        if name.startswith("arg"):
            val = args[int(name[3:])]
        else:
            val = (scratch_ptr or 0) if name == "global_scratch" else 0
        struct.pack_into("<" + code, template, 8 * i, val)
    compiled.run                                       # loads the module if it was not yet
    return cuda_build.Launch(compiled.function, grid0, 32 * compiled.metadata.num_warps,
                             device_index, template=template,
                             slots=range(0, 8 * len(params), 8),
                             head=struct.Struct("<" + "Q" * n_ptrs + "f" * int(scale)),
                             shared=compiled.metadata.shared,
                             pdl=bool(getattr(compiled.metadata, "launch_pdl", False)))


def _plain_class(x):
    """What Triton's specialization sees of a plain value other than an int passed to a
    runtime parameter: a float by its type (never specialized), anything else by value.  (An
    int's class, its width and whether it is 1 or a multiple of 16, is written out in
    :meth:`LaunchCache.key`, which runs on every launch.)"""
    return float if x.__class__ is float else x


def constexpr_positions(kernel) -> frozenset | None:
    """Positions of a Triton kernel's constexpr parameters (None when the kernel does not
    say: then every plain value keys by value)."""
    params = getattr(kernel, "params", None)
    if params is None or not all(hasattr(p, "is_constexpr") for p in params):
        return None
    return frozenset(i for i, p in enumerate(params) if p.is_constexpr)


class LaunchCache:
    """Launches of Triton kernels (prefill's): the first call of a signature through Triton's
    own ``kernel[grid](*args, **kw)``, later ones through a raw launch (:class:`ArgsLaunch`)
    that writes every runtime parameter, pointers and plain values alike, and the grid on each
    call.  The signature is the kernel, each tensor's position and dtype, each constexpr by
    value, each other plain value by what Triton specializes on (an int by its width and
    whether it is 1 or a multiple of 16: a prompt's token count or strides change without a new
    signature), the keywords and the device; calls with a tensor not 16-byte aligned, or
    without CuPy (the raw launch's binding), always take Triton's path.  Holds at most
    ``limit`` signatures (cleared when full).  ``bind(compiled, args, device_index)`` makes the
    raw launch (default: :class:`ArgsLaunch`, where CuPy is importable), called as
    ``fast(grid0, args)``.  tests/test_triton_launch_keys.py holds the keys to Triton's own
    specialization."""

    def __init__(self, limit: int = 512, bind=None):
        self.limit = limit
        self.bind = bind or _bind_raw
        self.fast = {}
        self.runtime = {}           # kernel -> positions of its runtime (not constexpr) params

    def key(self, kernel, args, kw):
        """(signature, device of the first tensor) of a call; None when a tensor is off 16
        bytes (never launched raw).  Runs on every launch: one pass over the arguments."""
        runtime = self.runtime.get(kernel)
        if runtime is None:
            const = constexpr_positions(kernel)
            runtime = self.runtime[kernel] = frozenset(
                () if const is None else set(range(len(kernel.params))) - const)
        key, dev = [kernel], None
        add = key.append
        for i, x in enumerate(args):
            c = x.__class__
            if c is int and i in runtime:
                # Triton's int classes: 1 (a constant), else i32 / i64 / u64 and % 16
                add(1 if x == 1 else 2 + (x % 16 == 0) + 2 * (-2147483648 <= x < 2147483648)
                    + 4 * (x >= 9223372036854775808))
            elif c is Tensor or isinstance(x, Tensor):
                if x.data_ptr() % 16:
                    return None
                if dev is None:
                    dev = x.get_device()
                add(x.dtype)
            elif i in runtime:
                add(_plain_class(x))
            else:
                add(x)
        return (tuple(key), tuple(kw.items()), dev), dev

    def __call__(self, kernel, grid0: int, args: tuple, **kw):
        hit = self.key(kernel, args, kw)
        key = None if hit is None else hit[0]
        if key is not None:
            fast = self.fast.get(key)
            if fast:
                fast(grid0, args)
                return
        compiled = kernel[(grid0,)](*args, **kw)
        if key is None or key in self.fast:
            return
        if len(self.fast) >= self.limit:
            self.fast.clear()
        try:
            self.fast[key] = self.bind(compiled, args, hit[1])
        except Exception:
            self.fast[key] = False


class Bound:
    """One Triton launch of a call signature (a prefill plan's: its grid and plain arguments
    fixed, the tensors' data new each call) through ``cache``: the first call takes the cache's
    path, which compiles and binds the raw launch; later calls take that launch straight, with
    no key to build, while their tensors are 16-byte aligned (else the cache's path again)."""

    __slots__ = ("cache", "kernel", "kw", "fast", "tensors")

    def __init__(self, cache: LaunchCache, kernel, **kw):
        self.cache, self.kernel, self.kw, self.fast, self.tensors = cache, kernel, kw, None, ()

    def __call__(self, grid0: int, args: tuple) -> None:
        fast = self.fast
        if fast:
            for i in self.tensors:
                if args[i].data_ptr() % 16:
                    break
            else:
                fast(grid0, args)
                return
        self.cache(self.kernel, grid0, args, **self.kw)
        if fast is None:
            hit = self.cache.key(self.kernel, args, self.kw)
            if hit is not None:             # (None: a tensor off 16 bytes; asked again next call)
                self.fast = self.cache.fast.get(hit[0]) or False
                self.tensors = tuple(i for i, x in enumerate(args) if isinstance(x, Tensor))


# each parameter of a raw launch gets an 8-byte slot: a struct code padded to it
_PAD = {"Q": "", "q": "", "d": "", "i": "4x", "I": "4x", "f": "4x", "h": "6x", "H": "6x",
        "b": "7x", "B": "7x"}


class ArgsLaunch(cuda_build.Launch):
    """cuLaunchKernel (cuLaunchKernelEx with programmatic dependent launch where the kernel was
    compiled with ``launch_pdl``) of a compiled Triton kernel: a :class:`cuda_build.Launch`
    whose whole parameter block, every runtime parameter from the call's positional arguments
    (a tensor as its pointer), is written per call with one ``pack_into``, and whose grid is
    given per call; Triton's own launcher would parse and specialize them all again.  Raises
    AttributeError when the kernel's parameters are not laid out as :func:`launcher_params`
    reads them, or it needs global scratch."""

    __slots__ = ("get", "is_ptr", "tail", "dynamic_pdl")

    def __init__(self, compiled, args: tuple, device_index: int):
        import struct
        params = _launch_params(compiled, None)
        if any(c not in _PAD for _, c in params):
            raise AttributeError("kernel parameters are not laid out as this launcher needs")
        # the positional argument of each parameter; the scratch pointers, which Triton's
        # launcher passes last, are always null here
        pos = [int(n[3:]) for n, _ in params if n.startswith("arg")]
        if [n for n, _ in params[:len(pos)]] != [f"arg{i}" for i in pos] or not pos \
                or max(pos) >= len(args):
            raise AttributeError("kernel parameters are not laid out as this launcher needs")
        pack = struct.Struct("<" + "".join(c + _PAD[c] for _, c in params))
        compiled.run                                   # loads the module if it was not yet
        # grid 0 and no PDL config of the base: both are the call's (its grid)
        super().__init__(compiled.function, 0, 32 * compiled.metadata.num_warps, device_index,
                         template=bytes(pack.size), slots=range(0, pack.size, 8), head=pack,
                         shared=compiled.metadata.shared)
        self.get = operator.itemgetter(*pos) if len(pos) > 1 else (lambda a: (a[pos[0]],))
        self.is_ptr = tuple(isinstance(args[i], torch.Tensor) for i in pos)
        self.tail = (0,) * (len(params) - len(pos))
        self.dynamic_pdl = bool(getattr(compiled.metadata, "launch_pdl", False))

    def __call__(self, grid0: int, args: tuple) -> None:
        try:
            buf, _, argv_addr = self._tls.b
        except AttributeError:
            buf, _, argv_addr = self.buffers()
        self.head.pack_into(buf, 0, *[x.data_ptr() if p else x
                                      for x, p in zip(self.get(args), self.is_ptr)], *self.tail)
        if self.dynamic_pdl:
            cuda_build.launch_raw_pdl(cuda_build.pdl_config(grid0, self.block, self.shared),
                                      self.func, self.dev, argv_addr)
        else:
            cuda_build.launch_raw(self.func, grid0, self.block, self.dev, argv_addr, self.shared)


def _bind_raw(compiled, args: tuple, device_index: int):
    _need_cupy()
    return ArgsLaunch(compiled, args, device_index)


def _need_cupy() -> None:
    """ImportError unless CuPy's driver binding (launch_raw's) is importable."""
    import importlib.util
    if importlib.util.find_spec("cupy_backends") is None:
        raise ImportError("no CuPy")


def fast_launch(compiled, grid0: int, ptrs: tuple, scale: float, tail: tuple,
                device_index: int, scratch=None, absent=()):
    """The quickest launcher this Triton and CuPy allow: :func:`raw_launch`, else
    :class:`FastLaunch` (Triton's C launcher without its Python binding), else None.
    ``absent``: the None pointer arguments between ``ptrs`` and ``scale``."""
    sp = None if scratch is None else scratch.data_ptr()
    try:
        _need_cupy()
        return raw_launch(compiled, grid0, (*ptrs, *absent, float(scale), *tail), len(ptrs),
                          device_index, sp)
    except Exception:
        pass
    try:
        return FastLaunch(compiled, grid0, tail, device_index, scratch, absent)
    except AttributeError:
        return None


class Dispatcher:
    """Per-signature launch cache of one Triton backend, behind ``run`` and ``bind``.

    ``first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, pool, verify,
    key)`` launches through Triton's own path and returns a launcher (:func:`fast_launch`) for
    later calls with the same key, or None to keep Triton's path.  The key is everything Triton
    specializes on except pointer alignment, which is checked on every call (it varies with the
    buffers).  ``launch(..., pool=, verify=, config=)`` is the backend's own launch with an
    explicit config, which ``run(..., config=...)`` takes (Triton's own path, every call).

    A pool call (``pool``: a :class:`gdnzoo.pool.Pool`) passes its index tensors' pointers with
    the data pointers on every call; its slot counts, null slot and index dtypes are in the key.
    A verify call (``verify``: a :class:`gdnzoo.verify.Verify`) passes its three tensors'
    pointers too; its form, the intermediate states' shape and strides and the index dtypes are
    in the key, so verify and other calls never share a launcher.

    ``pdl`` (the level of programmatic dependent launch, 0 off) is in the key when non-zero
    and then passed on as ``first_call(..., pdl=)`` and ``launch(..., pdl=)``; a backend that
    has none (``pdl=False`` here) refuses a non-zero level.
    """

    def __init__(self, first_call, launch, pdl=False):
        self.first_call = first_call
        self.launch = launch
        self.pdl = pdl
        self.fast = {}

    def pdl_kwargs(self, pdl) -> dict:
        """What ``first_call`` and ``launch`` are given for level ``pdl``: nothing when 0."""
        if not pdl:
            return {}
        if not self.pdl:
            raise ValueError(f"pdl: this backend has no programmatic dependent launch, got "
                             f"level {pdl!r}")
        return {"pdl": pdl}

    @staticmethod
    def key(q, k, v, state, A_log, a, dt_bias, b, out, new_state, use_qk_l2norm, pool=None,
            verify=None, pdl=0, form=(0, 0, 0)):
        # scale is passed per call, so it is not part of the key
        base = cuda_build.signature_key(q, k, v, state, A_log, a, dt_bias, b, None, out,
                                        new_state, use_qk_l2norm)
        if pool is not None:
            base = (base, state.shape[0], new_state.shape[0], pool.null_slot, pool.read.dtype,
                    pool.write.dtype, pool.same_indices)
        if verify is not None:
            st = verify.states
            dtype = lambda x: None if x is None else x.dtype      # noqa: E731
            base = (base, "verify", verify.per_token, verify.update,
                    None if st is None else (st.shape, st.stride(), st.dtype),
                    dtype(verify.indices), dtype(verify.accepted))
        if form != (0, 0, 0):
            base = (base, "form", form)
        return (base, "pdl", pdl) if pdl else base

    @staticmethod
    def pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool=None):
        """The kernel's pointer arguments in signature order (the two index pointers last: the
        state's without a pool), and whether all are 16-byte aligned (Triton specializes on
        that)."""
        s = state.data_ptr()
        r, w = (s, s) if pool is None else (pool.read.data_ptr(), pool.write.data_ptr())
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(),
                A_log.data_ptr(), dt_bias.data_ptr(), out.data_ptr(), s, new_state.data_ptr(),
                r, w)
        return ptrs, (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6]
                      | ptrs[7] | s | ptrs[9] | r | w) & 15 == 0

    @staticmethod
    def verify_pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool, verify):
        """:meth:`pointers` of a verify call: the three verify pointers follow (the state's for
        a tensor the call lacks, as :func:`verify_args`)."""
        ptrs, aligned = Dispatcher.pointers(q, k, v, state, A_log, a, dt_bias, b, out,
                                            new_state, pool)
        s = ptrs[8]
        more = tuple(s if x is None else x.data_ptr()
                     for x in (verify.states, verify.indices, verify.accepted))
        return ptrs + more, aligned and (more[0] | more[1] | more[2]) & 15 == 0

    def call(self, base, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2,
             pool=None, verify=None, pdl=0, form=(0, 0, 0)):
        if verify is None:
            ptrs, aligned = self.pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state,
                                          pool)
        else:
            ptrs, aligned = self.verify_pointers(q, k, v, state, A_log, a, dt_bias, b, out,
                                                 new_state, pool, verify)
        key = (base, aligned)
        fast = self.fast.get(key)
        if fast is not None:
            fast(ptrs, float(scale))
            return
        made = self.first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                               l2, pool, verify, key, **self.pdl_kwargs(pdl),
                               **form_kwargs(form))
        if key[1] and not interpreter_on():       # misaligned calls keep Triton's own path
            self.fast[key] = made

    def run(self, call, *, config=None):
        """The backend's entry point for a decode call record: the cached launch, or with an
        explicit ``config`` the backend's own launch with it."""
        c, f = call, form(call)
        if config is not None:
            self.launch(*tensors(c), c.scale, c.out, c.new_state, c.use_qk_l2norm, pool=c.pool,
                        verify=c.verify, config=config, **self.pdl_kwargs(c.pdl),
                        **form_kwargs(f))
            return
        base = self.key(*tensors(c), c.out, c.new_state, c.use_qk_l2norm, c.pool, c.verify,
                        c.pdl, f)
        self.call(base, *tensors(c), c.scale, c.out, c.new_state, c.use_qk_l2norm, c.pool,
                  c.verify, c.pdl, f)

    def bind(self, call, *, config=None):
        """A launcher of decode call records valid for every call with this one's shapes,
        strides, dtypes and mode (and, with a pool, its slot counts, null slot and index
        dtypes; with a verify, its form, intermediate states' shape and strides and index
        dtypes; its PDL level): what the dispatcher's signature guarantees, so the key is
        computed once, here, and its fast launchers are looked up by pointer alignment alone
        (no per-call hashing of the key).  ``config``: an explicit launch config (the
        backend's own launch, every call)."""
        c, pdl, f = call, call.pdl, form(call)
        self.pdl_kwargs(pdl)
        if config is not None:
            return lambda c: self.run(c, config=config)
        base = self.key(*tensors(c), c.out, c.new_state, c.use_qk_l2norm, c.pool, c.verify,
                        pdl, f)
        run, fast = self.call, self.fast
        slots = {}                                  # 16-byte aligned? -> FastLaunch

        if c.verify is None:
            def pointers(c):
                return self.pointers(*tensors(c), c.out, c.new_state, c.pool)
        else:
            def pointers(c):
                return self.verify_pointers(*tensors(c), c.out, c.new_state, c.pool, c.verify)

        def bound(c):
            ptrs, aligned = pointers(c)
            launch = slots.get(aligned)
            if launch is None:
                launch = fast.get((base, aligned))
                if launch is None:                  # first call of this kind: Triton's path
                    run(base, *tensors(c), c.scale, c.out, c.new_state, c.use_qk_l2norm,
                        c.pool, c.verify, pdl=pdl, form=f)
                    return
                slots[aligned] = launch
            launch(ptrs, float(c.scale))

        if c.pool is None and c.verify is None and f == (0, 0, 0):
            # The kernel's pointers from the dispatcher's (dispatch.DENSE_POINTERS order: q,
            # k, v, state, A_log, a, dt_bias, b, out, new_state, that 0 in place).
            order = operator.itemgetter(0, 1, 2, 5, 7, 4, 6, 8, 3,
                                        3 if c.new_state is c.state else 9, 3, 3)

            def with_pointers(p, scale):
                """Launch from the dispatcher's data pointers when a fast launcher for their
                alignment exists; False: call ``bound`` with the record instead."""
                launch = slots.get(not (p[0] | p[1] | p[2] | p[3] | p[4] | p[5] | p[6] | p[7]
                                        | p[8] | p[9]) & 15)
                if launch is None:
                    return False
                launch(order(p), scale)
                return True
            bound.with_pointers = with_pointers
        return bound


def tensors(call) -> tuple:
    """The eight input tensors of a decode call record, in the signature's order; with the
    precomputed gates, g and beta where a and b go (and g, never read, for A_log and
    dt_bias)."""
    c = call
    if c.g is not None:
        return (c.q, c.k, c.v, c.state, c.g, c.g, c.g, c.beta)
    return (c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b)


def form(call) -> tuple:
    """The kernel's (GATES, NEG, KFIRST) for a decode call record: precomputed gates,
    allow_neg_eigval, a K-first state."""
    return (int(call.g is not None), int(call.allow_neg_eigval), int(call.problem.k_first))


def form_kwargs(form) -> dict:
    """What the first call and a config's launch are given for a gate form and state layout:
    nothing for the raw gates and a k-last state (so backends without the forms never see it)."""
    return {} if form == (0, 0, 0) else {"form": form}


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

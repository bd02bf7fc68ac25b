"""Compile, cache and launch the CUDA C++ backends (cuda-v1, cuda-v4) through CuPy.

* Compiling: CuPy's NVRTC binding (``cupy_backends.cuda.libs.nvrtc``), for the running GPU's
  exact architecture (``--gpu-architecture=sm_90a`` on H100, ``sm_100a`` on B200, ``sm_XY``
  elsewhere; PTX for the newest arch NVRTC knows when the GPU is newer still).  CuPy's
  ``RawModule`` is not used because it appends its own ``-arch=sm_XY`` (no ``a`` suffix) and
  ``-ftz=true``.  Variants are ``-D`` constants (see :func:`defines`).
* Caching: in memory per (device, source, options); on disk as cubin files under
  ``$GDNZOO_CACHE_DIR``, else ``$CUPY_CACHE_DIR/gdnzoo``, else ``~/.cache/gdnzoo/cubin``, named by
  a hash of the sources, options and NVRTC version (CuPy's own kernel cache is not involved).
* Launching: ``cuLaunchKernel`` through CuPy's driver binding with one by-value
  :data:`PARAM_FIELDS` struct.  A :class:`Launch` is built once per signature (shapes,
  strides, dtypes, scale) with every non-pointer field packed; a call writes only the 15
  pointers, :data:`HEAD_FIELDS` (the raw ``data_ptr()`` values, index pointers included),
  into its per-thread copy, one ``pack_into``: no copies, no CuPy
  arrays, no allocation; on the current torch stream of the tensors' device, so CUDA-graph
  capture records the launch (the driver copies the parameter block into the graph node).  The
  first call of a variant compiles and loads the module; it must happen before graph capture.

Nothing here imports cupy at module import time.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import threading
from pathlib import Path

import torch

HEADER = Path(__file__).with_name("gdn_common.cuh")
STD = "-std=c++17"

# Mirrors struct GdnParams in gdn_common.cuh, in order; every field is 8 bytes.  Ordered by when
# a kernel first reads a field (see the struct): the first six share one 64-byte constant-cache
# line with the launch's memory descriptor and are all a kernel reads before its state loads.
PARAM_FIELDS = (
    "P", "null_slot", "s_n", "state", "idx", "accepted",
    "q", "k", "v", "a", "b", "A_log", "new_state", "out",
    "dt_bias", "inter_idx", "new_idx", "inter", "PN", "ns_n", "scale", "S",
    "i_n", "i_t", "B", "T", "H", "HV", "V",
    "q_n", "q_t", "q_h", "k_n", "k_t", "k_h", "v_n", "v_t", "v_h",
    "a_n", "a_t", "a_h", "b_n", "b_t", "b_h", "o_n", "o_t", "o_h",
    "s_h", "s_v", "ns_h", "ns_v", "A_log_h", "dtb_h",
)
# The 15 pointers, state .. inter, written on every call with one pack_into at HEAD_OFFSET.
HEAD_FIELDS = PARAM_FIELDS[PARAM_FIELDS.index("state"):PARAM_FIELDS.index("inter") + 1]
HEAD = struct.Struct("<" + "Q" * len(HEAD_FIELDS))
HEAD_OFFSET = 8 * PARAM_FIELDS.index("state")
PARAMS = struct.Struct("<" + "".join("Q" if n in HEAD_FIELDS else "d" if n == "scale" else "q"
                                     for n in PARAM_FIELDS))
# GdnParams' strides of q .. dt_bias, state and new_state (cuda-v4's GDN_DENSE=2 compiles them in)
STRIDE_FIELDS = ("s_n", "ns_n") + PARAM_FIELDS[PARAM_FIELDS.index("q_n"):]

DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}   # GDN_F32/BF16/F16
ELEM_SIZE = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def param_values(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, pool=None,
                 verify=None):
    """The GdnParams field values for these tensors, in PARAM_FIELDS order.  With ``pool`` (a
    :class:`gdnzoo.pool.Pool`) ``state`` and ``new_state`` are pools: their slot counts and the
    pool's ``null_slot`` are filled in; with ``verify`` (a :class:`gdnzoo.verify.Verify`) the
    intermediate states' row count and row and step strides (0 without them).  The index,
    count and intermediate pointers are 0: they are written per call."""
    qs, ks, vs, as_, bs = q.stride(), k.stride(), v.stride(), a.stride(), b.stride()
    os_, ss, ns = out.stride(), state.stride(), new_state.stride()
    B, T, H, _ = q.shape
    _, _, HV, V = v.shape
    P, PN, null = (0, 0, -1) if pool is None else (state.shape[0], new_state.shape[0],
                                                   int(pool.null_slot))
    x = None if verify is None else verify.states
    S, i_n, i_t = (0, 0, 0) if x is None else (x.shape[0], x.stride(0), x.stride(1))
    return (P, null, ss[0], state.data_ptr(), 0, 0,
            q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(),
            A_log.data_ptr(), new_state.data_ptr(), out.data_ptr(),
            dt_bias.data_ptr(), 0, 0, 0, PN, ns[0], float(scale), S,
            i_n, i_t, B, T, H, HV, V,
            qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
            as_[0], as_[1], as_[2], bs[0], bs[1], bs[2], os_[0], os_[1], os_[2],
            ss[1], ss[2], ns[1], ns[2], A_log.stride(0), dt_bias.stride(0))


def available(device="cuda"):
    """(ok, why) of every CUDA C++ backend (``device``: cuda, the only one they declare): CuPy
    (its NVRTC and driver bindings) importable."""
    import importlib.util
    if importlib.util.find_spec("cupy") is None:
        return False, "needs CuPy (pip install cupy-cuda13x or cupy-cuda12x)"
    return True, "CUDA C++ compiled with CuPy's NVRTC at first use"


def params_template(values) -> bytes:
    """A parameter block with the GdnParams ``values``, pointer fields zeroed (they are
    written on every call)."""
    return PARAMS.pack(*(0 if n in HEAD_FIELDS else x for n, x in zip(PARAM_FIELDS, values)))


def defines(state_dtype, io_dtype, a_dtype, b_dtype, dt_bias_dtype, K, l2norm, **extra):
    """The -D constants of one kernel variant, as a sorted tuple of (name, int)."""
    d = dict(GDN_K=int(K), GDN_STATE_DT=DTYPE_CODE[state_dtype], GDN_IO_DT=DTYPE_CODE[io_dtype],
             GDN_A_DT=DTYPE_CODE[a_dtype], GDN_B_DT=DTYPE_CODE[b_dtype],
             GDN_DTB_DT=DTYPE_CODE[dt_bias_dtype], GDN_L2NORM=int(bool(l2norm)))
    d.update({f"GDN_{n.upper()}": int(v) for n, v in extra.items()})
    return tuple(sorted(d.items()))


def define_options(defs) -> list[str]:
    return [f"-D{n}={v}" for n, v in defs]


_ARCH_SPECIFIC = {90, 100, 103}          # where the 'a' (arch-specific) target exists


def arch_option(cc, supported=None) -> tuple[str, str]:
    """NVRTC architecture option for compute capability ``cc`` and what it produces."""
    num = cc[0] * 10 + cc[1]
    if supported is not None and num not in supported:
        older = [s for s in supported if s <= num]
        if not older:
            raise RuntimeError(f"NVRTC supports {sorted(supported)}, none usable for sm_{num}")
        return f"--gpu-architecture=compute_{max(older)}", "ptx"   # the driver JITs it
    suffix = "a" if num in _ARCH_SPECIFIC else ""
    return f"--gpu-architecture=sm_{num}{suffix}", "cubin"


def nvrtc_options(defs, arch: str) -> list[str]:
    """The NVRTC options of one variant; ``arch`` from :func:`arch_option`."""
    return [STD, arch, f"--include-path={HEADER.parent}", *define_options(defs)]


def nvcc_args(defs, cc) -> list[str]:
    """The nvcc flags equivalent to the NVRTC options (used by tests/test_cuda_sources.py)."""
    num = cc[0] * 10 + cc[1]
    suffix = "a" if num in _ARCH_SPECIFIC else ""
    return [STD, f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}",
            f"-I{HEADER.parent}", *define_options(defs)]


def cache_dir() -> Path:
    if os.environ.get("GDNZOO_CACHE_DIR"):
        return Path(os.environ["GDNZOO_CACHE_DIR"])
    if os.environ.get("CUPY_CACHE_DIR"):
        return Path(os.environ["CUPY_CACHE_DIR"]) / "gdnzoo"
    return Path.home() / ".cache" / "gdnzoo" / "cubin"


def cache_key(source: str, options, nvrtc_version, kind) -> str:
    """The disk cache's name of a variant: its source, every header beside gdn_common.cuh (what
    a source may include), its options, the compiler and the output kind."""
    h = hashlib.sha256()
    headers = [p.read_text() for p in sorted(HEADER.parent.glob("*.cuh"))]
    for part in (*headers, source, "\0".join(options), repr(nvrtc_version), kind):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:40]


class Kernel:
    """A loaded kernel: driver function handle plus what the compiler made of it."""

    def __init__(self, func, module, arch, options, attrs):
        self.func, self.module, self.arch, self.options = func, module, arch, options
        self.num_regs = attrs["num_regs"]
        self.local_bytes = attrs["local_bytes"]        # > 0: stack or spills
        self.static_smem = attrs["static_smem"]
        self.max_threads = attrs["max_threads"]


_kernels: dict = {}
_lock = threading.Lock()


def _compile(source: str, options: list, kind: str) -> bytes:
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(source, "gdn.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC failed ({' '.join(options)}):\n"
                               f"{nvrtc.getProgramLog(prog)}") from e
        if kind == "cubin":
            return nvrtc.getCUBIN(prog)
        ptx = nvrtc.getPTX(prog)                       # str in older CuPy, bytes in newer
        ptx = ptx if isinstance(ptx, bytes) else ptx.encode()
        return ptx if ptx.endswith(b"\0") else ptx + b"\0"   # the driver wants C text
    finally:
        nvrtc.destroyProgram(prog)


MAX_DYNAMIC_SHARED = 8         # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
DEFAULT_SHARED = 48 * 1024     # dynamic shared memory a launch may take without that attribute


def get_kernel(cu_path: Path, name: str, defs, device_index: int, shared: int = 0) -> Kernel:
    """Compile (or load from the caches) kernel ``name`` of ``cu_path`` for this device.
    ``shared``: the dynamic shared memory its launches take; above 48 KB the function's limit
    is raised to it once, when loaded."""
    key = (device_index, str(cu_path), name, defs, shared)
    kern = _kernels.get(key)
    if kern is not None:
        return kern
    with _lock:
        if key in _kernels:
            return _kernels[key]
        import cupy
        from cupy_backends.cuda.api import driver
        from cupy_backends.cuda.libs import nvrtc
        cc = torch.cuda.get_device_capability(device_index)
        arch, kind = arch_option(cc, set(nvrtc.getSupportedArchs()))
        options = nvrtc_options(defs, arch)
        source = Path(cu_path).read_text()
        path = cache_dir() / f"{cache_key(source, options, nvrtc.getVersion(), kind)}.{kind}"
        image = path.read_bytes() if path.exists() else None
        if image is None:
            image = _compile(source, options, kind)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
                tmp.write_bytes(image)
                os.replace(tmp, path)
            except OSError:
                pass                                   # a read-only cache only costs time
        with cupy.cuda.Device(device_index):
            module = driver.moduleLoadData(image)
            func = driver.moduleGetFunction(module, name)
            # Querying attributes also forces a lazily loaded function in, before any capture.
            attrs = dict(max_threads=driver.funcGetAttribute(0, func),
                         static_smem=driver.funcGetAttribute(1, func),
                         local_bytes=driver.funcGetAttribute(3, func),
                         num_regs=driver.funcGetAttribute(4, func))
            if shared > DEFAULT_SHARED:
                driver.funcSetAttribute(func, MAX_DYNAMIC_SHARED, shared)
        kern = Kernel(func, module, arch, options, attrs)
        _kernels[key] = kern
        return kern


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_driver = None


def launch_raw(func, grid: int, block: int, device_index: int, argv_addr: int,
               shared: int = 0) -> None:
    """cuLaunchKernel(func) on the current torch stream of the device; ``argv_addr`` is the
    address of the kernel's ``void*`` parameter array (for our kernels one pointer, at one
    packed GdnParams block); ``shared``: dynamic shared memory bytes.

    The driver copies the parameter block before returning (during stream capture it goes into
    the graph's kernel node), so the caller may rewrite its buffer right after.
    """
    driver, runtime = _driver or _cupy_api()
    # The current torch stream, inlined: this runs on every launch of every CUDA and Triton backend.
    stream = _raw_stream(device_index) if _raw_stream is not None \
        else torch.cuda.current_stream(device_index).cuda_stream
    if runtime.getDevice() != device_index:
        import cupy
        with cupy.cuda.Device(device_index):
            driver.launchKernel(func, grid, 1, 1, block, 1, 1, shared, stream, argv_addr, 0)
        return
    try:
        driver.launchKernel(func, grid, 1, 1, block, 1, 1, shared, stream, argv_addr, 0)
    except driver.CUDADriverError:
        # A thread whose driver context was never made current (the runtime binds it lazily).
        runtime.setDevice(device_index)
        driver.launchKernel(func, grid, 1, 1, block, 1, 1, shared, stream, argv_addr, 0)


def _cupy_api() -> tuple:
    """(driver, runtime) of CuPy's CUDA bindings, imported once (ImportError without CuPy)."""
    global _driver
    if _driver is None:
        from cupy_backends.cuda.api import driver, runtime
        _driver = (driver, runtime)
    return _driver


def _device_now() -> int:
    """The calling thread's current device, as :func:`launch_raw` reads it (CuPy's runtime
    binding, a few times cheaper than torch's ``current_device``; torch's without CuPy)."""
    try:
        return (_driver or _cupy_api())[1].getDevice()
    except ImportError:
        return torch.cuda.current_device()


_PDL_CONFIGS: dict = {}


def pdl_config(grid: int, block: int, shared: int = 0):
    """The :class:`gdnzoo.backends._pdl_launch.PdlConfig` of (grid, block, shared bytes), made
    once: the prefill launchers, whose grid changes with every prompt, reuse them instead of
    building the driver's structures on every call (at most 256 kept; cleared when full)."""
    key = (grid, block, shared)
    cfg = _PDL_CONFIGS.get(key)
    if cfg is None:
        from gdnzoo.backends._pdl_launch import PdlConfig
        if len(_PDL_CONFIGS) >= 256:
            _PDL_CONFIGS.clear()
        cfg = _PDL_CONFIGS[key] = PdlConfig(grid, block, shared)
    return cfg


def launch_raw_pdl(config, func, device_index: int, argv_addr: int) -> None:
    """:func:`launch_raw` with programmatic dependent launch: ``config`` a
    :class:`gdnzoo.backends._pdl_launch.PdlConfig` (grid, block, shared bytes)."""
    stream = _raw_stream(device_index) if _raw_stream is not None \
        else torch.cuda.current_stream(device_index).cuda_stream
    if _device_now() != device_index:
        with torch.cuda.device(device_index):
            config.launch(func, stream, argv_addr)
        return
    try:
        config.launch(func, stream, argv_addr)
    except RuntimeError as e:
        if "error 201" not in str(e):      # CUDA_ERROR_INVALID_CONTEXT: a thread whose driver
            raise                          # context was never made current (bound lazily)
        torch.cuda.set_device(device_index)
        config.launch(func, stream, argv_addr)


class Launch:
    """One kernel, grid and block with a prebuilt parameter block: per call only the ``head``
    fields (by default GdnParams' pointers, :data:`HEAD_FIELDS` at HEAD_OFFSET) are written,
    one pack_into, before cuLaunchKernel.  Each thread gets its own copy of the block, so
    concurrent callers never rewrite a block the driver is still reading.

    Our CUDA kernels take one by-value GdnParams (``values``; one parameter at offset 0).  Other
    kernels (the Triton backends) pass ``template``, the bytes of all their parameters, and
    ``slots``, the offset of each parameter in it."""

    __slots__ = ("kern", "func", "grid", "block", "dev", "template", "slots", "head", "at",
                 "shared", "pdl", "_tls")

    def __init__(self, kern, grid: int, block: int, device_index: int, values=None, *,
                 template: bytes | None = None, slots=(0,), head=None, shared: int = 0,
                 pdl: bool = False):
        self.kern, self.func = kern, getattr(kern, "func", kern)
        self.grid, self.block, self.dev = int(grid), int(block), int(device_index)
        # Pointer fields are zeroed: they are written on every call, and a stale address from
        # the binding call must never reach a launch.
        self.template = params_template(values) if template is None else bytes(template)
        self.slots, self.shared = tuple(slots), int(shared)
        self.head, self.at = (HEAD, HEAD_OFFSET) if head is None else (head, 0)
        # pdl: launched with programmatic dependent launch (backends/_pdl_launch.py); the kernel
        # itself must wait (griddepcontrol.wait) before reading what the kernel before it writes.
        self.pdl = None
        if pdl:
            from gdnzoo.backends._pdl_launch import PdlConfig
            self.pdl = PdlConfig(self.grid, self.block, self.shared)
        self._tls = threading.local()

    def buffers(self):
        buf = ctypes.create_string_buffer(self.template, len(self.template))
        base = ctypes.addressof(buf)
        argv = (ctypes.c_void_p * len(self.slots))(*(base + o for o in self.slots))
        self._tls.b = (buf, argv, ctypes.addressof(argv))
        return self._tls.b

    def __call__(self, ptrs, *more) -> None:
        """Launch with these leading fields: ``ptrs`` (and ``more``, e.g. a Triton scale)."""
        try:
            buf, _, argv_addr = self._tls.b
        except AttributeError:
            buf, _, argv_addr = self.buffers()
        self.head.pack_into(buf, self.at, *ptrs, *more)
        if self.pdl is None:
            launch_raw(self.func, self.grid, self.block, self.dev, argv_addr, self.shared)
        else:
            launch_raw_pdl(self.pdl, self.func, self.dev, argv_addr)


def dense(q, k, v, state, A_log, a, dt_bias, b, out, new_state) -> bool:
    """Every tensor has the row-major strides of its shape (torch's contiguity, which ignores
    size-1 dims: their index is always 0), so a kernel may take its strides from the shapes as
    compile-time constants (cuda-v4's GDN_DENSE, fla-recurrent's DENSE)."""
    return all(t.is_contiguous() for t in (q, k, v, state, A_log, a, dt_bias, b, out, new_state))


def aligned16(*tensors) -> bool:
    """Each tensor can be read in 16-byte pieces along its last dim (cp.async, TMA): non-empty,
    the last dim contiguous, the base and every other stride a multiple of 16 bytes.  (Plain
    loops: a prefill call asks twice, and generators cost ~10 us on a slow host.)"""
    for t in tensors:
        st = t.stride()
        if st[-1] != 1 or t.data_ptr() % 16 or not t.numel():
            return False
        size = t.element_size()
        for x in st[:-1]:
            if x * size % 16:
                return False
    return True


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    """The SM count of a CUDA device (an index or a torch.device), asked of torch once per
    device (three times a prefill call otherwise)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def capability(device) -> tuple:
    """The compute capability of a CUDA device (an index or a torch.device), asked once."""
    return torch.cuda.get_device_capability(device)


def signature_key(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
    """Everything a bound launcher of the CUDA and Triton backends depends on except data
    pointers: shapes, dtypes, strides, the L2 norm, ``scale`` (None where it is passed per
    call), in place or not, and the device."""
    return (q.shape, v.shape, q.dtype, a.dtype, b.dtype, dt_bias.dtype, state.dtype,
            q.stride(), k.stride(), v.stride(), a.stride(), b.stride(), A_log.stride(),
            dt_bias.stride(), out.stride(), state.stride(), new_state.stride(), bool(l2),
            scale, new_state is state, q.get_device())


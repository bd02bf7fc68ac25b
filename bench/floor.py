"""The floor: what any kernel that must read and write the state bytes once costs on this GPU.

An in-place streaming kernel (CuPy/NVRTC) reads and writes exactly ``set_bytes`` as float4, with
``x * alpha + beta`` on runtime scalars so the compiler cannot drop the load/store pair.  Only bytes
matter, so one kernel serves fp32 and bf16 state.  Its launch shape (threads per block, float4s in
flight per thread, exact or persistent grid) is searched per size, timed with the same CUPTI clock
and the same cold-L2 rotation as the backends.  Also here: device-to-device copy bandwidth and an
empty-kernel time, measured in the same run.  Without CuPy, a torch ``mul_`` stands in (no search).

The pool floor (:func:`indexed_floor_times` of a :class:`PoolTarget`) streams the slots the
measured calls name, through their own index tensor, each slot's index loaded first; the verify
floor (a :class:`VerifyTarget`) stores each block wherever a speculative-verify form stores
states; the chained floor (:func:`chained_launcher`) is the pool floor kernel as one layer of a
model's graph runs it, right behind the kernel that writes mixed_qkv, at the decode's PDL levels.
Their launch shapes are searched the same way; without CuPy they are not measured.
"""
from __future__ import annotations

import functools
import importlib
import itertools

import numpy as np
import torch

from gdnzoo.bench import clocks

_SRC = r"""
// One thread's part of streaming n4 float4s from src, as block part.index() of part.count():
// all VPT loads are issued before any store, so loads in flight per thread hide DRAM latency;
// then ready(beta) gives the term the stores add (Now: beta itself) and store(k, t) writes
// float4 k as t = x * alpha + that term (runtime scalars: the compiler cannot drop the
// load/store pair).
template <int VPT, class Store, class Ready, class Part>
__device__ __forceinline__ void stream_part(float4* __restrict__ src, long long n4, float alpha,
                                            float beta, const Store& store, Ready& ready,
                                            const Part& part) {
    const long long step = (long long)blockDim.x;
    const long long stride = (long long)part.count() * blockDim.x * VPT;
    for (long long i = (long long)part.index() * blockDim.x * VPT + threadIdx.x; i < n4;
         i += stride) {
        float4 v[VPT];
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            long long k = i + j * step;
            if (k < n4) v[j] = src[k];
        }
        const float add = ready(beta);
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            long long k = i + j * step;
            if (k < n4) {
                float4 t = v[j];
                t.x = t.x * alpha + add; t.y = t.y * alpha + add;
                t.z = t.z * alpha + add; t.w = t.w * alpha + add;
                store(k, t);
            }
        }
    }
}

// Nothing to wait for: the stores add beta.
struct Now {
    __device__ __forceinline__ float operator()(float beta) const { return beta; }
};

// The block's part: the whole grid streams one array.
struct Whole {
    __device__ __forceinline__ unsigned index() const { return blockIdx.x; }
    __device__ __forceinline__ unsigned count() const { return gridDim.x; }
};

template <int VPT, class Store>
__device__ __forceinline__ void stream_each(float4* __restrict__ src, long long n4, float alpha,
                                            float beta, const Store& store) {
    Now now;
    stream_part<VPT>(src, n4, alpha, beta, store, now, Whole{});
}

// A store to one buffer (the source itself: a read-modify-write in place).
struct To {
    float4* __restrict__ dst;
    __device__ __forceinline__ void operator()(long long k, float4 t) const { dst[k] = t; }
};

template <int VPT>
__device__ __forceinline__ void stream_rmw(float4* __restrict__ x, long long n4, float alpha,
                                           float beta) {
    stream_each<VPT>(x, n4, alpha, beta, To{x});
}

// BLK is the block size the instantiation is launched with: __launch_bounds__ caps registers so
// that VPT float4s in flight still fit 1024 threads (without it x8/1024 is unlaunchable).
template <int VPT, int BLK>
__global__ void __launch_bounds__(BLK) stream_inplace(float4* __restrict__ x, long long n4,
                                                      float alpha, float beta) {
    stream_rmw<VPT>(x, n4, alpha, beta);
}

// The pool floor: blockIdx.y is the sequence, whose slot index is loaded first (as a decode
// kernel must), then gridDim.x blocks stream that slot's n4 float4s at pool + slot * page4.
template <int VPT, int BLK>
__global__ void __launch_bounds__(BLK) stream_pool(float4* __restrict__ pool,
                                                   const int* __restrict__ idx, long long page4,
                                                   long long n4, float alpha, float beta) {
    const long long slot = idx[blockIdx.y];
    if (slot < 0) return;
    stream_rmw<VPT>(pool + slot * page4, n4, alpha, beta);
}
extern "C" __global__ void empty_kernel() {}
"""

# The verify floor (appended to _SRC, compiled apart: only the verify bench needs it).  One
# sequence per blockIdx.y; its indices are loaded first, as a verify kernel must, then one
# [HV, V, K] block is read once and stored to every place the form writes.
_VERIFY_SRC = r"""
#define MAX_T 16

// The T intermediate states of one sequence (steps step4 apart from row), and with FINAL the
// final state back to the slot it was read from.
template <bool FINAL>
struct Steps {
    float4* row;
    float4* slot;
    long long step4;
    int T;
    __device__ __forceinline__ void operator()(long long k, float4 t) const {
#pragma unroll
        for (int d = 0; d < MAX_T; ++d)
            if (d < T) row[d * step4 + k] = t;
        if (FINAL) slot[k] = t;
    }
};

// One pool slot per token (vLLM's per-token form); a padded slot (< 0) is not written.
struct Slots {
    float4* pool;
    long long page4;
    int T;
    int s[MAX_T];
    __device__ __forceinline__ void operator()(long long k, float4 t) const {
#pragma unroll
        for (int d = 0; d < MAX_T; ++d)
            if (d < T && s[d] >= 0) pool[(long long)s[d] * page4 + k] = t;
    }
};

// FORM 0: read slot idx[n], store intermediate row rows[n], steps 0..T-1; FORM 1: the same and
// the final state back to the slot; FORM 2: read slot idx[n * ld + cnt[n] - 1], store token t's
// state to slot idx[n * ld + t]; FORM 3 (commit): read row rows[n], step cnt[n], store slot idx[n].
template <int FORM, int VPT, int BLK>
__global__ void __launch_bounds__(BLK) stream_verify(
        float4* __restrict__ pool, float4* __restrict__ inter, const int* __restrict__ idx,
        const int* __restrict__ rows, const int* __restrict__ cnt, long long ld, int T,
        long long page4, long long row4, long long step4, long long n4, float alpha, float beta) {
    const long long n = blockIdx.y;
    if (FORM == 2) {
        const int* my = idx + n * ld;
        const long long src = my[cnt[n] - 1];
        if (src < 0) return;
        Slots st{pool, page4, T, {}};
#pragma unroll
        for (int d = 0; d < MAX_T; ++d) st.s[d] = d < T ? my[d] : -1;
        stream_each<VPT>(pool + src * page4, n4, alpha, beta, st);
    } else if (FORM == 3) {
        const long long slot = idx[n];
        if (slot < 0) return;
        float4* from = inter + (long long)rows[n] * row4 + (long long)cnt[n] * step4;
        stream_each<VPT>(from, n4, alpha, beta, To{pool + slot * page4});
    } else {
        const long long slot = idx[n];
        if (slot < 0) return;
        float4* at = pool + slot * page4;
        stream_each<VPT>(at, n4, alpha, beta,
                         Steps<FORM == 1>{inter + (long long)rows[n] * row4, at, step4, T});
    }
}
"""
# The chained floor (appended to _SRC, compiled apart per launch shape: only the chained clock
# needs it).  The pool floor as one layer of a model runs it, right behind the kernel that
# writes mixed_qkv (the producer), on a flat grid of blocks-per-slot x B blocks (a PDL launch
# here takes a one-dimensional grid).
_CHAINED_SRC = r"""
// Grid dependency control (sm_90+): wait until the kernel before this one has completed and its
// writes are visible, then let the next kernel launch.  Compiled to nothing below sm_90, where
// the PDL levels are never launched.
__device__ __forceinline__ void wait_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The term a pass's stores add, once its loads are issued: beta + gamma * x, x the bf16 value
// at mixed (the producer's output), read on the first pass, after the wait at LEVEL 2.  A plain
// load: no read-only path for what the kernel before us writes.
template <int LEVEL>
struct AfterLoads {
    const unsigned short* mixed;
    float gamma, add;
    bool ready;
    __device__ __forceinline__ float operator()(float beta) {
        if (!ready) {
            if (LEVEL == 2) wait_producer();
            add = gamma * __uint_as_float((unsigned)mixed[0] << 16);
            ready = true;
        }
        return beta + add;
    }
};

// Block index of count blocks that stream one slot.
struct Share {
    unsigned i, n;
    __device__ __forceinline__ unsigned index() const { return i; }
    __device__ __forceinline__ unsigned count() const { return n; }
};

// Sequence n = blockIdx.x / per_slot loads its slot index, streams that slot's n4 float4s at
// pool + slot * page4 with per_slot blocks, and reads mixed[n * ld] (one value of its row of
// the producer's output); every value stored is x * alpha + beta + gamma * mixed[n * ld].
// LEVEL 0: a plain launch, no grid dependency instructions; 1 (PDL, wait first): the wait before
// any load; 2 (PDL, state early): the slot index and the first pass's state loads before it.
template <int LEVEL, int VPT, int BLK>
__global__ void __launch_bounds__(BLK) stream_pool_chained(
        float4* __restrict__ pool, const int* __restrict__ idx, const unsigned short* mixed,
        long long ld, long long page4, long long n4, unsigned per_slot, float alpha, float beta,
        float gamma) {
    if (LEVEL == 1) wait_producer();
    const unsigned n = blockIdx.x / per_slot;
    const long long slot = idx[n];
    if (slot < 0) return;
    float4* at = pool + slot * page4;
    AfterLoads<LEVEL> ready{mixed + n * ld, gamma, 0.0f, false};
    stream_part<VPT>(at, n4, alpha, beta, To{at}, ready,
                     Share{blockIdx.x - n * per_slot, per_slot});
}
"""
PDL_LEVELS = (0, 1, 2)           # the chained floor's: off, wait first, state early
MAX_TOKENS = 16                  # the verify floor stores at most this many states per sequence
VERIFY_FORMS = ("states", "states+update", "slots", "commit")
VPTS = (1, 2, 4, 8)
BLOCKS = (128, 256, 512, 1024)
WAVES = (None, 1, 2, 4)          # None: one pass, grid covers the array; k: k blocks per SM-slot


def cupy_available() -> tuple[bool, str]:
    try:
        importlib.import_module("cupy")
    except Exception as e:
        return False, f"cupy not importable ({type(e).__name__})"
    return True, "cupy"


@functools.lru_cache(maxsize=None)
def _compiled(extra: str, names: tuple) -> tuple:
    """(module, {name: kernel}) of :data:`_SRC` and ``extra`` compiled (CuPy, NVRTC) for the
    template instantiations ``names``."""
    import cupy
    mod = cupy.RawModule(code=_SRC + extra, options=("-std=c++17",), name_expressions=list(names))
    return mod, {n: mod.get_function(n) for n in names}


def _module_of(kind: str, *params) -> tuple:
    """(source, instantiations) of the module holding the kernels ``stream_<kind>``: ``inplace``
    and ``pool`` <vpt, block>, one module of every shape (and the empty kernel); ``verify``
    <form's index in VERIFY_FORMS, vpt, block>, one module per form; ``pool_chained`` <level,
    vpt, block>, one module per launch shape holding every level."""
    if kind == "verify":
        return _VERIFY_SRC, tuple(f"stream_verify<{params[0]}, {v}, {b}>" for v in VPTS
                                  for b in BLOCKS)
    if kind == "pool_chained":
        return _CHAINED_SRC, tuple(f"stream_pool_chained<{lv}, {params[1]}, {params[2]}>"
                                   for lv in PDL_LEVELS)
    return "", tuple(f"stream_{k}<{v}, {b}>" for k in ("inplace", "pool") for v in VPTS
                     for b in BLOCKS)


def _kernel(kind: str, *params):
    """The kernel ``stream_<kind><params>``, compiled with its module (:func:`_module_of`)."""
    return _compiled(*_module_of(kind, *params))[1][f"stream_{kind}<{', '.join(map(str, params))}>"]


def launchable(vpt: int, blk: int, *kind) -> tuple[bool, str]:
    """Whether the compiled (vpt, blk) kernel can start ``blk`` threads (registers, limits);
    ``kind``: :func:`_kernel`'s kind and leading parameters (default the dense floor's)."""
    try:
        f = _kernel(*(kind or ("inplace",)), vpt, blk)
        m = int(f.max_threads_per_block)
    except Exception as e:
        return False, f"x{vpt}/{blk}: {type(e).__name__}: {e}"
    if m < blk:
        return False, f"x{vpt}/{blk}: at most {m} threads per block ({f.num_regs} registers/thread)"
    return True, ""


def _stream():
    import cupy
    return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)


def configs(n4: int, sms: int, ok=None, seqs: int = 1):
    """(vpt, block, grid) launch shapes worth trying for n4 float4s; duplicates removed.

    ``ok(vpt, blk) -> bool`` drops the shapes the compiled kernel cannot launch.  ``seqs``: the
    pool floor's sequences, each streaming its own n4 float4s with ``grid`` blocks (a
    persistent grid shares its SM slots among them)."""
    out = {}                            # an ordered set
    for vpt, blk in itertools.product(VPTS, BLOCKS):
        if ok is None or ok(vpt, blk):
            exact = max(1, -(-n4 // (blk * vpt)))
            for w in WAVES:
                out[vpt, blk, exact if w is None else min(
                    exact, max(1, sms * w * max(1, 2048 // blk) // seqs))] = None
    return list(out)


def _launcher(rot, cfg, alpha=1.0, beta=0.0):
    """launch(i): launch shape ``cfg`` on the next buffer of ``rot`` (a clocks.Rotation of
    float buffers, shared by every session over them; the session's index ``i`` is unused)."""
    import cupy
    vpt, blk, grid = cfg
    f = _kernel("inplace", vpt, blk)
    arrs = [cupy.asarray(b) for b in rot.states]
    n4 = np.int64(rot.set_bytes // 16)
    one, zero = np.float32(alpha), np.float32(beta)

    def launch(i):
        with _stream():
            f((grid,), (blk,), (arrs[rot.next_index()], n4, one, zero))
    return launch


def search_configs(n4: int, sms: int, probe=None, seqs: int = 1, check=None, make=None):
    """Launch shapes the compiled kernel really launches, and a note per shape dropped.

    A shape must pass the kernel's attributes (``check(vpt, blk)``, default :func:`launchable`)
    and one probe launch on ``probe`` through ``make(probe, cfg)`` (default :func:`_launcher`: a
    rotation of buffers of n4 float4s; alpha=1, beta=0 leaves them unchanged), so a resource
    error never reaches a timed run.  ``seqs``: see :func:`configs`."""
    notes = []
    check = check or launchable
    make = make or _launcher

    def ok(vpt, blk):
        good, why = check(vpt, blk)
        if not good:
            notes.append(why)
        return good
    cfgs = configs(n4, sms, ok, seqs)
    if probe is None:
        return cfgs, notes
    kept = []
    for cfg in cfgs:
        try:
            make(probe, cfg)(0)
            torch.cuda.synchronize()
            kept.append(cfg)
        except Exception as e:           # launch errors are not sticky: the context stays usable
            notes.append(f"x{cfg[0]}/{cfg[1]} grid {cfg[2]}: {type(e).__name__}: {str(e)[:120]}")
    return kept, notes


FINALISTS = 3   # shapes re-timed in the search's second round
SEARCH_REPS = 8  # calls per shape in the search's first round


def pick_fastest(cfgs, make, search_reps, prepare=None):
    """The shape of ``cfgs`` whose launcher (``make(cfg)``) reads fastest on the kernel clock, in
    two interleaved rounds: every shape ``search_reps`` calls, then the ``FINALISTS`` fastest
    again with four times as many, so that the pick rests on more than 8 calls.  It does not make
    the pick stable: on the H100 at B = 1, T = 8 (verify floor) both forms of the search kept a
    shape other than the fastest of a 60-call interleaved timing in about one search of five
    (bench/results/h100-80gb-hbm3/verify/floor-search/)."""
    per, _ = clocks.interleaved_kernel_times([make(c) for c in cfgs], search_reps, prepare=prepare)
    med = [clocks.summarize(s)["median"] for s in per]
    order = sorted(range(len(cfgs)), key=med.__getitem__)[:FINALISTS]
    if len(order) > 1:
        per, _ = clocks.interleaved_kernel_times([make(cfgs[i]) for i in order], 4 * search_reps,
                                                 prepare=prepare)
        med2 = [clocks.summarize(s)["median"] for s in per]
        order = [order[min(range(len(order)), key=med2.__getitem__)]]
    return cfgs[order[0]]


def _search(what, n4, probe, make, seqs=1, check=None, prepare=None) -> tuple:
    """(the fastest launch shape for n4 float4s, a note on the shapes dropped, those shapes'
    notes, the number searched): :func:`search_configs` probing ``make(probe, cfg)``, then
    :func:`pick_fastest`; RuntimeError naming ``what`` when no shape launches."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfgs, dropped = search_configs(n4, sms, probe=probe, seqs=seqs, check=check, make=make)
    if not cfgs:
        raise RuntimeError(f"{what}: no launch shape could be launched: " + "; ".join(dropped[:4]))
    best = pick_fastest(cfgs, lambda c: make(probe, c), SEARCH_REPS, prepare=prepare)
    note = f" ({len(dropped)} shapes not launchable, skipped)" if dropped else ""
    return best, note, dropped, len(cfgs)


def best_launcher(set_bytes: int) -> dict:
    """The floor's launch shape for ``set_bytes``, searched on the kernel clock, and a cold
    rotating launcher of it: ``dict(launch, config, n_sets, dropped, searched, rot)``, with
    ``launch`` None (and ``config`` saying why) when CuPy is missing (no search possible)."""
    if set_bytes % 16:
        raise ValueError(f"floor: set_bytes must be a multiple of 16, got {set_bytes}")
    # drawn on the host: a failed graph capture elsewhere can leave the GPU's generator unusable
    rot = clocks.Rotation(torch.randn(set_bytes // 4).to("cuda"))
    ok, why = cupy_available()
    if not ok:
        return dict(launch=None, config=why, n_sets=rot.n, dropped=[], searched=0, rot=rot)
    best, note, dropped, searched = _search("floor", set_bytes // 16, rot, _launcher)
    return dict(launch=_launcher(rot, best), n_sets=rot.n, dropped=dropped, searched=searched,
                config="float4 x{}/thread, {} threads, grid {}".format(*best) + note, rot=rot)


def floor_times(set_bytes: int, iters: int = 100) -> dict:
    """Best in-place streaming time over ``set_bytes`` (us samples) and the winning launch shape,
    timed in a session of its own after the search (the search's best median is biased low:
    the minimum of many noisy medians); without CuPy, a torch ``mul_`` over the rotation."""
    f = best_launcher(set_bytes)
    launch, rot = f.pop("launch"), f.pop("rot")
    if launch is None:
        alpha = torch.ones((), device="cuda")

        def launch(i):
            rot.next()[0].mul_(alpha)
        f["config"] = f"torch mul_ (no shape search: {f['config']})"
    f["samples"], f["method"] = clocks.kernel_times(launch, iters)
    return f


def _check_storage(what, buf, page_elems: int, slot_elems: int, B: int) -> tuple:
    """(page, slot) in float4s of a pool floor's storage: flat, contiguous, 16-byte aligned
    pages and slots; B fits the grid's y axis.  Raises ValueError naming ``what``."""
    e = buf.element_size()
    if buf.dim() != 1 or not buf.is_contiguous() or buf.data_ptr() % 16:
        raise ValueError(f"{what}: buf must be a flat contiguous tensor on a 16-byte boundary "
                         f"(the pool's whole storage)")
    if (page_elems * e) % 16 or (slot_elems * e) % 16:
        raise ValueError(f"{what}: the page ({page_elems * e} bytes) and the slot "
                         f"({slot_elems * e} bytes) must be multiples of 16 bytes")
    if not 1 <= B <= 65535:
        raise ValueError(f"{what}: B must be in 1..65535 (the grid's y axis), got {B}")
    return page_elems * e // 16, slot_elems * e // 16


class PoolTarget:
    """What the pool floor streams: the state pool (``buf``, the pool's whole storage, flat;
    slot s's [HV, V, K] block is ``slot_elems`` elements at ``s * page_elems``) at the slots of
    ``index`` ([B] int32 on the device, the measured calls' index tensor), which
    ``prepare(i)`` refreshes before call i, outside the timed window (the measured calls'
    fresh slots, from the counter they share)."""
    what, kind = "pool floor", ("pool",)

    def __init__(self, buf, page_elems: int, slot_elems: int, B: int, index, prepare):
        self.page4, self.n4 = _check_storage("pool floor", buf, page_elems, slot_elems, B)
        if index.dtype != torch.int32 or tuple(index.shape) != (B,) or not index.is_contiguous():
            raise ValueError(f"pool floor: index must be a contiguous int32 [B={B}] tensor")
        self.buf, self.B, self.index, self.prepare = buf, B, index, prepare

    @property
    def bytes_moved(self) -> int:
        return 2 * self.B * self.n4 * 16

    def args(self, alpha, beta) -> tuple:
        """The pool floor kernel's arguments."""
        return (np.uint64(self.buf.data_ptr()), np.uint64(self.index.data_ptr()),  # pointers
                np.int64(self.page4), np.int64(self.n4), np.float32(alpha), np.float32(beta))


def _indexed_launcher(target, cfg, alpha=1.0, beta=0.0):
    """launch(i): launch shape ``cfg`` (vpt, block, blocks per slot) of the pool floor (a
    :class:`PoolTarget`) or a verify floor (a :class:`VerifyTarget`) over what ``target``'s
    index tensors hold (the session's index ``i`` is unused)."""
    vpt, blk, grid = cfg
    f, args = _kernel(*target.kind, vpt, blk), target.args(alpha, beta)

    def launch(i):
        with _stream():
            f((grid, target.B), (blk,), args)
    return launch


def chained_launcher(target: PoolTarget, shape, level: int, mixed, alpha: float = 1.0,
                     beta: float = 0.0, gamma: float = 0.0):
    """launch(i=None): the chained floor, the pool floor of launch shape ``shape`` (vpt, block,
    blocks per slot) over ``target``'s slots that also reads one value of the producer's output,
    ``mixed[n, 0]`` of a bf16 [B, D] ``mixed`` (unit last stride), and stores every value as
    x * alpha + beta + gamma * mixed[n, 0] (the defaults store what was read: the bytes moved
    are the pool floor's).  Launched on the current torch stream at PDL ``level`` (0: a plain
    launch; 1: programmatic dependent launch, griddepcontrol.wait before any load; 2: the same
    with the slot index and the first state loads before the wait).  The index tensor is
    ``target.index`` itself (its contents may change between launches, not its address).  The
    kernel is compiled and loaded here, before any capture."""
    import ctypes

    from gdnzoo.backends import _cuda_build
    if level not in PDL_LEVELS:
        raise ValueError(f"chained floor: level must be one of {PDL_LEVELS}, got {level!r}")
    B = target.B
    if (not isinstance(mixed, torch.Tensor) or mixed.dtype != torch.bfloat16 or mixed.dim() != 2
            or mixed.shape[0] != B or mixed.stride(1) != 1 or mixed.device != target.buf.device):
        raise ValueError(f"chained floor: mixed must be a bf16 [B={B}, D] tensor with a unit "
                         f"last stride on the pool's device")
    vpt, blk, per_slot = shape
    func = _kernel("pool_chained", level, vpt, blk)
    if int(func.max_threads_per_block) < blk:      # also loads a lazily loaded function
        raise ValueError(f"chained floor: x{vpt}/{blk} cannot start {blk} threads per block")
    grid = per_slot * B
    if grid >= 2**31:
        raise ValueError(f"chained floor: {per_slot} blocks per slot x B={B} exceed the grid")
    values = (ctypes.c_uint64(target.buf.data_ptr()), ctypes.c_uint64(target.index.data_ptr()),
              ctypes.c_uint64(mixed.data_ptr()), ctypes.c_int64(mixed.stride(0)),
              ctypes.c_int64(target.page4), ctypes.c_int64(target.n4), ctypes.c_uint32(per_slot),
              ctypes.c_float(alpha), ctypes.c_float(beta), ctypes.c_float(gamma))
    argv = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    addr, dev = ctypes.addressof(argv), target.buf.device.index
    fn = getattr(func, "kernel", func).ptr        # CuPy 14: a RawKernel; older: a Function
    if level == 0:
        def launch(i=None):
            _cuda_build.launch_raw(fn, grid, blk, dev, addr)
    else:
        from gdnzoo.backends._pdl_launch import PdlConfig
        cfg = PdlConfig(grid, blk)

        def launch(i=None):
            _cuda_build.launch_raw_pdl(cfg, fn, dev, addr)
    launch.args = (values, argv)              # what argv points to lives as long as launch
    return launch


def verify_stores(form: str, T: int) -> int:
    """[HV, V, K] blocks a verify of T tokens in ``form`` (or a commit) stores per sequence."""
    return {"states": T, "states+update": T + 1, "slots": T, "commit": 1}[form]


def _int32(name, x, shape):
    if (not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or tuple(x.shape) != shape
            or x.stride(-1) != 1):
        raise ValueError(f"verify floor: {name} must be an int32 {list(shape)} tensor with a "
                         f"unit last stride")


class VerifyTarget:
    """What the verify floor streams for one ``form`` of :data:`VERIFY_FORMS`: the pool (``buf``,
    its whole storage, flat; slot s's block is ``slot_elems`` elements at ``s * page_elems``)
    and, for the intermediate-state forms and commit, ``inter`` [S, T_max, HV, V, K] (each
    [HV, V, K] block contiguous), through the measured calls' own index tensors, which
    ``prepare(i)`` refreshes before call i, outside the timed window:

    * ``states``: ``index`` [B] read slots, ``rows`` [B] intermediate rows: each slot read once,
      stored at steps 0..T-1 of its row; ``states+update`` also stores it back to the slot;
    * ``slots``: ``index`` [B, T] per-token slots, ``counts`` [B] (num_accepted_tokens): slot
      ``index[n, counts[n] - 1]`` read, stored to every ``index[n, t]``;
    * ``commit``: step ``counts[n]`` of row ``rows[n]`` read, stored to slot ``index[n]``.

    Only state bytes are moved, as in the other floors (q, k, v, the gates and out are about 2%
    of a verify's bytes or less at the contest geometry); :attr:`bytes_moved` counts them."""

    def __init__(self, form, buf, page_elems: int, slot_elems: int, B: int, T: int, index,
                 prepare, inter=None, rows=None, counts=None):
        if form not in VERIFY_FORMS:
            raise ValueError(f"verify floor: form must be one of {', '.join(VERIFY_FORMS)}, "
                             f"got {form!r}")
        self.page4, self.n4 = _check_storage("verify floor", buf, page_elems, slot_elems, B)
        e = buf.element_size()
        if not 1 <= T <= MAX_TOKENS:
            raise ValueError(f"verify floor: T must be in 1..{MAX_TOKENS}, got {T}")
        _int32("index", index, (B, T) if form == "slots" else (B,))
        if form in ("slots", "commit"):
            _int32("counts", counts, (B,))
        self.row4 = self.step4 = 0
        if form != "slots":
            _int32("rows", rows, (B,))
            if (not isinstance(inter, torch.Tensor) or inter.dim() != 5
                    or inter.element_size() != e or inter.stride(2) * inter.shape[2] != slot_elems
                    or (inter.stride(0) * e) % 16 or (inter.stride(1) * e) % 16
                    or inter.data_ptr() % 16 or inter.shape[1] < (1 if form == "commit" else T)):
                raise ValueError(f"verify floor: inter must be [S, T_max >= T, HV, V, K] of "
                                 f"{e}-byte elements, each [HV, V, K] block of {slot_elems} "
                                 f"elements, rows and steps on 16-byte boundaries")
            self.row4, self.step4 = inter.stride(0) * e // 16, inter.stride(1) * e // 16
        self.form, self.buf, self.B, self.T, self.prepare = form, buf, B, T, prepare
        self.index, self.inter, self.rows, self.counts = index, inter, rows, counts
        self.ld = index.stride(0) if form == "slots" else 1
        self.what, self.kind = f"verify floor ({form})", ("verify", VERIFY_FORMS.index(form))

    @property
    def stores(self) -> int:
        """[HV, V, K] blocks stored per sequence."""
        return verify_stores(self.form, self.T)

    @property
    def bytes_moved(self) -> int:
        """State bytes read (one block per sequence) and written (:attr:`stores` per sequence)."""
        return (1 + self.stores) * self.B * self.n4 * 16

    def args(self, alpha, beta) -> tuple:
        """The verify floor kernel's arguments."""

        def ptr(x):
            return np.uint64(0 if x is None else x.data_ptr())
        return (ptr(self.buf), ptr(self.inter), ptr(self.index), ptr(self.rows), ptr(self.counts),
                np.int64(self.ld), np.int32(self.T), np.int64(self.page4), np.int64(self.row4),
                np.int64(self.step4), np.int64(self.n4), np.float32(alpha), np.float32(beta))


def best_indexed_launcher(target) -> dict:
    """The pool or verify floor's launch shape for ``target``, searched on the kernel clock over
    its slots (:func:`_search`), and its launcher: ``dict(launch, config, shape, dropped,
    searched)``, ``launch`` and ``shape`` None (``config`` saying why) without CuPy."""
    ok, why = cupy_available()
    if not ok:
        return dict(launch=None, config=f"not measured: {why}", shape=None, dropped=[], searched=0)
    best, note, dropped, searched = _search(
        target.what, target.n4, target, _indexed_launcher, seqs=target.B,
        check=lambda v, b: launchable(v, b, *target.kind), prepare=target.prepare)
    vpt, blk, grid = best
    return dict(launch=_indexed_launcher(target, best), shape=best, dropped=dropped,
                searched=searched, config=f"float4 x{vpt}/thread, {blk} threads, {grid} blocks "
                                          f"per slot x B={target.B}{note}")


def indexed_floor_times(target, iters: int = 100, reduce=clocks.span_us) -> dict:
    """The pool or verify floor of ``target`` through the measured calls' own index tensors
    (``target.prepare`` refreshes them before each call as theirs are), at its best launch shape
    (:func:`best_indexed_launcher`), timed after the search in a session of its own (``reduce``:
    see :func:`clocks.kernel_times`): dict(samples, config, shape, method, searched, dropped),
    ``samples`` and ``shape`` None (``config`` saying why) without CuPy."""
    f = best_indexed_launcher(target)
    launch = f.pop("launch")
    f["samples"], f["method"] = (None, "") if launch is None else clocks.kernel_times(
        launch, iters, reduce=reduce, prepare=target.prepare)
    return f


def copy_bandwidth(nbytes: int | None = None, iters: int = 20) -> dict:
    """Device-to-device copy: (bytes read + bytes written) / CUPTI time of one large torch copy."""
    nbytes = nbytes or max(16 * clocks.l2_bytes(), 512 << 20)
    src = torch.empty(nbytes // 4, device="cuda").uniform_()
    dst = torch.empty_like(src)
    samples, method = clocks.kernel_times(lambda i: dst.copy_(src), iters)
    s = clocks.summarize(samples)
    return dict(bytes=nbytes, us=s["median"], gbps=2 * nbytes / (s["median"] * 1e-6) / 1e9,
                method=method)


def empty_kernel_us(iters: int = 50) -> dict:
    ok, why = cupy_available()
    if not ok:
        return dict(us=float("nan"), note=f"not measured: {why}")
    k = _compiled(*_module_of("inplace"))[0].get_function("empty_kernel")

    def launch(i):
        with _stream():
            k((1,), (32,), ())
    samples, method = clocks.kernel_times(launch, iters)
    return dict(us=clocks.summarize(samples)["median"], method=method)

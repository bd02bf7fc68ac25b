"""The floor: what any kernel that must read and write the state bytes once costs on this GPU.

An in-place streaming kernel (CuPy/NVRTC) reads and writes exactly ``set_bytes`` as float4, with
``x * alpha + beta`` on runtime scalars so the compiler cannot drop the load/store pair.  Only bytes
matter, so one kernel serves fp32 and bf16 state.  Its launch shape (threads per block, float4s in
flight per thread, exact or persistent grid) is searched per size, timed with the same CUPTI clock
and the same cold-L2 rotation as the backends.  Also here: device-to-device copy bandwidth and an
empty-kernel time, measured in the same run.  Without CuPy, a torch ``mul_`` stands in (no search).
"""
from __future__ import annotations

import functools

import torch

from gdnzoo.bench import clocks

_SRC = r"""
// BLK is the block size the instantiation is launched with: __launch_bounds__ caps registers so
// that VPT float4s in flight still fit 1024 threads (without it x8/1024 is unlaunchable).
template <int VPT, int BLK>
__global__ void __launch_bounds__(BLK) stream_inplace(float4* __restrict__ x, long long n4,
                                                      float alpha, float beta) {
    // All VPT loads are issued before any store: loads in flight per thread hide DRAM latency.
    const long long step = (long long)blockDim.x;
    const long long stride = (long long)gridDim.x * blockDim.x * VPT;
    for (long long i = (long long)blockIdx.x * blockDim.x * VPT + threadIdx.x; i < n4; i += stride) {
        float4 v[VPT];
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            long long k = i + j * step;
            if (k < n4) v[j] = x[k];
        }
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            long long k = i + j * step;
            if (k < n4) {
                float4 t = v[j];
                t.x = t.x * alpha + beta; t.y = t.y * alpha + beta;
                t.z = t.z * alpha + beta; t.w = t.w * alpha + beta;
                x[k] = t;
            }
        }
    }
}
extern "C" __global__ void empty_kernel() {}
"""
VPTS = (1, 2, 4, 8)
BLOCKS = (128, 256, 512, 1024)
WAVES = (None, 1, 2, 4)          # None: one pass, grid covers the array; k: k blocks per SM-slot


def cupy_available() -> tuple[bool, str]:
    try:
        import cupy  # noqa: F401
    except Exception as e:
        return False, f"cupy not importable ({type(e).__name__})"
    return True, "cupy"


@functools.lru_cache(maxsize=None)
def _module():
    """(module, {(vpt, block): kernel}) for every instantiation."""
    import cupy
    keys = [(v, b) for v in VPTS for b in BLOCKS]
    names = [f"stream_inplace<{v}, {b}>" for v, b in keys]
    mod = cupy.RawModule(code=_SRC, options=("-std=c++17",), name_expressions=names)
    return mod, {k: mod.get_function(n) for k, n in zip(keys, names)}


def launchable(vpt: int, blk: int) -> tuple[bool, str]:
    """Whether the compiled (vpt, blk) kernel can start ``blk`` threads (registers, limits)."""
    try:
        f = _module()[1][(vpt, blk)]
        m = int(f.max_threads_per_block)
    except Exception as e:
        return False, f"x{vpt}/{blk}: {type(e).__name__}: {e}"
    if m < blk:
        return False, f"x{vpt}/{blk}: at most {m} threads per block ({f.num_regs} registers/thread)"
    return True, ""


def _stream():
    import cupy
    return cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)


def configs(n4: int, sms: int, ok=None):
    """(vpt, block, grid) launch shapes worth trying for n4 float4s; duplicates removed.

    ``ok(vpt, blk) -> bool`` drops the shapes the compiled kernel cannot launch.
    """
    seen, out = set(), []
    for vpt in VPTS:
        for blk in BLOCKS:
            if ok is not None and not ok(vpt, blk):
                continue
            exact = max(1, -(-n4 // (blk * vpt)))
            for w in WAVES:
                grid = exact if w is None else min(exact, sms * w * max(1, 2048 // blk))
                if (vpt, blk, grid) not in seen:
                    seen.add((vpt, blk, grid))
                    out.append((vpt, blk, grid))
    return out


def _launcher(rot, cfg, alpha=1.0, beta=0.0):
    """launch(i): launch shape ``cfg`` on the next buffer of ``rot`` (a clocks.Rotation of
    float buffers, shared by every session over them; the session's index ``i`` is unused)."""
    import numpy as np
    _, kern = _module()
    import cupy
    arrs = [cupy.asarray(b) for b in rot.states]
    n4 = np.int64(rot.set_bytes // 16)
    one, zero = np.float32(alpha), np.float32(beta)
    vpt, blk, grid = cfg

    def launch(i):
        with _stream():
            kern[(vpt, blk)]((grid,), (blk,), (arrs[rot.next_index()], n4, one, zero))
    return launch


def search_configs(n4: int, sms: int, probe=None):
    """Launch shapes the compiled kernel really launches, and a note per shape dropped.

    A shape must pass the kernel's attributes and one probe launch on ``probe`` (a rotation of
    buffers of n4 float4s; alpha=1, beta=0 leaves them unchanged), so a resource error never
    reaches a timed run.
    """
    notes = []

    def ok(vpt, blk):
        good, why = launchable(vpt, blk)
        if not good:
            notes.append(why)
        return good
    cfgs = configs(n4, sms, ok)
    if probe is None:
        return cfgs, notes
    kept = []
    for cfg in cfgs:
        try:
            _launcher(probe, cfg)(0)
            torch.cuda.synchronize()
            kept.append(cfg)
        except Exception as e:           # launch errors are not sticky: the context stays usable
            notes.append(f"x{cfg[0]}/{cfg[1]} grid {cfg[2]}: {type(e).__name__}: {str(e)[:120]}")
    return kept, notes


def best_launcher(set_bytes: int, search_reps: int = 8, l2: int | None = None) -> dict:
    """The floor's launch shape for ``set_bytes``, searched on the kernel clock, and a cold
    rotating launcher of it: ``dict(launch, config, n_sets, dropped, searched, rot)``, with
    ``launch`` None (and ``config`` saying why) when CuPy is missing (no search possible)."""
    if set_bytes % 16:
        raise ValueError(f"floor: set_bytes must be a multiple of 16, got {set_bytes}")
    rot = clocks.Rotation(torch.randn(set_bytes // 4, device="cuda"), l2=l2)
    ok, why = cupy_available()
    if not ok:
        return dict(launch=None, config=why, n_sets=rot.n, dropped=[], searched=0, rot=rot)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfgs, dropped = search_configs(set_bytes // 16, sms, probe=rot)
    if not cfgs:
        raise RuntimeError("floor: no launch shape could be launched: " + "; ".join(dropped[:4]))
    per, _ = clocks.interleaved_kernel_times([_launcher(rot, c) for c in cfgs], search_reps)
    med = [clocks.summarize(s)["median"] for s in per]
    best = cfgs[min(range(len(cfgs)), key=med.__getitem__)]
    vpt, blk, grid = best
    config = f"float4 x{vpt}/thread, {blk} threads, grid {grid}"
    if dropped:
        config += f" ({len(dropped)} shapes not launchable, skipped)"
    return dict(launch=_launcher(rot, best), config=config, n_sets=rot.n, dropped=dropped,
                searched=len(cfgs), rot=rot)


def floor_times(set_bytes: int, iters: int = 100, search_reps: int = 8, l2: int | None = None) -> dict:
    """Best in-place streaming time over ``set_bytes`` (us samples) and the winning launch shape,
    timed in a session of its own after the search (the search's best median is biased low:
    the minimum of many noisy medians)."""
    f = best_launcher(set_bytes, search_reps, l2)
    if f["launch"] is None:
        alpha = torch.ones((), device="cuda")
        rot = f["rot"]

        def launch(i):
            rot.next()[0].mul_(alpha)
        samples, method = clocks.kernel_times(launch, iters)
        return dict(samples=samples, config=f"torch mul_ (no shape search: {f['config']})",
                    n_sets=f["n_sets"], method=method)
    samples, method = clocks.kernel_times(f["launch"], iters)
    return dict(samples=samples, config=f["config"], n_sets=f["n_sets"], method=method,
                searched=f["searched"], dropped=f["dropped"])


def copy_bandwidth(nbytes: int | None = None, iters: int = 20) -> dict:
    """Device-to-device copy: (bytes read + bytes written) / CUPTI time of one large torch copy."""
    l2 = clocks.l2_bytes()
    nbytes = nbytes or max(16 * l2, 512 << 20)
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
    mod, _ = _module()
    k = mod.get_function("empty_kernel")

    def launch(i):
        with _stream():
            k((1,), (32,), ())
    samples, method = clocks.kernel_times(launch, iters)
    return dict(us=clocks.summarize(samples)["median"], method=method)

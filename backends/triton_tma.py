"""fla-tma: Triton with TMA tensor descriptors and a pipelined producer/consumer tile loop.

Same contract as fla-recurrent.  Each program makes a device-side tensor descriptor
(``tl.make_tensor_descriptor``) over its head's [V, K] state and loops over TILES tiles of
BV rows with ``tl.range(num_stages=STAGES, warp_specialize=WS)``.

What Triton 3.6 does with this on sm_90 (checked by compiling for sm_90 without a GPU; the
GPU script's compile report confirms on the device): with num_stages > 1 the pipeliner turns
the descriptor loads into asynchronous TMA copies (cp.async.bulk.tensor) into num_stages
shared-memory buffers guarded by mbarriers, so the TMA engine (producer) runs num_stages - 1
tiles ahead of the warps doing the math (consumer); stores go out by TMA too.  Hopper's
automatic warp specialization only partitions loops that feed a wgmma dot, and this loop has
none: ``warp_specialize=True`` creates no producer warps, and at 4+ warps it even dropped the
pipelining (load, wait, compute, store each tile).  The tables therefore default to
``ws=False``; the sweep measures both.  For T > 1 the nested token loop is not pipelined
(correct, just serial).  On sm_100 Triton runs its generic warp-specialization pass instead.

Device-side descriptors need global scratch (128 bytes per descriptor and program): Triton
asks ``triton.set_allocator``'s allocator for it at launch.  We install our own allocator for
the first (compiling) launch of a shape only, restoring the caller's, and then hand the same
buffer to every later launch, so steady-state calls allocate nothing and CUDA graphs that
captured its address stay valid.
"""
from __future__ import annotations

from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.registry import for_gpu

HEAD_DIMS = (64, 128, 256)
CPU_MAX_PROGRAM_TOKENS = 512      # the interpreter: ~5-20 ms per program and token
GRID_LIMIT = 2**31 - 1
SMEM_BUDGET = 160 * 1024

# GPU name substring -> state dtype -> rows (max B*HV inclusive or None, BV, TILES,
# num_warps, num_stages, warp_specialize).
LAUNCH_TABLE = {
    # Measured on an NVIDIA H100 80GB HBM3 (2026-11-22, torch 2.11, triton 3.6, contest
    # geometry HV=8, cold L2, CUDA-graph time): the fastest config per batch size from
    # `python3 bench/gpu_triton.py` (bench/results/h100-80gb-hbm3/gpu_triton_sweep.csv).
    "H100": {
        "fp32": [(64, 8, 1, 1, 1, False), (128, 8, 2, 1, 2, False), (256, 16, 2, 2, 2, False), (384, 16, 4, 2, 3, False), (None, 16, 2, 2, 2, False)],
        "bf16": [(64, 8, 1, 1, 1, False), (128, 8, 2, 1, 2, False), (256, 16, 2, 2, 2, False), (None, 16, 4, 2, 3, False)],
    },
    "default": {
        "fp32": [(64, 16, 2, 2, 2, False), (None, 32, 2, 4, 2, False)],
        "bf16": [(64, 16, 2, 2, 2, False), (None, 32, 2, 4, 2, False)],
    },
}


def fit_config(cfg, BHV: int, K: int, V: int, state_bytes: int):
    """Clamp (BV, TILES, num_warps, num_stages, ws) to V, registers, shared memory, grid."""
    BV, tiles, nw, ns, ws = cfg
    BV = min(BV, V)
    while BV * K > 64 * 32 * nw and nw < 8:
        nw *= 2
    while BV > 1 and (BV * K > 64 * 32 * nw or BV * K * state_bytes * (ns + 1) > SMEM_BUDGET):
        BV //= 2
    tiles = max(1, min(tiles, V // BV))
    while BHV * (V // (BV * tiles)) > GRID_LIMIT and BV * tiles < V:
        tiles *= 2
    return BV, tiles, nw, ns, ws


def lookup_config(gpu: str, state_dtype: str, BHV: int, K: int, V: int, table=None):
    table = LAUNCH_TABLE if table is None else table
    rows = for_gpu(table, gpu, table["default"]).get(state_dtype, table["default"][state_dtype])
    cfg = next(r[1:] for r in rows if r[0] is None or BHV <= r[0])
    return fit_config(cfg, BHV, K, V, 4 if state_dtype == "fp32" else 2)


def available():
    return tlaunch.available((9, 0))


def supports(problem):
    ok, why = tlaunch.common_supports(problem, HEAD_DIMS, CPU_MAX_PROGRAM_TOKENS, GRID_LIMIT)
    if ok and problem.device == "cuda" and problem.cc is not None and tuple(problem.cc) < (9, 0):
        return False, "TMA tensor descriptors need compute capability >= 9.0"
    return ok, why


def _check_tma_alignment(state, new_state):
    """TMA needs 16-byte aligned bases and row strides for every (sequence, head) slice."""
    for name, x in (("state", state), ("new_state", new_state)):
        es = x.element_size()
        bad = [s for s in x.stride()[:3] if (s * es) % 16]
        if x.data_ptr() % 16 or bad:
            raise ValueError(f"fla-tma: {name} must be 16-byte aligned with its B, HV and V "
                             f"strides multiples of 16 bytes (TMA), got address % 16 = "
                             f"{x.data_ptr() % 16} and strides {tuple(x.stride())} "
                             f"({es}-byte elements); use fla-recurrent for such views")


def launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           config=None, allocator=None):
    """Launch with an explicit (BV, TILES, num_warps, num_stages, ws), or the table's."""
    from gdnzoo.backends.triton_tma_kernel import gdn_tma_kernel
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.get_device()
    _check_tma_alignment(state, new_state)
    if config is None:
        if dev < 0:
            config = (V, 1, 1, 1, False)   # interpreter: fewest programs is fastest
        else:
            sd = "fp32" if state.element_size() == 4 else "bf16"
            config = lookup_config(tlaunch.gpu_name(dev), sd, B * HV, K, V)
    BV, tiles, nw, ns, ws = config
    if V % (BV * tiles):
        raise ValueError(f"fla-tma: BV*TILES={BV}*{tiles} must divide V={V}")
    grid0 = B * HV * (V // (BV * tiles))
    if grid0 > GRID_LIMIT:
        raise ValueError(f"fla-tma: grid {grid0} exceeds {GRID_LIMIT}")
    tail = (tlaunch.loop_count(T), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *a.stride(), *b.stride(), A_log.stride(0), dt_bias.stride(0), *out.stride()[:3],
            *state.stride()[:3], *new_state.stride()[:3],
            H, HV, K, V, BV, tiles, bool(use_qk_l2norm), new_state is state, ns, bool(ws))
    allocator = allocator or tlaunch.ScratchAllocator(dev)
    compiled = tlaunch.launch_with_allocator(allocator, lambda: gdn_tma_kernel[(grid0,)](
        q, k, v, a, b, A_log, dt_bias, out, state, new_state, float(scale), *tail,
        num_warps=nw, num_stages=ns))
    return compiled, grid0, tail, allocator


def _first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, key):
    compiled, grid0, tail, alloc = launch(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                          new_state, l2, allocator=_ALLOCS.get(key))
    _ALLOCS[key] = alloc
    ptrs, _ = tlaunch.Dispatcher.pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state)
    return tlaunch.fast_launch(compiled, grid0, ptrs, scale, tail, q.get_device(), alloc.buffer)


_ALLOCS = {}      # argument signature -> the scratch allocator its launches share
_DISPATCH = tlaunch.Dispatcher(_first_call)
run = _DISPATCH.run
bind = _DISPATCH.bind

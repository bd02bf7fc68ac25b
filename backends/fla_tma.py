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

A state pool's slot is found in the kernel, as in fla-recurrent; the descriptor is built over
the slot's head, and a padded sequence's tile coordinates are moved past the descriptor's rows
(TMA reads zeros there without touching memory and drops the stores).  Speculative verify is
not served here (registry.yaml says why; fla-recurrent serves it from the same kernel source):
the launcher passes the kernel's verify arguments as absent.
"""
from __future__ import annotations

from gdnzoo import tables
from gdnzoo.backends import _triton_launch as tlaunch

HEAD_DIMS = (64, 128, 256)
CPU_MAX_PROGRAM_TOKENS = 512      # the interpreter: ~5-20 ms per program and token
GRID_LIMIT = 2**31 - 1
SMEM_BUDGET = 160 * 1024

NAME = "fla-tma"                 # its public name: the key of its rows in backends/tables/
# The launch fields (a row of backends/tables/<gpu>.yaml names them; an explicit ``config=`` gives
# them in this order): BV rows per tile, TILES tiles per program, num_warps, num_stages (the TMA
# ring's depth), warp_specialize.
CONFIG = tables.ConfigFields(block_v=tables.REQUIRED, tiles=tables.REQUIRED,
                             warps=tables.REQUIRED, stages=tables.REQUIRED, warp_specialize=False)
# The shape search's first stage: configs of the sweep the H100 rows came from.
CANDIDATES = ((8, 1, 1, 1, False), (8, 2, 1, 2, False), (16, 2, 2, 2, False), (16, 4, 2, 3, False),
              (32, 2, 4, 2, False), (32, 4, 4, 3, False), (16, 8, 4, 4, False), (64, 2, 8, 2, False),
              (16, 2, 4, 2, True), (32, 4, 4, 3, True))


def fit_config(cfg, BHV: int, K: int, V: int, state_bytes: int):
    """Clamp (BV, TILES, num_warps, num_stages, ws) to V, registers, shared memory, grid."""
    BV, tiles, nw, ns, ws = CONFIG.normalize(cfg)
    BV = min(BV, V)
    while BV * K > 64 * 32 * nw and nw < 8:
        nw *= 2
    while BV > 1 and (BV * K > 64 * 32 * nw or BV * K * state_bytes * (ns + 1) > SMEM_BUDGET):
        BV //= 2
    tiles = max(1, min(tiles, V // BV))
    while BHV * (V // (BV * tiles)) > GRID_LIMIT and BV * tiles < V:
        tiles *= 2
    return BV, tiles, nw, ns, ws


def table_config(gpu, state_dtype: str, B, H, HV, K, V, inplace=True, T=1, pool=False):
    """This GPU's launch row for the call (backends/tables/), fitted to K and V."""
    row = tables.launch_config(NAME, CONFIG, gpu, state_dtype, inplace, T, B, H, HV, K, V, pool)
    return fit_config(row, B * HV, K, V, 4 if state_dtype == "fp32" else 2)


def launch_config(problem, gpu):
    """The tunable protocol's table lookup: :func:`table_config` for a Problem."""
    p = problem
    return table_config(gpu, p.state_name, p.B, p.H, p.HV, p.K, p.V, p.inplace, p.T, p.pool)


def candidates(problem):
    """The shape search's first stage (tunable protocol)."""
    return list(CANDIDATES)


def refine(ranked):
    """The shape search's second stage (tunable protocol): the first stage's three best."""
    return [CONFIG.normalize(c) for c in ranked[:3]]


def available(device):
    return tlaunch.available((9, 0), device)


def supports(problem):
    ok, why = tlaunch.common_supports(problem, HEAD_DIMS, CPU_MAX_PROGRAM_TOKENS, GRID_LIMIT)
    if ok and problem.device == "cuda" and problem.cc is not None and tuple(problem.cc) < (9, 0):
        return False, "TMA tensor descriptors need compute capability >= 9.0"
    return ok, why


def _check_tma_alignment(state, new_state):
    """TMA needs 16-byte aligned bases and row strides for every (sequence or slot, head)
    slice."""
    for name, x in (("state", state), ("new_state", new_state)):
        es = x.element_size()
        bad = [s for s in x.stride()[:3] if (s * es) % 16]
        if x.data_ptr() % 16 or bad:
            raise ValueError(f"fla-tma: {name} must be 16-byte aligned with its B, HV and V "
                             f"strides multiples of 16 bytes (TMA), got address % 16 = "
                             f"{x.data_ptr() % 16} and strides {tuple(x.stride())} "
                             f"({es}-byte elements); use fla-recurrent for such views")


def launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           pool=None, verify=None, config=None, allocator=None):
    """Launch with an explicit config (:data:`CONFIG`, a dict or a tuple (BV, TILES, num_warps,
    num_stages, ws)), or the table's.  ``pool``: a :class:`gdnzoo.pool.Pool`, ``state`` and
    ``new_state`` then pools [P, HV, V, K].  ``verify`` must be None (served by
    fla-recurrent)."""
    from gdnzoo.backends._triton_decode_kernel import gdn_decode_kernel
    if verify is not None:
        raise ValueError("fla-tma: speculative verify is not served here (its TMA tiling walks "
                         "V tiles outermost); use fla-recurrent")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.get_device()
    _check_tma_alignment(state, new_state)
    if config is None:
        if dev < 0:
            config = (V, 1, 1, 1, False)   # interpreter: fewest programs is fastest
        else:
            sd = "fp32" if state.element_size() == 4 else "bf16"
            config = table_config(tlaunch.gpu_name(dev), sd, B, H, HV, K, V, new_state is state,
                                  T, pool is not None)
    BV, tiles, nw, ns, ws = CONFIG.normalize(config)
    if V % (BV * tiles):
        raise ValueError(f"fla-tma: BV*TILES={BV}*{tiles} must divide V={V}")
    grid0 = B * HV * (V // (BV * tiles))
    if grid0 > GRID_LIMIT:
        raise ValueError(f"fla-tma: grid {grid0} exceeds {GRID_LIMIT}")
    # one descriptor reads and writes when every sequence writes the slice it read
    inplace = new_state is state and (pool is None or pool.same_indices)
    tail = (*tlaunch.runtime_args(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool),
            H, HV, K, V, BV, bool(use_qk_l2norm), 1, 1, 0,      # LPR, VEC, DENSE: unused with TMA
            True, tiles, inplace, ns, bool(ws), tlaunch.pool_mode(pool),
            *tlaunch.verify_mode(None))
    allocator = allocator or tlaunch.ScratchAllocator(dev)
    compiled = tlaunch.launch_with_allocator(allocator, lambda: gdn_decode_kernel[(grid0,)](
        q, k, v, a, b, A_log, dt_bias, out, state, new_state, *tlaunch.index_args(state, pool),
        *tlaunch.NO_VERIFY, float(scale), *tail, num_warps=nw, num_stages=ns))
    return compiled, grid0, tail, allocator


def _first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, pool, verify,
                key):
    compiled, grid0, tail, alloc = launch(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                          new_state, l2, pool, verify, allocator=_ALLOCS.get(key))
    _ALLOCS[key] = alloc
    ptrs, _ = tlaunch.Dispatcher.pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state,
                                          pool)
    return tlaunch.fast_launch(compiled, grid0, ptrs, scale, tail, q.get_device(), alloc.buffer,
                               tlaunch.NO_VERIFY)


_ALLOCS = {}      # argument signature -> the scratch allocator its launches share
_DISPATCH = tlaunch.Dispatcher(_first_call, launch)
run = _DISPATCH.run
bind = _DISPATCH.bind

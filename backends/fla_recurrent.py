"""fla-recurrent: our Triton kernel in the style of FLA's fused recurrent kernel.

One launch per call; one program per (sequence, v-head, V-tile of BV rows) holding its
[BV, K] state tile in registers across all T tokens, LPR lanes per row; raw gates (softplus /
exp / sigmoid) computed in the kernel; the k-last state read and written where it lies (no
transpose, no copy).  The launch shape (BV, num_warps, num_stages, LPR, and DENSE: compile-time
strides for contiguous inputs) comes from this GPU's launch rows (``backends/tables/<gpu>.yaml``,
measured by ``gdnzoo tune --shapes``); nothing is autotuned inside a call.

State pools (gdnzoo/pool.py) are served in the kernel: each program reads its sequence's slot
index and addresses the pool's slot (64-bit offsets) where it lies; padded sequences are
masked (zero out rows, no state read or written), so a pool call stays one launch and CUDA-graph
capturable with new indices per replay.

Speculative verify (gdnzoo/verify.py) is served in the same single pass over the tokens, each
token's tile stored once from registers: to its intermediate state (row n or
``intermediate_indices[n]``), or to its per-token slot ``state_indices[n, t]`` after reading
column ``num_accepted_tokens[n] - 1``; ``update_state=False`` compiles without the final store.
A verify call takes this GPU's ``verify`` launch rows of its state dtype, T and B where the
tables have them, else the row the same call without verify would take.

Programmatic dependent launch (``pdl``: 1 "wait", 2 "early"; compute capability >= 9.0) launches
with cuLaunchKernelEx and programmatic stream serialization, so the kernel may start while the
kernel before it (the producer of q, k, v, a, b) still runs; ``griddepcontrol.wait`` holds it
until that kernel has completed.  Level 1 waits before any global load or store; level 2 reads
the state (the slot and intermediate indices and accepted counts that find it too), A_log and
dt_bias before the wait, and q, k, v, a, b and every store after it.  Level 2 is correct only
when the state's last writer (and the indices' writer) completed before the producer started:
true when at least one kernel launched without PDL lies between the previous decode of this
state and this one.  Both let the next kernel launch right after the wait.  Level 0 compiles the
kernel as without PDL; a PDL call takes the launch row of the same call without it.
"""
from __future__ import annotations

from gdnzoo import tables
from gdnzoo.backends import _triton_launch as tlaunch

HEAD_DIMS = (64, 128, 256)
# On CPU the interpreter runs each program in numpy: ~5-20 ms per program and token.
CPU_MAX_PROGRAM_TOKENS = 512
GRID_LIMIT = 2**31 - 1

NAME = "fla-recurrent"           # its public name: the key of its rows in backends/tables/
# The launch fields (a row of backends/tables/<gpu>.yaml names them; an explicit ``config=`` gives
# them in this order): BV rows per program, num_warps, num_stages, lanes per row (None: all of a
# row's 16-byte vectors, at most 32 lanes: the thread map Triton picks by itself for a [BV, K]
# tile), DENSE (1: the shapes' compile-time strides when every tensor is contiguous, else the
# strides passed; 0: always the strides passed).  Small B*HV takes small tiles so that enough
# programs cover the SMs (B=1 at HV=8 on the H100: 8 heads x 32 tiles of 4 rows).
CONFIG = tables.ConfigFields(block_v=tables.REQUIRED, warps=tables.REQUIRED,
                             stages=tables.REQUIRED, lanes_per_row=None, dense=0)


def vec_elems(state_dtype: str) -> int:
    """State elements in one 16-byte vector (a thread's unit along K)."""
    return 4 if state_dtype == "fp32" else 8


def default_lpr(state_dtype: str, K: int) -> int:
    """Lanes per row when a table row names none: all of a row's vectors, at most 32 (the
    thread map Triton picks by itself for a [BV, K] tile)."""
    return min(32, K // vec_elems(state_dtype))


def fit_lpr(state_dtype: str, K: int, lpr: int) -> int:
    """``lpr`` lowered until its lanes' vectors divide K (the table is measured at K=128)."""
    while lpr > 1 and K % (lpr * vec_elems(state_dtype)):
        lpr //= 2
    return lpr


def fit_config(state_dtype: str, BHV: int, K: int, V: int, config) -> tuple:
    """(BV, num_warps, num_stages, LPR, DENSE) of a row or an explicit config, fitted to K, V:
    lanes per row dividing K, the fp32 tile at <= 64 registers a thread (more warps first, then
    a smaller tile), and the grid (B*HV*V/BV programs) on one axis."""
    BV, nw, ns, lpr, dense = CONFIG.normalize(config)
    lpr = fit_lpr(state_dtype, K, default_lpr(state_dtype, K) if lpr is None else lpr)
    BV = min(BV, V)
    while BV * K > 64 * 32 * nw and nw < 8:
        nw *= 2
    while BV * K > 64 * 32 * nw and BV > 1:
        BV //= 2
    while BHV * (V // BV) > GRID_LIMIT and BV < V:
        BV *= 2
    return BV, nw, ns, lpr, int(dense)


def table_config(gpu, state_dtype: str, B, H, HV, K, V, inplace=True, T=1, pool=False,
                 verify=False) -> tuple:
    """This GPU's launch row for the call (backends/tables/), fitted to K and V."""
    row = tables.launch_config(NAME, CONFIG, gpu, state_dtype, inplace, T, B, H, HV, K, V, pool,
                               verify)
    return fit_config(state_dtype, B * HV, K, V, row)


def pdl_config(state_dtype: str, BHV: int, K: int, V: int, config) -> tuple:
    """The launch shape of a PDL launch: ``config``, its tiles doubled while the grid's blocks
    are too small for PDL (:func:`gdnzoo.backends._pdl_launch.too_small`), with 16 state
    elements a thread as those measured."""
    from gdnzoo.backends._pdl_launch import too_small
    BV, nw, ns, lpr, dense = CONFIG.normalize(config)
    size = 4 if state_dtype == "fp32" else 2
    if not too_small(BHV * (V // BV), 2 * BV * K * size):
        return BV, nw, ns, lpr, dense
    while BV < V and too_small(BHV * (V // BV), 2 * BV * K * size):
        BV *= 2
    nw = max(nw, min(8, BV * K // (16 * 32)))
    return fit_config(state_dtype, BHV, K, V, (BV, nw, ns, None, dense))


def kfirst_config(state_dtype: str, BHV: int, K: int, V: int, config) -> tuple:
    """The launch of a K-first state ([K, V] a head, V contiguous; ``config`` the k-last row it
    replaces, whose DENSE it keeps): one warp whose tile reads, for each K row, BV consecutive V
    elements, 64 bytes of them (16 fp32, 32 bf16), 128 for an fp32 state at 2048 head-rows
    (B*HV) or more; at most 128 state elements a thread.  The kernel keeps such a tile in the
    layout its load gives it (V innermost) and shapes q and k into it.  On an H200 (16/32 and
    4/8 heads, destination passing, graph replays;
    lab/notebook/h200/kfirst_rows_2026-11-28_late.log) these were the fastest of 8, 16 and 32
    rows at every B measured (1 to 256), and the k-last rows' own tiles (4 or 8 rows, more
    warps) were slower by up to 44%."""
    *_, dense = CONFIG.normalize(config)
    size = 4 if state_dtype == "fp32" else 2
    BV = (128 if size == 4 and BHV >= 2048 else 64) // size
    BV = max(1, min(BV, V, 4096 // K))
    while BHV * (V // BV) > GRID_LIMIT and BV < V:
        BV *= 2
    return BV, 1, 1, default_lpr(state_dtype, K), dense


def launch_config(problem, gpu):
    """The tunable protocol's table lookup: :func:`table_config` for a Problem (and
    :func:`kfirst_config` for a K-first state)."""
    p = problem
    row = table_config(gpu, p.state_name, p.B, p.H, p.HV, p.K, p.V, p.inplace, p.T, p.pool,
                       bool(p.verify))
    return kfirst_config(p.state_name, p.B * p.HV, p.K, p.V, row) if p.k_first else row


def candidates(problem):
    """The shape search's first stage (tunable protocol): (BV, num_warps, 1, LPR, DENSE) with at
    most 64 state elements a thread and at least as many rows as the threads cover (32/LPR
    rows a warp), each with the strides passed and with constant strides."""
    sd, K, V = problem.state_name, problem.K, problem.V
    vec = vec_elems(sd)
    return [(bv, nw, 1, lpr, d) for lpr in (4, 8, 16, 32) if K % (lpr * vec) == 0
            for bv in (1, 2, 4, 8, 16, 32, 64, 128) for nw in (1, 2, 4, 8)
            if bv <= V and bv * K <= 64 * 32 * nw and bv >= (32 // lpr) * nw for d in (0, 1)]


def refine(ranked):
    """The shape search's second stage (tunable protocol): the first stage's three best."""
    return [CONFIG.normalize(c) for c in ranked[:3]]


def available(device):
    return tlaunch.available((8, 0), device)


def supports(problem):
    if problem.op == "prefill":
        from gdnzoo.backends import _fla_recurrent_prefill
        return _fla_recurrent_prefill.supports(problem)
    ok, why = tlaunch.common_supports(problem, HEAD_DIMS, CPU_MAX_PROGRAM_TOKENS, GRID_LIMIT)
    if ok and getattr(problem, "pdl", ""):
        return tlaunch.pdl_supports(problem)
    return ok, why


PDL_LEVELS = (0, 1, 2)     # the kernel's PDL: off, wait first, state early


def launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           pool=None, verify=None, config=None, pdl=0, form=(0, 0, 0)):
    """Launch with an explicit config (:data:`CONFIG`: a dict, or a tuple (BV, num_warps,
    num_stages[, LPR[, DENSE]])), or the table's when None.  DENSE 1 takes the strides from the
    shapes when every tensor is contiguous (else the strides passed are used all the same; a
    pool's slot stride is always passed).  ``pool``: a :class:`gdnzoo.pool.Pool`, ``state``
    and ``new_state`` then pools [P, HV, V, K].  ``verify``: a :class:`gdnzoo.verify.Verify`
    (its ``verify`` launch row, else the one of the same call without it).  ``pdl``: the level of
    programmatic dependent launch (:data:`PDL_LEVELS`; a CUDA GPU only)."""
    from gdnzoo.backends._triton_decode_kernel import gdn_decode_kernel
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.get_device()
    sd = "fp32" if state.element_size() == 4 else "bf16"
    if pdl not in PDL_LEVELS:
        raise ValueError(f"fla-recurrent: pdl must be one of {PDL_LEVELS}, got {pdl!r}")
    if pdl and tlaunch.interpreter_on():
        raise ValueError("fla-recurrent: pdl (programmatic dependent launch) needs a CUDA GPU; "
                         "the Triton interpreter has none")
    if config is None:
        if dev < 0:
            config = (V, 1, 1)                    # interpreter: fewest programs is fastest
        else:
            config = table_config(tlaunch.gpu_name(dev), sd, B, H, HV, K, V,
                                  new_state is state, T, pool is not None, verify is not None)
            if form[2]:
                config = kfirst_config(sd, B * HV, K, V, config)
            if pdl:
                config = pdl_config(sd, B * HV, K, V, config)
    BV, nw, ns, lpr, dense = CONFIG.normalize(config)
    lpr = default_lpr(sd, K) if lpr is None else lpr
    dense = bool(dense) and tlaunch.constant_strides(q, k, v, state, A_log, a, dt_bias, b, out,
                                                     new_state, pool)
    grid0 = B * HV * (V // BV)
    if V % BV or grid0 > GRID_LIMIT:
        raise ValueError(f"fla-recurrent: BV={BV} must divide V={V} and B*HV*V/BV <= {GRID_LIMIT}")
    if lpr not in (1, 2, 4, 8, 16, 32) or K % (lpr * vec_elems(sd)):
        raise ValueError(f"fla-recurrent: LPR={lpr} lanes x {vec_elems(sd)} elements must "
                         f"divide K={K}")
    # every argument after scale, the TMA tiling's constexprs at their defaults
    tail = (*tlaunch.runtime_args(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool,
                                  verify),
            H, HV, K, V, BV, bool(use_qk_l2norm), lpr, vec_elems(sd), T if dense else 0,
            0, 1, 0, 1, 0, tlaunch.pool_mode(pool, verify), *tlaunch.verify_mode(verify), pdl,
            *(form if any(form) else ()))   # GATES, NEG, KFIRST: absent at their defaults
    # launch_pdl: Triton's launcher (and raw_launch after it) launches with PDL
    options = {"launch_pdl": True} if pdl else {}
    compiled = gdn_decode_kernel[(grid0,)](q, k, v, a, b, A_log, dt_bias, out, state, new_state,
                                           *tlaunch.index_args(state, pool),
                                           *tlaunch.verify_args(state, verify), float(scale),
                                           *tail, num_warps=nw, num_stages=ns, **options)
    return compiled, grid0, tail


def _first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, pool, verify,
                key, pdl=0, form=(0, 0, 0)):
    compiled, grid0, tail = launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                                   l2, pool, verify, pdl=pdl, form=form)
    if verify is None:
        ptrs, _ = tlaunch.Dispatcher.pointers(q, k, v, state, A_log, a, dt_bias, b, out,
                                              new_state, pool)
        absent = tlaunch.NO_VERIFY
    else:
        ptrs, _ = tlaunch.Dispatcher.verify_pointers(q, k, v, state, A_log, a, dt_bias, b, out,
                                                     new_state, pool, verify)
        absent = ()
    return tlaunch.fast_launch(compiled, grid0, ptrs, scale, tail, q.get_device(),
                               absent=absent)


_DISPATCH = tlaunch.Dispatcher(_first_call, launch, pdl=True)


def run(call, *, config=None):
    """The entry point of both operations: a decode call record (the launcher of this call's
    signature), or a prefill one (backends/_fla_recurrent_prefill.py)."""
    if call.op == "prefill":
        from gdnzoo.backends import _fla_recurrent_prefill
        return _fla_recurrent_prefill.run(call, config=config)
    return _DISPATCH.run(call, config=config)


def bind(call, *, config=None):
    """A launcher specialised to the call's signature (decode), or the prefill entry."""
    if call.op == "prefill":
        from gdnzoo.backends import _fla_recurrent_prefill
        return lambda c: _fla_recurrent_prefill.run(c, config=config)
    return _DISPATCH.bind(call, config=config)

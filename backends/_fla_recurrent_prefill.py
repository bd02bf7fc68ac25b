"""fla-recurrent's prefill (its module, backends/fla_recurrent.py, hands prefill calls here):
the decode kernel's per-token recurrence over packed sequences.

One launch, one program per (sequence, value head, V-tile of BV state rows), the tile in
registers through every token of its sequence (``cu_seqlens`` read on the device: no host
sync, CUDA-graph capturable), outputs stored per token, the final state once
(``gdn_varlen_kernel`` in ``backends/_triton_decode_kernel.py``, with the decode kernel's
thread map and token math).  No chunking and no WY inverse: each token's update is exact in
fp32, so a short sequence costs its tokens' steps and nothing more; a long one is a chain of
as many steps as it has tokens (the chunked kernels take 64 tokens a step).

Served: fp32 and bf16 states, k-last or K-first (strides passed), none (zeros); pools with the
decode pool rules (padding: zero outputs, nothing read or written) and ``has_initial_state``;
raw or precomputed gates and ``allow_neg_eigval``; checkpoints every ``checkpoint_every``
tokens.  Not served: programmatic dependent launch (not compiled in).

The launch shape: BV and the lanes per row from the decode launch rows of this GPU at N
sequences (``backends/tables/``), else 16 rows of 4 warps; not yet measured for prefill.
"""
from __future__ import annotations

from gdnzoo import tables
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import fla_recurrent as fr

HEAD_DIMS = fr.HEAD_DIMS
# On CPU the interpreter runs each program token by token in numpy: ~20 ms a token and head.
CPU_MAX_PROGRAM_TOKENS = 1024
GRID_LIMIT = 2**31 - 1


def supports(problem):
    """The registry's question for a prefill problem."""
    p = problem
    if p.K not in HEAD_DIMS or p.V not in HEAD_DIMS:
        return False, f"K and V must each be one of {HEAD_DIMS}, got K={p.K} V={p.V}"
    if p.HV % p.H:
        return False, f"HV must be a multiple of H (GVA), got H={p.H} HV={p.HV}"
    if p.device == "cpu":
        if not tlaunch.interpreter_on():
            return False, "CPU tensors need the Triton interpreter (set TRITON_INTERPRET=1)"
        if p.T * p.HV > CPU_MAX_PROGRAM_TOKENS:
            return False, (f"on CPU the Triton interpreter is limited to T*HV <= "
                           f"{CPU_MAX_PROGRAM_TOKENS}, got {p.T * p.HV}")
    if p.N * p.HV * p.V > GRID_LIMIT:
        return False, f"N*HV*V must be <= {GRID_LIMIT} (one grid axis), got {p.N * p.HV * p.V}"
    if getattr(p, "pdl", ""):
        return False, "programmatic dependent launch is not compiled into its prefill kernel"
    return True, ""


def config_for(call) -> tuple:
    """(BV, num_warps, LPR) of a call: the decode launch row of this GPU at N sequences and
    T = 1 (fitted to K, V; a K-first state's through fla-recurrent's kfirst_config), else 16 rows
    of 4 warps; on CPU one program per head (fewest programs is fastest there)."""
    p = call.problem
    sd = "fp32" if call.new_state.element_size() == 4 else "bf16"
    if p.device == "cpu":
        return p.V, 1, fr.default_lpr(sd, p.K)
    dev = call.q.get_device()
    try:
        row = fr.table_config(tlaunch.gpu_name(dev), sd, max(p.N, 1), p.H, p.HV, p.K, p.V)
    except tables.TableError:                   # no row for this GPU and shape
        row = fr.fit_config(sd, max(p.N, 1) * p.HV, p.K, p.V, (16, 4, 1))
    if p.k_first:
        row = fr.kfirst_config(sd, max(p.N, 1) * p.HV, p.K, p.V, row)
    BV, nw, _, lpr, _ = fr.CONFIG.normalize(row)
    return BV, nw, fr.default_lpr(sd, p.K) if lpr is None else fr.fit_lpr(sd, p.K, lpr)


def run(call, *, config=None):
    """The backend's entry point: a prefill call record (:mod:`gdnzoo.prefill_contract`).
    ``config``: (BV, num_warps, LPR), default :func:`config_for`."""
    from gdnzoo.backends._triton_decode_kernel import gdn_varlen_kernel
    c, p = call, call.problem
    N = c.cu_seqlens.shape[0] - 1
    if N < 1:
        return
    BV, nw, lpr = config or config_for(c)
    sd = "fp32" if c.new_state.element_size() == 4 else "bf16"
    vec = fr.vec_elems(sd)
    if p.V % BV or p.K % (lpr * vec):
        raise ValueError(f"fla-recurrent: BV={BV} must divide V={p.V} and LPR={lpr} x {vec} "
                         f"elements must divide K={p.K}")
    pool = c.pool
    mode, idx, new_idx, init = tlaunch.prefill_slots(
        c.cu_seqlens, None if pool is None else pool.read,
        None if pool is None or pool.same_indices else pool.write, c.has_initial_state)
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(c.A_log, c.a, c.dt_bias, c.b, c.g,
                                                          c.beta)
    src = c.new_state if c.state is None else c.state
    ck = c.checkpoints if c.checkpoints is not None else c.new_state
    q, k, v, out = c.q, c.k, c.v, c.out
    gdn_varlen_kernel[(N * p.HV * (p.V // BV),)](
        q, k, v, ga, gb, A_log, dt_bias, out, src, c.new_state, idx, new_idx, c.cu_seqlens,
        q.shape[0], init, ck, float(c.scale),             # the record's scale: resolved
        c.checkpoint_every or 1,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        ga.stride(0), ga.stride(1), gb.stride(0), gb.stride(1), A_log.stride(0),
        dt_bias.stride(0), out.stride(0), out.stride(1),
        *tlaunch.state_strides(src, p.k_first), *tlaunch.state_strides(c.new_state, p.k_first),
        *tlaunch.state_strides(ck, p.k_first),
        src.shape[0], c.new_state.shape[0], c.null_slot,
        p.H, p.HV, p.K, p.V, BV, bool(c.use_qk_l2norm), lpr, vec, mode,
        int(c.state is not None), int(c.has_initial_state is not None),
        int(c.checkpoints is not None), gates, int(bool(c.allow_neg_eigval)),
        *((1,) if p.k_first else ()), num_warps=nw, num_stages=1)   # KFIRST: default 0

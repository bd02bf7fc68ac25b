"""The Triton kernels of triton-chunk's segmented form: each sequence's chunks cut into S
segments whose chains run side by side (context parallelism), then joined.

Why.  One long sequence runs its chunks one after another on N * HV * V / block_v programs
(64 at 4/8 heads with 16 state rows a program): half an H200's SMs, each step latency-bound.
Segments give S times the chains, each S times shorter, for some extra work.

The math.  A token's update is S <- S A_t + beta_t v_t k_t^T with A_t = alpha_t (I - beta_t
k_t k_t^T) [K, K] (k normalized), so over a segment

    S_end = S_start Phi + Z,          o_t = S_start w_t + o^Z_t

with Z (and the outputs o^Z) the segment's chain from a zero state, Phi = A_1 ... A_L, and w_t
= A_1 ... A_t q_t scale.  Phi and w are what the same chunk machinery computes on the identity
[K, K] as its state with v = 0 (the "identity chain": its tile rows index K, so K == V here).

Three launches after the prep kernel (whose workspace is per token, so a segment cut at a chunk
boundary reads it as is):

1. :func:`cp_chain_kernel`, one program per (task, sequence, value head, tile of BV rows):
   tasks 0..S-1 the real chains (segment 0 from the initial state, the others from zeros),
   tasks S..2S-2 the identity chains of segments 1..S-1; outputs into a buffer ([2, T, HV,
   V]: o, then w; fp32, or bf16 for "bf16" products and bf16 outputs, whose products round w
   to bf16 anyway), each chain's final tile into ``fbuf`` ([2, N, S, HV, V, K]:
   Z, then Phi).  A sequence's chunks split as ceil(chunks / S) a segment (later segments may
   be empty: Z = 0, Phi = I).
2. :func:`cp_combine_kernel`, one program per (sequence, value head, tile): the segments'
   start states in order (``starts`` [N, S, HV, V, K]; S - 1 products of [BV, K] by [K, K])
   and the final state, written to the sequence's write slot, from Z and Phi (``zbuf``,
   ``phibuf``: fbuf's halves, or cuda-chunk-bf16's chain kernel's buffers, Phi in bf16).
3. :func:`cp_out_kernel`, one program per (chunk slot, value head): out = o, plus w S_start^T
   in segments past the first, in q's dtype (``IN_PLACE``: o is already in ``out``, as
   cuda-chunk-bf16's chain kernel writes it; segment 0's programs then have nothing to do).

Pools, padding and ``has_initial_state`` follow the unsegmented kernel (a padded sequence's
outputs and w are zeros, nothing written); no checkpoints, no PDL (the launcher runs the
unsegmented kernel then).
"""
import triton
import triton.language as tl

from gdnzoo.backends._triton_chunk_kernel import chain, chunk_of_slot, mm
from gdnzoo.backends._triton_decode_kernel import (INTERPRETED, as_mask, bind_interpreted,
                                                    pool_slots, sequence_bounds,
                                                    sequence_program)


@triton.jit
def segment_chunks(bos, eos, C: tl.constexpr, S: tl.constexpr):
    """(chunks, chunks a segment) of the sequence [bos, eos): segment s holds its chunks
    s * per <= j < (s + 1) * per (later segments may be empty)."""
    n_chunks = tl.cdiv(eos - bos, C)
    return n_chunks, tl.cdiv(n_chunks, S)


@triton.jit
def cp_chain_kernel(
        q, k, v, zv, cu_seqlens, mats, vecs, obuf, state, fbuf, slot_idx, new_slot_idx,
        has_init, N, T_all, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, ss_n, ss_h, ss_v, ss_k, P, PN,
        null_slot,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
        BV: tl.constexpr, PREC: tl.constexpr, S: tl.constexpr, POOL: tl.constexpr,
        STATE0: tl.constexpr, HAS_INIT: tl.constexpr, STAGES: tl.constexpr,
        V_AHEAD: tl.constexpr):
    # Task-major: the V-tiles of one head neighbour each other (they read the same rows).
    NV: tl.constexpr = V // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    rest = pid // NV
    i_hv = rest % HV
    rest = rest // HV
    i_n = rest % N
    task = rest // N
    real = task < S
    seg = tl.where(real, task, task - S + 1)
    i_h = i_hv // (HV // H)
    bos, eos = sequence_bounds(cu_seqlens, i_n, T_all)
    n_chunks, per = segment_chunks(bos, eos, C, S)
    j0 = tl.minimum(seg * per, n_chunks)
    j1 = tl.minimum(j0 + per, n_chunks)
    if POOL == 0:
        slot_r = i_n
        rd = as_mask(i_n >= 0)
    else:
        slot_r, _, rd, _ = pool_slots(slot_idx, new_slot_idx, i_n, P, PN, null_slot, POOL)
    rows_v = i_v * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    if real:
        init = rd & as_mask(seg == 0)
        if HAS_INIT:
            init = init & (tl.load(has_init + i_n) != 0)
        if STATE0:
            h = tl.load(state + slot_r * ss_n + i_hv * ss_h + rows_v[:, None] * ss_v
                        + cols[None, :] * ss_k, mask=init, other=0.0).to(tl.float32)
        else:
            h = tl.zeros([BV, K], tl.float32)
        vb = v
        svt = sv_t
        svh = sv_h
    else:
        h = (rows_v[:, None] == cols[None, :]).to(tl.float32)     # the identity's rows
        vb = zv                                                   # v = 0: one zero row
        svt = sv_t * 0
        svh = sv_h * 0
    role = tl.where(real, 0, 1).to(tl.int64)
    ob = obuf + role * T_all * HV * V
    h = chain(h, j0, j1, bos, eos, 0, 0, q, k, vb, mats, vecs, ob, ob, T_all, i_h, i_hv, rows_v,
              cols, rd, sq_t, sq_h, sk_t, sk_h, svt, svh, HV * V, V, 0, 0, 0, 0, HV, K, C, PREC,
              0, STAGES, V_AHEAD)
    fb = fbuf + (((role * N + i_n) * S + seg) * HV + i_hv) * (V * K)
    tl.store(fb + rows_v[:, None] * K + cols[None, :], h)


@triton.jit
def cp_combine_kernel(
        cu_seqlens, zbuf, phibuf, starts, new_state, slot_idx, new_slot_idx, N, T_all, P, PN,
        null_slot,
        sn_n, sn_h, sn_v, sn_k,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BV: tl.constexpr, PREC: tl.constexpr, S: tl.constexpr, POOL: tl.constexpr):
    i_v, i_n, i_hv, i_h, bos, eos, slot_r, slot_w, rd, wr = sequence_program(
        cu_seqlens, T_all, slot_idx, new_slot_idx, P, PN, null_slot, H, HV, V, BV, POOL)
    rows_v = i_v * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    tile = rows_v[:, None] * K + cols[None, :]
    square = cols[:, None] * K + cols[None, :]
    h = tl.load(zbuf + (i_n * S * HV + i_hv) * (V * K) + tile)       # Z of segment 0
    for s in tl.static_range(1, S):
        at = ((i_n * S + s) * HV + i_hv) * (V * K)
        tl.store(starts + at + tile, h.to(starts.dtype.element_ty))
        phi = tl.load(phibuf + at + square)
        h = mm(h, phi, PREC) + tl.load(zbuf + at + tile)
    tl.store(new_state + slot_w * sn_n + i_hv * sn_h + rows_v[:, None] * sn_v
             + cols[None, :] * sn_k, h.to(new_state.dtype.element_ty), mask=wr)


@triton.jit
def cp_out_kernel(
        cu_seqlens, obuf, wbuf, starts, out, N, T_all, so_t, so_h,
        HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
        PREC: tl.constexpr, S: tl.constexpr, IN_PLACE: tl.constexpr):
    pid = tl.program_id(0)
    i_hv = pid % HV
    slot = pid // HV
    eos, t0, i_n, bos = chunk_of_slot(cu_seqlens, slot, N, T_all, C)
    if t0 >= eos:
        return
    t = t0 + tl.arange(0, C)
    m = t < eos
    cols = tl.arange(0, V)
    row = t[:, None] * (HV * V) + i_hv * V
    dst = out + t[:, None] * so_t + i_hv * so_h + cols[None, :]
    _, per = segment_chunks(bos, eos, C, S)
    seg = ((t0 - bos) // C) // per
    if IN_PLACE:
        if seg == 0:            # the chains wrote segment 0's outputs, final already
            return
        o = tl.load(dst, mask=m[:, None], other=0.0).to(tl.float32)
    else:
        o = tl.load(obuf + row + cols[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    if seg > 0:
        kk = tl.arange(0, K)
        w = tl.load(wbuf + row + kk[None, :], mask=m[:, None], other=0.0)
        at = ((i_n * S + seg) * HV + i_hv) * (V * K)
        start = tl.load(starts + at + cols[:, None] * K + kk[None, :])        # [V, K]
        o = o + mm(w, tl.trans(start), PREC)
    tl.store(dst, o.to(out.dtype.element_ty), mask=m[:, None])


if INTERPRETED:
    bind_interpreted(globals())

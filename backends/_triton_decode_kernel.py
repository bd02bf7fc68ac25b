"""The Triton decode kernel of fla-recurrent and fla-tma: one launch convention (the arguments,
pointers first, then the scale, T and every stride), two ways to hold the state (``TMA``).

* ``TMA`` 0 (fla-recurrent): one program per (sequence, v-head, V-tile of BV rows), the tile in
  registers as a 4-D tensor [LPR, BV, KO, VEC] over K = KO * LPR * VEC: each thread holds
  16-byte vectors (VEC elements) of its row, LPR lanes share a row and the rest of the warp takes
  further rows.  Triton orders a blocked layout's threads by the pointer's contiguity (VEC) and
  then by dimension index, so putting the lanes-of-a-row dimension first gives exactly this
  thread map; a [BV, K] tile would put all 32 lanes along K.  A row's dot products then add
  VEC * KO products in a thread and finish with log2(LPR) shuffle rounds instead of five.
* ``TMA`` 1 (fla-tma): one program per (sequence, v-head, chunk of TILES tiles of BV rows).  The
  program builds a device-side 2-D descriptor [V, K] over its head's state and walks its tiles
  in a ``tl.range`` loop: with ``STAGES`` > 1 Triton's pipeliner turns the descriptor loads into
  asynchronous TMA copies into a ring of shared-memory buffers guarded by mbarriers (the
  producer runs ahead of the math); ``WS`` asks Triton to split producer and consumer into
  separate warps where its compiler can (see backends/fla_tma.py for what Triton 3.6 does on
  sm_90).  V rows are independent, so the tile loop can be outermost and the T tokens loop
  inside it, each tile's state kept in registers across the tokens.

``POOL`` reads the state from a pool (gdnzoo/pool.py) instead of a dense batch: 0 dense, 1 the
slot ``slot_idx[n]`` is read and written, 2 read at ``slot_idx[n]``, written at
``new_slot_idx[n]``.  The slot is read from memory by every program of the sequence, and a
padded sequence is served by masks: its out rows are zero, its state loads and stores are
masked off (fla-tma: its tiles' coordinates are moved past the descriptor's rows, where TMA
reads zeros and drops stores), and an index outside the pool is never used for an address.
With POOL 0 the index pointers and P, PN, null_slot are unused (the launchers pass the state
pointer and 0, 0, -1).

Speculative verify (gdnzoo/verify.py), ``TMA`` 0 only, in the same single pass over the tokens
with the tile in registers: ``INTER`` 1 or 2 stores the tile after token t (in the state's
dtype) to ``inter[row, t]``, row n or ``inter_idx[n]`` (no store for a row outside [0, S) or a
padded sequence); ``UPDATE`` 0 skips the final store; ``POOL`` 3 is per-token slots:
``slot_idx`` is [B, T], the tile is read from column ``accepted[n] - 1`` (``ACC`` 0: column 0;
a count outside 1..T pads the sequence), and token t's tile is stored to slot
``slot_idx[n, t]`` of ``new_state`` (none for a padding slot), with no final store.  Calls that
are not verify calls pass None for the three verify pointers and for S and the intermediate
strides: Triton makes them absent constants, so those instantiations keep the parameter list
(and the code) they had before verify existed.

``GATES`` 1 (``TMA`` 0 only): the ``a`` and ``b`` pointers are the precomputed log decay g and
beta (FLA's form; ``A_log`` and ``dt_bias`` are never read); ``NEG`` 1: beta = 2 sigmoid(b)
(allow_neg_eigval); ``KFIRST`` 1: every state block (the state's, ``new_state``'s, the
intermediate states') is K-first, [K, V] per head with V contiguous.  At 0 each compiles to the
code of before.

``PDL`` (``TMA`` 0 only) is for a launch with programmatic dependent launch
(backends/_pdl_launch.py): the kernel may then start while the kernel before it in the stream
still runs, and ``griddepcontrol.wait`` (``gdc_wait``) returns once that kernel has completed
and its writes are visible.  0: no grid dependency instructions (the code of every other
instantiation is as it was without PDL).  1, wait first: the wait comes before any global load
or store.  2, state early: what the kernel before us does not write is loaded before the wait
(the slot and intermediate-row indices, the accepted counts, the state tile, A_log, dt_bias),
and q, k, v, a, b and every store after it.  Both then let the next kernel launch
(``gdc_launch_dependents``) right after the wait: a kernel launched so must itself wait
before it reads what this one writes.

The constexprs of one tiling are unused by the other (the launchers pass defaults).  Imported
only when a Triton backend runs (it imports triton at module level).
"""
import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# sequences counted per load over cu_seqlens (triton-chunk's chunk_of_slot, checkpoint_row0)
SEQ_BLOCK = tl.constexpr(256)
# Read when this module is imported, as triton.jit itself reads it when it decorates.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


def bind_interpreted(namespace: dict) -> None:
    """Under Triton's interpreter, which re-patches triton.language on every device-function
    call (~3 ms each: most of a CPU run's time), bind a kernel module's device functions to
    the plain functions the interpreter rewrites them to: inside a kernel the module is
    patched already.  The kernels (names ending in ``_kernel``) stay as they are."""
    from triton.runtime.interpreter import InterpretedFunction
    for name, fn in list(namespace.items()):
        if isinstance(fn, InterpretedFunction) and not name.endswith("_kernel"):
            namespace[name] = fn.rewrite()


@triton.jit
def softplus_decay(A_neg, a_raw, dt_bias):
    """g = exp(-exp(A_log) * softplus(a + dt_bias)), given A_neg = -exp(A_log); softplus with
    beta 1, threshold 20 as torch's."""
    x = a_raw + dt_bias
    # exp() is clamped so the branch that where() discards never makes inf; below -15,
    # log(1 + e^x) rounds to 0 in fp32 while e^x is the value to 1 ulp.
    ex = tl.exp(tl.minimum(x, 20.0))
    sp = tl.where(x > 20.0, x, tl.where(x < -15.0, ex, tl.log(1.0 + ex)))
    return tl.exp(A_neg * sp)


@triton.jit
def token_inputs(p_q, p_k, p_v, p_a, p_b, A_neg, dt_bias, GATES: tl.constexpr = 0,
                 NEG: tl.constexpr = 0):
    """One token's q, k, v (fp32, the pointers' shapes) and gates g, beta.  The loads stay in
    this order (q, k, v, then each gate right before its math): moving all five loads ahead of
    the gate math changed the bf16 SASS schedule and cost 7-12% at some launch shapes on the
    H100.  ``GATES`` 1: ``p_a`` and ``p_b`` point at the precomputed log decay and beta;
    ``NEG`` 1: beta = 2 sigmoid(b) (allow_neg_eigval)."""
    b_q = tl.load(p_q).to(tl.float32)
    b_k = tl.load(p_k).to(tl.float32)
    b_v = tl.load(p_v).to(tl.float32)
    if GATES:
        g = tl.exp(tl.load(p_a).to(tl.float32))
        beta = tl.load(p_b).to(tl.float32)
    else:
        g = softplus_decay(A_neg, tl.load(p_a).to(tl.float32), dt_bias)
        beta = tl.sigmoid(tl.load(p_b).to(tl.float32))
        if NEG:
            beta = 2.0 * beta
    return b_q, b_k, b_v, g, beta


@triton.jit
def token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dt_bias, scale, L2NORM: tl.constexpr):
    """One token on a [BV, K] fp32 state tile, its inputs read at the given pointers: returns
    (the new tile, the tile's [BV] outputs).

    Inputs from :func:`token_inputs`.  One pass over the tile: both row reductions read the old
    state, so they run side by side; then S' = g S + u k^T and o = scale (g S q + u (k.q))
    need no second reduction."""
    b_q, b_k, b_v, g, beta = token_inputs(p_q, p_k, p_v, p_a, p_b, A_neg, dt_bias)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
    sk = tl.sum(h * b_k[None, :], 1)
    sq = tl.sum(h * b_q[None, :], 1)
    kq = tl.sum(b_k * b_q)
    u = beta * (b_v - g * sk)
    return g * h + u[:, None] * b_k[None, :], scale * (g * sq + u * kq)


@triton.jit
def token_pointers(q, k, v, out, a, b, i_b, i_h, i_hv, sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, so_b,
                   so_h, sa_b, sa_h, sb_b, sb_h, qk_cols, vo_rows):
    """The first token's pointers of a program's sequence (batch index ``i_b``) and heads: q
    and k at ``qk_cols``, v and out at ``vo_rows``, the gates a and b."""
    return (q + i_b * sq_b + i_h * sq_h + qk_cols, k + i_b * sk_b + i_h * sk_h + qk_cols,
            v + i_b * sv_b + i_hv * sv_h + vo_rows, out + i_b * so_b + i_hv * so_h + vo_rows,
            a + i_b * sa_b + i_hv * sa_h, b + i_b * sb_b + i_hv * sb_h)


@triton.jit
def next_token(p_q, p_k, p_v, p_o, p_a, p_b, sq_t, sk_t, sv_t, so_t, sa_t, sb_t):
    """The per-token pointers moved to the next token."""
    return p_q + sq_t, p_k + sk_t, p_v + sv_t, p_o + so_t, p_a + sa_t, p_b + sb_t


@triton.jit
def as_mask(c):
    """A scalar condition as a load/store mask.  Triton's interpreter keeps a scalar comparison
    in its operands' integer type, which Triton 3.9's interpreter refuses as a mask once a load
    or store splats it to the pointer's shape; a select between true and false is a boolean
    there, and the compiler folds it to ``c`` (no instruction)."""
    return tl.where(c, True, False)


@triton.jit
def pool_slots(slot_idx, new_slot_idx, i_n, P, PN, null_slot, POOL: tl.constexpr):
    """Sequence i_n's (read slot, write slot, reads a real slot, and writes one), the slots as
    int64 (slot x stride(0) may pass 2^31 elements) and 0 where padding.  Padding: a negative
    index, ``null_slot``, or an index past the pool (P read slots, PN write slots); a padded
    read slot pads the write too."""
    r = tl.load(slot_idx + i_n).to(tl.int64)
    w = r
    if POOL == 2:
        w = tl.load(new_slot_idx + i_n).to(tl.int64)
    rd = as_mask((r >= 0) & (r < P) & (r != null_slot))
    wr = rd & (w >= 0) & (w < PN) & (w != null_slot)
    return tl.where(rd, r, 0), tl.where(wr, w, 0), rd, wr


@triton.jit
def head_gate_constants(A_log, dt_bias, i_hv, s_alog, s_dtb, GATES: tl.constexpr):
    """-exp(A_log[h]) and dt_bias[h] (unused with precomputed gates)."""
    A_neg = 0.0
    dtb = 0.0
    if GATES == 0:
        A_neg = -tl.exp(tl.load(A_log + i_hv * s_alog).to(tl.float32))
        dtb = tl.load(dt_bias + i_hv * s_dtb).to(tl.float32)
    return A_neg, dtb


@triton.jit
def held(bos, eos, T):
    """Token bounds [bos, eos) held inside [0, T] (eos >= bos): ``cu_seqlens`` values that
    break the contract (checked only on request: a host sync) give wrong results, but never a
    row outside the tensors read or written."""
    bos = tl.minimum(tl.maximum(bos, 0), T)
    return bos, tl.minimum(tl.maximum(eos, bos), T)


@triton.jit
def sequence_bounds(cu_seqlens, n, T):
    """Sequence n's tokens [bos, eos) as int64, :func:`held` inside [0, T]."""
    return held(tl.load(cu_seqlens + n).to(tl.int64), tl.load(cu_seqlens + n + 1).to(tl.int64),
                T)


@triton.jit
def sequence_program(cu_seqlens, T, slot_idx, new_slot_idx, P, PN, null_slot,
                     H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                     POOL: tl.constexpr):
    """What a program of a packed-sequence kernel (one per sequence, value head and V-tile of
    BV rows; neighbouring programs take the V-tiles of one head) works on: (V-tile, sequence,
    value head, q/k head, first token, end token, read slot, write slot, reads a real state,
    writes one), the tokens and slots int64; ``POOL`` as :func:`pool_slots` (0: the sequence's
    own row)."""
    NV: tl.constexpr = V // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)                 # GVA: repeat_interleave mapping
    bos, eos = sequence_bounds(cu_seqlens, i_n, T)
    if POOL == 0:
        slot_r = i_n
        slot_w = i_n
        rd = as_mask(i_n >= 0)
        wr = rd
    else:
        slot_r, slot_w, rd, wr = pool_slots(slot_idx, new_slot_idx, i_n, P, PN, null_slot, POOL)
    return i_v, i_n, i_hv, i_h, bos, eos, slot_r, slot_w, rd, wr


@triton.jit
def accepted_slot(slot_idx, accepted, i_n, T, P, null_slot, ACC: tl.constexpr):
    """Per-token slots (``slot_idx`` [B, T]): sequence i_n's read slot, column
    ``accepted[i_n] - 1`` of its row (``ACC`` 0: column 0), as int64 and 0 where padding, and
    whether it is real.  A count outside 1..T pads the sequence, as a padding slot does."""
    row = slot_idx + i_n * T
    if ACC:
        c = tl.load(accepted + i_n).to(tl.int64)
        ok = (c >= 1) & (c <= T)
        r = tl.load(row + tl.where(ok, c - 1, 0)).to(tl.int64)
        rd = ok & (r >= 0) & (r < P) & (r != null_slot)
    else:
        r = tl.load(row).to(tl.int64)
        rd = (r >= 0) & (r < P) & (r != null_slot)
    return tl.where(rd, r, 0), as_mask(rd)


@triton.jit
def row_sum(x):
    """[LPR, BV, KO, VEC] -> [BV]: the in-thread axes first, then the lanes of each row."""
    return tl.sum(tl.sum(tl.sum(x, 3), 2), 0)


@triton.jit
def lanes_shape(x, h):
    """A [K] vector as the K axes of the [LPR, BV, KO, VEC] tile ``h``: [LPR, 1, KO, VEC]."""
    return tl.broadcast_to(tl.expand_dims(tl.permute(
        tl.reshape(x, [h.shape[2], h.shape[0], h.shape[3]]), (1, 0, 2)), 1), h.shape)


@triton.jit
def lanes_token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dtb, scale, L2NORM: tl.constexpr,
                     GATES: tl.constexpr, NEG: tl.constexpr, QK1D: tl.constexpr = 0):
    """:func:`token_step` on the [LPR, BV, KO, VEC] tile of the lanes-per-row thread map (q and
    k read with the tile's shape): returns (the new tile, its [BV] outputs).  One pass: both
    reductions read the old state, then S' = g S + u k^T and o = scale (g S q + u (k.q)) need
    no second reduction.  ``QK1D`` 1: q and k are read as [K] vectors, normalized and dotted as
    such, then shaped into the tile's K axes (:func:`lanes_shape`), so that the tile keeps the
    layout its own load gave it (a K-first state's: V innermost); read with the tile's shape,
    they pulled the tile into theirs, and every token paid the state's transposition twice."""
    b_q, b_k, b_v, g, beta = token_inputs(p_q, p_k, p_v, p_a, p_b, A_neg, dtb, GATES, NEG)
    if QK1D:
        if L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 0) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)
        kq = tl.sum(b_k * b_q, 0)
        b_q = lanes_shape(b_q, h)
        b_k = lanes_shape(b_k, h)
    elif L2NORM:
        b_q = b_q * tl.rsqrt(row_sum(b_q * b_q) + 1e-6)[None, :, None, None]
        b_k = b_k * tl.rsqrt(row_sum(b_k * b_k) + 1e-6)[None, :, None, None]
    sk = row_sum(h * b_k)
    sq = row_sum(h * b_q)
    if not QK1D:
        kq = row_sum(b_k * b_q)
    u = beta * (b_v - g * sk)
    return g * h + u[None, :, None, None] * b_k, scale * (g * sq + u * kq)


@triton.jit
def gdn_decode_kernel(
        q, k, v, a, b, A_log, dt_bias, out, state, new_state,          # pointers first
        slot_idx, new_slot_idx, inter, inter_idx, accepted,
        scale, T,
        sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
        sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, s_alog, s_dtb,
        so_b, so_t, so_h, ss_b, ss_h, ss_v, sn_b, sn_h, sn_v,
        P, PN, null_slot, S, si_s, si_t,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BV: tl.constexpr, L2NORM: tl.constexpr,
        LPR: tl.constexpr = 1, VEC: tl.constexpr = 1, DENSE: tl.constexpr = 0,      # TMA 0
        TMA: tl.constexpr = 0, TILES: tl.constexpr = 1, INPLACE: tl.constexpr = 0,  # TMA 1
        STAGES: tl.constexpr = 1, WS: tl.constexpr = 0, POOL: tl.constexpr = 0,
        INTER: tl.constexpr = 0, UPDATE: tl.constexpr = 1, ACC: tl.constexpr = 0,   # verify
        PDL: tl.constexpr = 0, GATES: tl.constexpr = 0, NEG: tl.constexpr = 0,
        KFIRST: tl.constexpr = 0):
    if PDL == 1:
        gdc_wait()                         # before any global load or store
        gdc_launch_dependents()
    NV: tl.constexpr = V // (BV * TILES)      # programs per head
    # Everything on grid axis 0 (limit 2^31-1; axes 1 and 2 stop at 65535). Neighbouring
    # programs take neighbouring V tiles of one head, so they stream contiguous state.
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)            # GVA: repeat_interleave mapping, not i_hv % H
    # DENSE > 0: every tensor is contiguous (the launcher checked) and DENSE is T, so every
    # stride is the shapes' compile-time constant, and the address arithmetic before the first
    # state load shrinks (H100, B=1: the first state load moved from the 99th to the 73rd
    # instruction, fp32 2.11 -> 2.05 us).  i_b is the per-token tensors' batch index: sequence
    # n's tokens start at token row n*T.  A size-1 dimension's own stride may differ from
    # these, but its index is always 0.  A pool's slot stride is always the one passed (a
    # vLLM page is larger than a slot); the rest of a slot's strides are fixed by the layout.
    i_b = i_n
    if DENSE > 0:
        i_b = i_n * DENSE
        # (batch, token, head) strides in token rows, and the state's (batch, head, row)
        sq_b, sq_t, sq_h = H * K, H * K, K
        sk_b, sk_t, sk_h = sq_b, sq_t, sq_h
        sv_b, sv_t, sv_h = HV * V, HV * V, V
        so_b, so_t, so_h = sv_b, sv_t, sv_h
        sa_b, sa_t, sa_h = HV, HV, 1
        sb_b, sb_t, sb_h = sa_b, sa_t, sa_h
        s_alog, s_dtb = 1, 1
        if POOL == 0:
            ss_b = HV * V * K
            sn_b = ss_b
        ss_h, ss_v = V * K, K
        sn_h, sn_v = ss_h, ss_v

    # The one place a sequence's state addresses are formed (read and write): batch row i_n,
    # or in a pool the sequence's read / write slot, with masks for padding (None: no mask).
    rd = None
    wr = None
    if POOL == 0:
        src = state + i_n * ss_b + i_hv * ss_h
        dst = new_state + i_n * sn_b + i_hv * sn_h
    elif POOL == 3:
        slot_r, rd = accepted_slot(slot_idx, accepted, i_n, T, P, null_slot, ACC)
        src = state + slot_r * ss_b + i_hv * ss_h
        dst = new_state + i_hv * sn_h          # token t's slot is added in the token loop
    else:
        slot_r, slot_w, rd, wr = pool_slots(slot_idx, new_slot_idx, i_n, P, PN, null_slot, POOL)
        src = state + slot_r * ss_b + i_hv * ss_h
        dst = new_state + slot_w * sn_b + i_hv * sn_h

    if TMA:
        tl.static_assert((POOL < 3) & (INTER == 0) & (UPDATE == 1), "verify needs TMA 0")
        tl.static_assert(PDL == 0, "PDL needs TMA 0")
        i_c = i_v.to(tl.int32)
        # TMA needs 16-byte aligned bases and row strides; the launcher checked both.
        d_src = tl.make_tensor_descriptor(src, shape=[V, K], strides=[ss_v, 1], block_shape=[BV, K])
        if INPLACE:
            d_dst = d_src                  # one descriptor: fewer global writes and fences
        else:
            d_dst = tl.make_tensor_descriptor(dst, shape=[V, K], strides=[sn_v, 1],
                                              block_shape=[BV, K])
        A_neg = -tl.exp(tl.load(A_log + i_hv * s_alog).to(tl.float32))
        dtb = tl.load(dt_bias + i_hv * s_dtb).to(tl.float32)
        q0, k0, v0, o0, a0, b0 = token_pointers(q, k, v, out, a, b, i_b, i_h, i_hv, sq_b, sq_h,
                                                sk_b, sk_h, sv_b, sv_h, so_b, so_h, sa_b, sa_h,
                                                sb_b, sb_h, tl.arange(0, K), 0)
        if POOL > 0:
            # A padded sequence's tiles move past the descriptor's V rows: TMA reads zeros
            # there without touching memory and drops the stores.
            past_r = tl.where(rd, 0, V).to(tl.int32)
            past_w = tl.where(wr, 0, V).to(tl.int32)
        for j in tl.range(0, TILES, num_stages=STAGES, warp_specialize=WS):
            r0 = (i_c * TILES + j) * BV
            r_ld = r0
            r_st = r0
            if POOL > 0:
                r_ld = r0 + past_r
                r_st = r0 + past_w
            h = d_src.load([r_ld, 0]).to(tl.float32)
            rows = r0 + tl.arange(0, BV)
            p_q, p_k, p_v, p_o, p_a, p_b = q0, k0, v0 + rows, o0 + rows, a0, b0
            # q, k and the gates are re-read per tile: they are tiny and stay in L1/L2, and a
            # tile's tokens must see them in order while its rows stay in registers.
            for _ in tl.range(0, T):
                h, o = token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dtb, scale, L2NORM)
                if POOL > 0:
                    o = tl.where(rd, o, 0.0)
                tl.store(p_o, o.to(out.dtype.element_ty))
                p_q, p_k, p_v, p_o, p_a, p_b = next_token(p_q, p_k, p_v, p_o, p_a, p_b, sq_t,
                                                           sk_t, sv_t, so_t, sa_t, sb_t)
            d_dst.store([r_st, 0], h.to(new_state.dtype.element_ty))
    else:
        KO: tl.constexpr = K // (LPR * VEC)
        rows = i_v * BV + tl.arange(0, BV)
        rows4 = rows.to(tl.int64)[None, :, None, None]
        col = (tl.arange(0, LPR)[:, None, None, None] * VEC
               + tl.arange(0, KO)[None, None, :, None] * (LPR * VEC)
               + tl.arange(0, VEC)[None, None, None, :])
        # A tile's element (row r, column k) of a head's block: r * K + k (k-last; a pool's or
        # a strided state's rows at its own stride), or k * V + r (KFIRST: each head's [K, V]
        # block contiguous, as validated).  Each address is formed where it is used, as before
        # KFIRST existed, so that KFIRST 0 compiles to the same code.
        # Issue the big load first; the small per-token loads below overlap its latency.
        if KFIRST:
            h = tl.load(src + rows4 + col.to(tl.int64) * V, mask=rd).to(tl.float32)
        else:
            h = tl.load(src + rows4 * ss_v + col, mask=rd).to(tl.float32)

        # q and k are read with the tile's shape (same thread map, rows reading the same
        # address), so no layout conversion sits between them and the state.  A K-first tile
        # loads V-innermost: its q and k are [K] vectors shaped into it (lanes_token_step).
        col = tl.broadcast_to(col, [LPR, BV, KO, VEC])
        if GATES:                          # never read: the gates come precomputed
            A_neg = 0.0
            dtb = 0.0
        else:
            A_neg = -tl.exp(tl.load(A_log + i_hv * s_alog).to(tl.float32))
            dtb = tl.load(dt_bias + i_hv * s_dtb).to(tl.float32)
        qk_col = tl.arange(0, K) if KFIRST else col
        p_q = q + i_b * sq_b + i_h * sq_h + qk_col
        p_k = k + i_b * sk_b + i_h * sk_h + qk_col
        p_v = v + i_b * sv_b + i_hv * sv_h + rows
        p_o = out + i_b * so_b + i_hv * so_h + rows
        p_a = a + i_b * sa_b + i_hv * sa_h
        p_b = b + i_b * sb_b + i_hv * sb_h
        if INTER > 0:
            # Sequence n's row of intermediate states (64-bit: row x stride(0) may pass 2^31
            # elements); each [HV, V, K] block is contiguous.
            row = i_n
            if INTER == 2:
                row = tl.load(inter_idx + i_n).to(tl.int64)
            keep = as_mask((row >= 0) & (row < S))
            if POOL > 0:
                keep = keep & rd
            if KFIRST:
                p_i = (inter + tl.where(keep, row, 0) * si_s + i_hv * (V * K) + rows4
                       + col.to(tl.int64) * V)
            else:
                p_i = inter + tl.where(keep, row, 0) * si_s + i_hv * (V * K) + rows4 * K + col
        if POOL == 3:
            p_w = slot_idx + i_n * T              # the row of per-token write slots
        if PDL == 2:
            gdc_wait()                # the state, indices and head constants were read above
            gdc_launch_dependents()
        for _ in tl.range(0, T):
            if POOL == 3:
                w = tl.load(p_w).to(tl.int64)     # loaded before the token's math
                w_ok = rd & (w >= 0) & (w < PN) & (w != null_slot)
            h, o = lanes_token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dtb, scale, L2NORM,
                                    GATES, NEG, KFIRST)
            if POOL > 0:
                o = tl.where(rd, o, 0.0)
            tl.store(p_o, o.to(out.dtype.element_ty))
            if INTER > 0:
                tl.store(p_i, h.to(inter.dtype.element_ty), mask=keep)
                p_i += si_t
            if POOL == 3:
                if KFIRST:
                    tl.store(dst + tl.where(w_ok, w, 0) * sn_b + rows4 + col.to(tl.int64) * V,
                             h.to(new_state.dtype.element_ty), mask=w_ok)
                else:
                    tl.store(dst + tl.where(w_ok, w, 0) * sn_b + rows4 * sn_v + col,
                             h.to(new_state.dtype.element_ty), mask=w_ok)
                p_w += 1
            p_q, p_k, p_v, p_o, p_a, p_b = next_token(p_q, p_k, p_v, p_o, p_a, p_b, sq_t, sk_t,
                                                       sv_t, so_t, sa_t, sb_t)

        if (UPDATE == 1) & (POOL != 3):   # per-token slots: the last token's store was the final
            if KFIRST:
                tl.store(dst + rows4 + col.to(tl.int64) * V, h.to(new_state.dtype.element_ty),
                         mask=wr)
            else:
                tl.store(dst + rows4 * sn_v + col, h.to(new_state.dtype.element_ty), mask=wr)


@triton.jit
def checkpoint_row0(cu_seqlens, i_n, every, T):
    """The first checkpoint row of sequence ``i_n``: the sum of L_i // every over i < i_n
    (counted SEQ_BLOCK sequences a load; each sequence :func:`held` inside [0, T])."""
    idx = tl.arange(0, SEQ_BLOCK)
    row = i_n * 0
    n0 = i_n * 0
    while n0 < i_n:
        i = n0 + idx
        m = i < i_n
        bos, eos = held(tl.load(cu_seqlens + i, mask=m, other=0).to(tl.int64),
                        tl.load(cu_seqlens + i + 1, mask=m, other=0).to(tl.int64), T)
        row += tl.sum((eos - bos) // every, 0)
        n0 += SEQ_BLOCK
    return row


@triton.jit
def checkpoint_due(row0, end, every, T):
    """Whether a sequence whose checkpoints start at row ``row0`` stores one after its token
    ``end`` (counted from 1): ``end`` a multiple of ``every``, and the row inside the T // every
    rows the contract asks of the buffer (``cu_seqlens`` values that break the contract, checked
    only on request, must not write past them)."""
    return (end % every == 0) & (row0 + end // every <= T // every)


@triton.jit
def gdn_varlen_kernel(
        q, k, v, a, b, A_log, dt_bias, out, state, new_state, slot_idx, new_slot_idx,
        cu_seqlens, T_all, has_init, ckpt, scale, every,
        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sa_h, sb_t, sb_h, s_alog, s_dtb, so_t, so_h,
        ss_b, ss_h, ss_v, ss_k, sn_b, sn_h, sn_v, sn_k, sc_b, sc_h, sc_v, sc_k, P, PN, null_slot,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BV: tl.constexpr, L2NORM: tl.constexpr, LPR: tl.constexpr, VEC: tl.constexpr,
        POOL: tl.constexpr, STATE0: tl.constexpr, HAS_INIT: tl.constexpr, CKPT: tl.constexpr,
        GATES: tl.constexpr, NEG: tl.constexpr, KFIRST: tl.constexpr = 0):
    """The decode kernel's recurrence over packed variable-length sequences (fla-recurrent's
    prefill): one program per (sequence, v-head, V-tile of BV rows), the tile in registers with
    the decode kernel's thread map through every token of the sequence (tokens ``cu_seqlens[n]``
    to ``cu_seqlens[n + 1]`` of q, k [T, H, K], v, out [T, HV, V], a, b [T, HV]), outputs
    stored per token, the final tile stored once.  The state's (V row, K column) strides are
    passed, so a k-last and a K-first state are read where they lie.  ``STATE0`` 0: no state
    (zeros); ``POOL`` as the decode kernel's (a padded sequence: zero outputs, no state read or
    written); ``KFIRST`` 1: the states are K-first (q and k then read as [K] vectors, as the
    decode kernel reads them for such a state); ``HAS_INIT``: ``has_init[n]`` False starts from
    zeros without reading the slot;
    ``CKPT``: the tile also stored after every ``every`` tokens of a real sequence, at the rows
    :func:`checkpoint_row0` counts."""
    i_v, i_n, i_hv, i_h, bos, eos, slot_r, slot_w, rd, wr = sequence_program(
        cu_seqlens, T_all, slot_idx, new_slot_idx, P, PN, null_slot, H, HV, V, BV, POOL)
    KO: tl.constexpr = K // (LPR * VEC)
    rows = i_v * BV + tl.arange(0, BV)
    rows4 = rows.to(tl.int64)[None, :, None, None]
    col = (tl.arange(0, LPR)[:, None, None, None] * VEC
           + tl.arange(0, KO)[None, None, :, None] * (LPR * VEC)
           + tl.arange(0, VEC)[None, None, None, :]).to(tl.int64)
    col = tl.broadcast_to(col, [LPR, BV, KO, VEC])
    if STATE0:
        init = rd
        if HAS_INIT:
            init = init & (tl.load(has_init + i_n) != 0)
        h = tl.load(state + slot_r * ss_b + i_hv * ss_h + rows4 * ss_v + col * ss_k,
                    mask=init, other=0.0).to(tl.float32)
    else:
        h = tl.zeros([LPR, BV, KO, VEC], tl.float32)
    A_neg, dtb = head_gate_constants(A_log, dt_bias, i_hv, s_alog, s_dtb, GATES)
    # the first token's pointers: its row bos of the packed [T, ..] tensors
    p_q, p_k, p_v, p_o, p_a, p_b = token_pointers(q, k, v, out, a, b, bos, i_h, i_hv, sq_t, sq_h,
                                                  sk_t, sk_h, sv_t, sv_h, so_t, so_h, sa_t,
                                                  sa_h, sb_t, sb_h,
                                                  tl.arange(0, K) if KFIRST else col, rows)
    if CKPT:
        row0 = checkpoint_row0(cu_seqlens, i_n, every, T_all)
        p_c = ckpt + row0 * sc_b + i_hv * sc_h + rows4 * sc_v + col * sc_k
    n_tok = eos - bos
    t = n_tok * 0                # a while loop: the interpreter's range() refuses its scalars
    while t < n_tok:
        h, o = lanes_token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dtb, scale, L2NORM, GATES,
                                NEG, KFIRST)
        tl.store(p_o, tl.where(rd, o, 0.0).to(out.dtype.element_ty))
        t += 1
        if CKPT:
            tl.store(p_c, h.to(ckpt.dtype.element_ty),
                     mask=as_mask(rd & checkpoint_due(row0, t, every, T_all)))
            p_c += tl.where(t % every == 0, sc_b, 0)
        p_q, p_k, p_v, p_o, p_a, p_b = next_token(p_q, p_k, p_v, p_o, p_a, p_b, sq_t, sk_t,
                                                   sv_t, so_t, sa_t, sb_t)
    tl.store(new_state + slot_w * sn_b + i_hv * sn_h + rows4 * sn_v + col * sn_k,
             h.to(new_state.dtype.element_ty), mask=wr)


if INTERPRETED:
    bind_interpreted(globals())

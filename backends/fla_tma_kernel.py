"""The fla-tma Triton kernel: state tiles moved by TMA tensor descriptors.

One program per (sequence, v-head, chunk of TILES tiles of BV rows).  The program builds a
device-side 2-D descriptor [V, K] over its head's state and walks its tiles in a
``tl.range`` loop: with ``num_stages`` > 1 Triton's pipeliner turns the descriptor loads into
asynchronous TMA copies into a ring of shared-memory buffers guarded by mbarriers (the
producer runs ahead of the math); ``warp_specialize`` asks Triton to split producer and
consumer into separate warps where its compiler can (see the backend module for what
Triton 3.6 does on sm_90).  V rows are independent, so the tile loop can be outermost and
the T tokens loop inside it, each tile's state kept in registers across the tokens.

Imported only when the backend runs (it imports triton at module level).
"""
import triton
import triton.language as tl

from gdnzoo.backends._triton_gates import token_step


@triton.jit
def gdn_tma_kernel(
        q, k, v, a, b, A_log, dt_bias, out, state, new_state,          # pointers first
        scale, T,
        sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
        sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, s_alog, s_dtb,
        so_b, so_t, so_h, ss_b, ss_h, ss_v, sn_b, sn_h, sn_v,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BV: tl.constexpr, TILES: tl.constexpr, L2NORM: tl.constexpr, INPLACE: tl.constexpr,
        STAGES: tl.constexpr, WS: tl.constexpr):
    NC: tl.constexpr = V // (BV * TILES)
    pid = tl.program_id(0).to(tl.int64)
    i_c = (pid % NC).to(tl.int32)
    i_nh = pid // NC
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)            # GVA: repeat_interleave mapping

    # The one place a sequence's state addresses are formed (read and write). A state pool
    # replaces i_n here by the sequence's read / write slot.
    src = state + i_n * ss_b + i_hv * ss_h
    dst = new_state + i_n * sn_b + i_hv * sn_h

    # TMA needs 16-byte aligned bases and row strides; the launcher checked both.
    d_src = tl.make_tensor_descriptor(src, shape=[V, K], strides=[ss_v, 1], block_shape=[BV, K])
    if INPLACE:
        d_dst = d_src                  # one descriptor: fewer global writes and fences
    else:
        d_dst = tl.make_tensor_descriptor(dst, shape=[V, K], strides=[sn_v, 1],
                                          block_shape=[BV, K])

    cols = tl.arange(0, K)
    A_neg = -tl.exp(tl.load(A_log + i_hv * s_alog).to(tl.float32))
    dtb = tl.load(dt_bias + i_hv * s_dtb).to(tl.float32)
    q0 = q + i_n * sq_b + i_h * sq_h + cols
    k0 = k + i_n * sk_b + i_h * sk_h + cols
    v0 = v + i_n * sv_b + i_hv * sv_h
    o0 = out + i_n * so_b + i_hv * so_h
    a0 = a + i_n * sa_b + i_hv * sa_h
    b0 = b + i_n * sb_b + i_hv * sb_h

    for j in tl.range(0, TILES, num_stages=STAGES, warp_specialize=WS):
        r0 = (i_c * TILES + j) * BV
        h = d_src.load([r0, 0]).to(tl.float32)
        rows = r0 + tl.arange(0, BV)
        p_q, p_k, p_v, p_o, p_a, p_b = q0, k0, v0 + rows, o0 + rows, a0, b0
        # q, k and the gates are re-read per tile: they are tiny and stay in L1/L2, and a
        # tile's tokens must see them in order while its rows stay in registers.
        for _ in tl.range(0, T):
            h, o = token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dtb, scale, L2NORM)
            tl.store(p_o, o.to(out.dtype.element_ty))
            p_q += sq_t
            p_k += sk_t
            p_v += sv_t
            p_o += so_t
            p_a += sa_t
            p_b += sb_t
        d_dst.store([r0, 0], h.to(new_state.dtype.element_ty))

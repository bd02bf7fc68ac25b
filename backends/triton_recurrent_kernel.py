"""The fla-recurrent Triton kernel: one program per (sequence, v-head, V-tile).

Imported only when the backend runs (it imports triton at module level).
"""
import triton
import triton.language as tl

from gdnzoo.backends._triton_gates import token_step


@triton.jit
def gdn_recurrent_kernel(
        q, k, v, a, b, A_log, dt_bias, out, state, new_state,          # pointers first
        scale, T,
        sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
        sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, s_alog, s_dtb,
        so_b, so_t, so_h, ss_b, ss_h, ss_v, sn_b, sn_h, sn_v,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
        BV: tl.constexpr, L2NORM: tl.constexpr):
    NV: tl.constexpr = V // BV
    # Everything on grid axis 0 (limit 2^31-1; axes 1 and 2 stop at 65535). Neighbouring
    # programs take neighbouring V tiles of one head, so they stream contiguous state.
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)            # GVA: repeat_interleave mapping, not i_hv % H

    # The one place a sequence's state addresses are formed (read and write). A state pool
    # replaces i_n here by the sequence's read / write slot.
    src = state + i_n * ss_b + i_hv * ss_h
    dst = new_state + i_n * sn_b + i_hv * sn_h

    rows = i_v * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    rows64 = rows.to(tl.int64)
    p_src = src + (rows64 * ss_v)[:, None] + cols[None, :]
    p_dst = dst + (rows64 * sn_v)[:, None] + cols[None, :]
    # Issue the big load first; the small per-token loads below overlap its latency.
    h = tl.load(p_src).to(tl.float32)

    A_neg = -tl.exp(tl.load(A_log + i_hv * s_alog).to(tl.float32))
    dtb = tl.load(dt_bias + i_hv * s_dtb).to(tl.float32)
    p_q = q + i_n * sq_b + i_h * sq_h + cols
    p_k = k + i_n * sk_b + i_h * sk_h + cols
    p_v = v + i_n * sv_b + i_hv * sv_h + rows
    p_o = out + i_n * so_b + i_hv * so_h + rows
    p_a = a + i_n * sa_b + i_hv * sa_h
    p_b = b + i_n * sb_b + i_hv * sb_h

    for _ in tl.range(0, T):
        h, o = token_step(h, p_q, p_k, p_v, p_a, p_b, A_neg, dtb, scale, L2NORM)
        tl.store(p_o, o.to(out.dtype.element_ty))
        p_q += sq_t
        p_k += sk_t
        p_v += sv_t
        p_o += so_t
        p_a += sa_t
        p_b += sb_t

    tl.store(p_dst, h.to(new_state.dtype.element_ty))

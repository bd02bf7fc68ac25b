"""Per-token inputs and gate math of the Triton kernels, and fla-tma's per-token step on a
[BV, K] tile (fla-recurrent keeps its tile as [LPR, BV, KO, VEC] and reduces it itself;
imports triton; only kernel modules import it)."""
import triton
import triton.language as tl


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
def token_inputs(p_q, p_k, p_v, p_a, p_b, A_neg, dt_bias):
    """One token's q, k, v (fp32, the pointers' shapes) and gates g, beta.  The loads stay in
    this order (q, k, v, then each gate right before its math): moving all five loads ahead of
    the gate math changed the bf16 SASS schedule and cost 7-12% at some launch shapes on the
    H100."""
    b_q = tl.load(p_q).to(tl.float32)
    b_k = tl.load(p_k).to(tl.float32)
    b_v = tl.load(p_v).to(tl.float32)
    g = softplus_decay(A_neg, tl.load(p_a).to(tl.float32), dt_bias)
    beta = tl.sigmoid(tl.load(p_b).to(tl.float32))
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

"""Gate and per-token math shared by the Triton kernels (imports triton; only kernel modules
import it)."""
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
def token_step(h, b_q, b_k, b_v, a_raw, b_raw, A_neg, dt_bias, scale, L2NORM: tl.constexpr):
    """One token on a [BV, K] fp32 state tile: returns (the new tile, the tile's [BV] outputs).

    One pass over the tile: both row reductions read the old state, so they run side by side;
    then S' = g S + u k^T and o = scale (g S q + u (k.q)) need no second reduction."""
    g = softplus_decay(A_neg, a_raw, dt_bias)
    beta = tl.sigmoid(b_raw)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
    sk = tl.sum(h * b_k[None, :], 1)
    sq = tl.sum(h * b_q[None, :], 1)
    kq = tl.sum(b_k * b_q)
    u = beta * (b_v - g * sk)
    return g * h + u[:, None] * b_k[None, :], scale * (g * sq + u * kq)

"""Gate math shared by the Triton kernels (imports triton; only kernel modules import it)."""
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

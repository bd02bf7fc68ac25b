"""One edit of cuda-chunk's prep kernel for ``python -m lab.prep_ab --edits`` this file
``--variants sep`` (written in the eighteenth session without device time left; not run):

* sep: the decays e^(G_i - G_j) of A and P (i >= j) as e^(G_i - G_b) e^(G_b - G_j), G_b the
  first of j's 16-token block: 16 column factors and 8 row factors a thread instead of 32
  exponentials and their masks, every exponential as one ``ex2.approx.ftz`` (no denormal
  rescaling).  Both factors stay in fp32 range while no 16-token block of the chunk decays by
  60 or more (a uniform test a CTA); a chunk that does takes the exact form, as before.  The
  workspace changes in its last bits (two exponentials for one), within the tests' 2e-5 of
  triton-chunk's prep presumably; ``--errors`` reads the whole call against float64.
  Statically (``python -m lab.sass_lines``, nvcc 13.0, sm_90a, GDN_HEADS 1, "bf16"): the A and
  P block 796 SASS instructions a warp in the tree, 434 + 24 MUFU on the new path (the exact
  form kept beside it as the fallback: 3720 instructions in all against 3400); registers 128
  without the tree's 16 spilled bytes at one head a CTA, 288 against 148 spilled bytes at four.
  The bench's inputs (make_prefill_inputs, 16/32) never decay by 60 in a 16-token block (the
  least -47.7), 14% of their 64-token chunks do: hence blocks of 16 for the reference.
"""
OLD = """        // A (to shared memory) and P
        float P[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {"""
NEW = """        // A (to shared memory) and P
        float P[8][4];
        bool sep = true;                 // no 16-token block decays by 60 or more
#pragma unroll
        for (int b = 0; b < 4; ++b) sep = sep && sm.G[16 * b] - sm.G[16 * b + 15] < 60.f;
        if (sep) {
            float cf[8][2];              // e^(G_b - G_j) rk_j, b the first of j's block
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = 8 * nt + 2 * t4 + e;
                    cf[nt][e] = ex2ftz(1.44269504f * (sm.G[16 * (nt >> 1)] - sm.G[j])) * sm.rk[j];
                }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * w + g + 8 * h;
                const float Gi = sm.G[i], bi = sm.beta[i] * sm.rk[i], si = scale * sm.rq[i];
                float rb[4], rs[4];      // e^(G_i - G_b) beta_i rk_i and scale rq_i (b <= i's)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const float r = ex2ftz(1.44269504f * fminf(Gi - sm.G[16 * b], 0.f));
                    rb[b] = r * bi;
                    rs[b] = r * si;
                }
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    float av[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int j = 8 * nt + 2 * t4 + e;
                        av[e] = i > j ? KK[nt][2 * h + e] * cf[nt][e] * rb[nt >> 1] : 0.f;
                        P[nt][2 * h + e] = i >= j ? QK[nt][2 * h + e] * cf[nt][e] * rs[nt >> 1]
                                                  : 0.f;
                    }
                    *reinterpret_cast<float2*>(&sm.u.m.A[i][8 * nt + 2 * t4]) =
                        make_float2(av[0], av[1]);
                }
            }
        } else
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {"""
HELPER_OLD = """// d += a b with a's four fragment registers in an array"""
HELPER_NEW = """// 2^x, flushing denormal results to 0
__device__ __forceinline__ float ex2ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// d += a b with a's four fragment registers in an array"""
EDITS = {"sep": [(OLD, NEW), (HELPER_OLD, HELPER_NEW)]}

"""Does cuda-chunk-bf16's chain wait on dependent warpgroup MMAs?  Variants of
``backends/cuda_chunk_chain.cu`` whose chain products accumulate into two independent
accumulators, summed after, instead of one (edits for ``lab/chain_ab.py``):

    X      X = S0 k^T: k-steps 0..3 and 4..7 (+32 registers)
    V      V'^T = R T^T: k-steps 0, 1 and 2, 3 (+32 registers)
    U      S = e^G_last S + va k: k-steps 0, 1 into S and 2, 3 into a fresh tile (+64)

Every variant was slower (``session.log``, section 4; run then by a script of its own with the
same steps as ``lab/chain_ab.py``).  From the repository root, on an sm_90 GPU with cupy:

    python -m lab.chain_ab --edits lab/notebook/h200/lookahead_2026-11-30/chain_split.py \
        --variants X,V,U,X+V,X+V+U --cells 4/8:1x8192,16/32:8x1024
"""

X_OLD = """        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
        wg_commit();"""
X_NEW = """        float X[32], X2[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            mma64rs<0>(X, sa[k], desc(st.k, 32 * k, 16), k);
            mma64rs<0>(X2, sa[k + 4], desc(st.k + BOX, 32 * k, 16), k);
        }
        wg_commit();"""
X_WAIT_OLD = """        wg_wait<0>();
        pin(X);
        form_r("""
X_WAIT_NEW = """        wg_wait<0>();
        pin(X);
        pin(X2);
#pragma unroll
        for (int i = 0; i < 32; ++i) X[i] += X2[i];
        form_r("""
V_OLD = """    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), k);
    wg_commit();
}"""
V_NEW = """    wg_fence();
    mma64rs<1>(X, ra[0], desc(t, 0, 8192), 0);
    mma64rs<1>(X2, ra[2], desc(t, 4096, 8192), 0);
    mma64rs<1>(X, ra[1], desc(t, 2048, 8192), 1);
    mma64rs<1>(X2, ra[3], desc(t, 6144, 8192), 1);
    wg_commit();
}"""
V_SIG_OLD = ("__device__ __forceinline__ void issue_vp(float (&X)[32], unsigned (&ra)[4][4], "
             "const bf16_t* t) {")
V_SIG_NEW = ("__device__ __forceinline__ void issue_vp(float (&X)[32], unsigned (&ra)[4][4], "
             "const bf16_t* t, float (&X2)[32]) {")
V_CALL_OLD = """        unsigned ra[4][4];
        issue_vp(X, ra, st.t);                  // V'^T = R T^T (into X's registers)"""
V_CALL_NEW = """        unsigned ra[4][4];
        float V2[32];
        issue_vp(X, ra, st.t, V2);              // V'^T = R T^T (into X's registers)"""
V_WAIT_OLD = """        wg_wait<0>();
        pin(X);
        scale_tokens(X, st.f[3], t4);"""
V_WAIT_NEW = """        wg_wait<0>();
        pin(X);
        pin(V2);
#pragma unroll
        for (int i = 0; i < 32; ++i) X[i] += V2[i];
        scale_tokens(X, st.f[3], t4);"""
U_OLD = """        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) mma128rs<1>(S, va[k], desc(st.k, 2048 * k, 8192), 1);
        wg_commit();
        wg_wait<0>();
        pin(S);"""
U_NEW = """        float U[64];
        wg_fence();
        mma128rs<1>(S, va[0], desc(st.k, 0, 8192), 1);
        mma128rs<1>(U, va[2], desc(st.k, 4096, 8192), 0);
        mma128rs<1>(S, va[1], desc(st.k, 2048, 8192), 1);
        mma128rs<1>(U, va[3], desc(st.k, 6144, 8192), 1);
        wg_commit();
        wg_wait<0>();
        pin(S);
        pin(U);
#pragma unroll
        for (int i = 0; i < 64; ++i) S[i] += U[i];"""
EDITS = {"X": [(X_OLD, X_NEW), (X_WAIT_OLD, X_WAIT_NEW)],
         "V": [(V_OLD, V_NEW), (V_SIG_OLD, V_SIG_NEW), (V_CALL_OLD, V_CALL_NEW),
               (V_WAIT_OLD, V_WAIT_NEW)],
         "U": [(U_OLD, U_NEW)]}

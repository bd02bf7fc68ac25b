"""What would an fp32-accurate chain cost on warpgroup MMAs?  Edits of cuda-chunk-bf16's chain
kernel (``backends/cuda_chunk_chain.cu``), its solo form, for ``lab/chain_ab.py``.

The automatic prefill choice never rounds the state's products to bf16, so on Hopper it runs
cuda-chunk, whose Triton chain takes every product in three bf16 passes ("bf16x3": a_hi b_hi +
a_hi b_lo + a_lo b_hi) and is 2-4x slower than FlashInfer at long sequences.  A CPU emulation
(``chain_precision.py`` here) says which operands must be split for the strict fp32 bound (1e-4
relative state error): all of them (S0, R and V' on the register side, T^T and M^T in the
workspace); S0, R and V' alone leave 4e-4.  These edits build the register-side splits (exact:
hi = bf16(x), lo = bf16(x - hi), two MMA passes where the other operand is exact) and time them:

    solosplit        S0, R and V'^T split: X = S0 k^T, Y = S0 q^T and the update in two passes,
                     V'^T = R T^T and R M^T in two (T^T, M^T bf16 as now).  Correct: its errors
                     are the emulation's "S0+va+R" (a check of the split code).
    solosplit+tp3    a third pass for V'^T and R M^T (R_hi times T^T / M^T again, standing in for
                     the workspace's lo rows, which the prep does not write): the MMA count of the
                     whole fp32-accurate chain, timing only (its results are wrong by design).

The lo rows' copies (two more TMA boxes a chunk) are not modelled.  From the repository root, on
an sm_90 GPU with cupy:

    python -m lab.chain_ab --solo --edits lab/notebook/h200/chain_split_prec_2026-12-01/split_edits.py \\
        --variants solosplit,solosplit+tp3 --cells 4/8:1x8192,16/32:8x1024
"""

FRAG = """template <int R>
__device__ __forceinline__ void frag(unsigned (&a)[4], const float (&d)[R], int s) {
    a[0] = pack2(d[8 * s + 0], d[8 * s + 1]);
    a[1] = pack2(d[8 * s + 2], d[8 * s + 3]);
    a[2] = pack2(d[8 * s + 4], d[8 * s + 5]);
    a[3] = pack2(d[8 * s + 6], d[8 * s + 7]);
}
"""
FRAG_LO = FRAG + """#define SPLIT_TP 2
// the bf16 remainders x - bf16(x) of a fragment's pairs
__device__ __forceinline__ unsigned lo2(float x0, float x1) {
    const unsigned h = pack2(x0, x1);
    return pack2(x0 - __uint_as_float(h << 16), x1 - __uint_as_float(h & 0xffff0000u));
}
template <int R>
__device__ __forceinline__ void frag_lo(unsigned (&a)[4], const float (&d)[R], int s) {
    a[0] = lo2(d[8 * s + 0], d[8 * s + 1]);
    a[1] = lo2(d[8 * s + 2], d[8 * s + 3]);
    a[2] = lo2(d[8 * s + 4], d[8 * s + 5]);
    a[3] = lo2(d[8 * s + 6], d[8 * s + 7]);
}
"""
CU_AT = "__device__ __forceinline__ long long cu_at("
SPLIT_FNS = """// V'^T = R T^T with R split (R_hi T^T + R_lo T^T; SPLIT_TP 3: R_hi T^T once more)
__device__ __forceinline__ void issue_vp2(float (&X)[32], unsigned (&ra)[4][4],
                                          unsigned (&rl)[4][4], const bf16_t* t) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        frag(ra[k], X, k);
        frag_lo(rl[k], X, k);
    }
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), k);
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, rl[k], desc(t, 2048 * k, 8192), 1);
    if (SPLIT_TP == 3) {
#pragma unroll
        for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), 1);
    }
    wg_commit();
}
// the update with V'^T split
template <class St>
__device__ __forceinline__ void issue_update2(float (&S)[64], float (&X)[32], const St& st,
                                              int t4) {
    scale_tokens(X, st.f[3], t4);
    unsigned va[4][4], vl[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        frag(va[k], X, k);
        frag_lo(vl[k], X, k);
    }
    const float gl = st.glast[0];
#pragma unroll
    for (int i = 0; i < 64; ++i) S[i] *= gl;
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma128rs<1>(S, va[k], desc(st.k, 2048 * k, 8192), 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) mma128rs<1>(S, vl[k], desc(st.k, 2048 * k, 8192), 1);
    wg_commit();
}

""" + CU_AT
X_OLD = """        unsigned sa[8][4];
#pragma unroll
        for (int k = 0; k < 8; ++k) frag(sa[k], S, k);
        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
        wg_commit();"""
X_NEW = """        unsigned sa[8][4], sl[8][4];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            frag(sa[k], S, k);
            frag_lo(sl[k], S, k);
        }
        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sl[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), 1);
        wg_commit();"""
Y_OLD = """            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sa[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), k);"""
Y_NEW = Y_OLD + """
#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sl[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), 1);"""
VP_OLD = """        issue_vp(X, ra, st.t);                  // V'^T = R T^T (into X's registers)
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // Y (V'^T may still run)"""
VP_NEW = """        unsigned rl[4][4];
        issue_vp2(X, ra, rl, st.t);             // V'^T = R T^T (into X's registers)
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // Y (V'^T may still run)"""
RM_OLD = """            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, ra[k], desc(sm.os.m, 2048 * k, 8192), 1);"""
RM_NEW = RM_OLD + """
#pragma unroll
            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, rl[k], desc(sm.os.m, 2048 * k, 8192), 1);
            if (SPLIT_TP == 3) {
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    mma64rs<1>(Y, ra[k], desc(sm.os.m, 2048 * k, 8192), 1);
            }"""
UP_OLD = """        issue_update(S, X, st, t4);
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // R M^T (the update may still run)"""
UP_NEW = """        issue_update2(S, X, st, t4);
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // R M^T (the update may still run)"""

EDITS = {
    "solosplit": [(FRAG, FRAG_LO), (CU_AT, SPLIT_FNS), (X_OLD, X_NEW), (Y_OLD, Y_NEW),
                  (VP_OLD, VP_NEW), (RM_OLD, RM_NEW), (UP_OLD, UP_NEW)],
    "tp3": [("#define SPLIT_TP 2", "#define SPLIT_TP 3")],
}

# ---- solox3: the whole fp32-accurate chain, the workspace's lo rows (triton-chunk's "bf16x3"
# rows: per token and head T^T hi, T^T lo, M^T hi, M^T lo, 64 columns each) copied into their
# own tiles; needs the rows' tensor map over 4 x 64 columns and 133 KB of shared memory (one
# CTA an SM): ``x3_ab.py`` launches it so.
CST_OLD = """    bf16_t t[BOX];
    bf16_t v[BOX];
    float f[4][C_];"""
CST_NEW = """    bf16_t t[BOX];
    bf16_t tl[BOX];             // T^T lo rows
    bf16_t v[BOX];
    float f[4][C_];"""
OST_OLD = """    bf16_t q[2 * BOX];          // outputs' products are done)
    bf16_t m[BOX];
};"""
OST_NEW = """    bf16_t q[2 * BOX];          // outputs' products are done)
    bf16_t m[BOX];
    bf16_t ml[BOX];             // M^T lo rows
};"""
LD_OLD = """        arrive_expect(full, (ident ? 3 : 4) * BOX * 2 + extra);
        const int t = (int)t0;
        tma3(st.k, p.tk, 0, i_h, t, full);
        tma3(st.k + BOX, p.tk, 64, i_h, t, full);
        tma3(st.t, p.tm, 0, i_hv, t, full);"""
LD_NEW = """        arrive_expect(full, (ident ? 4 : 5) * BOX * 2 + extra);
        const int t = (int)t0;
        tma3(st.k, p.tk, 0, i_h, t, full);
        tma3(st.k + BOX, p.tk, 64, i_h, t, full);
        tma3(st.t, p.tm, 0, i_hv, t, full);
        tma3(st.tl, p.tm, C_, i_hv, t, full);"""
OUT_OLD = """#define OUT_BYTES (3 * BOX * 2)"""
OUT_NEW = """#define OUT_BYTES (4 * BOX * 2)"""
LM_OLD = """    tma3(st.m, p.tm, C_, i_hv, t, full);"""
LM_NEW = """    tma3(st.m, p.tm, 2 * C_, i_hv, t, full);
    tma3(st.ml, p.tm, 3 * C_, i_hv, t, full);"""
VP3_FNS = SPLIT_FNS.replace(
    "unsigned (&rl)[4][4], const bf16_t* t) {",
    "unsigned (&rl)[4][4], const bf16_t* t,\n                                          const bf16_t* tl) {"
).replace(
    "        for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), 1);\n    }",
    "        for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(tl, 2048 * k, 8192), 1);\n    }")
VP3_NEW = VP_NEW.replace("issue_vp2(X, ra, rl, st.t);             //",
                         "issue_vp2(X, ra, rl, st.t, st.tl);      //")
RM3_NEW = RM_NEW.replace("mma64rs<1>(Y, ra[k], desc(sm.os.m, 2048 * k, 8192), 1);\n            }",
                         "mma64rs<1>(Y, ra[k], desc(sm.os.ml, 2048 * k, 8192), 1);\n            }")
EDITS["solox3"] = [(FRAG, FRAG_LO.replace("#define SPLIT_TP 2", "#define SPLIT_TP 3")),
                   (CU_AT, VP3_FNS), (X_OLD, X_NEW), (Y_OLD, Y_NEW), (VP_OLD, VP3_NEW),
                   (RM_OLD, RM3_NEW), (UP_OLD, UP_NEW), (CST_OLD, CST_NEW), (OST_OLD, OST_NEW),
                   (LD_OLD, LD_NEW), (OUT_OLD, OUT_NEW), (LM_OLD, LM_NEW)]

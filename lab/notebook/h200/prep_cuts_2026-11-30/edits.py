"""Two more edits of cuda-chunk's prep kernel for ``python -m lab.prep_ab --edits`` this file
(which also holds ``sep`` of ``../prep_separable_2026-11-30/edits.py``; "a+b" runs both):

* stm ("bf16" only): the stored rows staged straight from the warps' fragments: M = P T's C
  fragments and T's rows (read as fragments from shared memory, the blocks above the diagonal
  zeros, never stored) rounded to bf16 pairs and written transposed by ``stmatrix .trans``
  (8 a warp), instead of M through shared memory as fp32 and 64 scalar loads a thread to
  transpose both; the upper blocks of T no longer cleared.
* blkinv: T's blocks below the diagonal in the block-inverse form, T_hi,lo = -T_hi A_hi,lo T_lo
  over halves of 32 rows: T_10 and T_32 (warps 1, 3), then X_rc = A_r0 T_0c + A_r1 T_1c (warp
  2 (r - 2) + c, its scratch), then T_rc = -(T_r2 X_2c + T_r3 X_3c): the same 16 products a
  (chunk, head), 6 on the longest warp's path instead of 9, three barriers as before.  The
  products' association changes (the last bits of T and M).
"""
import runpy
from pathlib import Path

EDITS = dict(runpy.run_path(str(Path(__file__).parents[1] / "prep_separable_2026-11-30"
                                / "edits.py"))["EDITS"])

STM_HELPER_OLD = """// d += a b with a's four fragment registers in an array"""
STM_HELPER_NEW = """// four 8 x 8 bf16 matrices (a C fragment's pairs) stored transposed; lane 8 m + r gives
// matrix m's row-r address (after the transpose: the fragment's column r)
__device__ __forceinline__ void stm4t(void* p, unsigned r0, unsigned r1, unsigned r2,
                                      unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};"
                 :: "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))), "r"(r0), "r"(r1),
                    "r"(r2), "r"(r3) : "memory");
}
// d += a b with a's four fragment registers in an array"""

STM_ZERO_OLD = """                        if (cb > w) sm.u.m.T[16 * w + i][16 * cb + c] = 0.f;"""
STM_ZERO_NEW = """                        if (GDN_STORE3 && cb > w) sm.u.m.T[16 * w + i][16 * cb + c] = 0.f;"""

STM_M_OLD = """#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(&sm.u.m.A[16 * w + g + 8 * h][8 * nt + 2 * t4]) =
                    make_float2(M[nt][2 * h], M[nt][2 * h + 1]);
        __syncthreads();"""
STM_M_NEW = """#if GDN_STORE3
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(&sm.u.m.A[16 * w + g + 8 * h][8 * nt + 2 * t4]) =
                    make_float2(M[nt][2 * h], M[nt][2 * h + 1]);
#else
        {   // the stored rows staged: row i = column i of T, then of M, in bf16 (stmatrix's
            // transpose of the warp's rows [16 w, 16 w + 16); T's blocks above the diagonal 0)
            const int m = lane >> 3, r = lane & 7;
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                unsigned tr[4], mr[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int nt = 2 * np + (u >> 1), h = u & 1;
                    float2 x = make_float2(0.f, 0.f);
                    if (nt < 2 * w + 2)
                        x = *reinterpret_cast<const float2*>(
                            &sm.u.m.T[16 * w + g + 8 * h][8 * nt + 2 * t4]);
                    tr[u] = gdn_pack2<GDN_BF16>(x.x, x.y);
                    mr[u] = gdn_pack2<GDN_BF16>(M[nt][2 * h], M[nt][2 * h + 1]);
                }
                bf16_t* row = &sm.x.out[16 * np + 8 * (m >> 1) + r][16 * w + 8 * (m & 1)];
                stm4t(row, tr[0], tr[1], tr[2], tr[3]);
                stm4t(row + C_, mr[0], mr[1], mr[2], mr[3]);
            }
        }
#endif
        __syncthreads();"""

STM_PASS_OLD = """            if (pass) __syncthreads();   // the last pass's rows stored
            for (int it = tid;"""
STM_PASS_NEW = """            if (pass) __syncthreads();   // the last pass's rows stored
            if (GDN_STORE3) {
            for (int it = tid;"""
STM_PASS2_OLD = """                    *reinterpret_cast<uint4*>(row + C_) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            }
            __syncthreads();"""
STM_PASS2_NEW = """                    *reinterpret_cast<uint4*>(row + C_) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            }
            __syncthreads();
            }"""
EDITS["stm"] = [(STM_HELPER_OLD, STM_HELPER_NEW), (STM_ZERO_OLD, STM_ZERO_NEW),
                (STM_M_OLD, STM_M_NEW), (STM_PASS_OLD, STM_PASS_NEW),
                (STM_PASS2_OLD, STM_PASS2_NEW)]

TREE_OLD = """        // the blocks below: block row r a step, warp c < r forms T_rc
        for (int r = 1; r < 4; ++r) {
            if (w < r) {
                const int c = w;"""
TREE_NEW = """        // the blocks below, T_hi,lo = -T_hi A_hi,lo T_lo over halves of 32 rows: T_10 and
        // T_32 (warps 1 and 3) ...
        if (w & 1) {
            const int r = w, c = w - 1;"""
TREE_OLD2 = """                put16(&sm.u.m.T[16 * r][16 * c], LD, X, -1.f, g, t4);
            }
            __syncthreads();
        }"""
TREE_NEW2 = """                put16(&sm.u.m.T[16 * r][16 * c], LD, X, -1.f, g, t4);
        }
        __syncthreads();
        {   // ... X_rc = A_r0 T_0c + A_r1 T_1c (r = 2, 3; c = 0, 1; warp 2 (r - 2) + c) ...
            const int r = 2 + (w >> 1), c = w & 1;
            float X[2][4] = {};
            for (int kb = c; kb < 2; ++kb) {
                const Frag fa = frag_a(&sm.u.m.A[16 * r][16 * kb], LD, g, t4);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    unsigned bh[2], bl[2];
                    frag_b(&sm.u.m.T[16 * kb][16 * c], LD, nt, g, t4, bh, bl);
                    mma3(X[nt], fa, bh, bl);
                }
            }
            put16(&sm.x.S[w][0][0], SL, X, 1.f, g, t4);
        }
        __syncthreads();
        {   // ... and T_rc = -(T_r2 X_2c + T_r3 X_3c)
            const int r = 2 + (w >> 1), c = w & 1;
            float Y[2][4] = {};
            for (int kb = 2; kb <= r; ++kb) {
                const Frag fa = frag_a(&sm.u.m.T[16 * r][16 * kb], LD, g, t4);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    unsigned bh[2], bl[2];
                    frag_b(&sm.x.S[2 * (kb - 2) + c][0][0], SL, nt, g, t4, bh, bl);
                    mma3(Y[nt], fa, bh, bl);
                }
            }
            put16(&sm.u.m.T[16 * r][16 * c], LD, Y, -1.f, g, t4);
        }
        __syncthreads();"""
EDITS["blkinv"] = [(TREE_OLD, TREE_NEW), (TREE_OLD2, TREE_NEW2)]

# norm: 1 / ||row|| of q and k from the diagonals of q q^T and k k^T (their 16 x 16 blocks on
# the warp's rows: 32 more mma a warp; k k^T's own block sits at a warp-dependent n-tile, which
# would index its registers), instead of 256 products a thread from shared memory
NORM_OLD = """    {   // 1 / ||row|| of q and k (two threads a row)
        const int r = tid >> 1, c0 = (tid & 1) * 64;
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int c = 0; c < 64; c += 8) {
            const uint4 xq = *reinterpret_cast<const uint4*>(&sm.u.in.q[r][c0 + c]);
            const uint4 xk = *reinterpret_cast<const uint4*>(&sm.u.in.k[r][c0 + c]);
            const unsigned wq[4] = {xq.x, xq.y, xq.z, xq.w}, wk[4] = {xk.x, xk.y, xk.z, xk.w};
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float q0, q1, k0, k1;
                gdn_unpack2<GDN_BF16>(wq[u], q0, q1);
                gdn_unpack2<GDN_BF16>(wk[u], k0, k1);
                sq += q0 * q0 + q1 * q1;
                sk += k0 * k0 + k1 * k1;
            }
        }
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        if ((tid & 1) == 0) {
            sm.rq[r] = p.l2norm ? rsqrtf(sq + 1e-6f) : 1.f;
            sm.rk[r] = p.l2norm ? rsqrtf(sk + 1e-6f) : 1.f;
        }
    }
    // k k^T and q k^T, rows [16 w, 16 w + 16), all 64 columns"""
NORM_NEW = """    // k k^T and q k^T, rows [16 w, 16 w + 16), all 64 columns; q q^T's diagonal block"""
NORM_OLD2 = """    float KK[8][4] = {}, QK[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < K_ / 16; ++ks) {
        unsigned ak[4], aq[4];
        ldm4(ak, &sm.u.in.k[16 * w + a_r][ks * 16 + a_c]);
        ldm4(aq, &sm.u.in.q[16 * w + a_r][ks * 16 + a_c]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {"""
NORM_NEW2 = """    float KK[8][4] = {}, QK[8][4] = {}, QQ[2][4] = {}, KD[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < K_ / 16; ++ks) {
        unsigned ak[4], aq[4], bq[4], bd[4];
        ldm4(ak, &sm.u.in.k[16 * w + a_r][ks * 16 + a_c]);
        ldm4(aq, &sm.u.in.q[16 * w + a_r][ks * 16 + a_c]);
        ldm4(bq, &sm.u.in.q[16 * w + b_r][ks * 16 + b_c]);
        ldm4(bd, &sm.u.in.k[16 * w + b_r][ks * 16 + b_c]);
        mma(QQ[0], aq, bq[0], bq[1]);
        mma(QQ[1], aq, bq[2], bq[3]);
        mma(KD[0], ak, bd[0], bd[1]);
        mma(KD[1], ak, bd[2], bd[3]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {"""
NORM_OLD3 = """    const float scale = (float)p.scale;"""
NORM_NEW3 = """    // 1 / ||row|| of q and k: row 16 w + g + 8 h's squared norms are the diagonal elements
    // (h, 2 h + (g & 1)) of QQ and KD, held by the lane with t4 == g / 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const bool odd = g & 1;
        const float qq = odd ? QQ[h][2 * h + 1] : QQ[h][2 * h];
        const float kk = odd ? KD[h][2 * h + 1] : KD[h][2 * h];
        if (t4 == g >> 1) {
            sm.rq[16 * w + g + 8 * h] = p.l2norm ? rsqrtf(qq + 1e-6f) : 1.f;
            sm.rk[16 * w + g + 8 * h] = p.l2norm ? rsqrtf(kk + 1e-6f) : 1.f;
        }
    }
    const float scale = (float)p.scale;"""
EDITS["norm"] = [(NORM_OLD, NORM_NEW), (NORM_OLD2, NORM_NEW2), (NORM_OLD3, NORM_NEW3)]

"""The edit of cuda-chunk's prep kernel not kept, for ``python -m lab.prep_ab --edits`` this file
``--variants blkinv`` (sep, stm and norm, measured beside it, are in the tree since 92b0d0d;
their edits are in git history):

* blkinv: T's blocks below the diagonal in the block-inverse form, T_hi,lo = -T_hi A_hi,lo T_lo
  over halves of 32 rows: T_10 and T_32 (warps 1, 3), then X_rc = A_r0 T_0c + A_r1 T_1c (warp
  2 (r - 2) + c, its scratch), then T_rc = -(T_r2 X_2c + T_r3 X_3c): the same 16 products a
  (chunk, head), 6 on the longest warp's path instead of 9, three barriers as before.  The
  products' association changes (the last bits of T and M).  Slower at one head a CTA beside
  the norms' products (README.md).
"""
EDITS = {}

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

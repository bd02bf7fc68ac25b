"""Two edits of cuda-chunk's prep kernel, each writing the same workspace bit for bit
(``python -m lab.prep_ab --edits`` this file ``--variants skip,hoist,hoist+skip``):

* skip: warp w forms only the tiles of k k^T, q k^T, A and P at or left of its diagonal block
  (columns < 16 w + 16): the tiles right of it are never read (the diagonal inverse, the block
  substitution and M = P T read only the blocks at or below the diagonal), so warps 0-2 skip
  3/4, 1/2 and 1/4 of those products and of the decays' exponentials.
* hoist: the row factors (G_i, beta_i rk_i, scale rq_i) read once a thread, the column factors
  (G_j, rk_j) as one float2 pair a tile, instead of per element.
"""
SKIP_PRODUCTS = (
    """        for (int np = 0; np < 4; ++np) {
            unsigned bk[4];""",
    """        for (int np = 0; np < 4; ++np) {
            if (np > w) break;          // right of the warp's diagonal block: never read
            unsigned bk[4];""")
SKIP_AP = (
    """        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * w + g + 8 * h;""",
    """        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (nt > 2 * w + 1) break;  // right of the warp's diagonal block: never read
                const int i = 16 * w + g + 8 * h;""")
HOIST_OLD = """        float P[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * w + g + 8 * h;
                const float Gi = sm.G[i], bi = sm.beta[i] * sm.rk[i], si = scale * sm.rq[i];
                float av[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = 8 * nt + 2 * t4 + e;
                    // __expf (ex2.approx, as the Triton prep's exp): Gi - G_j <= 0, same
                    // errors against float64, ~1% of the kernel (lab/notebook/h200/
                    // prep_variants_2026-11-30/)
                    const float dec = __expf(i >= j ? Gi - sm.G[j] : 0.f) * sm.rk[j];"""
HOIST_NEW = """        float P[8][4];
        float Gr[2], br[2], sr[2];          // the thread's two rows' factors
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 16 * w + g + 8 * h;
            Gr[h] = sm.G[i];
            br[h] = sm.beta[i] * sm.rk[i];
            sr[h] = scale * sm.rq[i];
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * w + g + 8 * h;
                const float Gi = Gr[h], bi = br[h], si = sr[h];
                const float2 Gj2 = *reinterpret_cast<const float2*>(&sm.G[8 * nt + 2 * t4]);
                const float2 rk2 = *reinterpret_cast<const float2*>(&sm.rk[8 * nt + 2 * t4]);
                float av[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = 8 * nt + 2 * t4 + e;
                    const float Gj = e ? Gj2.y : Gj2.x, rkj = e ? rk2.y : rk2.x;
                    const float dec = __expf(i >= j ? Gi - Gj : 0.f) * rkj;"""
EDITS = {"skip": [SKIP_PRODUCTS, SKIP_AP], "hoist": [(HOIST_OLD, HOIST_NEW)]}

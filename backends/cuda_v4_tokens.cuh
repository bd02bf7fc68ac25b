// cuda-v4's multi-token pieces (included by cuda_v4.cu after its launch constants): the tokens'
// Gram entries from the block (GDN_CHUNK 1), every token's inputs, gates and slots loaded ahead
// of the state's arithmetic (GDN_CHUNK, GDN_AHEAD), and the head's per-token scalars from the
// block (GDN_HSC).
#pragma once

#if GDN_CHUNK
// The Gram entries of GDN_CHUNK, over the raw q and k rows of the T tokens: k_j.k_t at
// chunk_pair(j, t) (j <= t; j == t is k_t's squared norm), k_j.q_t at CH_KQ + chunk_pair(j, t),
// and with the L2 norm q_t.q_t at CH_QQ + t.
constexpr int CH_NP = T * (T + 1) / 2;
constexpr int CH_KQ = CH_NP;
constexpr int CH_QQ = 2 * CH_NP;
constexpr int CH_NENT = CH_QQ + (GDN_L2NORM ? T : 0);
__device__ __forceinline__ constexpr int chunk_pair(int j, int t) { return t * (t + 1) / 2 + j; }

// Every entry by a group of CH_GL lanes (K / CH_GL elements each, a 3-step butterfly); the
// groups of the block take the entries in turn.  Every lane runs every round (full-warp
// shuffles); a lane past the last entry computes entry 0 again and stores nothing.
constexpr int CH_GL = 8;
#if GDN_CHUNK == 1
__device__ __forceinline__ void chunk_gram(const uint4 (&cqk)[T][2][QK_CH], float* cgram) {
    constexpr int NG = 32 * W / CH_GL, KE = K / CH_GL;
    const int grp = (int)threadIdx.x / CH_GL, gl = (int)threadIdx.x % CH_GL;
#pragma unroll
    for (int r = 0; r < (CH_NENT + NG - 1) / NG; ++r) {
        const int e0 = grp + r * NG, e = e0 < CH_NENT ? e0 : 0;
        int x, xk, y, yk;                                  // rows (token, is k) of the pair
        if (e < CH_QQ) {
            const int f = e < CH_NP ? e : e - CH_NP;
            const int t = (int)((sqrtf(8.0f * f + 1.0f) - 1.0f) * 0.5f);
            x = f - t * (t + 1) / 2; xk = 1; y = t; yk = e < CH_NP;
        } else {
            x = y = e - CH_QQ; xk = yk = 0;
        }
        float xs[KE], ys[KE];
        ld_vec<IOD, KE>(&cqk[x][xk][0], gl * KE, xs);
        ld_vec<IOD, KE>(&cqk[y][yk][0], gl * KE, ys);
        float d = dot_sum<KE>([&](int i) { return xs[i] * ys[i]; });
#pragma unroll
        for (int off = CH_GL / 2; off > 0; off >>= 1) d += __shfl_xor_sync(FULL, d, off);
        if (gl == 0 && e0 < CH_NENT) cgram[e0] = d;
    }
}
#endif
#endif

// The inputs of every token that do not depend on the state (GDN_CHUNK, GDN_AHEAD): this
// lane's v of each row group (0 past V) and the raw gate inputs a + dt_bias and b ...
template <typename Params>
__device__ __forceinline__ void token_inputs(const Params& p, long long v0, long long v_t,
                                             long long a0, long long a_t, long long b0,
                                             long long b_t, const bool (&live)[RW], float dtb,
                                             float (&vr)[T][RW], float (&gd)[T], float (&beta)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int g = 0; g < RW; ++g)
            vr[t][g] = live[g] ? gdn_ld<IOD>(p.v, v0 + t * v_t + g * RPW) : 0.0f;
        if (!GDN_HSC) {                        // GDN_HSC: the block's head_scalars
            gd[t] = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
            beta[t] = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
        }
    }
}

// ... and from those the decay and beta gates, in place.
__device__ __forceinline__ void token_gates(float A_log, float (&gd)[T], float (&beta)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
        gd[t] = gdn_gate_decay<GDN_FASTGATE>(A_log, gd[t]);
        beta[t] = gdn_gate_beta<GDN_FASTGATE>(beta[t]);
    }
}

#if GDN_POOL >= 3
// Every token's slot idx[n, t] (per-token slots).
__device__ __forceinline__ void token_slots(const GdnParams& p, unsigned n, long long (&ts)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) ts[t] = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T + t);
}
#endif

#if GDN_HSC
// GDN_HSC: warp w computes tokens w, w + W, ...; a round takes HS_NG of them at once, one group
// of HS_GS lanes a token.  The sums do not depend on the launch shape (a PDL launch may double
// W, and must write what the plain launch writes): a token's q and k are always 16 chunks of
// HS_CE elements, each chunk's products summed as a balanced tree, the 16 chunk sums as the
// tree of a 16-lane butterfly; a lane of a smaller group holds 16 / HS_GS chunks and adds them
// in that tree's order before its group's butterfly.
__host__ __device__ constexpr int pow2_at_least(int x) { return x <= 1 ? 1 : 2 * pow2_at_least((x + 1) / 2); }
constexpr int HS_TPW = (T + W - 1) / W;
constexpr int HS_NG = pow2_at_least(HS_TPW) < 2 ? 2 : pow2_at_least(HS_TPW) < 8 ? pow2_at_least(HS_TPW) : 8;
constexpr int HS_GS = 32 / HS_NG;                  // 16, 8 or 4 lanes a token
constexpr int HS_RND = (HS_TPW + HS_NG - 1) / HS_NG;
constexpr int HS_CE = K / 16;                      // elements of a chunk
constexpr int HS_CPL = 16 / HS_GS;                 // chunks a lane
static_assert(HS_CE >= 1 && HS_CE * 16 == K, "GDN_HSC: K a multiple of 16");

// Token t's shared scalars in hs[t]: {g, beta, rk, g rk} and {scale g rq, scale (k.q) rq rk},
// rq and rk the inverse norms of the raw q and k (1 without the L2 norm), so a row's step is
// u = beta (v - g rk s.k), s += u rk k, o = scale g rq s.q + scale (k.q) rq rk u.  Ends with the
// block's barrier: every warp reads every token's scalars.
template <typename Params>
__device__ __forceinline__ void head_scalars(const Params& p, long long q0, long long q_t,
                                             long long k0, long long k_t, long long a0,
                                             long long a_t, long long b0, long long b_t,
                                             float A_log, float dtb, float scale, unsigned warp,
                                             unsigned lane, float4 (*hs)[2]) {
    const int grp = (int)lane / HS_GS, gl = (int)lane % HS_GS;
#pragma unroll
    for (int r = 0; r < HS_RND; ++r) {
        const int t0 = (r * HS_NG + grp) * W + (int)warp;
        const int t = t0 < T ? t0 : 0;             // past the last token: token 0, not stored
        const float xa = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
        const float xb = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
        // Chunk j of this lane is chunk gl + HS_GS * j of the row.
        float kq[HS_CPL], qq[HS_CPL], kk[HS_CPL];
#pragma unroll
        for (int j = 0; j < HS_CPL; ++j) {
            const long long e0 = (long long)(gl + HS_GS * j) * HS_CE;
            float qs[HS_CE], ks[HS_CE];
            if constexpr (GDN_VEC16) {             // the rows are 16-byte aligned
                ld_vec<IOD, HS_CE>(p.q, q0 + t * q_t + e0, qs);
                ld_vec<IOD, HS_CE>(p.k, k0 + t * k_t + e0, ks);
            } else {
#pragma unroll
                for (int e = 0; e < HS_CE; ++e) {
                    qs[e] = gdn_ld<IOD>(p.q, q0 + t * q_t + e0 + e);
                    ks[e] = gdn_ld<IOD>(p.k, k0 + t * k_t + e0 + e);
                }
            }
            kq[j] = tree_sum<0, HS_CE>([&](int i) { return ks[i] * qs[i]; });
            qq[j] = GDN_L2NORM ? tree_sum<0, HS_CE>([&](int i) { return qs[i] * qs[i]; }) : 0.0f;
            kk[j] = GDN_L2NORM ? tree_sum<0, HS_CE>([&](int i) { return ks[i] * ks[i]; }) : 0.0f;
        }
        // The 16-lane butterfly's levels 8 .. HS_GS within the lane, the rest across lanes.
#pragma unroll
        for (int h = HS_CPL / 2; h > 0; h >>= 1)
#pragma unroll
            for (int j = 0; j < h; ++j) {
                kq[j] += kq[j + h];
                qq[j] += qq[j + h];
                kk[j] += kk[j + h];
            }
#pragma unroll
        for (int off = HS_GS / 2; off > 0; off >>= 1) qk_shfl(kq[0], qq[0], kk[0], off);
        const float g = gdn_gate_decay<GDN_FASTGATE>(A_log, xa);
        const float beta = gdn_gate_beta<GDN_FASTGATE>(xb);
        const float rq = GDN_L2NORM ? rsqrtf(qq[0] + 1e-6f) : 1.0f;
        const float rk = GDN_L2NORM ? rsqrtf(kk[0] + 1e-6f) : 1.0f;
        if (gl == 0 && t0 < T) {
            hs[t][0] = make_float4(g, beta, rk, g * rk);
            hs[t][1] = make_float4(scale * g * rq, scale * (kq[0] * rq * rk), 0.0f, 0.0f);
        }
    }
    if constexpr (W > 1) __syncthreads();
    else __syncwarp();
}
#endif

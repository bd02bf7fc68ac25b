// cuda-chunk's sequential kernel: triton-chunk's chunk_state_kernel (backends/
// _triton_chunk_kernel.py) in CUDA, on the workspace the prep kernel wrote.  Per chunk of C = 64
// tokens, on a [ROWS, K] tile of the state S0 (K = 128):
//
//     X = S0 k^T,  R = v^T diag(beta) - X diag(beta rk e^G),  V'^T = R T^T,
//     O^T = (S0 q^T) diag(scale rq e^G) + R M^T,  S = e^G_last S0 + V'^T diag(rk e^(G_last-G)) k
//
// One CTA per (sequence, value head, tile of ROWS = 16 GDN_RG state rows); GDN_RG groups of four
// warps, a group per 16 rows.  The four warps of a group split each product's columns, not its
// rows, so a chunk's serial chain (X, then V'^T, then S) runs on all four tensor cores of the
// SM: warp c of a group owns the state's columns [32 c, 32 c + 32) (fp32, in its mma.sync
// accumulators for the whole sequence) and the chunk's tokens [16 c, 16 c + 16) of X, R, V'^T
// and O.  Three exchanges through shared memory a chunk, each behind one __syncthreads: the tile
// (as the A operand of X and S0 q^T), R (of V'^T and R M^T), V'^T (of the update).  A chunk's
// operands (k and q rows, the workspace rows, v, the factors) are shared by the CTA's warps and
// copied with cp.async one chunk ahead (GDN_STAGES buffers).
//
// Products: GDN_STORE3 1 ("bf16x3"): every fp32 operand split into bf16 hi + lo, hi hi + hi lo
// + lo hi (k and q raw: two products); 0 ("bf16"): rounded to bf16, one product.
//
// -D constants: GDN_RG, GDN_STAGES, GDN_STORE3, GDN_POOL (0 dense, 1 read slots written, 2
// separate write slots), GDN_STATE0 (0: no state, zeros), GDN_HAS_INIT, GDN_CKPT, GDN_PDL,
// GDN_S_DT, GDN_NS_DT, GDN_C_DT (state, new state, checkpoint dtypes: 0 fp32, 1 bf16), GDN_SMEM
// (the dynamic shared memory the host sizes, checked against sizeof(ChainSmem)).

#define C_ 64
#define K_ 128
#define KP 136          // a bf16 row of K plus 8: ldmatrix rows on distinct banks
#define CP 72           // a bf16 row of C plus 8

#include "gdn_chunk_mma.cuh"

#define ROWS (16 * GDN_RG)
#define NTHR (128 * GDN_RG)
#define NP (GDN_STORE3 ? 2 : 1)
#define MW (2 * NP * C_)    // a token's workspace row: T^T (hi, lo), then M^T (hi, lo)
#define MWP (MW + 8)
#define VP (ROWS + 8)

// by value, every field 8 bytes (backends/_cuda_chunk_chain.py packs it)
struct ChainParams {
    const bf16_t* q; const bf16_t* k; const bf16_t* v; const void* cu; const bf16_t* mats;
    const float* vecs; bf16_t* out; const void* state; void* new_state; const void* idx;
    const void* new_idx; const unsigned char* has_init; void* ckpt;
    long long N, T_all, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h;
    long long ss_n, ss_h, ss_v, ss_k, sn_n, sn_h, sn_v, sn_k, sc_n, sc_h, sc_v, sc_k;
    long long P, PN, null_slot, every, H, HV, V, cu64, idx64, nidx64;
};

struct alignas(16) Stage {
    bf16_t k[C_][KP];
    bf16_t q[C_][KP];
    bf16_t m[C_][MWP];
    bf16_t v[C_][VP];           // the chunk's v rows of the tile's state rows
    float f[4][C_];             // beta, beta rk e^G, scale rq e^G, rk e^(G_last - G)
    float glast[4];             // e^G_last
};
struct alignas(16) ChainSmem {
    Stage st[GDN_STAGES];
    bf16_t h[NP][ROWS][KP];     // the tile, as the A operand of X and S0 q^T
    bf16_t r[NP][ROWS][CP];     // R
    bf16_t vn[NP][ROWS][CP];    // V'^T diag(rk e^(G_last - G))
    unsigned long long ckrow;
};
static_assert(sizeof(ChainSmem) == GDN_SMEM, "GDN_SMEM: backends/_cuda_chunk_chain.py smem_bytes");

__device__ __forceinline__ long long ld_index(const void* p, long long i, long long is64) {
    return is64 ? static_cast<const long long*>(p)[i] : static_cast<const int*>(p)[i];
}
__device__ __forceinline__ void held(long long& bos, long long& eos, long long T) {
    bos = bos < 0 ? 0 : (bos > T ? T : bos);
    eos = eos < bos ? bos : (eos > T ? T : eos);
}

// chunk [t0, min(t0 + C, eos)) of the operands into stage buffer ``st`` (zeros past eos)
__device__ __forceinline__ void load_chunk(Stage& st, const ChainParams& p, long long t0,
                                           long long eos, int i_h, int i_hv, int row0, int tid) {
    const long long rem = eos - t0;
    const long long HV = p.HV;
    for (int i = tid; i < C_ * 16; i += NTHR) {
        const int r = i >> 4, c = (i & 15) * 8;
        const bool ok = r < rem;
        const long long t = t0 + (ok ? r : 0);
        cp16(&st.k[r][c], p.k + t * p.sk_t + i_h * p.sk_h + c, ok);
        cp16(&st.q[r][c], p.q + t * p.sq_t + i_h * p.sq_h + c, ok);
    }
    constexpr int MP = MW / 8;
    for (int i = tid; i < C_ * MP; i += NTHR) {
        const int r = i / MP, c = (i % MP) * 8;
        const bool ok = r < rem;
        const long long t = t0 + (ok ? r : 0);
        cp16(&st.m[r][c], p.mats + (t * HV + i_hv) * MW + c, ok);
    }
    constexpr int VPC = ROWS / 8;
    for (int i = tid; i < C_ * VPC; i += NTHR) {
        const int r = i / VPC, c = (i % VPC) * 8;
        const bool ok = r < rem;
        const long long t = t0 + (ok ? r : 0);
        cp16(&st.v[r][c], p.v + t * p.sv_t + i_hv * p.sv_h + row0 + c, ok);
    }
    for (int i = tid; i < 4 * C_; i += NTHR) {
        const int f = i / C_, r = i % C_;
        const bool ok = r < rem;
        cp4(&st.f[f][r], p.vecs + (i_hv * 5 + f) * p.T_all + t0 + (ok ? r : 0), ok);
    }
    if (tid == 0) cp4(&st.glast[0], p.vecs + (i_hv * 5 + 4) * p.T_all + t0, rem > 0);
}

// a warp's C fragments (rows g, g + 8 of its 16; columns c0 + 8 nt + 2 t4, + 1) into ``dst``
// [NP][ROWS][ld] as bf16 (hi, lo), each times ``s[nt][0 or 1]`` (a token's factor) or 1
template <int NT, int LDD>
__device__ __forceinline__ void put_frags(bf16_t (*dst)[ROWS][LDD], const float (&d)[NT][4],
                                          int row, int c0, int t4) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int rr = row + 8 * hh, cc = c0 + 8 * nt + 2 * t4;
            const float a = d[nt][2 * hh], b = d[nt][2 * hh + 1];
#if GDN_STORE3
            unsigned hi, lo;
            split2(a, b, hi, lo);
            *reinterpret_cast<unsigned*>(&dst[0][rr][cc]) = hi;
            *reinterpret_cast<unsigned*>(&dst[1][rr][cc]) = lo;
#else
            *reinterpret_cast<unsigned*>(&dst[0][rr][cc]) = gdn_pack2<GDN_BF16>(a, b);
#endif
        }
}

// the tile fragments' global offsets: rows row0 + g (+ 8), columns c0 + 8 nt + 2 t4 (+ 1)
template <int DT>
__device__ __forceinline__ void load_tile(float (&h)[4][4], const void* src, long long base,
                                          long long s_v, long long s_k, int row, int c0, int t4,
                                          bool ok) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            h[nt][i] = ok ? gdn_ld<DT>(src, base + (row + 8 * (i >> 1)) * s_v
                                                + (c0 + 8 * nt + 2 * t4 + (i & 1)) * s_k)
                          : 0.f;
}
template <int DT>
__device__ __forceinline__ void store_tile(const float (&h)[4][4], void* dst, long long base,
                                           long long s_v, long long s_k, int row, int c0,
                                           int t4) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            gdn_st<DT>(dst, base + (row + 8 * (i >> 1)) * s_v
                                 + (c0 + 8 * nt + 2 * t4 + (i & 1)) * s_k, h[nt][i]);
}

extern "C" __global__ void __launch_bounds__(NTHR, 1) gdn_chunk_chain(const ChainParams p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    ChainSmem& sm = *reinterpret_cast<ChainSmem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int rg = w >> 2, wc = w & 3;          // row group, column quarter
#if GDN_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");   // the prep kernel's workspace
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    const int HV = (int)p.HV, NV = (int)(p.V / ROWS);
    const int i_v = (int)(blockIdx.x % NV);
    const long long i_nh = blockIdx.x / NV;
    const long long i_n = i_nh / HV;
    const int i_hv = (int)(i_nh % HV);
    const int i_h = i_hv / (HV / (int)p.H);
    long long bos = ld_index(p.cu, i_n, p.cu64), eos = ld_index(p.cu, i_n + 1, p.cu64);
    held(bos, eos, p.T_all);
    long long slot_r = i_n, slot_w = i_n;
    bool rd = true, wr = true;
#if GDN_POOL
    {
        const long long r = ld_index(p.idx, i_n, p.idx64);
        const long long wv = GDN_POOL == 2 ? ld_index(p.new_idx, i_n, p.nidx64) : r;
        rd = r >= 0 && r < p.P && r != p.null_slot;
        wr = rd && wv >= 0 && wv < p.PN && wv != p.null_slot;
        slot_r = rd ? r : 0;
        slot_w = wr ? wv : 0;
    }
#endif
    bool init = rd && GDN_STATE0;
#if GDN_HAS_INIT
    init = init && p.has_init[i_n] != 0;
#endif
    const int row0 = i_v * ROWS;                // the tile's first state row
    const int hrow = rg * 16 + g;               // this thread's fragment rows: hrow, hrow + 8
    const int kc0 = 32 * wc, tc0 = 16 * wc;     // its state columns, its chunk tokens
    float h[4][4];
#if GDN_STATE0
    load_tile<GDN_S_DT>(h, p.state, slot_r * p.ss_n + i_hv * p.ss_h, p.ss_v, p.ss_k,
                        row0 + hrow, kc0, t4, init);
#else
    load_tile<GDN_S_DT>(h, p.state, 0, 0, 0, 0, 0, t4, false);
#endif
    const long long n_chunks = (eos - bos + C_ - 1) / C_;
#if GDN_CKPT
    // the sequence's first checkpoint row: the sum of L_i // every over i < i_n
    if (tid == 0) sm.ckrow = 0;
    __syncthreads();
    {
        unsigned long long part = 0;
        for (long long i = tid; i < i_n; i += NTHR) {
            long long b0 = ld_index(p.cu, i, p.cu64), e0 = ld_index(p.cu, i + 1, p.cu64);
            held(b0, e0, p.T_all);
            part += (unsigned long long)((e0 - b0) / p.every);
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) part += __shfl_xor_sync(0xffffffffu, part, d);
        if (lane == 0 && part) atomicAdd(&sm.ckrow, part);
    }
    __syncthreads();
    const long long ck0 = (long long)sm.ckrow;
#endif
    put_frags<4, KP>(sm.h, h, hrow, kc0, t4);
#pragma unroll
    for (int s = 0; s < GDN_STAGES - 1; ++s) {
        if (s < n_chunks) load_chunk(sm.st[s], p, bos + s * C_, eos, i_h, i_hv, row0, tid);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    // lane addresses of ldmatrix: A (row-major 16 x 16 at rows r, columns c), B from rows n
    // (non-transposed: rows are the n index) and from rows k (transposed)
    const int a_r = (lane & 7) + 8 * ((lane >> 3) & 1), a_c = 8 * (lane >> 4);
    const int bn_r = (lane & 7) + 8 * (lane >> 4), bn_c = 8 * ((lane >> 3) & 1);
    const int bk_r = (lane & 7) + 8 * ((lane >> 3) & 1), bk_c = 8 * (lane >> 4);
    for (long long j = 0; j < n_chunks; ++j) {
        asm volatile("cp.async.wait_group %0;" :: "n"(GDN_STAGES - 2) : "memory");
        __syncthreads();                        // chunk j's operands, the tile in sm.h
        {
            const long long jn = j + GDN_STAGES - 1;
            if (jn < n_chunks)
                load_chunk(sm.st[jn % GDN_STAGES], p, bos + jn * C_, eos, i_h, i_hv, row0, tid);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        const Stage& st = sm.st[j % GDN_STAGES];
        const long long t0 = bos + j * C_;
        // X = S0 k^T and Y = S0 q^T at this warp's 16 tokens (two n-tiles), over K
        float x[2][4] = {}, y[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < K_ / 16; ++ks) {
            unsigned ah[4], bk[4], bq[4];
            ldm4(ah, &sm.h[0][rg * 16 + a_r][ks * 16 + a_c]);
            ldm4(bk, &st.k[tc0 + bn_r][ks * 16 + bn_c]);
            ldm4(bq, &st.q[tc0 + bn_r][ks * 16 + bn_c]);
#if GDN_STORE3
            unsigned al[4];
            ldm4(al, &sm.h[1][rg * 16 + a_r][ks * 16 + a_c]);
            mma(x[0], al, bk[0], bk[1]); mma(x[1], al, bk[2], bk[3]);
            mma(y[0], al, bq[0], bq[1]); mma(y[1], al, bq[2], bq[3]);
#endif
            mma(x[0], ah, bk[0], bk[1]); mma(x[1], ah, bk[2], bk[3]);
            mma(y[0], ah, bq[0], bq[1]); mma(y[1], ah, bq[2], bq[3]);
        }
        // R = v^T diag(beta) - X diag(beta rk e^G); O^T starts as Y diag(scale rq e^G)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int tok = tc0 + 8 * nt + 2 * t4 + (i & 1);
                const float vv = gdn_bf16_to_f32(st.v[tok][hrow + 8 * (i >> 1)]);
                x[nt][i] = vv * st.f[0][tok] - x[nt][i] * st.f[1][tok];
                y[nt][i] *= st.f[2][tok];
            }
        put_frags<2, CP>(sm.r, x, hrow, tc0, t4);
        __syncthreads();                        // R complete
        // V'^T = R T^T and O^T += R M^T at this warp's 16 tokens, over the chunk's tokens
        float vn[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < C_ / 16; ++ks) {
            unsigned rh[4], th[4], mh[4];
            ldm4(rh, &sm.r[0][rg * 16 + a_r][ks * 16 + a_c]);
            const bf16_t* mrow = &st.m[ks * 16 + bk_r][tc0 + bk_c];
            ldm4t(th, mrow);
            ldm4t(mh, mrow + NP * C_);
#if GDN_STORE3
            unsigned rl[4], tl[4], ml[4];
            ldm4(rl, &sm.r[1][rg * 16 + a_r][ks * 16 + a_c]);
            ldm4t(tl, mrow + C_);
            ldm4t(ml, mrow + 3 * C_);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                mma(vn[nt], rl, th[2 * nt], th[2 * nt + 1]);
                mma(vn[nt], rh, tl[2 * nt], tl[2 * nt + 1]);
                mma(y[nt], rl, mh[2 * nt], mh[2 * nt + 1]);
                mma(y[nt], rh, ml[2 * nt], ml[2 * nt + 1]);
            }
#endif
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                mma(vn[nt], rh, th[2 * nt], th[2 * nt + 1]);
                mma(y[nt], rh, mh[2 * nt], mh[2 * nt + 1]);
            }
        }
        // the outputs (zeros for a padded sequence), V'^T diag(rk e^(G_last - G)) exchanged
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int tok = tc0 + 8 * nt + 2 * t4 + (i & 1);
                if (t0 + tok < eos)
                    p.out[(t0 + tok) * p.so_t + i_hv * p.so_h + row0 + hrow + 8 * (i >> 1)] =
                        gdn_f32_to_bf16(rd ? y[nt][i] : 0.f);
                vn[nt][i] *= st.f[3][tok];
            }
        put_frags<2, CP>(sm.vn, vn, hrow, tc0, t4);
        __syncthreads();                        // V'^T complete
        // S = e^G_last S0 + V'^T diag(..) k at this warp's 32 state columns, over the tokens
        const float gl = st.glast[0];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) h[nt][i] *= gl;
#pragma unroll
        for (int ks = 0; ks < C_ / 16; ++ks) {
            unsigned vh[4], b01[4], b23[4];
            ldm4(vh, &sm.vn[0][rg * 16 + a_r][ks * 16 + a_c]);
            ldm4t(b01, &st.k[ks * 16 + bk_r][kc0 + bk_c]);
            ldm4t(b23, &st.k[ks * 16 + bk_r][kc0 + 16 + bk_c]);
#if GDN_STORE3
            unsigned vl[4];
            ldm4(vl, &sm.vn[1][rg * 16 + a_r][ks * 16 + a_c]);
            mma(h[0], vl, b01[0], b01[1]); mma(h[1], vl, b01[2], b01[3]);
            mma(h[2], vl, b23[0], b23[1]); mma(h[3], vl, b23[2], b23[3]);
#endif
            mma(h[0], vh, b01[0], b01[1]); mma(h[1], vh, b01[2], b01[3]);
            mma(h[2], vh, b23[0], b23[1]); mma(h[3], vh, b23[2], b23[3]);
        }
        put_frags<4, KP>(sm.h, h, hrow, kc0, t4);
#if GDN_CKPT
        {
            const long long end = (j + 1) * C_;
            const bool due = end % p.every == 0 && ck0 + end / p.every <= p.T_all / p.every
                             && end <= eos - bos && rd;
            if (due)
                store_tile<GDN_C_DT>(h, p.ckpt, (ck0 + end / p.every - 1) * p.sc_n
                                     + i_hv * p.sc_h, p.sc_v, p.sc_k, row0 + hrow, kc0, t4);
        }
#endif
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (wr)
        store_tile<GDN_NS_DT>(h, p.new_state, slot_w * p.sn_n + i_hv * p.sn_h, p.sn_v, p.sn_k,
                              row0 + hrow, kc0, t4);
}

// A CUDA form of triton-chunk's sequential kernel (lab prototype): the same math on the same
// workspace (the prep kernel's T^T, M^T rows and per-token factors), with every product a
// warp-level mma.sync whose fragments stay in the layouts they are used in.
//
// One CTA per (sequence, value head, tile of BV = 16 RG state rows); WK warps (4 or 8) a row group.
// Per chunk of C = 64 tokens, for the row group's [16, K] state tile h (fp32 in registers:
// warp w owns K columns [32w, 32w + 32); its bf16 hi/lo copy in shared memory for the others):
//   1. X = h k^T, Y = h q^T            warp w: token columns [16w, 16w + 16), all of K
//   2. R = v^T diag(beta) - X diag(bk) (same columns), hi/lo into shared memory
//   3. Vn = R T^T, O = Y diag(fq) + R M^T   warp w: token columns [16w, 16w + 16), R whole
//   4. h = g_last h + (Vn diag(fk)) k   warp w: K columns [32w, 32w + 32), Vn whole
// Three barriers a chunk; chunk j+1's operands arrive by cp.async while chunk j computes.
// PREC3 1: every fp32 operand split into bf16 hi + lo (three products, two with a raw bf16
// operand), T^T and M^T stored as hi/lo pairs; 0: one bf16 product each (triton-chunk's "bf16").

#define C_ 64
#define K_ 128
#define KP 136          // padded row (bf16 elements) of the q, k and h tiles: conflict-free ldmatrix
#define RP 72           // padded row of R and Vn [16, 64]

typedef unsigned short bf16_t;

__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
#ifdef ABL_NOMMA   // timing ablation: no tensor-core work (the result is garbage)
    d[0] += __uint_as_float((a[0] ^ b0) & 0x3f800000u);
    return;
#endif
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldm4(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldm4t(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldm2(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldm2t(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}

// B fragments of n-tiles (1 or 2) from a [k][n] row-major tile (lane's row address ``p``)
__device__ __forceinline__ void ldmB(unsigned (&r)[4], const bf16_t* p, int n_tiles) {
    if (n_tiles == 2) ldm4t(r, p);
    else ldm2t(r, p);
}

__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void cp4(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 4 : 0));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// (a, b) as bf16x2, a in the low half, rounded to nearest.
__device__ __forceinline__ unsigned pack2(float a, float b) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
__device__ __forceinline__ float lo_f(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(((unsigned)x) << 16); }

// The pair (a, b) as bf16 hi and lo parts.
__device__ __forceinline__ void split2(float a, float b, unsigned& hi, unsigned& lo) {
    hi = pack2(a, b);
    lo = pack2(a - lo_f(hi), b - hi_f(hi));
}

template <int RG, int PREC3>
struct alignas(16) Smem {
    static constexpr int BV = 16 * RG;
    static constexpr int MW = PREC3 ? 4 * C_ : 2 * C_;      // a token's T^T, M^T row (bf16)
    static constexpr int MP = MW + 8;
    struct alignas(16) Stage {
        bf16_t k[C_][KP];
        bf16_t q[C_][KP];
        bf16_t m[C_][MP];
        bf16_t v[C_][BV];
        float vec[5][C_];       // beta, bk, fq, fk; [4][0]: e^G_last
    };
    Stage st[2];
    bf16_t h[RG][2][16][KP];    // hi, lo
    bf16_t r[RG][2][16][RP];
    bf16_t vn[RG][2][16][RP];
    bf16_t o[RG][C_][16];
};

// A thread's share of a chunk's copies: rows r0 + i * step of each tensor.  Its global pointers
// are made once and advanced a chunk at a time; a row past the sequence's end is zero-filled
// (its source then the sequence's first row, never read).
template <int RG, int WK, int PREC3>
struct Loader {
    typedef Smem<RG, PREC3> S;
    static constexpr int NT = 32 * WK * RG;
    static constexpr int QS = NT / 16;                  // q, k: 16 pieces of 16 B a row
    static constexpr int MPC = S::MW / 8, MS = NT / MPC;
    static constexpr int VPC = S::BV / 8, VS = NT / VPC;
    static constexpr int ES = NT / C_;                  // vec rows: one token a thread
    const bf16_t *q, *k, *m, *v, *q0, *k0, *m0, *v0;
    const float *e, *e0, *eg;
    long long qs, ks, ms, vs, es;                       // one step of rows (vecs: of vectors)
    long long qa, ka, ma, va;                           // one chunk
    int rq, rm, rv, re, cq, cm, cv, we;
    __device__ Loader(const bf16_t* q_, const bf16_t* k_, const bf16_t* m_, const bf16_t* v_,
                      const float* vecs, long long bos, long long T_all, int i_h, int i_hv,
                      int HV, int v_0, long long sq_t, long long sq_h, long long sk_t,
                      long long sk_h, long long sv_t, long long sv_h, int tid) {
        rq = tid / 16; cq = (tid % 16) * 8;
        rm = tid / MPC; cm = (tid % MPC) * 8;
        rv = tid / VPC; cv = (tid % VPC) * 8;
        re = tid % C_; we = tid / C_;
        const long long m_t = (long long)HV * S::MW;
        q0 = q_ + bos * sq_t + i_h * sq_h;
        k0 = k_ + bos * sk_t + i_h * sk_h;
        m0 = m_ + bos * m_t + i_hv * S::MW;
        v0 = v_ + bos * sv_t + i_hv * sv_h + v_0;
        e0 = vecs + (long long)i_hv * 5 * T_all + bos;
        q = q0 + rq * sq_t + cq;
        k = k0 + rq * sk_t + cq;
        m = m0 + rm * m_t + cm;
        v = v0 + rv * sv_t + cv;
        e = e0 + we * T_all + re;
        eg = e0 + 4 * T_all;
        qs = QS * sq_t; ks = QS * sk_t; ms = MS * m_t; vs = VS * sv_t; es = ES * T_all;
        qa = C_ * sq_t; ka = C_ * sk_t; ma = C_ * m_t; va = C_ * sv_t;
    }
    // the next chunk (rem of its tokens real) into s
    __device__ __forceinline__ void load(typename S::Stage& s, int rem) {
#pragma unroll
        for (int i = 0; i < C_ / QS; ++i) {
            const int r = rq + i * QS;
            const bool ok = r < rem;
            cp16(&s.q[r][cq], ok ? q + i * qs : q0, ok);
            cp16(&s.k[r][cq], ok ? k + i * ks : k0, ok);
        }
#pragma unroll
        for (int i = 0; i < C_ / MS; ++i) {
            const int r = rm + i * MS;
            const bool ok = r < rem;
            cp16(&s.m[r][cm], ok ? m + i * ms : m0, ok);
        }
#pragma unroll
        for (int i = 0; i < (C_ + VS - 1) / VS; ++i) {
            const int r = rv + i * VS;
            if (r < C_) {
                const bool ok = r < rem;
                cp16(&s.v[r][cv], ok ? v + i * vs : v0, ok);
            }
        }
        const bool eok = re < rem;
#pragma unroll
        for (int i = 0; i < (4 + ES - 1) / ES; ++i) {
            const int w = we + i * ES;
            if (w < 4)
                cp4(&s.vec[w][re], eok ? e + i * es : e0, eok);
        }
        if (re == 0 && we == 0)
            cp4(&s.vec[4][0], eg, true);
        q += qa; k += ka; m += ma; v += va; e += C_; eg += C_;
    }
};

template <int RG, int WK, int PREC3, int STATE_BF16>
__global__ void __launch_bounds__(32 * WK * RG, 1)
chunk_state_cuda(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                 const bf16_t* __restrict__ v, const long long* __restrict__ cu_seqlens,
                 const bf16_t* __restrict__ mats, const float* __restrict__ vecs,
                 bf16_t* __restrict__ out, const void* __restrict__ state,
                 void* __restrict__ new_state, long long T_all, int N, int H, int HV, int V,
                 long long sq_t, long long sq_h, long long sk_t, long long sk_h,
                 long long sv_t, long long sv_h, long long so_t, long long so_h,
                 long long ss_n, long long ss_h, long long ss_v, long long ss_k,
                 long long sn_n, long long sn_h, long long sn_v, long long sn_k) {
    typedef Smem<RG, PREC3> S;
    constexpr int BV = S::BV;
    constexpr int TC = C_ / WK, NT1 = TC / 8;        // phases 1-3: token columns a warp
    constexpr int KC = K_ / WK, NT4 = KC / 8;        // phase 4: K columns a warp
    constexpr int NTH = 32 * WK;                     // threads a row group
    extern __shared__ __align__(16) unsigned char smem_raw[];
    S& sm = *reinterpret_cast<S*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int w = warp % WK, rg = warp / WK;
    const int g = lane >> 2, t4 = lane & 3;
    const int NV = V / BV;
    const long long pid = blockIdx.x;
    const int i_v = (int)(pid % NV);
    const long long i_nh = pid / NV;
    const int i_n = (int)(i_nh / HV), i_hv = (int)(i_nh % HV);
    const int i_h = i_hv / (HV / H);
    const long long bos = cu_seqlens[i_n], eos = cu_seqlens[i_n + 1];
    const int v0 = i_v * BV;
    const int row_base = v0 + rg * 16;

    // The warp's K columns of the tile: hs[nt][e] at row g + 8 (e / 2), column
    // KC w + 8 nt + 2 t4 + (e % 2).
    float hs[NT4][4];
#pragma unroll
    for (int nt = 0; nt < NT4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float x = 0.f;
            if (state != nullptr) {
                const long long off = i_n * ss_n + i_hv * ss_h
                    + (long long)(row_base + g + 8 * (e >> 1)) * ss_v
                    + (long long)(KC * w + 8 * nt + 2 * t4 + (e & 1)) * ss_k;
                x = STATE_BF16 ? bf2f(static_cast<const bf16_t*>(state)[off])
                               : static_cast<const float*>(state)[off];
            }
            hs[nt][e] = x;
        }
    const long long n_chunks = (eos - bos + C_ - 1) / C_;
    Loader<RG, WK, PREC3> ld(q, k, mats, v, vecs, bos, T_all, i_h, i_hv, HV, v0, sq_t, sq_h,
                             sk_t, sk_h, sv_t, sv_h, tid);
    auto remaining = [&](long long j) {
        const long long r = eos - bos - j * C_;
        return (int)(r < C_ ? r : C_);
    };
    if (n_chunks > 0)
        ld.load(sm.st[0], remaining(0));
    cp_commit();

    // the tile's hi/lo copy for phase 1
    auto put_h = [&]() {
#pragma unroll
        for (int nt = 0; nt < NT4; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = g + 8 * half, c = KC * w + 8 * nt + 2 * t4;
                unsigned hi, lo;
                if (PREC3) {
                    split2(hs[nt][2 * half], hs[nt][2 * half + 1], hi, lo);
                    *reinterpret_cast<unsigned*>(&sm.h[rg][1][r][c]) = lo;
                } else {
                    hi = pack2(hs[nt][2 * half], hs[nt][2 * half + 1]);
                }
                *reinterpret_cast<unsigned*>(&sm.h[rg][0][r][c]) = hi;
            }
    };
    put_h();
    cp_wait_all();
    __syncthreads();

    // ldmatrix lane offsets: A tiles and trans-B tiles (row, col); non-trans B tiles of two
    // n-tiles (row, col); x2 loads use lanes 0-15's addresses of the A pattern.
    const int a_r = (lane & 7) + 8 * ((lane >> 3) & 1), a_c = 8 * (lane >> 4);
    const int b_r = (lane & 7) + 8 * (lane >> 4), b_c = 8 * ((lane >> 3) & 1);
    constexpr int OFF_T = 0, OFF_M = PREC3 ? 2 * C_ : C_;

    for (long long j = 0; j < n_chunks; ++j) {
        const int stg = (int)(j & 1);
        const long long t0 = bos + j * C_;
        const int rem = remaining(j);
#ifdef ABL_NOLOAD   // timing ablation: chunk 0's operands reused for every chunk
        if (false)
#else
        if (j + 1 < n_chunks)
#endif
            ld.load(sm.st[stg ^ 1], remaining(j + 1));
        cp_commit();
#ifdef ABL_NOLOAD
        typename S::Stage& s = sm.st[0];
#else
        typename S::Stage& s = sm.st[stg];
#endif

        // 1. X = h k^T, Y = h q^T at token columns [TC w, TC w + TC)
        float X[NT1][4] = {}, Y[NT1][4] = {};
#pragma unroll
        for (int ks = 0; ks < K_ / 16; ++ks) {
            unsigned ahi[4], alo[4], bk[4], bq[4];
            ldm4(ahi, &sm.h[rg][0][a_r][ks * 16 + a_c]);
            if (PREC3) ldm4(alo, &sm.h[rg][1][a_r][ks * 16 + a_c]);
            if (NT1 == 2) {
                ldm4(bk, &s.k[TC * w + b_r][ks * 16 + b_c]);
                ldm4(bq, &s.q[TC * w + b_r][ks * 16 + b_c]);
            } else {
                ldm2(bk, &s.k[TC * w + (lane & 7)][ks * 16 + b_c]);
                ldm2(bq, &s.q[TC * w + (lane & 7)][ks * 16 + b_c]);
            }
#pragma unroll
            for (int nt = 0; nt < NT1; ++nt) {
                if (PREC3) {
                    mma(X[nt], alo, bk[2 * nt], bk[2 * nt + 1]);
                    mma(Y[nt], alo, bq[2 * nt], bq[2 * nt + 1]);
                }
                mma(X[nt], ahi, bk[2 * nt], bk[2 * nt + 1]);
                mma(Y[nt], ahi, bq[2 * nt], bq[2 * nt + 1]);
            }
        }
        // 2. R = v^T diag(beta) - X diag(bk); O = Y diag(fq)
        float O[NT1][4];
#pragma unroll
        for (int nt = 0; nt < NT1; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = g + 8 * half, c = TC * w + 8 * nt + 2 * t4;
                const float2 beta = *reinterpret_cast<const float2*>(&s.vec[0][c]);
                const float2 bk = *reinterpret_cast<const float2*>(&s.vec[1][c]);
                const float2 fq = *reinterpret_cast<const float2*>(&s.vec[2][c]);
                const float r0 = bf2f(s.v[c][rg * 16 + r]) * beta.x - X[nt][2 * half] * bk.x;
                const float r1 = bf2f(s.v[c + 1][rg * 16 + r]) * beta.y
                                 - X[nt][2 * half + 1] * bk.y;
                O[nt][2 * half] = Y[nt][2 * half] * fq.x;
                O[nt][2 * half + 1] = Y[nt][2 * half + 1] * fq.y;
                unsigned hi, lo;
                if (PREC3) {
                    split2(r0, r1, hi, lo);
                    *reinterpret_cast<unsigned*>(&sm.r[rg][1][r][c]) = lo;
                } else {
                    hi = pack2(r0, r1);
                }
                *reinterpret_cast<unsigned*>(&sm.r[rg][0][r][c]) = hi;
            }
        __syncthreads();

        // 3. Vn = R T^T, O += R M^T at token columns [TC w, TC w + TC)
        float Vn[NT1][4] = {};
#pragma unroll
        for (int ks = 0; ks < C_ / 16; ++ks) {
            unsigned rhi[4], rlo[4], th[4], mh[4], tl[4], ml[4];
            ldm4(rhi, &sm.r[rg][0][a_r][ks * 16 + a_c]);
            if (PREC3) ldm4(rlo, &sm.r[rg][1][a_r][ks * 16 + a_c]);
            const bf16_t* row = &s.m[ks * 16 + a_r][TC * w + (NT1 == 2 ? a_c : 0)];
            ldmB(th, row + OFF_T, NT1);
            ldmB(mh, row + OFF_M, NT1);
            if (PREC3) {
                ldmB(tl, row + OFF_T + C_, NT1);
                ldmB(ml, row + OFF_M + C_, NT1);
            }
#pragma unroll
            for (int nt = 0; nt < NT1; ++nt) {
                if (PREC3) {
                    mma(Vn[nt], rlo, th[2 * nt], th[2 * nt + 1]);
                    mma(O[nt], rlo, mh[2 * nt], mh[2 * nt + 1]);
                    mma(Vn[nt], rhi, tl[2 * nt], tl[2 * nt + 1]);
                    mma(O[nt], rhi, ml[2 * nt], ml[2 * nt + 1]);
                }
                mma(Vn[nt], rhi, th[2 * nt], th[2 * nt + 1]);
                mma(O[nt], rhi, mh[2 * nt], mh[2 * nt + 1]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT1; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = g + 8 * half, c = TC * w + 8 * nt + 2 * t4;
                const float2 fk = *reinterpret_cast<const float2*>(&s.vec[3][c]);
                const float u0 = Vn[nt][2 * half] * fk.x;
                const float u1 = Vn[nt][2 * half + 1] * fk.y;
                unsigned hi, lo;
                if (PREC3) {
                    split2(u0, u1, hi, lo);
                    *reinterpret_cast<unsigned*>(&sm.vn[rg][1][r][c]) = lo;
                } else {
                    hi = pack2(u0, u1);
                }
                *reinterpret_cast<unsigned*>(&sm.vn[rg][0][r][c]) = hi;
                const unsigned o2 = pack2(O[nt][2 * half], O[nt][2 * half + 1]);
                sm.o[rg][c][r] = (bf16_t)(o2 & 0xffffu);
                sm.o[rg][c + 1][r] = (bf16_t)(o2 >> 16);
            }
        __syncthreads();

        // 4. h = g_last h + (Vn diag(fk)) k at K columns [KC w, KC w + KC)
        float U[NT4][4] = {};
#pragma unroll
        for (int ks = 0; ks < C_ / 16; ++ks) {
            unsigned vhi[4], vlo[4];
            ldm4(vhi, &sm.vn[rg][0][a_r][ks * 16 + a_c]);
            if (PREC3) ldm4(vlo, &sm.vn[rg][1][a_r][ks * 16 + a_c]);
#pragma unroll
            for (int p = 0; p < NT4 / 2; ++p) {
                unsigned b[4];
                ldm4t(b, &s.k[ks * 16 + a_r][KC * w + 16 * p + a_c]);
                if (PREC3) {
                    mma(U[2 * p], vlo, b[0], b[1]);
                    mma(U[2 * p + 1], vlo, b[2], b[3]);
                }
                mma(U[2 * p], vhi, b[0], b[1]);
                mma(U[2 * p + 1], vhi, b[2], b[3]);
            }
        }
        const float gl = s.vec[4][0];
#pragma unroll
        for (int nt = 0; nt < NT4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                hs[nt][e] = gl * hs[nt][e] + U[nt][e];
        put_h();
        // the chunk's outputs: 16 B (8 rows of one token) a thread
        for (int i = tid - rg * NTH; i < C_ * 2; i += NTH) {
            const int row = i >> 1, c = (i & 1) * 8;
            if (row < rem)
                *reinterpret_cast<uint4*>(out + (t0 + row) * so_t + i_hv * so_h + row_base + c) =
                    *reinterpret_cast<const uint4*>(&sm.o[rg][row][c]);
        }
        cp_wait_all();
        __syncthreads();
    }
#pragma unroll
    for (int nt = 0; nt < NT4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const long long off = i_n * sn_n + i_hv * sn_h
                + (long long)(row_base + g + 8 * (e >> 1)) * sn_v
                + (long long)(KC * w + 8 * nt + 2 * t4 + (e & 1)) * sn_k;
            if (STATE_BF16) {
                const unsigned p = pack2(hs[nt][e], 0.f);
                static_cast<bf16_t*>(new_state)[off] = (bf16_t)(p & 0xffffu);
            } else {
                static_cast<float*>(new_state)[off] = hs[nt][e];
            }
        }
}

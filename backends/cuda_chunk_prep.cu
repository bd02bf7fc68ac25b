// cuda-chunk's prep kernel: triton-chunk's prep (backends/_triton_chunk_kernel.py,
// chunk_prep_kernel) in CUDA, writing the same workspace, which triton-chunk's sequential kernel
// then reads.  Per (chunk of C = 64 tokens, value head): the gates, k k^T and q k^T (exact: bf16
// products, fp32 sums), A and P, T = (I + A)^-1 and M = P T; stored per token as the rows of T^T
// and M^T (GDN_STORE3 1: bf16 hi and lo parts, triton-chunk's "bf16x3"; 0: bf16, its "bf16"),
// then five factors per token (beta, beta rk e^G, scale rq e^G, rk e^(G_last - G), e^G_last).
//
// One CTA of 4 warps per (chunk slot, group of GDN_HEADS value heads of one k-head); warp w owns
// the chunk's rows [16 w, 16 w + 16).  The group's heads share q, k, their norms and k k^T, q k^T
// (loaded and formed once; the norms from the diagonals of k k^T and q q^T, whose 16 x 16 blocks
// on a warp's rows are two more products); the rest runs once per head, one after the other.
// T: the 16 x 16 diagonal blocks inverted by forward substitution (a lane per column), then the
// blocks below by block forward substitution, T_rc = -D_r sum_{c <= k < r} A_rk T_kc, one block
// row a step (three steps), every block product an mma.sync with its fp32 operands split into
// bf16 hi + lo (three products).  M = P T the same way.  Measured against the Triton kernel in
// lab/chunk_prep_cuda.py (the workspaces agree to ~5e-7 relative; 1.3x-1.65x faster on an H200).
//
// -D constants: GDN_GATES (0 raw a, b with A_log, dt_bias; 1 FLA's g, beta), GDN_A_DT, GDN_B_DT,
// GDN_ALOG_DT, GDN_DTB_DT (0 fp32, 1 bf16, 2 fp16), GDN_NEG (raw beta = 2 sigmoid(b)), GDN_PDL
// (wait for the kernel before, then let the next one launch), GDN_STORE3, GDN_HEADS (value heads
// a CTA: a divisor of HV / H), GDN_MIN_CTAS (CTAs an SM the registers must allow: 4 caps
// them at 128, with a few spills; 3 leaves the kernel its ~147), GDN_FLAGS (run beside the chain
// kernel, launched as its programmatic dependent: no wait for it at the start; each head's flag
// ``flags[slot * HV + head]`` set once its rows and factors are stored, an empty slot's at once;
// the last CTA to finish waits for the chain kernel, so that the prefill's last kernel in the
// stream ends after both).

#define C_ 64
#define K_ 128
#define KP 136
#define LD 68           // fp32 [64, 64] tiles' padded row
#define SL 20           // a warp's fp32 [16, 16] scratch row
#define LOG_DECAY_MIN (-128.0f)    // as triton-chunk: exp of it is 0 in fp32 already
#define LOG2E 1.44269504f

#include "gdn_common.cuh"                      // mma16816, gdn_ld, gdn_pack2/unpack2
#ifndef GDN_HEADS
#define GDN_HEADS 1
#endif
#ifndef GDN_MIN_CTAS
#define GDN_MIN_CTAS 4
#endif
#ifndef GDN_FLAGS
#define GDN_FLAGS 0
#endif

typedef unsigned short bf16_t;

// by value, every field 8 bytes (backends/_cuda_chunk_prep.py packs it)
struct PrepParams {
    const bf16_t* q; const bf16_t* k; const void* a; const void* b; const void* A_log;
    const void* dt_bias; const void* cu; bf16_t* mats; float* vecs; int* flags;
    long long N, T_all, sq_t, sq_h, sk_t, sk_h, sa_t, sa_h, sb_t, sb_h, s_alog, s_dtb, H, HV;
    long long l2norm, cu64;
    double scale;
};

// 2^x, flushing denormal results to 0
__device__ __forceinline__ float ex2ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// four 8 x 8 bf16 matrices (a C fragment's pairs) stored transposed; lane 8 m + r gives
// matrix m's row-r address (after the transpose: the fragment's column r)
__device__ __forceinline__ void stm4t(void* p, unsigned r0, unsigned r1, unsigned r2,
                                      unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};"
                 :: "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))), "r"(r0), "r"(r1),
                    "r"(r2), "r"(r3) : "memory");
}
// d += a b with a's four fragment registers in an array
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
    mma16816(d, a[0], a[1], a[2], a[3], b0, b1);
}
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldm4(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0));
}
// the pair (a, b) as bf16 hi and lo parts, a in the low halves
__device__ __forceinline__ void split2(float a, float b, unsigned& hi, unsigned& lo) {
    hi = gdn_pack2<GDN_BF16>(a, b);
    float ha, hb;
    gdn_unpack2<GDN_BF16>(hi, ha, hb);
    lo = gdn_pack2<GDN_BF16>(a - ha, b - hb);
}

// fp32 operands in shared memory as bf16 hi/lo fragments.  A: the 16 x 16 tile at ``p`` (row
// stride ld).  B: n-tile nt (8 columns) of the 16 x 16 (k, n) tile at ``p``.
struct Frag { unsigned hi[4], lo[4]; };
__device__ __forceinline__ Frag frag_a(const float* p, int ld, int g, int t4) {
    Frag f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = *reinterpret_cast<const float2*>(p + (g + 8 * (i & 1)) * ld
                                                          + 2 * t4 + 8 * (i >> 1));
        split2(x.x, x.y, f.hi[i], f.lo[i]);
    }
    return f;
}
__device__ __forceinline__ void frag_b(const float* p, int ld, int nt, int g, int t4,
                                       unsigned (&hi)[2], unsigned (&lo)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float* c = p + (2 * t4 + 8 * i) * ld + 8 * nt + g;
        split2(c[0], c[ld], hi[i], lo[i]);
    }
}
// d += a b, bf16x3: the small products first
__device__ __forceinline__ void mma3(float (&d)[4], const Frag& a, const unsigned (&bh)[2],
                                     const unsigned (&bl)[2]) {
    mma(d, a.lo, bh[0], bh[1]);
    mma(d, a.hi, bl[0], bl[1]);
    mma(d, a.hi, bh[0], bh[1]);
}
// the C fragments of a 16 x 16 product (two n-tiles) into fp32 shared memory, times ``s``
__device__ __forceinline__ void put16(float* p, int ld, const float (&d)[2][4], float s, int g,
                                      int t4) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(p + (g + 8 * h) * ld + 8 * nt + 2 * t4) =
                make_float2(s * d[nt][2 * h], s * d[nt][2 * h + 1]);
}

// 52 KB: four CTAs an SM on Hopper.  q and k are read only until k k^T and q k^T are in
// registers; A and T then take their space.  The warps' scratch is done with before the stored
// rows are assembled, 128 bf16 columns a pass.
struct alignas(16) PrepSmem {
    union {
        struct { bf16_t q[C_][KP]; bf16_t k[C_][KP]; } in;
        struct { float A[C_][LD]; float T[C_][LD]; } m;     // A, then M; T
    } u;
    union {
        long long cu[128];      // cu_seqlens read by the sequence search (N < 128)
        float S[4][16][SL];
        bf16_t out[C_][2 * C_ + 8];
    } x;
    float G[C_], beta[C_], rk[C_], rq[C_];
    float total;
};

__device__ __forceinline__ long long cu_at(const PrepParams& p, long long i) {
    return p.cu64 ? static_cast<const long long*>(p.cu)[i] : static_cast<const int*>(p.cu)[i];
}

// GDN_FLAGS: the head's rows and factors of the slot stored (by every thread: the caller's
// barrier), flag set for the chain kernel
__device__ __forceinline__ void publish(const PrepParams& p, long long slot, int i_hv) {
#if GDN_FLAGS
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("st.release.gpu.global.b32 [%0], %1;"
                     :: "l"(p.flags + slot * p.HV + i_hv), "r"(1) : "memory");
    }
#endif
}
// GDN_FLAGS: the last CTA to finish waits for the chain kernel (its count after the flags,
// cleared by the chain kernel before this one starts)
__device__ __forceinline__ void finish(const PrepParams& p) {
#if GDN_FLAGS
    if (threadIdx.x == 0) {
        unsigned* done = reinterpret_cast<unsigned*>(p.flags + (p.T_all / C_ + p.N) * p.HV);
        if (atomicAdd(done, 1u) == gridDim.x - 1)
            asm volatile("griddepcontrol.wait;" ::: "memory");
    }
#endif
}

extern "C" __global__ void __launch_bounds__(128, GDN_MIN_CTAS) gdn_chunk_prep(const PrepParams p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    PrepSmem& sm = *reinterpret_cast<PrepSmem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
#if GDN_PDL && !GDN_FLAGS
    asm volatile("griddepcontrol.wait;" ::: "memory");   // every input may be the producer's
#endif
#if GDN_PDL || GDN_FLAGS
    asm volatile("griddepcontrol.launch_dependents;");   // the sequential kernel waits for all
#endif
    const int HV = (int)p.HV, N = (int)p.N, groups = HV / GDN_HEADS;
    const long long T_all = p.T_all;
    const int hv0 = (int)(blockIdx.x % groups) * GDN_HEADS;    // the group's first value head
    const long long slot = blockIdx.x / groups;
    const int i_h = hv0 / (HV / (int)p.H);
    // the slot's sequence: the count of sequences whose first slot cu[n] / C + n is <= slot
    // (with N < 128 every bound cu[0..N] is read once, kept for the sequence's bounds: one
    // global latency fewer before the copies)
    int count = 0;
    for (int n0 = 0; n0 < N; n0 += 128) {
        const int n = n0 + tid;
        const long long c = n <= N ? cu_at(p, n) : 0;
        if (N < 128) sm.x.cu[tid] = c;
        count += __syncthreads_count(n < N && c / C_ + n <= slot);
    }
    const int n = count > 0 ? count - 1 : 0;
    long long bos = N < 128 ? sm.x.cu[n] : cu_at(p, n);
    long long eos = N < 128 ? sm.x.cu[n + 1] : cu_at(p, n + 1);
    bos = bos < 0 ? 0 : (bos > T_all ? T_all : bos);      // held inside [0, T], as triton-chunk
    eos = eos < bos ? bos : (eos > T_all ? T_all : eos);
    const long long t0 = count > 0 ? bos + (slot - (bos / C_ + n)) * C_ : eos;
    if (t0 >= eos) {                 // an empty slot: nothing to wait for
#pragma unroll
        for (int hh = 0; hh < GDN_HEADS; ++hh) publish(p, slot, hv0 + hh);
        finish(p);
        return;
    }
    const int rem = (int)(eos - t0 < C_ ? eos - t0 : C_);

    for (int i = tid; i < C_ * 16; i += 128) {
        const int r = i >> 4, c = (i & 15) * 8;
        const bool ok = r < rem;
        const long long t = t0 + (ok ? r : 0);
        cp16(&sm.u.in.q[r][c], p.q + t * p.sq_t + i_h * p.sq_h + c, ok);
        cp16(&sm.u.in.k[r][c], p.k + t * p.sk_t + i_h * p.sk_h + c, ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    // every head's gates of token tid while the copies land
    float gams[GDN_HEADS], betas[GDN_HEADS];
#pragma unroll
    for (int hh = 0; hh < GDN_HEADS; ++hh) {
        const int i_hv = hv0 + hh;
        float gam = 0.f, beta = 0.f;
        if (tid < rem) {
            const long long t = t0 + tid;
            const float xa = gdn_ld<GDN_A_DT>(p.a, t * p.sa_t + i_hv * p.sa_h);
            const float xb = gdn_ld<GDN_B_DT>(p.b, t * p.sb_t + i_hv * p.sb_h);
#if GDN_GATES == 0
            const float x = xa + gdn_ld<GDN_DTB_DT>(p.dt_bias, i_hv * p.s_dtb);
            // clamped so the branch not taken makes no inf; below -15 log(1 + e^x) rounds to 0
            const float e = expf(fminf(x, 20.f));
            const float soft = x > 20.f ? x : (x < -15.f ? e : logf(1.f + e));
            gam = -expf(gdn_ld<GDN_ALOG_DT>(p.A_log, i_hv * p.s_alog)) * soft;
            beta = 1.f / (1.f + expf(-xb));
            if (GDN_NEG) beta = 2.f * beta;
#else
            gam = xa;
            beta = xb;
#endif
        }
        gams[hh] = gam < LOG_DECAY_MIN ? LOG_DECAY_MIN : gam;
        betas[hh] = beta;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    // k k^T and q k^T, rows [16 w, 16 w + 16), all 64 columns; q q^T's diagonal block
    const int a_r = (lane & 7) + 8 * ((lane >> 3) & 1), a_c = 8 * (lane >> 4);
    const int b_r = (lane & 7) + 8 * (lane >> 4), b_c = 8 * ((lane >> 3) & 1);
    float KK[8][4] = {}, QK[8][4] = {}, QQ[2][4] = {}, KD[2][4] = {};
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
        for (int np = 0; np < 4; ++np) {
            unsigned bk[4];
            ldm4(bk, &sm.u.in.k[16 * np + b_r][ks * 16 + b_c]);
            mma(KK[2 * np], ak, bk[0], bk[1]);
            mma(KK[2 * np + 1], ak, bk[2], bk[3]);
            mma(QK[2 * np], aq, bk[0], bk[1]);
            mma(QK[2 * np + 1], aq, bk[2], bk[3]);
        }
    }
    // 1 / ||row|| of q and k: row 16 w + g + 8 h's squared norms are the diagonal elements
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
    const float scale = (float)p.scale;
#pragma unroll 1
    for (int hh = 0; hh < GDN_HEADS; ++hh) {
        const int i_hv = hv0 + hh;
        if (hh) __syncthreads();         // the last head's factors read
        {   // G: inclusive sums of the head's gam over the chunk (warps 0 and 1)
            float gam = gams[0], beta = betas[0];
#pragma unroll
            for (int j = 1; j < GDN_HEADS; ++j)      // registers, not a local array indexed by hh
                if (j == hh) gam = gams[j], beta = betas[j];
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, gam, d);
                if (lane >= d) gam += y;
            }
            if (tid == 31) sm.total = gam;
            if (tid < C_) sm.beta[tid] = beta;
            __syncthreads();             // total, beta, rq, rk written
            if (tid < C_) sm.G[tid] = tid >= 32 ? gam + sm.total : gam;
            __syncthreads();
        }
        // A (to shared memory) and P.  Their decays e^(G_i - G_j) (i >= j) as
        // e^(G_i - G_b) e^(G_b - G_j), G_b the first of j's 16-token block: 16 column and 8 row
        // factors a thread instead of 32 exponentials, each one ex2.approx.ftz (as the Triton
        // prep's exp); both stay in fp32 range while no 16-token block decays by 60 or more,
        // else the chunk takes the exact form (lab/notebook/h200/prep_cuts_2026-11-30/: same
        // errors against float64, the prep 4-6% faster)
        float P[8][4];
        bool sep = true;
#pragma unroll
        for (int b = 0; b < 4; ++b) sep = sep && sm.G[16 * b] - sm.G[16 * b + 15] < 60.f;
        if (sep) {
            float cf[8][2];              // e^(G_b - G_j) rk_j, b the first of j's block
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = 8 * nt + 2 * t4 + e;
                    cf[nt][e] = ex2ftz(LOG2E * (sm.G[16 * (nt >> 1)] - sm.G[j])) * sm.rk[j];
                }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * w + g + 8 * h;
                const float Gi = sm.G[i], bi = sm.beta[i] * sm.rk[i], si = scale * sm.rq[i];
                float rb[4], rs[4];      // e^(G_i - G_b) beta_i rk_i and scale rq_i (b <= i's)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const float r = ex2ftz(LOG2E * fminf(Gi - sm.G[16 * b], 0.f));
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
            for (int h = 0; h < 2; ++h) {
                const int i = 16 * w + g + 8 * h;
                const float Gi = sm.G[i], bi = sm.beta[i] * sm.rk[i], si = scale * sm.rq[i];
                float av[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = 8 * nt + 2 * t4 + e;
                    const float dec = __expf(i >= j ? Gi - sm.G[j] : 0.f) * sm.rk[j];
                    av[e] = i > j ? KK[nt][2 * h + e] * dec * bi : 0.f;
                    P[nt][2 * h + e] = i >= j ? QK[nt][2 * h + e] * dec * si : 0.f;
                }
                *reinterpret_cast<float2*>(&sm.u.m.A[i][8 * nt + 2 * t4]) =
                    make_float2(av[0], av[1]);
            }
        __syncthreads();
        // the diagonal block D_w = (I + A_ww)^-1: lane c (c < 16) forms its column c
        {
            const int c = lane & 15;
            float d[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                float s = i == c ? 1.f : 0.f;
#pragma unroll
                for (int j = 0; j < i; ++j)
                    s -= sm.u.m.A[16 * w + i][16 * w + j] * d[j];
                d[i] = s;
            }
            if (lane < 16) {
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    sm.u.m.T[16 * w + i][16 * w + c] = d[i];
#pragma unroll
                    for (int cb = 0; cb < 4; ++cb)      // the upper blocks ("bf16x3")
                        if (GDN_STORE3 && cb > w) sm.u.m.T[16 * w + i][16 * cb + c] = 0.f;
                }
            }
        }
        __syncthreads();
        // the blocks below: block row r a step, warp c < r forms T_rc
        for (int r = 1; r < 4; ++r) {
            if (w < r) {
                const int c = w;
                float S[2][4] = {};
                for (int kb = c; kb < r; ++kb) {
                    const Frag fa = frag_a(&sm.u.m.A[16 * r][16 * kb], LD, g, t4);
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt) {
                        unsigned bh[2], bl[2];
                        frag_b(&sm.u.m.T[16 * kb][16 * c], LD, nt, g, t4, bh, bl);
                        mma3(S[nt], fa, bh, bl);
                    }
                }
                put16(&sm.x.S[w][0][0], SL, S, 1.f, g, t4);
                __syncwarp();
                const Frag fd = frag_a(&sm.u.m.T[16 * r][16 * r], LD, g, t4);
                float X[2][4] = {};
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    unsigned bh[2], bl[2];
                    frag_b(&sm.x.S[w][0][0], SL, nt, g, t4, bh, bl);
                    mma3(X[nt], fd, bh, bl);
                }
                put16(&sm.u.m.T[16 * r][16 * c], LD, X, -1.f, g, t4);
            }
            __syncthreads();
        }
        // M = P T, rows [16 w, 16 w + 16): only the blocks at or below the diagonal
        float M[8][4] = {};
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            if (ks > w) break;
            Frag fp;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int nt = 2 * ks + (i >> 1), h = i & 1;
                split2(P[nt][2 * h], P[nt][2 * h + 1], fp.hi[i], fp.lo[i]);
            }
#pragma unroll
            for (int nt = 0; nt < 2 * ks + 2; ++nt) {
                unsigned bh[2], bl[2];
                frag_b(&sm.u.m.T[16 * ks][8 * (nt & ~1)], LD, nt & 1, g, t4, bh, bl);
                mma3(M[nt], fp, bh, bl);
            }
        }
#if GDN_STORE3                        // M to shared memory (A's space) for the passes below
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(&sm.u.m.A[16 * w + g + 8 * h][8 * nt + 2 * t4]) =
                    make_float2(M[nt][2 * h], M[nt][2 * h + 1]);
#else
        {   // "bf16": the stored rows staged from the warps' fragments, row i = column i of T,
            // then of M (the warp's rows [16 w, 16 w + 16) as bf16 pairs, transposed by
            // stmatrix; T's blocks above the diagonal are zeros, never formed)
            const int m = lane >> 3, r = lane & 7;      // stmatrix: lane 8 m + r, row r of m
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
#if __CUDA_ARCH__ >= 900
                bf16_t* row = &sm.x.out[16 * np + 8 * (m >> 1) + r][16 * w + 8 * (m & 1)];
                stm4t(row, tr[0], tr[1], tr[2], tr[3]);
                stm4t(row + C_, mr[0], mr[1], mr[2], mr[3]);
#else                                    // no stmatrix before Hopper: its transpose by halves
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    bf16_t* at = &sm.x.out[8 * (2 * np + (u >> 1)) + 2 * t4][16 * w + 8 * (u & 1) + g];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        at[e * (2 * C_ + 8)] = (bf16_t)(tr[u] >> 16 * e);
                        at[e * (2 * C_ + 8) + C_] = (bf16_t)(mr[u] >> 16 * e);
                    }
                }
#endif
            }
        }
#endif
        __syncthreads();
        // the stored rows: row i = column i of T, then of M; with "bf16x3" their hi parts,
        // then their lo parts, assembled from shared memory a pass each ("bf16": staged above)
        constexpr int NP = GDN_STORE3 ? 2 : 1, ROW = 2 * NP * C_;
#pragma unroll 1
        for (int pass = 0; pass < NP; ++pass) {
#if GDN_STORE3
            if (pass) __syncthreads();   // the last pass's rows stored
            for (int it = tid; it < C_ * 8; it += 128) {
                const int i = it & 63, c8 = it >> 6;
                const float* src = pass ? &sm.u.m.A[0][0] : &sm.u.m.T[0][0];
                unsigned hi[4], lo[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const float x0 = src[(8 * c8 + 2 * u) * LD + i];
                    const float x1 = src[(8 * c8 + 2 * u + 1) * LD + i];
                    split2(x0, x1, hi[u], lo[u]);
                }
                bf16_t* row = &sm.x.out[i][8 * c8];
                *reinterpret_cast<uint4*>(row) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
                *reinterpret_cast<uint4*>(row + C_) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            }
            __syncthreads();
#endif
            for (int it = tid; it < C_ * 16; it += 128) {
                const int i = it >> 4, c = (it & 15) * 8;
                if (i < rem)
                    *reinterpret_cast<uint4*>(p.mats + ((t0 + i) * HV + i_hv) * ROW
                                              + 2 * C_ * pass + c) =
                        *reinterpret_cast<const uint4*>(&sm.x.out[i][c]);
            }
        }
        if (tid < rem) {
            const float G = sm.G[tid], GL = sm.G[C_ - 1], eG = expf(G);
            const float rk = sm.rk[tid], beta = sm.beta[tid];
            float* v = p.vecs + (long long)i_hv * 5 * T_all + t0 + tid;
            v[0] = beta;
            v[T_all] = beta * rk * eG;
            v[2 * T_all] = scale * sm.rq[tid] * eG;
            v[3 * T_all] = rk * expf(GL - G);
            v[4 * T_all] = expf(GL);
        }
        if (GDN_FLAGS) __syncthreads();
        publish(p, slot, i_hv);
    }                                // the group's heads
    finish(p);
}

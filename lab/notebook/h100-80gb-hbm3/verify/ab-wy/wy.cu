// Experiment, not a backend (NOTES "eighth session"): speculative verify in the states form
// (and states+update with -DWY_UPD=1) at small batch, its dot products on the tensor cores.
// Contest geometry only (K = V = 128, bf16 q/k/v/a/b, fp32 A_log and dt_bias, int32 indices).
// A block owns R = 8 rows of one head.  For the dot products warp w owns the K slice
// [16w, 16w + 16) of all 8 rows (the m16n8k16 A fragment, rows 8..15 zero; K permuted within
// the slice so a lane's 4 elements are contiguous); for the updates warp w owns row w, lane l
// its K [4l, 4l + 4).  Before the state arrives: the gates (lane t: token t), the head's Gram
// entries (two MMAs a warp over [k; q] x [k | q], summed over the warps through shared memory),
// then each warp its own copy of L (the tokens' lower-triangular system) and N (the outputs'
// weights), loaded into registers.  After: the 2T dot products with the initial state (two
// MMAs, three for each split of an fp32 state), summed over the warps behind one barrier;
// y_t = beta_t v_t - beta_t E_t rk_t s.k_t; u = (I + L)^-1 y by forward substitution; then the
// T states, each stored at once; o_t = scale rq_t E_t s.q_t + sum_j N[t][j] u_j.
// -DWY_XTIME=1: clock64 marks per warp into wy_xt (tl_wy.py).
#include "gdn_common.cuh"

constexpr int T = WY_T, HV = WY_HV, GVA = WY_GVA;
constexpr int K = 128, V = 128, R = 8, NW = 8;
#define SD WY_SD
static_assert(T >= 1 && T <= 8, "T <= 8");
#ifndef WY_XTIME
#define WY_XTIME 0
#endif
#if WY_XTIME
__device__ unsigned long long wy_xt[4096][8];
#define XCLK(i) { unsigned long long c_; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c_) :: "memory"); xt[i] = c_; }
#define XPIN(r) asm volatile("" : "+r"(r) :: "memory");
#define XPINF(r) asm volatile("" : "+f"(r) :: "memory");
#define XDEP(f) { unsigned d_; asm volatile("mov.b32 %0, %1;" : "=r"(d_) : "f"(f) : "memory"); if (d_ == 0x7fffffffu) xt[7] = 1; }
#else
#define XCLK(i)
#define XDEP(f)
#define XPIN(r)
#define XPINF(r)
#endif

// Fields in the order of first use: what the first loads need shares the first lines.
struct WyParams {
    const int* idx;
    const unsigned short *k, *q, *v, *a, *b;
    const float *A_log, *dt_bias;
    const int* inter_idx;
    long long qk_n, qk_t, v_n, v_t, ab_n, ab_t;
    int P, null_slot;
    void* state;
    long long s_n;
    void* inter;
    unsigned short* out;
    int S;
    float scale;
    int never;
};

__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint2 ld8(const unsigned short* p) {
    return *reinterpret_cast<const uint2*>(p);
}

// x = hi + mid + lo, each a bf16 pair (x0 low half): exact for normal fp32 values.
__device__ __forceinline__ void split3(float x0, float x1, unsigned& h, unsigned& m, unsigned& l) {
    float a, b;
    h = gdn_pack2<GDN_BF16>(x0, x1);
    gdn_unpack2<GDN_BF16>(h, a, b);
    x0 -= a; x1 -= b;
    m = gdn_pack2<GDN_BF16>(x0, x1);
    gdn_unpack2<GDN_BF16>(m, a, b);
    x0 -= a; x1 -= b;
    l = gdn_pack2<GDN_BF16>(x0, x1);
}

extern "C" __global__ void __launch_bounds__(256, 1) wy_verify(const WyParams p) {
    using ST = typename GdnStorage<SD>::type;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    constexpr int PARTS = V / R;
    const unsigned part = blockIdx.x % PARTS, nh = blockIdx.x / PARTS;
    const unsigned h = nh % HV, n = nh / HV, hq = h / GVA;
    const int row = (int)part * R + g;                 // the MMA layout's row (lane group g)
    const int wrow = (int)part * R + w;                // the update layout's row (warp w)
    const int kp = 16 * w + 4 * c;                     // the MMA layout's K (warp w's slice)
    const int kr = 4 * lane;                           // the update layout's K
#if WY_XTIME
    unsigned long long xt[8];
    XCLK(0);
#endif

    const long long slot = p.idx[n];
    // Everything that does not depend on the slot, before it is used.
    const long long qk0 = (long long)n * p.qk_n + hq * K;
    uint2 kx[T];                                       // k_t at kr, every token
#pragma unroll
    for (int t = 0; t < T; ++t) kx[t] = ld8(p.k + qk0 + t * p.qk_t + kr);
    uint2 bk = make_uint2(0u, 0u), bq = make_uint2(0u, 0u);
    if (g < T) {
        bk = ld8(p.k + qk0 + g * p.qk_t + kp);
        bq = ld8(p.q + qk0 + g * p.qk_t + kp);
    }
    float vv[T];                                       // v_t of row wrow
#pragma unroll
    for (int t = 0; t < T; ++t)
        vv[t] = gdn_bf16_to_f32(p.v[(long long)n * p.v_n + t * p.v_t + h * V + wrow]);
    float xa = 0.f, xb = 0.f;
    if (lane < T) {
        xa = gdn_bf16_to_f32(p.a[(long long)n * p.ab_n + lane * p.ab_t + h]) + p.dt_bias[h];
        xb = gdn_bf16_to_f32(p.b[(long long)n * p.ab_n + lane * p.ab_t + h]);
    }
    const float A_log = p.A_log[h];
    const long long irow = p.inter_idx[n];
    const float scale = p.scale;
    // Keep every load above issued before the slot is used (else the compiler sinks the ones
    // used only after the slot check, A_log among them, past the slot's arrival).
    asm volatile("" ::: "memory");

    const bool rd = (unsigned long long)slot < (unsigned long long)p.P && slot != (long long)p.null_slot;
    if (!rd) {
        if (lane < T) p.out[(((long long)n * T + lane) * HV + h) * V + wrow] = 0;
        // p.never is 0 (set by the host): a use of A_log and irow on this path
        // too, so the compiler keeps their loads above the slot check instead of sinking them
        // below it, where they would wait a full memory latency after the slot's.
        if (p.never)
            p.out[0] = (unsigned short)(__float_as_uint(A_log) + __float_as_uint(scale) + (unsigned)irow
                                        + (unsigned)p.S + (unsigned)(size_t)p.inter);
        return;
    }
    XCLK(1);
    const ST* const sbase = static_cast<const ST*>(p.state) + slot * p.s_n + (long long)h * V * K;
    uint2 sx;                                          // MMA layout, bf16
    float sm[4], s[4];                                 // MMA layout (fp32), update layout
    if constexpr (SD == GDN_BF16) {
        sx = *reinterpret_cast<const uint2*>(sbase + (long long)row * K + kp);
        const uint2 u = *reinterpret_cast<const uint2*>(sbase + (long long)wrow * K + kr);
        gdn_unpack2<GDN_BF16>(u.x, s[0], s[1]);
        gdn_unpack2<GDN_BF16>(u.y, s[2], s[3]);
    } else {
        const float4 f = *reinterpret_cast<const float4*>(sbase + (long long)row * K + kp);
        sm[0] = f.x; sm[1] = f.y; sm[2] = f.z; sm[3] = f.w;
        const float4 u = *reinterpret_cast<const float4*>(sbase + (long long)wrow * K + kr);
        s[0] = u.x; s[1] = u.y; s[2] = u.z; s[3] = u.w;
    }

    // ---- token scalars (lane t < T of every warp): the gates now, the norms after the Gram --
    float gl = 1.f, bl = 0.f;
    if (lane < T) {
        gl = gdn_decay_fast(A_log, xa);
        bl = gdn_sigmoid_fast(xb);
    }
    // D(t, i) = g_{i+1} .. g_t for this lane's pairs (t, i) = (lane / 8 + 4 r, lane % 8), and
    // E_t = g_0 .. g_t for lane t: products of the shuffled gates, no division.
    constexpr int NP = (T * T + 31) / 32;              // pairs a lane
    float Dp[NP], El = 1.f;
#pragma unroll
    for (int r = 0; r < NP; ++r) Dp[r] = 1.f;
#pragma unroll
    for (int m = 0; m < T; ++m) {
        const float gm = __shfl_sync(0xffffffffu, gl, m);
        if (m <= lane) El *= gm;
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int e = lane + 32 * r, t = e / T, i = e % T;
            if (m > i && m <= t) Dp[r] *= gm;
        }
    }

    // ---- the head's Gram entries (per warp over its K slice, then summed) -------------------
    __shared__ float4 gp[NW][32][2];
    __shared__ float gt[256];
    __shared__ float4 sp[NW][R][4];
    __shared__ float wL[NW][T * T], wN[NW][T * T], ws[NW][5][T];   // per warp: its own copy
    {
        float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
        // A = [k_0..k_7; q_0..q_7] (rows g, g + 8), B = k (c1) or q (c2), columns = tokens.
        mma16816(c1, bk.x, bq.x, bk.y, bq.y, bk.x, bk.y);
        mma16816(c2, bk.x, bq.x, bk.y, bq.y, bq.x, bq.y);
        gp[w][lane][0] = make_float4(c1[0], c1[1], c1[2], c1[3]);
        gp[w][lane][1] = make_float4(c2[0], c2[1], c2[2], c2[3]);
    }
    __syncthreads();
    {
        const int tid = threadIdx.x;
        const float* base = reinterpret_cast<const float*>(&gp[0][0][0]) + tid;
        float x = 0.f;
#pragma unroll
        for (int ww = 0; ww < NW; ++ww) x += base[ww * 256];
        gt[tid] = x;
    }
    __syncthreads();
    XCLK(2);
    // Entry of lane L = i*4 + t/2: [0, 1] k_i.k_t, [2, 3] q_i.k_t, [4, 5] k_i.q_t, [6, 7] q_i.q_t.
#define KK(i, t) gt[((i) * 4 + (t) / 2) * 8 + ((t) & 1)]
#define KQ(i, t) gt[((i) * 4 + (t) / 2) * 8 + 4 + ((t) & 1)]
#define QQ(t) gt[((t) * 4 + (t) / 2) * 8 + 6 + ((t) & 1)]
    // ---- the head's coefficients, each warp its own copy (no block barrier) ----------------
    // L[t][i] = beta_t rk_t rk_i D(t, i) k_i.k_t (i < t), N[t][i] = scale rq_t D(t, i) rk_i
    // k_i.q_t (i <= t); ye_t = beta_t E_t rk_t, ew_t = scale rq_t E_t.
    {
        float rkl = 1.f, rql = 1.f;
        if (lane < T) {
            rkl = rsqrtf(KK(lane, lane) + 1e-6f);
            rql = rsqrtf(QQ(lane) + 1e-6f);
            ws[w][0][lane] = gl;
            ws[w][1][lane] = bl;
            ws[w][2][lane] = rkl;
            ws[w][3][lane] = bl * El * rkl;
            ws[w][4][lane] = scale * rql * El;
        }
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int e = lane + 32 * r, t = e / T, i = e % T;
            const int ts = t < T ? t : 0;
            const float bt = __shfl_sync(0xffffffffu, bl, ts);
            const float rkt = __shfl_sync(0xffffffffu, rkl, ts);
            const float rqt = __shfl_sync(0xffffffffu, rql, ts);
            const float rki = __shfl_sync(0xffffffffu, rkl, i);
            if (e < T * T) {
                wL[w][e] = i < t ? bt * rkt * rki * Dp[r] * KK(i, t) : 0.f;
                wN[w][e] = i <= t ? scale * rqt * Dp[r] * rki * KQ(i, t) : 0.f;
            }
        }
        __syncwarp();
    }
    // This lane's coefficients, into registers before the state is needed.
    const int jv = lane & 15, tv0 = 2 * (jv >> 2) + (jv & 1), tv = tv0 < T ? tv0 : 0;
    const bool isq = (jv & 2) != 0;
    float Lr[T][T], gr[T], rkr[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        gr[t] = ws[w][0][t];
        rkr[t] = ws[w][2][t];
#pragma unroll
        for (int j = 0; j < t; ++j) Lr[t][j] = wL[w][t * T + j];
    }
    const float btv = ws[w][1][tv], yetv = ws[w][3][tv], ewtv = ws[w][4][tv];
    float Nr[T];
#pragma unroll
    for (int j = 0; j < T; ++j) Nr[j] = wN[w][tv * T + j];
    float vt = vv[0];
#pragma unroll
    for (int t = 1; t < T; ++t)
        if (t == tv) vt = vv[t];
    const float bv = btv * vt;
    XCLK(3);
#if WY_XTIME
    if constexpr (SD == GDN_BF16) { XPIN(sx.x); XPIN(sx.y); XDEP(__uint_as_float(sx.x)); }
    else { XPINF(sm[0]); XPINF(sm[1]); XPINF(sm[2]); XPINF(sm[3]); XDEP(sm[0]); }
#endif
    XCLK(4);

    // ---- the state arrives: its 2T dot products -------------------------------------------
    float d1[4] = {0.f, 0.f, 0.f, 0.f}, d2[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (SD == GDN_BF16) {
        mma16816(d1, sx.x, 0u, sx.y, 0u, bk.x, bk.y);
        mma16816(d2, sx.x, 0u, sx.y, 0u, bq.x, bq.y);
    } else {
        unsigned h0, m0, l0, h1, m1, l1;
        split3(sm[0], sm[1], h0, m0, l0);
        split3(sm[2], sm[3], h1, m1, l1);
        mma16816(d1, l0, 0u, l1, 0u, bk.x, bk.y);
        mma16816(d2, l0, 0u, l1, 0u, bq.x, bq.y);
        mma16816(d1, m0, 0u, m1, 0u, bk.x, bk.y);
        mma16816(d2, m0, 0u, m1, 0u, bq.x, bq.y);
        mma16816(d1, h0, 0u, h1, 0u, bk.x, bk.y);
        mma16816(d2, h0, 0u, h1, 0u, bq.x, bq.y);
    }
    sp[w][g][c] = make_float4(d1[0], d1[1], d2[0], d2[1]);   // s.k_2c, s.k_2c+1, s.q_2c, s.q_2c+1
    __syncthreads();
    // Warp w: row wrow's 16 sums, lane j < 16 the value j (c = j / 4: s.k_2c, s.k_2c+1,
    // s.q_2c, s.q_2c+1), then y_t = beta_t v_t - ye_t s.k_t gathered into every lane.
    float sum = 0.f;
    {
        const float* base = reinterpret_cast<const float*>(&sp[0][w][0]) + jv;
#pragma unroll
        for (int ww = 0; ww < NW; ++ww) sum += base[ww * R * 16];
    }
    const float ylv = bv - yetv * sum;
    float y[T];
#pragma unroll
    for (int t = 0; t < T; ++t) y[t] = __shfl_sync(0xffffffffu, ylv, 4 * (t >> 1) + (t & 1));
    XDEP(y[T - 1]);
    XCLK(5);
    // u = (I + L)^-1 y by columns; w_t = rk_t u_t.
    float u[T], wr[T];
#pragma unroll
    for (int t = 0; t < T; ++t) u[t] = y[t];
#pragma unroll
    for (int j = 0; j < T; ++j)
#pragma unroll
        for (int t = j + 1; t < T; ++t) u[t] -= Lr[t][j] * u[j];
#pragma unroll
    for (int t = 0; t < T; ++t) wr[t] = rkr[t] * u[t];
    XDEP(wr[T - 1]);
    XCLK(6);
    // ---- the states, token by token (warp w: row wrow, lane: K [4 lane, 4 lane + 4)) ---------
    const bool keep = (unsigned long long)irow < (unsigned long long)(long long)p.S;
    ST* const irow_p = static_cast<ST*>(p.inter) + (keep ? irow : 0) * ((long long)T * HV * V * K)
                       + (long long)h * V * K + (long long)wrow * K + kr;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        float k0, k1, k2, k3;
        gdn_unpack2<GDN_BF16>(kx[t].x, k0, k1);
        gdn_unpack2<GDN_BF16>(kx[t].y, k2, k3);
        s[0] = gr[t] * s[0] + wr[t] * k0;
        s[1] = gr[t] * s[1] + wr[t] * k1;
        s[2] = gr[t] * s[2] + wr[t] * k2;
        s[3] = gr[t] * s[3] + wr[t] * k3;
        ST* const to = irow_p + (long long)t * HV * V * K;
        if (keep) {
            if constexpr (SD == GDN_BF16)
                *reinterpret_cast<uint2*>(to) = make_uint2(gdn_pack2<GDN_BF16>(s[0], s[1]),
                                                           gdn_pack2<GDN_BF16>(s[2], s[3]));
            else
                *reinterpret_cast<float4*>(to) = make_float4(s[0], s[1], s[2], s[3]);
        }
    }
    // Output o_t of row wrow by the lane holding s.q_t: e_t s.q_t + sum_{j <= t} N[t][j] u_j.
    if (lane < 16 && isq && tv0 < T) {
        float o = ewtv * sum;
#pragma unroll
        for (int j = 0; j < T; ++j) o += Nr[j] * u[j];
        p.out[(((long long)n * T + tv) * HV + h) * V + wrow] = gdn_f32_to_bf16(o);
    }
#if WY_UPD
    ST* const fin = static_cast<ST*>(p.state) + slot * p.s_n + (long long)h * V * K
                    + (long long)wrow * K + kr;
    if constexpr (SD == GDN_BF16)
        *reinterpret_cast<uint2*>(fin) = make_uint2(gdn_pack2<GDN_BF16>(s[0], s[1]),
                                                    gdn_pack2<GDN_BF16>(s[2], s[3]));
    else
        *reinterpret_cast<float4*>(fin) = make_float4(s[0], s[1], s[2], s[3]);
#endif
#if WY_XTIME
    XCLK(7);
    if (lane == 0 && blockIdx.x * NW + w < 4096)
        for (int i = 0; i < 8; ++i) wy_xt[blockIdx.x * NW + w][i] = xt[i];
#endif
}

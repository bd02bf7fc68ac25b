// Experiment, not a backend (NOTES "ninth session"): wy.cu with a loader warp.  The same
// tensor-core verify (states form, states+update with -DWY_UPD=1; contest geometry only), but
// the block has a ninth warp that alone waits for the slot and copies the block's 8 state rows
// into shared memory (cp.async), then arrives on a named barrier.  The 8 compute warps never
// wait for the slot: the gates, the Gram, the coefficients (read as 16-byte vectors) and the
// unpacked k rows are made while the slot and the state are in flight, and the compute warps
// meet the loader at the barrier.  What follows is wy.cu's: the 2T dot products on the tensor
// cores, summed over the warps, the forward substitution, the T states stored at once.
// -DWY_XTIME=1: clock64 marks per warp into wy_xt (tl_wy.py wy2).
#include "gdn_common.cuh"

constexpr int T = WY_T, HV = WY_HV, GVA = WY_GVA;
constexpr int K = 128, V = 128, R = 8, NW = 8, NT = 32 * (NW + 1);   // + the loader warp
#define SD WY_SD
static_assert(T >= 1 && T <= 8, "T <= 8");
#ifndef WY_XTIME
#define WY_XTIME 0
#endif
#if WY_XTIME
__device__ unsigned long long wy_xt[4608][16];
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

// Two 64-byte constant lines: the compute warps read only the first (with the launch's memory
// descriptor), the loader the first and the second.  The activations are the engines' packed
// views (q | k | v token rows of WY_ROW elements, a | b rows of 2 HV), their strides compiled in.
constexpr int ROW = WY_ROW, HK = (HV / GVA) * K;
struct WyParams {
    const int* idx;
    const unsigned short* qkv;                     // q of sequence 0, token 0; k at +HK, v at +2HK
    const unsigned short* ab;                      // a of sequence 0, token 0; b at +HV
    const float *A_log, *dt_bias;
    const int* inter_idx;
    void* state;
    long long s_n;
    int P, null_slot;
    void* inter;
    unsigned short* out;
    int S;
    float scale;
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

__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

extern "C" __global__ void __launch_bounds__(NT, 1) wy_verify(const WyParams p) {
    using ST = typename GdnStorage<SD>::type;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    constexpr int PARTS = V / R;
    const unsigned part = blockIdx.x % PARTS, nh = blockIdx.x / PARTS;
    const unsigned h = nh % HV, n = nh / HV, hq = h / GVA;
    // The block's state rows in shared memory, rows padded so that both layouts' reads below
    // take the fewest wavefronts (bf16 8-byte reads, fp32 16-byte reads).
    constexpr int SB = (int)sizeof(ST), SROW = K * SB + (SB == 2 ? 32 : 64);
    __shared__ __align__(16) unsigned char stile[R * SROW];
    __shared__ long long sslot;
#if WY_XTIME
    unsigned long long xt[16] = {};
    XCLK(0);
#endif

    if (w == NW) {
        // ---- the loader warp: the slot, then the block's state rows into shared memory ----
        const long long slot = p.idx[n];
        const bool rd = (unsigned long long)slot < (unsigned long long)p.P && slot != (long long)p.null_slot;
#if WY_XTIME
        XDEP((float)slot);
        XCLK(1);
#endif
        if (rd) {
            const char* src = reinterpret_cast<const char*>(
                static_cast<const ST*>(p.state) + slot * p.s_n + (long long)h * V * K + (long long)part * R * K);
            constexpr int CPR = K * SB / 16, CH = R * CPR;      // 16-byte chunks: a row, the tile
#pragma unroll
            for (int j = 0; j < CH / 32; ++j) {
                const int ch = lane + 32 * j, r = ch / CPR, cc = ch % CPR;
                const unsigned to = (unsigned)__cvta_generic_to_shared(stile + r * SROW + cc * 16);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             :: "r"(to), "l"(src + (long long)r * K * SB + cc * 16) : "memory");
            }
            asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
        }
        if (lane == 0) sslot = rd ? slot : -1;
#if WY_XTIME
        XCLK(2);
        if (lane == 0 && blockIdx.x * (NW + 1) + w < 4608)
            for (int i = 0; i < 16; ++i) wy_xt[blockIdx.x * (NW + 1) + w][i] = xt[i];
#endif
        asm volatile("bar.arrive 1, %0;" :: "n"(NT) : "memory");
        return;
    }

    // ---- the compute warps: nothing here waits for the slot until the state barrier -------
    const int wrow = (int)part * R + w;                // the update layout's row (warp w)
    const int kp = 16 * w + 4 * c;                     // the MMA layout's K (warp w's slice)
    const int kr = 4 * lane;                           // the update layout's K
    const unsigned short* const q0 = p.qkv + (long long)n * T * ROW + hq * K;   // token 0's q
    const unsigned short* const k0 = q0 + HK;
    uint2 kx[T];                                       // k_t at kr, every token
#pragma unroll
    for (int t = 0; t < T; ++t) kx[t] = ld8(k0 + t * ROW + kr);
    uint2 bk = make_uint2(0u, 0u), bq = make_uint2(0u, 0u);
    if (g < T) {
        bk = ld8(k0 + g * ROW + kp);
        bq = ld8(q0 + g * ROW + kp);
    }
    float vv[T];                                       // v_t of row wrow
    const unsigned short* const v0 = p.qkv + (long long)n * T * ROW + 2 * HK + h * V + wrow;
#pragma unroll
    for (int t = 0; t < T; ++t) vv[t] = gdn_bf16_to_f32(v0[t * ROW]);
    // Lane t < T: token t's gate inputs (every lane loads, lanes >= T token 0's: no branch,
    // which would take A_log's load into it, issued only once the other inputs are in).
    const int tl = lane < T ? lane : 0;
    const unsigned short* const ab = p.ab + ((long long)n * T + tl) * (2 * HV) + h;
    const float xa = gdn_bf16_to_f32(ab[0]) + p.dt_bias[h];
    const float xb = gdn_bf16_to_f32(ab[HV]);
    const float A_log = p.A_log[h];
    const long long irow = p.inter_idx[n];
    const float scale = p.scale;
#if WY_XTIME
    XDEP(xa); XDEP(xb); XDEP(vv[T - 1]); XDEP(__uint_as_float(kx[T - 1].x));
    XDEP(__uint_as_float(bk.x)); XDEP(__uint_as_float(bq.x));
    XCLK(14);                                          // every input in
#endif

    // ---- token scalars (lane t < T of every warp): the gates now, the norms after the Gram --
    const float gl = gdn_decay_fast(A_log, xa);       // lanes >= T: unused
    const float bl = gdn_sigmoid_fast(xb);
    XDEP(gl); XDEP(bl);
    XCLK(12);
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
    XDEP(Dp[0]); XDEP(El);
    XCLK(13);

    // ---- the head's Gram entries (per warp over its K slice, then summed) -------------------
    __shared__ float4 gp[NW][32][2];
    __shared__ float gt[256];
    __shared__ float4 sp[NW][R][4];
    // Per warp, its own copy; rows of 8 so that a row is two 16-byte reads.
    __shared__ __align__(16) float wL[NW][T][8], wN[NW][T][8], ws[NW][5][8];
    {
        float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
        // A = [k_0..k_7; q_0..q_7] (rows g, g + 8), B = k (c1) or q (c2), columns = tokens.
        mma16816(c1, bk.x, bq.x, bk.y, bq.y, bk.x, bk.y);
        mma16816(c2, bk.x, bq.x, bk.y, bq.y, bq.x, bq.y);
        gp[w][lane][0] = make_float4(c1[0], c1[1], c1[2], c1[3]);
        gp[w][lane][1] = make_float4(c2[0], c2[1], c2[2], c2[3]);
    }
    bar_sync(2, 32 * NW);
    {
        const int tid = threadIdx.x;
        const float* base = reinterpret_cast<const float*>(&gp[0][0][0]) + tid;
        float x = 0.f;
#pragma unroll
        for (int ww = 0; ww < NW; ++ww) x += base[ww * 256];
        gt[tid] = x;
    }
    bar_sync(2, 32 * NW);
    XCLK(1);
    // Entry of lane L = i*4 + t/2: [0, 1] k_i.k_t, [2, 3] q_i.k_t, [4, 5] k_i.q_t, [6, 7] q_i.q_t.
#define KK(i, t) gt[((i) * 4 + (t) / 2) * 8 + ((t) & 1)]
#define KQ(i, t) gt[((i) * 4 + (t) / 2) * 8 + 4 + ((t) & 1)]
#define QQ(t) gt[((t) * 4 + (t) / 2) * 8 + 6 + ((t) & 1)]
    // ---- the head's coefficients, each warp its own copy (no block barrier) ----------------
    // L[t][i] = beta_t rk_t rk_i D(t, i) k_i.k_t (i < t), N[t][i] = scale rq_t D(t, i) rk_i
    // k_i.q_t (i <= t); ye_t = beta_t E_t rk_t, ew_t = scale rq_t E_t.
    {
        // scale rq_t made by lane t and shuffled: scale read once, by the uniform path (a
        // per-lane read of it in the loop below was an indexed constant load, measured slow).
        float rkl = 1.f, srql = scale;
        if (lane < T) {
            rkl = rsqrtf(KK(lane, lane) + 1e-6f);
            srql = scale * rsqrtf(QQ(lane) + 1e-6f);
            ws[w][0][lane] = gl;
            ws[w][1][lane] = bl;
            ws[w][2][lane] = rkl;
            ws[w][3][lane] = bl * El * rkl;
            ws[w][4][lane] = srql * El;
        }
        XDEP(rkl); XDEP(srql);
        XCLK(8);
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int e = lane + 32 * r, t = e / T, i = e % T;
            const int ts = t < T ? t : 0;
            const float bt = __shfl_sync(0xffffffffu, bl, ts);
            const float rkt = __shfl_sync(0xffffffffu, rkl, ts);
            const float srqt = __shfl_sync(0xffffffffu, srql, ts);
            const float rki = __shfl_sync(0xffffffffu, rkl, i);
            if (e < T * T) {
                wL[w][t][i] = i < t ? bt * rkt * rki * Dp[r] * KK(i, t) : 0.f;
                wN[w][t][i] = i <= t ? srqt * Dp[r] * rki * KQ(i, t) : 0.f;
            }
        }
        __syncwarp();
        XCLK(9);
    }
    // This lane's coefficients, into registers before the state is needed (16-byte reads).
    const int jv = lane & 15, tv0 = 2 * (jv >> 2) + (jv & 1), tv = tv0 < T ? tv0 : 0;
    const bool isq = (jv & 2) != 0;
    constexpr int T4 = (T + 3) / 4;
    float Lr[T][T], gr[T], rkr[T], Nr[T];
    {
        const float4* L4 = reinterpret_cast<const float4*>(&wL[w][0][0]);
        const float4* N4 = reinterpret_cast<const float4*>(&wN[w][tv][0]);
        const float4* g4 = reinterpret_cast<const float4*>(&ws[w][0][0]);
        const float4* r4 = reinterpret_cast<const float4*>(&ws[w][2][0]);
#pragma unroll
        for (int q4 = 0; q4 < T4; ++q4) {
            const float4 a = g4[q4], b = r4[q4], d = N4[q4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
            const float dv[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * q4 + e < T) { gr[4 * q4 + e] = av[e]; rkr[4 * q4 + e] = bv[e]; Nr[4 * q4 + e] = dv[e]; }
        }
#pragma unroll
        for (int t = 1; t < T; ++t)
#pragma unroll
            for (int q4 = 0; q4 < (t + 3) / 4; ++q4) {
                const float4 a = L4[t * 2 + q4];
                const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (4 * q4 + e < t) Lr[t][4 * q4 + e] = av[e];
            }
    }
    XDEP(Lr[T - 1][0]); XDEP(gr[T - 1]); XDEP(Nr[0]); XDEP(rkr[T - 1]);
    XCLK(10);
    const float btv = ws[w][1][tv], yetv = ws[w][3][tv], ewtv = ws[w][4][tv];
    float vt = vv[0];
#pragma unroll
    for (int t = 1; t < T; ++t)
        if (t == tv) vt = vv[t];
    float bv = btv * vt;
    XDEP(bv);
    XCLK(11);
    float kf[T][4];                                    // k_t at kr, unpacked
#pragma unroll
    for (int t = 0; t < T; ++t) {
        gdn_unpack2<GDN_BF16>(kx[t].x, kf[t][0], kf[t][1]);
        gdn_unpack2<GDN_BF16>(kx[t].y, kf[t][2], kf[t][3]);
    }
    // Made here, not after the barrier (the compiler would sink them to their first use).
    asm volatile("" : "+f"(bv));
#pragma unroll
    for (int t = 0; t < T; ++t)
        asm volatile("" : "+f"(kf[t][0]), "+f"(kf[t][1]), "+f"(kf[t][2]), "+f"(kf[t][3]));
    XCLK(2);

    // ---- the state: wait for the loader ------------------------------------------------------
    bar_sync(1, NT);
    XCLK(3);
    const long long slot = sslot;                      // read with the state rows below
    uint2 sx;                                          // MMA layout, bf16
    float sm[4], s[4];                                 // MMA layout (fp32), update layout
    if constexpr (SD == GDN_BF16) {
        sx = *reinterpret_cast<const uint2*>(stile + g * SROW + kp * 2);
        const uint2 u = *reinterpret_cast<const uint2*>(stile + w * SROW + kr * 2);
        gdn_unpack2<GDN_BF16>(u.x, s[0], s[1]);
        gdn_unpack2<GDN_BF16>(u.y, s[2], s[3]);
    } else {
        const float4 f = *reinterpret_cast<const float4*>(stile + g * SROW + kp * 4);
        sm[0] = f.x; sm[1] = f.y; sm[2] = f.z; sm[3] = f.w;
        const float4 u = *reinterpret_cast<const float4*>(stile + w * SROW + kr * 4);
        s[0] = u.x; s[1] = u.y; s[2] = u.z; s[3] = u.w;
    }
#if WY_XTIME
    if constexpr (SD == GDN_BF16) { XPIN(sx.x); XPIN(sx.y); XDEP(__uint_as_float(sx.x)); }
    else { XPINF(sm[0]); XPINF(sm[1]); XPINF(sm[2]); XPINF(sm[3]); XDEP(sm[0]); }
#endif
    if (slot < 0) {                                    // padded: zero out rows, nothing stored
        if (lane < T) p.out[(((long long)n * T + lane) * HV + h) * V + wrow] = 0;
        return;
    }
    XCLK(4);

    // ---- its 2T dot products -----------------------------------------------------------------
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
    bar_sync(2, 32 * NW);
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
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = gr[t] * s[e] + wr[t] * kf[t][e];
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
    if (lane == 0 && blockIdx.x * (NW + 1) + w < 4608)
        for (int i = 0; i < 16; ++i) wy_xt[blockIdx.x * (NW + 1) + w][i] = xt[i];
#endif
}

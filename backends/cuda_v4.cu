// cuda-v4: latency-optimized GDN decode (SPEC section 1).
//
// At small batch the step is latency-bound: what counts is how many loads are in flight at
// once and how many SMs issue them.  So:
//  * each head's V rows are split over blocks_per_head (p.aux0) blocks, and each block has
//    several warps, so even B=1 spreads over every SM;
//  * a row is read along its contiguous K axis with 16-byte loads by LPR lanes; a warp-wide
//    load covers RPW whole rows, perfectly coalesced;
//  * all RW row groups of a warp are loaded before any is used (the loads are independent and
//    fully unrolled), and the gate inputs, q, k and v loads are issued right behind them;
//  * per row, k.S and q.S come from one pass and one interleaved butterfly; the output uses
//    o = scale*(g*(q.S) + u*(k.q)) (SPEC section 1), so the new row is never re-read;
//  * the gates are computed by every lane of each warp, redundantly: it costs a few
//    instructions hidden behind the state loads, where a per-block computation would put a
//    __syncthreads on the critical path.
//
// Compile-time (-D, gdnzoo/cuda_build.py): GDN_K, GDN_STATE_DT, GDN_IO_DT, GDN_A_DT, GDN_B_DT,
// GDN_DTB_DT, GDN_L2NORM (0/1), GDN_RW (row groups per warp), GDN_VEC16 (1: 16-byte vectors,
// which the host picks only when every state/q/k row is 16-byte aligned; 0: element loads).
// Runtime: warps per block (blockDim.x / 32), blocks per head, B, T, H, HV, V, strides.
#include "gdn_common.cuh"

#if !defined(GDN_K) || !defined(GDN_STATE_DT) || !defined(GDN_IO_DT) || !defined(GDN_A_DT) || \
    !defined(GDN_B_DT) || !defined(GDN_DTB_DT) || !defined(GDN_L2NORM) || !defined(GDN_RW) || \
    !defined(GDN_VEC16)
#error "compile with the -D options of gdnzoo/cuda_build.py"
#endif

constexpr int K = GDN_K;
constexpr int SD = GDN_STATE_DT;
constexpr int IOD = GDN_IO_DT;
constexpr int SBYTES = SD == GDN_F32 ? 4 : 2;
constexpr int VEC = GDN_VEC16 ? 16 / SBYTES : 1;   // state elements per lane per load
constexpr int LPR = K / VEC < 32 ? K / VEC : 32;   // lanes that share one row
constexpr int NV = K / (LPR * VEC);                // loads per lane per row
constexpr int RPW = 32 / LPR;                      // rows covered by one warp-wide load
constexpr int RW = GDN_RW;                         // row groups per warp
constexpr unsigned FULL = 0xffffffffu;
static_assert(K % VEC == 0 && 32 % LPR == 0 && NV * LPR * VEC == K, "unsupported K");
static_assert(RW >= 1 && RW * RPW <= 32, "a warp owns at most 32 rows");

// N consecutive elements of dtype DT (N*size a multiple of the access width, aligned to it)
// as fp32, with the widest loads: 16 bytes when N*size allows.
template <int DT, int N>
__device__ __forceinline__ void ld_vec(const void* base, long long i, float (&x)[N]) {
    if constexpr (DT == GDN_F32 && N % 4 == 0) {
        const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
            const float4 f = p[c];
            x[4 * c] = f.x; x[4 * c + 1] = f.y; x[4 * c + 2] = f.z; x[4 * c + 3] = f.w;
        }
    } else if constexpr (DT != GDN_F32 && N % 8 == 0) {
        const uint4* p = reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(base) + i);
#pragma unroll
        for (int c = 0; c < N / 8; ++c) {
            const uint4 u = p[c];
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                x[8 * c + 2 * e] = gdn_to_f32<DT>((unsigned short)(w[e] & 0xffffu));
                x[8 * c + 2 * e + 1] = gdn_to_f32<DT>((unsigned short)(w[e] >> 16));
            }
        }
    } else if constexpr (DT != GDN_F32 && N % 4 == 0) {
        const uint2* p = reinterpret_cast<const uint2*>(static_cast<const unsigned short*>(base) + i);
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
            const uint2 u = p[c];
            x[4 * c] = gdn_to_f32<DT>((unsigned short)(u.x & 0xffffu));
            x[4 * c + 1] = gdn_to_f32<DT>((unsigned short)(u.x >> 16));
            x[4 * c + 2] = gdn_to_f32<DT>((unsigned short)(u.y & 0xffffu));
            x[4 * c + 3] = gdn_to_f32<DT>((unsigned short)(u.y >> 16));
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) x[e] = gdn_ld<DT>(base, i + e);
    }
}

template <int DT, int N>
__device__ __forceinline__ void st_vec(void* base, long long i, const float (&x)[N]) {
    if constexpr (DT == GDN_F32 && N % 4 == 0) {
        float4* p = reinterpret_cast<float4*>(static_cast<float*>(base) + i);
#pragma unroll
        for (int c = 0; c < N / 4; ++c)
            p[c] = make_float4(x[4 * c], x[4 * c + 1], x[4 * c + 2], x[4 * c + 3]);
    } else if constexpr (DT != GDN_F32 && N % 8 == 0) {
        uint4* p = reinterpret_cast<uint4*>(static_cast<unsigned short*>(base) + i);
#pragma unroll
        for (int c = 0; c < N / 8; ++c) {
            unsigned w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
                w[e] = (unsigned)gdn_from_f32<DT>(x[8 * c + 2 * e]) |
                       ((unsigned)gdn_from_f32<DT>(x[8 * c + 2 * e + 1]) << 16);
            p[c] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) gdn_st<DT>(base, i + e, x[e]);
    }
}

extern "C" __global__ void __launch_bounds__(256) gdn_decode_v4(const GdnParams p) {
    using ST = typename GdnStorage<SD>::type;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    const long long bph = p.aux0;                      // blocks per head
    const long long nh = blockIdx.x / bph;
    const long long part = blockIdx.x - nh * bph;
    const long long n = nh / p.HV;
    const long long h = nh - n * p.HV;
    const long long hq = h / (p.HV / p.H);             // GVA: repeat_interleave mapping
    const int sub = lane / LPR;                        // which row of a warp-wide load
    const int kl = lane % LPR;                         // position along K within that row
    // This warp owns rows wbase .. wbase + RW*RPW - 1; lane handles wbase + g*RPW + sub.
    const long long wbase = part * (long long)(nwarps * RW * RPW) + (long long)warp * (RW * RPW);

    const ST* src = static_cast<const ST*>(p.state) + gdn_state_read_offset(p, n, h);
    ST* dst = static_cast<ST*>(p.new_state) + gdn_state_write_offset(p, n, h);

    // Lane's i-th vector holds K elements [(i*LPR + kl)*VEC, +VEC): consecutive lanes read
    // consecutive 16-byte chunks of a row.
    float S[RW][NV][VEC];
    bool live[RW];
#pragma unroll
    for (int g = 0; g < RW; ++g) {
        const long long row = wbase + g * RPW + sub;
        live[g] = row < p.V;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            if (live[g]) {
                ld_vec<SD, VEC>(src, row * p.s_v + (i * LPR + kl) * VEC, S[g][i]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) S[g][i][e] = 0.0f;
            }
        }
    }

    const float A_log = p.A_log[h * p.A_log_h];
    const float dtb = gdn_ld<GDN_DTB_DT>(p.dt_bias, h * p.dtb_h);
    const float scale = (float)p.scale;

    for (long long t = 0; t < p.T; ++t) {
        float qv[NV][VEC], kv[NV][VEC];
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long kofs = (i * LPR + kl) * VEC;
            ld_vec<IOD, VEC>(p.q, n * p.q_n + t * p.q_t + hq * p.q_h + kofs, qv[i]);
            ld_vec<IOD, VEC>(p.k, n * p.k_n + t * p.k_t + hq * p.k_h + kofs, kv[i]);
        }
        float vr[RW];
#pragma unroll
        for (int g = 0; g < RW; ++g)
            vr[g] = live[g] ? gdn_ld<IOD>(p.v, n * p.v_n + t * p.v_t + h * p.v_h + wbase + g * RPW + sub)
                            : 0.0f;
        const float gd = gdn_decay(A_log, gdn_ld<GDN_A_DT>(p.a, n * p.a_n + t * p.a_t + h * p.a_h) + dtb);
        const float beta = gdn_sigmoid(gdn_ld<GDN_B_DT>(p.b, n * p.b_n + t * p.b_t + h * p.b_h));

        // This lane's slice of every dot product; the butterfly below sums the LPR slices.
        float kq = 0.0f, qq = 0.0f, kk = 0.0f, sk[RW], sq[RW];
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                kq += kv[i][e] * qv[i][e];
                if (GDN_L2NORM) {
                    qq += qv[i][e] * qv[i][e];
                    kk += kv[i][e] * kv[i][e];
                }
            }
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            sk[g] = 0.0f;
            sq[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < NV; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    sk[g] += S[g][i][e] * kv[i][e];
                    sq[g] += S[g][i][e] * qv[i][e];
                }
        }
        // xor offsets below LPR stay inside a row's lane group; all chains are interleaved so
        // the shuffles of different rows overlap.
#pragma unroll
        for (int off = LPR / 2; off > 0; off >>= 1) {
            kq += __shfl_xor_sync(FULL, kq, off);
            if (GDN_L2NORM) {
                qq += __shfl_xor_sync(FULL, qq, off);
                kk += __shfl_xor_sync(FULL, kk, off);
            }
#pragma unroll
            for (int g = 0; g < RW; ++g) {
                sk[g] += __shfl_xor_sync(FULL, sk[g], off);
                sq[g] += __shfl_xor_sync(FULL, sq[g], off);
            }
        }
        // With the L2 norm, q.S, k.S and k.q of the raw vectors are rescaled instead of
        // normalizing q and k first, which keeps the norms off the dot products' path.
        float rq = 1.0f, rk = 1.0f;
        if (GDN_L2NORM) {
            rq = rsqrtf(qq + 1e-6f);
            rk = rsqrtf(kk + 1e-6f);
        }
        const float kqn = kq * rq * rk;
        float o[RW];
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            const float u = beta * (vr[g] - gd * sk[g] * rk);   // k read from the decayed row
            o[g] = scale * (gd * sq[g] * rq + u * kqn);          // q read from the updated row
            const float uk = u * rk;
#pragma unroll
            for (int i = 0; i < NV; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e) S[g][i][e] = gd * S[g][i][e] + uk * kv[i][e];
        }
        // Lane j stores the output of the warp's row wbase + j (row group j / RPW, sub-row
        // j % RPW, whose sums every lane of lane group j % RPW holds): one coalesced store.
        float mine = 0.0f;
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            const float x = __shfl_sync(FULL, o[g], (lane % RPW) * LPR);
            if (lane / RPW == g) mine = x;
        }
        if (lane < RW * RPW && wbase + lane < p.V)
            gdn_st<IOD>(p.out, n * p.o_n + t * p.o_t + h * p.o_h + wbase + lane, mine);
    }

#pragma unroll
    for (int g = 0; g < RW; ++g) {
        if (!live[g]) continue;
        const long long row = wbase + g * RPW + sub;
#pragma unroll
        for (int i = 0; i < NV; ++i) st_vec<SD, VEC>(dst, row * p.ns_v + (i * LPR + kl) * VEC, S[g][i]);
    }
}

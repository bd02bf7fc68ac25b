// cuda-v4's decode for a K-first state ([.., HV, K, V] a head: V contiguous, FLA's and
// transformers' default layout), read and written where it lies: no transpose, one launch.
// backends/_cuda_v4_kfirst.py builds it and picks its launch shape.
//
// A K-first head is K rows of V contiguous values.  A block owns CW = (32 / LK) * VEC columns of
// a head and all K rows of them: its W warps split the K rows, and in a warp 32 / LK lanes side
// by side read one 16-byte vector of a row each (CW * 4 or CW * 2 contiguous bytes: whole
// 128-byte lines at LK = 4), LK lanes down the rows, each lane holding KR = K / (W * LK)
// consecutive rows of its VEC columns.  The sums over K of a column (k.S and q.S) and q's and
// k's norms and k.q are a lane's rows, a butterfly over the warp's LK lanes, then (W > 1) the
// warps' partial sums through shared memory behind one barrier a token (two buffers, so a
// token's writes never meet the last token's reads).  Everything else is cuda_v4.cu's step:
// the decay first, u = beta (v - g k.S), S = g S + k u^T, o = scale (g q.S + u k.q), with the
// gates, slots, strides and dtypes of gdn_common.cuh.
//
// -D switches (backends/_cuda_build.py): GDN_K, GDN_V, GDN_T, GDN_HV, GDN_GVA, the dtype
// codes, GDN_L2NORM, GDN_W (warps a block: the K split), GDN_LK (lanes of a warp along K),
// GDN_VEC16 (16-byte vectors; 0: one column a lane, element loads), GDN_HINT (bit 0 .nc state
// loads, bit 1 streaming state stores; 16-byte vectors only), GDN_FASTGATE, GDN_DENSE,
// GDN_POOL (0 dense, 1 and 2 a pool, 3 and 4 per-token slots, as cuda_v4.cu), GDN_IDX64,
// GDN_GATES, GDN_NEG, GDN_PDL (1: wait before any global access); the speculative verify's
// GDN_INTER (the state after token t to intermediate row n, 1, or inter_idx[n], 2: K-first
// [K, V] blocks) and GDN_UPDATE (0: no final store), both or neither, as cuda_v4.cu.
// GDN_STAGED (T = 1, no verify form, a head's K rows contiguous: its [K, V] tile one run of
// memory): one block of 256 threads a (sequence, head), the whole tile copied into shared
// memory by bulk asynchronous copies onto one mbarrier while q, k, v and the gates load; thread
// t then owns columns 2c, 2c + 1 (c = t % 64) of the 32 rows r * 32 .. r * 32 + 31 (r = t / 64):
// its sums over K in the thread, the four row groups' through shared memory behind one barrier,
// and the new rows stored from the tile straight to global memory (W, LK, VEC16 unused).  Few
// registers and the loads in shared memory: more of the state in flight an SM than the
// register tile holds (lab/notebook/h200/kfirst_staged_2026-12-01/).
#include "gdn_common.cuh"

#include "cuda_v4_switches.cuh"               // GDN_INTER, GDN_UPDATE, GDN_PDL defaults
#define GDN_CHAIN 0
#if !defined(GDN_K) || !defined(GDN_V) || !defined(GDN_T) || !defined(GDN_HV) || \
    !defined(GDN_GVA) || !defined(GDN_STATE_DT) || !defined(GDN_IO_DT) || !defined(GDN_A_DT) || \
    !defined(GDN_B_DT) || !defined(GDN_DTB_DT) || !defined(GDN_L2NORM) || !defined(GDN_W) || \
    !defined(GDN_LK) || !defined(GDN_VEC16) || !defined(GDN_HINT) || !defined(GDN_FASTGATE) || \
    !defined(GDN_DENSE) || !defined(GDN_POOL) || \
    ((GDN_POOL || GDN_INTER == 2) && !defined(GDN_IDX64))
#error "compile with the -D options of backends/_cuda_v4_kfirst.py"
#endif
#ifndef GDN_STAGED
#define GDN_STAGED 0
#endif

#include "cuda_v4_shape.cuh"                        // K, V, T, HV, GVA, SD, IOD, sizes
constexpr int VEC = GDN_VEC16 ? 16 / SBYTES : 1;   // columns a lane
constexpr int LK = GDN_LK;                         // lanes of a warp along K
constexpr int LC = 32 / LK;                        // lanes of a warp side by side in a row
constexpr int W = GDN_W;                           // warps a block, each K / W rows
constexpr int KR = K / (W * LK);                   // K rows a lane
constexpr int CW = LC * VEC;                       // columns a block
constexpr unsigned BPH = V / CW;                   // blocks a head
constexpr int RED = 2 * CW + 3;                    // a warp's partial sums: k.S, q.S, k.q, q.q, k.k
constexpr unsigned FULL = 0xffffffffu;
static_assert(LK >= 1 && LK <= 32 && 32 % LK == 0 && K % (W * LK) == 0,
              "LK: a power of two; W * LK dividing K");
static_assert(V % CW == 0, "whole blocks of columns a head");
static_assert(W >= 1 && W <= 8 && T >= 1 && HV % GVA == 0 && GDN_POOL <= 4, "bad constants");
static_assert(GDN_INTER >= 0 && GDN_INTER <= 2 && (GDN_POOL < 3 || (GDN_UPDATE && !GDN_INTER)),
              "per-token slots (GDN_POOL 3, 4) store every token's state themselves");
static_assert(!GDN_STAGED || (T == 1 && !GDN_INTER && GDN_POOL < 3 && K == 128 && V == 128 &&
                              W == 8), "GDN_STAGED: one token, K = V = 128, 8 warps");
// GDN_STAGED's dynamic shared memory: the tile, raw k and q, the row groups' sums over K, the
// warps' sums of q.q, k.k and k.q, the mbarrier (backends/_cuda_v4_kfirst.py staged_smem)
constexpr unsigned STAGED_TILE = K * V * SBYTES;
constexpr int STAGED_RG = 4;

#include "cuda_v4_lane.cuh"                        // ld_vec, st_vec, tree_sum, qk_shfl

#if GDN_STAGED
__device__ __forceinline__ unsigned staged_smem_u32(const void* ptr) {
    return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// Columns 2c, 2c + 1 of row `row` of the staged tile.
__device__ __forceinline__ void staged_ld(const unsigned char* tile, int row, int c, float& x0,
                                          float& x1) {
    if constexpr (SD == GDN_F32) {
        const float2 w = reinterpret_cast<const float2*>(tile)[row * (V / 2) + c];
        x0 = w.x;
        x1 = w.y;
    } else {
        gdn_unpack2<SD>(reinterpret_cast<const unsigned*>(tile)[row * (V / 2) + c], x0, x1);
    }
}

// GDN_STAGED's token (the header says how): src the head's contiguous [K, V] tile, dst its new
// rows ns_k apart, o_head the head's output row.
template <typename ST>
__device__ __forceinline__ void staged_step(const GdnParams& p, const ST* src, ST* dst,
                                            long long ns_k, unsigned n, unsigned h, unsigned hq,
                                            long long o_head, bool store) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* tile = smem;                                    // [K][V]
    float* kq = reinterpret_cast<float*>(smem + STAGED_TILE);     // raw k [K], raw q [K]
    float* red = kq + 2 * K;                                       // [2][RG][V]
    float* sums = red + 2 * STAGED_RG * V;                         // [4 warps][3]
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(sums + 16);
    const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
    constexpr unsigned PIECE = STAGED_TILE / 4;
    if (t == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(staged_smem_u32(bar)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(staged_smem_u32(bar)), "r"(STAGED_TILE) : "memory");
        const unsigned char* from = reinterpret_cast<const unsigned char*>(src);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                         "[%0], [%1], %2, [%3];"
                         :: "r"(staged_smem_u32(tile + i * PIECE)), "l"(from + i * PIECE),
                            "r"(PIECE), "r"(staged_smem_u32(bar)) : "memory");
    }
    constexpr unsigned H = HV / GVA;
    const long long q0 = n * GDN_STRIDE(q_n, T * H * K) + hq * GDN_STRIDE(q_h, K);
    const long long k0 = n * GDN_STRIDE(k_n, T * H * K) + hq * GDN_STRIDE(k_h, K);
    if (t < K) {                            // while the tile is in flight: q, k and their sums
        const float qv = gdn_ld<IOD>(p.q, q0 + t), kv = gdn_ld<IOD>(p.k, k0 + t);
        kq[t] = kv;
        kq[K + t] = qv;
        float s0 = qv * qv, s1 = kv * kv, s2 = kv * qv;
#pragma unroll
        for (int off = 16; off; off >>= 1) {
            s0 += __shfl_xor_sync(FULL, s0, off);
            s1 += __shfl_xor_sync(FULL, s1, off);
            s2 += __shfl_xor_sync(FULL, s2, off);
        }
        if (lane == 0) {
            sums[warp * 3] = s0;
            sums[warp * 3 + 1] = s1;
            sums[warp * 3 + 2] = s2;
        }
    }
    const float A_log = p.A_log[h * GDN_STRIDE(A_log_h, 1)];
    const float dtb = gdn_ld<GDN_DTB_DT>(p.dt_bias, h * GDN_STRIDE(dtb_h, 1));
    const float xa = gdn_ld<GDN_A_DT>(p.a, n * GDN_STRIDE(a_n, T * HV) + h * GDN_STRIDE(a_h, 1))
                     + dtb;
    const float xb = gdn_ld<GDN_B_DT>(p.b, n * GDN_STRIDE(b_n, T * HV) + h * GDN_STRIDE(b_h, 1));
    const float gd = gdn_gate_decay<GDN_FASTGATE>(A_log, xa);
    const float beta = gdn_gate_beta<GDN_FASTGATE>(xb);
    const int c = t % 64, r = t / 64;
    const long long vi = n * GDN_STRIDE(v_n, T * HV * V) + h * GDN_STRIDE(v_h, V) + 2 * c;
    const float v0 = gdn_ld<IOD>(p.v, vi), v1 = gdn_ld<IOD>(p.v, vi + 1);
    __syncthreads();
    float rq = 1.0f, rk = 1.0f;
    if (GDN_L2NORM) {
        rq = rsqrtf(sums[0] + sums[3] + sums[6] + sums[9] + 1e-6f);
        rk = rsqrtf(sums[1] + sums[4] + sums[7] + sums[10] + 1e-6f);
    }
    const float kqn = (sums[2] + sums[5] + sums[8] + sums[11]) * rq * rk;
    asm volatile("{\n\t.reg .pred P1;\n"
                 "STAGED_WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n\t"
                 "@!P1 bra STAGED_WAIT;\n}" :: "r"(staged_smem_u32(bar)) : "memory");
    float sk0 = 0.f, sk1 = 0.f, sq0 = 0.f, sq1 = 0.f;       // raw k and q: k.S, q.S
    constexpr int KR_ = K / STAGED_RG;
#pragma unroll 8
    for (int i = 0; i < KR_; ++i) {
        const int row = r * KR_ + i;
        float x0, x1;
        staged_ld(tile, row, c, x0, x1);
        const float kv = kq[row], qv = kq[K + row];
        sk0 += kv * x0;
        sk1 += kv * x1;
        sq0 += qv * x0;
        sq1 += qv * x1;
    }
    red[r * V + 2 * c] = sk0;
    red[r * V + 2 * c + 1] = sk1;
    red[(STAGED_RG + r) * V + 2 * c] = sq0;
    red[(STAGED_RG + r) * V + 2 * c + 1] = sq1;
    __syncthreads();
    sk0 = sk1 = sq0 = sq1 = 0.f;
#pragma unroll
    for (int j = 0; j < STAGED_RG; ++j) {
        sk0 += red[j * V + 2 * c];
        sk1 += red[j * V + 2 * c + 1];
        sq0 += red[(STAGED_RG + j) * V + 2 * c];
        sq1 += red[(STAGED_RG + j) * V + 2 * c + 1];
    }
    const float scale = (float)p.scale;
    const float u0 = beta * (v0 - gd * rk * sk0), u1 = beta * (v1 - gd * rk * sk1);
    if (r == 0) {
        gdn_st<IOD>(p.out, o_head + 2 * c, scale * (gd * rq * sq0 + u0 * kqn));
        gdn_st<IOD>(p.out, o_head + 2 * c + 1, scale * (gd * rq * sq1 + u1 * kqn));
    }
    if (!store) return;
#pragma unroll 8
    for (int i = 0; i < KR_; ++i) {
        const int row = r * KR_ + i;
        float x0, x1;
        staged_ld(tile, row, c, x0, x1);
        const float kn = kq[row] * rk;
        x0 = gd * x0 + kn * u0;
        x1 = gd * x1 + kn * u1;
        if constexpr (SD == GDN_F32) {
            *reinterpret_cast<float2*>(dst + row * ns_k + 2 * c) = make_float2(x0, x1);
        } else {
            *reinterpret_cast<unsigned*>(dst + row * ns_k + 2 * c) = gdn_pack2<SD>(x0, x1);
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(32 * W) gdn_decode_v4_kfirst(const GdnParams p) {
    using ST = typename GdnStorage<SD>::type;
    constexpr bool NC = GDN_VEC16 && (GDN_HINT & 1);
    constexpr bool CS = GDN_VEC16 && (GDN_HINT & 2);
    constexpr unsigned H = HV / GVA;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned nh = GDN_STAGED ? blockIdx.x : blockIdx.x / BPH;
    const unsigned part = GDN_STAGED ? 0 : blockIdx.x - nh * BPH;
    const unsigned n = nh / HV;
    const unsigned h = nh - n * HV;
    const unsigned hq = h / GVA;                       // GVA: repeat_interleave mapping
    const unsigned kl = lane / LC;                     // which KR rows of the warp's K / W
    const int ccol = (int)(lane % LC) * VEC;           // the lane's columns within the block's
    const int col = (int)(part * CW) + ccol;
    const int row0 = (int)(warp * (K / W) + kl * KR);
#if GDN_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const long long o_t = GDN_STRIDE(o_t, HV * V);
    const long long o0 = n * GDN_STRIDE(o_n, T * HV * V) + h * GDN_STRIDE(o_h, V) + col;
#if GDN_POOL
    // A padded sequence: zero outputs, no state read or written (no intermediate state either).
    const GdnSlots slot =
        gdn_slots_from<GDN_POOL, T, GDN_IDX64>(p, n, gdn_first_index<GDN_POOL, T, GDN_IDX64>(p, n));
    if (!slot.rd) {
        if (GDN_STAGED) {
            if (threadIdx.x < V) gdn_st<IOD>(p.out, o0 - col + threadIdx.x, 0.0f);
        } else if (warp == 0 && kl == 0)
            for (int t = 0; t < T; ++t)
#pragma unroll
                for (int c = 0; c < VEC; ++c) gdn_st<IOD>(p.out, o0 + t * o_t + c, 0.0f);
        return;
    }
    const long long s_head = GDN_READ_OFFSET(slot.read, h);
    const long long ns_head = GDN_WRITE_OFFSET(slot.write, h);
    const bool store = GDN_UPDATE && slot.wr;          // per-token slots: wr false
#elif GDN_DENSE
    const long long s_head = (long long)nh * (V * K), ns_head = s_head;
    constexpr bool store = GDN_UPDATE;
#else
    const long long s_head = GDN_READ_OFFSET(n, h), ns_head = GDN_WRITE_OFFSET(n, h);
    constexpr bool store = GDN_UPDATE;
#endif
    // s_v and ns_v are the stride of a K row here (V when dense).
    const long long s_k = GDN_STRIDE(s_v, V), ns_k = GDN_STRIDE(ns_v, V);
    const ST* src = static_cast<const ST*>(p.state) + s_head;
    ST* dst = static_cast<ST*>(p.new_state) + ns_head;
#if GDN_STAGED
    staged_step<ST>(p, src, dst, ns_k, n, h, hq, o0 - col, store);
    return;
#endif
#if GDN_INTER
    bool ikeep;                                         // a row outside 0..S-1 stores nothing
    ST* const inter = intermediate_block<ST>(p, n, h, ikeep);
#endif
    float S[KR][VEC];
#pragma unroll
    for (int i = 0; i < KR; ++i) ld_vec<SD, VEC, NC>(src, (row0 + i) * s_k + col, S[i]);
    asm volatile("" ::: "memory");                      // the state loads first

    const float A_log = p.A_log[h * GDN_STRIDE(A_log_h, 1)];
    const float dtb = gdn_ld<GDN_DTB_DT>(p.dt_bias, h * GDN_STRIDE(dtb_h, 1));
    const float scale = (float)p.scale;
    const long long q_t = GDN_STRIDE(q_t, H * K), k_t = GDN_STRIDE(k_t, H * K);
    const long long v_t = GDN_STRIDE(v_t, HV * V);
    const long long a_t = GDN_STRIDE(a_t, HV), b_t = GDN_STRIDE(b_t, HV);
    const long long q0 = n * GDN_STRIDE(q_n, T * H * K) + hq * GDN_STRIDE(q_h, K) + row0;
    const long long k0 = n * GDN_STRIDE(k_n, T * H * K) + hq * GDN_STRIDE(k_h, K) + row0;
    const long long v0 = n * GDN_STRIDE(v_n, T * HV * V) + h * GDN_STRIDE(v_h, V) + col;
    const long long a0 = n * GDN_STRIDE(a_n, T * HV) + h * GDN_STRIDE(a_h, 1);
    const long long b0 = n * GDN_STRIDE(b_n, T * HV) + h * GDN_STRIDE(b_h, 1);

    constexpr bool WARPS_SUM = W > 1 && !GDN_STAGED;   // (GDN_STAGED returned above)
    __shared__ float red[WARPS_SUM ? 2 : 1][WARPS_SUM ? W : 1][WARPS_SUM ? RED : 1];
#pragma unroll 1
    for (int t = 0; t < T; ++t) {
        float qv[KR], kv[KR], vv[VEC];
        if constexpr (GDN_VEC16) {
            ld_vec<IOD, KR>(p.q, q0 + t * q_t, qv);
            ld_vec<IOD, KR>(p.k, k0 + t * k_t, kv);
        } else {
#pragma unroll
            for (int i = 0; i < KR; ++i) {
                qv[i] = gdn_ld<IOD>(p.q, q0 + t * q_t + i);
                kv[i] = gdn_ld<IOD>(p.k, k0 + t * k_t + i);
            }
        }
        // v's VEC columns in one load where aligned (engines pass views of a fused tensor)
        const long long vi = v0 + t * v_t;
        if (GDN_VEC16 && VEC * IOBYTES >= 8 &&
            ((reinterpret_cast<unsigned long long>(p.v) + vi * IOBYTES) & (VEC * IOBYTES - 1)) == 0) {
            ld_vec<IOD, VEC>(p.v, vi, vv);
        } else {
#pragma unroll
            for (int c = 0; c < VEC; ++c) vv[c] = gdn_ld<IOD>(p.v, vi + c);
        }
        const float xa = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
        const float xb = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
        const float gd = gdn_gate_decay<GDN_FASTGATE>(A_log, xa);
        const float beta = gdn_gate_beta<GDN_FASTGATE>(xb);
        // This lane's slices: k.q (and the norms), the columns' k.S and q.S (raw q, k).
        float kq = tree_sum<0, KR>([&](int i) { return kv[i] * qv[i]; });
        float qq = 0.0f, kk = 0.0f;
        if (GDN_L2NORM) {
            qq = tree_sum<0, KR>([&](int i) { return qv[i] * qv[i]; });
            kk = tree_sum<0, KR>([&](int i) { return kv[i] * kv[i]; });
        }
        float sk[VEC], sq[VEC];
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            sk[c] = tree_sum<0, KR>([&](int i) { return kv[i] * S[i][c]; });
            sq[c] = tree_sum<0, KR>([&](int i) { return qv[i] * S[i][c]; });
        }
#pragma unroll
        for (int off = 16; off >= LC; off >>= 1) {      // the warp's LK lanes down the rows
            qk_shfl(kq, qq, kk, off);
#pragma unroll
            for (int c = 0; c < VEC; ++c) {
                sk[c] += __shfl_xor_sync(FULL, sk[c], off);
                sq[c] += __shfl_xor_sync(FULL, sq[c], off);
            }
        }
        if constexpr (WARPS_SUM) {                      // the warps' K slices
            float* mine = red[t & 1][warp];
            if (kl == 0) {
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    mine[ccol + c] = sk[c];
                    mine[CW + ccol + c] = sq[c];
                }
                if (lane == 0) {
                    mine[2 * CW] = kq;
                    mine[2 * CW + 1] = qq;
                    mine[2 * CW + 2] = kk;
                }
            }
            __syncthreads();
            kq = qq = kk = 0.0f;
#pragma unroll
            for (int c = 0; c < VEC; ++c) sk[c] = sq[c] = 0.0f;
#pragma unroll
            for (int w = 0; w < W; ++w) {
                const float* r = red[t & 1][w];
#pragma unroll
                for (int c = 0; c < VEC; ++c) {
                    sk[c] += r[ccol + c];
                    sq[c] += r[CW + ccol + c];
                }
                kq += r[2 * CW];
                qq += r[2 * CW + 1];
                kk += r[2 * CW + 2];
            }
        }
        float rq = 1.0f, rk = 1.0f;
        if (GDN_L2NORM) {
            rq = rsqrtf(qq + 1e-6f);
            rk = rsqrtf(kk + 1e-6f);
        }
        const float kqn = kq * rq * rk;
        float u[VEC], o[VEC];
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
            u[c] = beta * (vv[c] - gd * rk * sk[c]);
            o[c] = scale * (gd * rq * sq[c] + u[c] * kqn);
        }
#pragma unroll
        for (int i = 0; i < KR; ++i) {
            const float kn = kv[i] * rk;
#pragma unroll
            for (int c = 0; c < VEC; ++c) S[i][c] = gd * S[i][c] + kn * u[c];
        }
#if GDN_INTER
        if (ikeep) {                                    // the state after token t, step t
            ST* const step = inter + t * GDN_SLOT_STRIDE(i_t);
#pragma unroll
            for (int i = 0; i < KR; ++i) st_vec<SD, VEC, CS>(step, (row0 + i) * V + col, S[i]);
        }
#elif GDN_POOL >= 3
        {                                               // token t's slot idx[n, t]
            const long long ts = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T + t);
            if (gdn_token_slot_ok(p, ts)) {
                ST* const tok = static_cast<ST*>(p.new_state) + GDN_WRITE_OFFSET(ts, h);
#pragma unroll
                for (int i = 0; i < KR; ++i) st_vec<SD, VEC, CS>(tok, (row0 + i) * ns_k + col, S[i]);
            }
        }
#endif
        if (warp == 0 && kl == 0) {                    // one vector where a lane's are 16 bytes
            const long long oi = o0 + t * o_t;
            if (VEC * IOBYTES == 16 &&
                ((reinterpret_cast<unsigned long long>(p.out) + oi * IOBYTES) & 15) == 0) {
                st_vec<IOD, VEC>(p.out, oi, o);
            } else {
#pragma unroll
                for (int c = 0; c < VEC; ++c) gdn_st<IOD>(p.out, oi + c, o[c]);
            }
        }
    }
    if (store) {
#pragma unroll
        for (int i = 0; i < KR; ++i) st_vec<SD, VEC, CS>(dst, (row0 + i) * ns_k + col, S[i]);
    }
}

// Lab prototype (kfirst_staged.py beside it; in the product: GDN_STAGED of
// backends/cuda_v4_kfirst.cu): one decode step on a K-first state ([B, HV, K, V] a head,
// V contiguous), the head's whole state tile staged in shared memory by bulk asynchronous copies
// (cp.async.bulk onto one mbarrier) instead of loaded into registers as cuda_v4_kfirst.cu does.
// The question: does a block that holds its tile in shared memory (few registers, so more blocks
// an SM, and up to 32 KB / 64 KB of each block's loads in flight) read and write a K-first state
// at the k-last kernel's bandwidth?
//
// Dense, T = 1, K = V = 128, raw gates, q and k L2-normalized, in place or to another tensor.
// One block a (sequence, value head), 256 threads: thread t owns columns 2c, 2c + 1 (c = t % 64)
// of rows r * 32 .. r * 32 + 31 (r = t / 64): its sums over K are 32 rows in the thread, then the
// four row groups' partial sums through shared memory behind one barrier.  A warp reads 32
// consecutive column pairs of a row: whole 128-byte (bf16) or 256-byte (fp32) runs, no bank
// conflicts.  The new state goes straight from the registers to global memory, row by row.
//
// -D SD: the state's dtype code (gdn_common.cuh: 0 fp32, 1 bf16).
#define GDN_GATES 0
#define GDN_NEG 0
#include "gdn_common.cuh"

#ifndef SD
#error "compile with -D SD=0 (fp32) or 1 (bf16)"
#endif

constexpr int K = 128, V = 128, THREADS = 256, RG = THREADS / 64, KR = K / RG;
constexpr int SB = SD == GDN_F32 ? 4 : 2;
constexpr unsigned TILE = K * V * SB;
constexpr int PIECES = 4;

struct Params {
    const void* state;
    void* new_state;                  // state itself in place
    const unsigned short* q;          // [B, 1, H, K] bf16, contiguous
    const unsigned short* k;
    const unsigned short* v;          // [B, 1, HV, V]
    const unsigned short* a;          // [B, 1, HV]
    const unsigned short* b;
    const float* A_log;               // [HV]
    const float* dt_bias;             // [HV]
    unsigned short* out;              // [B, 1, HV, V]
    long long HV, GVA;
    float scale, pad;
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// a column pair (2c, 2c + 1) of row `row` of the staged tile, as floats
__device__ __forceinline__ void tile_ld(const unsigned char* tile, int row, int c, float& x0,
                                        float& x1) {
    if constexpr (SD == GDN_F32) {
        const float2 w = reinterpret_cast<const float2*>(tile)[row * (V / 2) + c];
        x0 = w.x;
        x1 = w.y;
    } else {
        gdn_unpack2<GDN_BF16>(reinterpret_cast<const unsigned*>(tile)[row * (V / 2) + c], x0, x1);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) kfirst_staged(const Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* tile = smem;                                    // [K][V] the state's dtype
    float* kq = reinterpret_cast<float*>(smem + TILE);            // [2][K]: raw k, raw q
    float* red = kq + 2 * K;                                       // [2][RG][V]
    float* sums = red + 2 * RG * V;                                // [4 warps][3]
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(sums + 16);
    const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const unsigned nh = blockIdx.x;
    const unsigned n = nh / p.HV, h = nh - n * p.HV, hq = h / p.GVA;
    const long long H = p.HV / p.GVA;
    const long long head = (long long)nh * K * V;
    if (t == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(bar)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(smem_u32(bar)), "r"(TILE) : "memory");
        const unsigned char* src = static_cast<const unsigned char*>(p.state) + head * SB;
#pragma unroll
        for (int i = 0; i < PIECES; ++i)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                         "[%0], [%1], %2, [%3];"
                         :: "r"(smem_u32(tile + i * (TILE / PIECES))),
                            "l"(src + i * (TILE / PIECES)), "r"(TILE / PIECES),
                            "r"(smem_u32(bar)) : "memory");
    }
    // while the tile is in flight: q, k and their sums, the gates, this thread's v
    if (t < K) {
        const float qv = gdn_bf16_to_f32(p.q[(n * H + hq) * K + t]);
        const float kv = gdn_bf16_to_f32(p.k[(n * H + hq) * K + t]);
        kq[t] = kv;
        kq[K + t] = qv;
        float s0 = qv * qv, s1 = kv * kv, s2 = kv * qv;
#pragma unroll
        for (int off = 16; off; off >>= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, off);
            s1 += __shfl_xor_sync(0xffffffffu, s1, off);
            s2 += __shfl_xor_sync(0xffffffffu, s2, off);
        }
        if (lane == 0) {
            sums[warp * 3] = s0;
            sums[warp * 3 + 1] = s1;
            sums[warp * 3 + 2] = s2;
        }
    }
    const float g = gdn_decay(p.A_log[h], gdn_bf16_to_f32(p.a[nh]) + p.dt_bias[h]);
    const float beta = gdn_sigmoid(gdn_bf16_to_f32(p.b[nh]));
    const int c = t % 64, r = t / 64;
    float v0, v1;
    gdn_unpack2<GDN_BF16>(reinterpret_cast<const unsigned*>(p.v + (long long)nh * V)[c], v0, v1);
    __syncthreads();
    const float qq = sums[0] + sums[3] + sums[6] + sums[9];
    const float kk = sums[1] + sums[4] + sums[7] + sums[10];
    const float qk = sums[2] + sums[5] + sums[8] + sums[11];
    const float rq = rsqrtf(qq + 1e-6f), rk = rsqrtf(kk + 1e-6f);
    // the tile
    asm volatile("{\n\t.reg .pred P1;\n"
                 "WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n\t"
                 "@!P1 bra WAIT;\n}" :: "r"(smem_u32(bar)) : "memory");
    float sk0 = 0.f, sk1 = 0.f, sq0 = 0.f, sq1 = 0.f;
#pragma unroll 8
    for (int i = 0; i < KR; ++i) {
        const int row = r * KR + i;
        float x0, x1;
        tile_ld(tile, row, c, x0, x1);
        const float kv = kq[row], qv = kq[K + row];
        sk0 += kv * x0;
        sk1 += kv * x1;
        sq0 += qv * x0;
        sq1 += qv * x1;
    }
    red[r * V + 2 * c] = sk0;
    red[r * V + 2 * c + 1] = sk1;
    red[(RG + r) * V + 2 * c] = sq0;
    red[(RG + r) * V + 2 * c + 1] = sq1;
    __syncthreads();
    sk0 = sk1 = sq0 = sq1 = 0.f;
#pragma unroll
    for (int j = 0; j < RG; ++j) {
        sk0 += red[j * V + 2 * c];
        sk1 += red[j * V + 2 * c + 1];
        sq0 += red[(RG + j) * V + 2 * c];
        sq1 += red[(RG + j) * V + 2 * c + 1];
    }
    const float kqn = qk * rq * rk, scale = p.scale;
    const float u0 = beta * (v0 - g * rk * sk0), u1 = beta * (v1 - g * rk * sk1);
    if (r == 0) {
        const float o0 = scale * (g * rq * sq0 + u0 * kqn);
        const float o1 = scale * (g * rq * sq1 + u1 * kqn);
        reinterpret_cast<unsigned*>(p.out + (long long)nh * V)[c] = gdn_pack2<GDN_BF16>(o0, o1);
    }
    unsigned char* dst = static_cast<unsigned char*>(p.new_state) + head * SB;
#pragma unroll 8
    for (int i = 0; i < KR; ++i) {
        const int row = r * KR + i;
        float x0, x1;
        tile_ld(tile, row, c, x0, x1);
        const float kn = kq[row] * rk;
        x0 = g * x0 + kn * u0;
        x1 = g * x1 + kn * u1;
        if constexpr (SD == GDN_F32) {
            reinterpret_cast<float2*>(dst)[row * (V / 2) + c] = make_float2(x0, x1);
        } else {
            reinterpret_cast<unsigned*>(dst)[row * (V / 2) + c] = gdn_pack2<GDN_BF16>(x0, x1);
        }
    }
}

// A probe of TMA tensor copies (cuTensorMapEncodeTiled maps, 128-byte swizzle) feeding Hopper's
// wgmma B operand from the swizzled tiles, for cuda-chunk-bf16's chain kernel
// (backends/cuda_chunk_chain.cu): which descriptor offsets make wgmma read a TMA-written tile as
// the products need it.
//
// B global: [64 rows][128] bf16 row-major (a chunk's k rows: row = token).  Two TMA boxes of
// [64 rows][64 columns] (128 bytes a row, 128-byte swizzle) land at sb and sb + 8 KB; the raw
// shared bytes are copied out (``Braw``) so the host checks the placement on its own.
// GDN_MODE 0 (K-major, X = S0 k^T's form): D [64, 64] = A [64, 16] B[:, 16 s .. 16 s + 16]^T,
//   the descriptor starting at box (s / 4) + 32 (s % 4) bytes.
// GDN_MODE 1 (MN-major, the update's form, imm-trans-b 1): D [64, 128] = A [64, 16]
//   B[16 s .. 16 s + 16, :], the descriptor starting at box 0 + 2048 s bytes.
// A: no swizzle core matrices (lab/wgmma_probe.cu: LBO 128 along K, SBO 256 along M).
#include "wgmma.cuh"
typedef unsigned short bf16_t;
struct alignas(64) TMap { unsigned long long v[16]; };
struct ProbeParams {
    TMap tmap;
    const bf16_t* A; bf16_t* Braw; float* D;
    long long lbo, sbo, s;
};
extern "C" __global__ void __launch_bounds__(128) tma_probe(const __grid_constant__ ProbeParams p) {
    // the boxes at the start of 100 KB of dynamic shared memory: a wrong (LBO, SBO) reads
    // garbage inside the CTA's shared memory, not past it
    extern __shared__ __align__(1024) bf16_t sb[];
    __shared__ __align__(1024) bf16_t sa[64 * 16];
    __shared__ __align__(8) unsigned long long bar;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int i = tid; i < 64 * 16; i += 128) {
        const int m = i / 16, k = i % 16;
        sa[((m / 8) * 256 + (k / 8) * 128 + (m % 8) * 16 + (k % 8) * 2) / 2] = p.A[i];
    }
    const unsigned b = smem_u32(&bar);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(b), "r"(2 * 64 * 64 * 2) : "memory");
        const unsigned long long tm = reinterpret_cast<unsigned long long>(&p.tmap);
#pragma unroll
        for (int box = 0; box < 2; ++box)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                         " [%0], [%1, {%2, %3}], [%4];"
                         :: "r"(smem_u32(sb + box * 64 * 64)), "l"(tm), "r"(64 * box), "r"(0),
                            "r"(b) : "memory");
    }
    asm volatile("{\n\t.reg .pred P1;\n\tWAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], 0;\n\t"
                 "@!P1 bra WAIT;\n}" :: "r"(b) : "memory");
    for (int i = tid; i < 2 * 64 * 64; i += 128) p.Braw[i] = sb[i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned long long da = wg_desc(smem_u32(sa), 128, 256, 0);
    const int s = (int)p.s, g = lane >> 2, t4 = lane & 3;
#if GDN_MODE == 0
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    const unsigned long long db = wg_desc(smem_u32(sb + (s / 4) * 64 * 64) + 32 * (s % 4),
                                          (unsigned)p.lbo, (unsigned)p.sbo, 1);
    wg_fence();
    mma64ss<0>(d, da, db, 0);
    constexpr int NN = 64;
#else
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    const unsigned long long db = wg_desc(smem_u32(sb) + 2048 * s, (unsigned)p.lbo,
                                          (unsigned)p.sbo, 1);
    wg_fence();
    mma128ss<1>(d, da, db, 0);
    constexpr int NN = 128;
#endif
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < NN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * w + g + 8 * h, col = 8 * j + 2 * t4;
            p.D[row * NN + col] = d[4 * j + 2 * h];
            p.D[row * NN + col + 1] = d[4 * j + 2 * h + 1];
        }
}

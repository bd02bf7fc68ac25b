// A probe of Hopper's warpgroup MMA (wgmma) from raw PTX, for the chunk kernels to come: one
// m64n64k16 product of bf16 operands in shared memory (no swizzle), its descriptors' leading and
// stride byte offsets given at run time, the operands placed in shared memory by given strides
// (lab/wgmma_probe.py tries the combinations and says which reproduce A B^T).
//
// A: [64, 16] (M x K) K-major: element (m, k) at (m / 8) a_so + (k / 8) a_si + (m % 8) 16 +
// (k % 8) 2 bytes.  B: with GDN_BT 0 [64, 16] (N x K) K-major, element (n, k) at (n / 8) b_s1 +
// (k / 8) b_s2 + (n % 8) 16 + (k % 8) 2; with GDN_BT 1 (wgmma's transposed B, N contiguous)
// B given as [16, 64] (K x N), element (k, n) at (n / 8) b_s1 + (k / 8) b_s2 + (k % 8) 16 +
// (n % 8) 2.  D = A B^T [64, 64]
// fp32, written row-major from the assumed accumulator layout: warp w rows 16 w + lane / 4 (+ 8),
// n-chunk j columns 8 j + 2 (lane % 4) (+ 1) in registers 4 j .. 4 j + 3.
#include "wgmma.cuh"
typedef unsigned short bf16_t;
struct ProbeParams {
    const bf16_t* A; const bf16_t* B; float* D;
    long long a_so, a_si, a_lbo, a_sbo, b_s1, b_s2, b_lbo, b_sbo;
};
extern "C" __global__ void __launch_bounds__(128) wgmma_probe(const ProbeParams p) {
    __shared__ __align__(1024) bf16_t sa[4096];
    __shared__ __align__(1024) bf16_t sb[4096];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int i = tid; i < 4096; i += 128) sa[i] = sb[i] = 0;
    __syncthreads();
    for (int i = tid; i < 64 * 16; i += 128) {
        const int m = i / 16, k = i % 16;
        sa[((m / 8) * p.a_so + (k / 8) * p.a_si + (m % 8) * 16 + (k % 8) * 2) / 2] = p.A[i];
#if GDN_BT
        sb[((m / 8) * p.b_s1 + (k / 8) * p.b_s2 + (k % 8) * 16 + (m % 8) * 2) / 2] = p.B[k * 64 + m];
#else
        sb[((m / 8) * p.b_s1 + (k / 8) * p.b_s2 + (m % 8) * 16 + (k % 8) * 2) / 2] = p.B[i];
#endif
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    wg_fence();
    mma64ss<GDN_BT>(d, wg_desc(smem_u32(sa), (unsigned)p.a_lbo, (unsigned)p.a_sbo, 0),
                    wg_desc(smem_u32(sb), (unsigned)p.b_lbo, (unsigned)p.b_sbo, 0), 0);
    wg_commit();
    wg_wait<0>();
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * w + g + 8 * h, col = 8 * j + 2 * t4;
            p.D[row * 64 + col] = d[4 * j + 2 * h];
            p.D[row * 64 + col + 1] = d[4 * j + 2 * h + 1];
        }
}

// The warpgroup MMA's rate in the shapes the chain kernel issues (lab/wgmma_rate.py): each CTA
// one warpgroup, ITERS batches of products into registers, A from registers (rs) or shared
// memory (ss), B from shared memory (contents irrelevant to the rate).
// MODE 0: 8 x m64n64k16 rs (X = S0 k^T); 1: 8 x m64n128k16 rs (X and Y as one product);
// 2: 16 x m64n64k16 rs into two accumulators, same A (X and Y as now); 3: 8 x m64n64k16 ss;
// 4: 8 x m64n128k16 ss; 5: 4 x m64n128k16 rs (the update of S).
// WAIT 0: wait for each batch before the next (a dependent chain); 1: one batch in flight.
#include "wgmma.cuh"
#ifndef MODE
#define MODE 0
#endif
#ifndef WAIT
#define WAIT 0
#endif
#ifndef ITERS
#define ITERS 256
#endif
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_rate(float* out) {
    extern __shared__ __align__(1024) unsigned char sm[];
    const unsigned base = smem_u32(sm);
    unsigned a[8][4];
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[k][i] = 0x3f803f80u ^ (threadIdx.x * 131 + k * 7 + i);
    float d[64], e[32];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) e[i] = 0.f;
    for (int it = 0; it < ITERS; ++it) {
        wg_fence();
#if MODE == 0 || MODE == 2
        float (&x)[32] = *reinterpret_cast<float (*)[32]>(d);
#pragma unroll
        for (int k = 0; k < 8; ++k) mma64rs<0>(x, a[k], wg_desc(base + 32 * k, 16, 1024, 1), 1);
#if MODE == 2
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(e, a[k], wg_desc(base + 16384 + 32 * k, 16, 1024, 1), 1);
#endif
#elif MODE == 1
#pragma unroll
        for (int k = 0; k < 8; ++k) mma128rs<0>(d, a[k], wg_desc(base + 32 * k, 16, 1024, 1), 1);
#elif MODE == 3
        float (&x)[32] = *reinterpret_cast<float (*)[32]>(d);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64ss<0>(x, wg_desc(base + 32768 + 32 * k, 16, 1024, 1),
                       wg_desc(base + 32 * k, 16, 1024, 1), 1);
#elif MODE == 4
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma128ss<0>(d, wg_desc(base + 32768 + 32 * k, 16, 1024, 1),
                        wg_desc(base + 32 * k, 16, 1024, 1), 1);
#elif MODE == 5
#pragma unroll
        for (int k = 0; k < 4; ++k) mma128rs<1>(d, a[k], wg_desc(base + 2048 * k, 8192, 1024, 1), 1);
#endif
        wg_commit();
        wg_wait<WAIT>();
        pin(d);
        pin(e);
    }
    wg_wait<0>();
    pin(d);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += d[i];
#pragma unroll
    for (int i = 0; i < 32; ++i) s += e[i];
    out[blockIdx.x * 128 + threadIdx.x] = s;
}

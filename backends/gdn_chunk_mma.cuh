// Shared by cuda-chunk's two kernels (cuda_chunk_prep.cu, cuda_chunk_chain.cu): warp-level
// tensor-core fragments through shared memory (ldmatrix), cp.async copies, bf16 hi/lo splits.
// Self-contained like gdn_common.cuh (which it needs for mma16816 and the bf16 packing).
#pragma once
#include "gdn_common.cuh"

typedef unsigned short bf16_t;

// d += a b with a's four fragment registers in an array
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
    mma16816(d, a[0], a[1], a[2], a[3], b0, b1);
}
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// four 8 x 8 bf16 matrices; lane i names row i % 8 of matrix i / 8
__device__ __forceinline__ void ldm4(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
// the same, each matrix transposed
__device__ __forceinline__ void ldm4t(unsigned (&r)[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
// 16 bytes global -> shared, zeros when !ok (nothing read)
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0));
}
// 4 bytes global -> shared, zeros when !ok
__device__ __forceinline__ void cp4(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 4 : 0));
}
// the pair (a, b) as bf16 hi and lo parts, a in the low halves
__device__ __forceinline__ void split2(float a, float b, unsigned& hi, unsigned& lo) {
    hi = gdn_pack2<GDN_BF16>(a, b);
    float ha, hb;
    gdn_unpack2<GDN_BF16>(hi, ha, hb);
    lo = gdn_pack2<GDN_BF16>(a - ha, b - hb);
}

// Hopper warpgroup MMA (wgmma) from raw PTX for cuda_chunk_chain.cu and the lab probes
// (lab/wgmma_probe.cu, lab/tma_probe.cu): bf16 operands, fp32 accumulators, m64n64k16 and
// m64n128k16, A from registers ("rs") or by descriptor ("ss"), B by descriptor; the fences,
// commits and waits around them.
// Descriptors: start address, leading byte offset (LBO), stride byte offset (SBO), swizzle
// (0 none, 1 128-byte), each offset >> 4 in its field.  Settled on an H200
// (lab/notebook/h200/wgmma_probe_2026-11-29.log, wgmma_chain_2026-11-29/tma_probe.log): no
// swizzle, LBO is the core-matrix stride along K and SBO along M/N; 128-byte swizzle, K-major:
// SBO 1024, k-steps at +32 bytes in a 64-column box; MN-major: LBO 8192 (the next 64-wide box
// along N), SBO 1024, k-steps at +2048.
#pragma once

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                      unsigned swizzle) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4)
         | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32)
         | ((unsigned long long)swizzle << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// keeps the compiler from touching accumulators between an async wgmma and its wait
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// the accumulators' operand lists and placeholders (d[0..31] are %0..%31, d[32..63] %32..%63)
#define WG_D8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32(d) WG_D8(d, 0), WG_D8(d, 8), WG_D8(d, 16), WG_D8(d, 24)
#define WG_D64(d) WG_D32(d), WG_D8(d, 32), WG_D8(d, 40), WG_D8(d, 48), WG_D8(d, 56)
#define WG_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
               "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
               "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
               "%62, %63}"

// d (+)= A B (``acc`` 0: d = A B), A [64, 16] from registers (mma.sync's A fragment), B [16, 64]
template <int TB>
__device__ __forceinline__ void mma64rs(float (&d)[32], const unsigned (&a)[4],
                                        unsigned long long db, int acc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}"
                 : WG_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
// the same with A by descriptor (K-major)
template <int TB>
__device__ __forceinline__ void mma64ss(float (&d)[32], unsigned long long da,
                                        unsigned long long db, int acc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_R32
                 ", %32, %33, p, 1, 1, 0, %35;\n}"
                 : WG_D32(d) : "l"(da), "l"(db), "r"(acc), "n"(TB));
}
// d (+)= A B, B [16, 128]; A from registers
template <int TB>
__device__ __forceinline__ void mma128rs(float (&d)[64], const unsigned (&a)[4],
                                         unsigned long long db, int acc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %69, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_R64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}"
                 : WG_D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
// the same with A by descriptor (K-major)
template <int TB>
__device__ __forceinline__ void mma128ss(float (&d)[64], unsigned long long da,
                                         unsigned long long db, int acc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_R64
                 ", %64, %65, p, 1, 1, 0, %67;\n}"
                 : WG_D64(d) : "l"(da), "l"(db), "r"(acc), "n"(TB));
}

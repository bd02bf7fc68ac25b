// The tensor-core verify's instruction-level pieces (included by cuda_v4_tc.cu after its
// constants; the MMA itself, mma16816, is gdn_common.cuh's): the bf16 split of an fp32 state,
// predicated stores (no branch in the token loop), the scheduling fence, and the warp's sums
// (WARP_DOTS).
#pragma once

// 8 bytes (four bf16) at p, one load.
__device__ __forceinline__ uint2 ld8(const unsigned short* p) {
    return *reinterpret_cast<const uint2*>(p);
}

// x = hi + mid + lo exactly, each a bf16 pair (x0 in the low half): hi keeps the top 16 bits
// of x (truncation, one PRMT a pair), mid the top 16 of the rest, lo what is left (at most 8
// significant bits, so its top 16 bits hold it exactly).
__device__ __forceinline__ unsigned hi2(float a, float b) {
    return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
}
__device__ __forceinline__ float rest(float a) {
    return a - __uint_as_float(__float_as_uint(a) & 0xffff0000u);
}
__device__ __forceinline__ void split3(float x0, float x1, unsigned& h, unsigned& m, unsigned& l) {
    h = hi2(x0, x1);
    const float r0 = rest(x0), r1 = rest(x1);
    m = hi2(r0, r1);
    l = hi2(rest(r0), rest(r1));
}

// A lane's 4 state elements to global memory at byte address ``to`` where ``ok``: predicated,
// not branched around, so no branch splits the token loop.  The addresses come from the
// loader through shared memory, so the compiler cannot tell they are global: written as
// st.global, not as generic stores.
template <typename ST>
__device__ __forceinline__ void st4_global(unsigned long long to, bool ok, const float (&s)[4]) {
    if constexpr (sizeof(ST) == 2) {
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %3, 0;\n\t"
                     "@q st.global.v2.b32 [%0], {%1, %2};\n\t}" :: "l"(to),
                     "r"(gdn_pack2<GDN_BF16>(s[0], s[1])), "r"(gdn_pack2<GDN_BF16>(s[2], s[3])),
                     "r"((unsigned)ok) : "memory");
    } else {
        asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %5, 0;\n\t"
                     "@q st.global.v4.f32 [%0], {%1, %2, %3, %4};\n\t}" :: "l"(to), "f"(s[0]),
                     "f"(s[1]), "f"(s[2]), "f"(s[3]), "r"((unsigned)ok) : "memory");
    }
}

// OWN_STORES (an fp32 state): one token's store, its 4 values and its address as registers of
// their own.
struct St4 {
    float x[4];
    unsigned long long to;                             // the address, read by the store too
    __device__ __forceinline__ void store(bool ok) const { st4_global<float>(to, ok, x); }
    // Keeps the registers live to here (folded into ``acc``, which goes to sched_fence's sink):
    // a store reads its registers after it issues, so a later token's state written into the
    // same registers would wait for the store.
    __device__ __forceinline__ void keep(unsigned& acc) const {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc ^= __float_as_uint(x[e]);
        acc ^= (unsigned)to ^ (unsigned)(to >> 32);
    }
};

// One bf16 output where ``ok``, likewise predicated.
__device__ __forceinline__ void st_bf16_global(unsigned short* to, bool ok, float x) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q st.global.b16 [%0], %1;\n\t}"
                 :: "l"(to), "h"(gdn_f32_to_bf16(x)), "r"((unsigned)ok) : "memory");
}

// One bf16 into shared memory where ``ok``, predicated (no branch).
__device__ __forceinline__ void st_shared_b16(void* to, bool ok, unsigned short x) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q st.shared.b16 [%0], %1;\n\t}"
                 :: "r"((unsigned)__cvta_generic_to_shared(to)), "h"(x), "r"((unsigned)ok)
                 : "memory");
}

// A scheduling fence: ptxas moves no instruction across a clock read, so a read after each
// token's store keeps the next tokens' arithmetic behind it.  Without it ptxas makes every
// token's state first and issues the T stores last, about 400 cycles after token 0's state is
// ready (bf16, T = 8), and the stores' drain, the longest part of the kernel, starts that much
// later.  A clock read whose value goes nowhere is dropped, so the values are folded into
// ``acc``, which the kernel stores where it is never read again (the end of the kernel).
__device__ __forceinline__ void sched_fence(unsigned& acc) {
    unsigned c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c) :: "memory");
    acc ^= c;
}

// 1 / sqrt(x + 1e-6): the L2 norm's inverse (1 without it).  rsqrt.approx.ftz is the MUFU
// instruction alone; x + 1e-6 is never subnormal, so it equals rsqrtf, which adds a
// subnormal-input rescale around it.
__device__ __forceinline__ float rnorm(float x) {
    float y = 1.f;
    if (GDN_L2NORM) asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x + 1e-6f));
    return y;
}

// a where c, else b: a select the compiler keeps (written as ?: over an array, it became a
// dynamic index into local memory).
__device__ __forceinline__ float selp(bool c, float a, float b) {
    float r;
    asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %3, 0;\n\tselp.f32 %0, %1, %2, q;\n\t}"
        : "=f"(r) : "f"(a), "f"(b), "r"((unsigned)c));
    return r;
}

// (a0 b0 + a1 b1) + (a2 b2 + a3 b3): a lane's share of a row's dot product (WARP_DOTS).
__device__ __forceinline__ float dot4(const float (&a)[4], const float (&b)[4]) {
    return (a[0] * b[0] + a[1] * b[1]) + (a[2] * b[2] + a[3] * b[3]);
}

// One level of warp_sums: N values to N / 2, the partner across lane bit M keeping the other half.
template <int N, int M>
__device__ __forceinline__ void warp_halve(float (&d)[16], int lane) {
    const bool hi = (lane & M) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        const float keep = selp(hi, d[i + N / 2], d[i]), send = selp(hi, d[i], d[i + N / 2]);
        d[i] = keep + __shfl_xor_sync(FULL, send, M);
    }
    if constexpr (N > 2) warp_halve<N / 2, M / 2>(d, lane);
}

// P sums of the warp's 16 values a lane in d: lane l ends with sum l >> (5 - log2 P) in d[0]
// (P - 1 + 5 - log2 P shuffles for P sums).
template <int P>
__device__ __forceinline__ float warp_sums(float (&d)[16], int lane) {
    static_assert(P == 1 || P == 2 || P == 4 || P == 8 || P == 16, "warp_sums: P = 2^n <= 16");
    constexpr int LG = P >= 16 ? 4 : P >= 8 ? 3 : P >= 4 ? 2 : P >= 2 ? 1 : 0;
    if constexpr (P > 1) warp_halve<P, 16>(d, lane);
#pragma unroll
    for (int lv = LG; lv < 5; ++lv) d[0] += __shfl_xor_sync(FULL, d[0], 16 >> lv);
    return d[0];
}

// Named barrier ``id`` of ``n`` threads (the compute warps' own, or theirs with the loader's).
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");
}

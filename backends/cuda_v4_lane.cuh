// cuda-v4's lane-level pieces (included by cuda_v4.cu after its launch constants): a lane's
// 16-byte loads and stores of its slices of a row, and the sums of its slices of a dot product,
// which the kernel's butterflies then add over the LPR lanes of the row.
#pragma once

// The state loads of GDN_HINT bit 0 (no L1 allocation) are inline PTX that, to the compiler,
// reads no memory, so it may move them anywhere their address is ready; with PDL they are
// volatile, which keeps them in program order with griddepcontrol.wait.  State-early (GDN_PDL
// 2) also drops .nc: ptxas moves .nc loads (read-only for the whole grid) past the wait, where
// the state loads must not wait; it keeps coherent loads before it.
#if GDN_PDL
#define GDN_ASM_NC asm volatile
#else
#define GDN_ASM_NC asm
#endif
#if GDN_PDL == 2
#define GDN_LD_NC "ld.global.L1::no_allocate.v4.u32"
#else
#define GDN_LD_NC "ld.global.nc.L1::no_allocate.v4.u32"
#endif

// N consecutive elements of dtype DT (N*size a multiple of the access width, aligned to it)
// as fp32, with the widest loads: 16 bytes when N*size allows.  NC: the read-only,
// no-L1-allocate path (each state element is read once, before the same thread writes it).
template <int DT, int N, bool NC = false>
__device__ __forceinline__ void ld_vec(const void* base, long long i, float (&x)[N]) {
    constexpr int PER16 = DT == GDN_F32 ? 4 : 8;
    if constexpr (N % PER16 == 0) {
        const uint4* p = reinterpret_cast<const uint4*>(
            static_cast<const char*>(base) + i * (DT == GDN_F32 ? 4 : 2));
#pragma unroll
        for (int c = 0; c < N / PER16; ++c) {
            uint4 u;
            if constexpr (NC)
                GDN_ASM_NC(GDN_LD_NC " {%0,%1,%2,%3}, [%4];"
                             : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p + c));
            else
                u = p[c];
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (DT == GDN_F32) x[PER16 * c + e] = __uint_as_float(w[e]);
                else gdn_unpack2<DT>(w[e], x[8 * c + 2 * e], x[8 * c + 2 * e + 1]);
            }
        }
    } else if constexpr (DT != GDN_F32 && N % 4 == 0) {      // 4 x 16-bit: one 8-byte load
        const uint2* p = reinterpret_cast<const uint2*>(static_cast<const unsigned short*>(base) + i);
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
            const uint2 u = p[c];
            gdn_unpack2<DT>(u.x, x[4 * c], x[4 * c + 1]);
            gdn_unpack2<DT>(u.y, x[4 * c + 2], x[4 * c + 3]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) x[e] = gdn_ld<DT>(base, i + e);
    }
}

// 16-byte stores; CS: st.global.cs (streaming: evict first).
template <int DT, int N, bool CS = false>
__device__ __forceinline__ void st_vec(void* base, long long i, const float (&x)[N]) {
    constexpr int PER16 = DT == GDN_F32 ? 4 : 8;
    if constexpr (N % PER16 == 0) {
        uint4* p = reinterpret_cast<uint4*>(static_cast<char*>(base) + i * (DT == GDN_F32 ? 4 : 2));
#pragma unroll
        for (int c = 0; c < N / PER16; ++c) {
            unsigned w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (DT == GDN_F32) w[e] = __float_as_uint(x[4 * c + e]);
                else w[e] = gdn_pack2<DT>(x[8 * c + 2 * e], x[8 * c + 2 * e + 1]);
            }
            // Inline PTX: from C++ the front end splits this store into four 4-byte stores.
            if constexpr (CS)
                asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};"
                             :: "l"(p + c), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
            else
                asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
                             :: "l"(p + c), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) gdn_st<DT>(base, i + e, x[e]);
    }
}

// Sum of f(LO) .. f(LO + N - 1) as a balanced tree: log2(N) dependent adds, not N.
template <int LO, int N, typename F>
__device__ __forceinline__ float tree_sum(const F& f) {
    if constexpr (N == 1) return f(LO);
    else return tree_sum<LO, N / 2>(f) + tree_sum<LO + N / 2, N - N / 2>(f);
}

// Sum of the products f(0) .. f(N-1) as GDN_CHAIN says: a tree, or N/C interleaved chains of
// C fused multiply-adds (chain c takes c, c + N/C, ...) added by a tree.
template <int N, typename F>
__device__ __forceinline__ float dot_sum(const F& f) {
    constexpr int C = GDN_CHAIN;
    if constexpr (C <= 0) {
        return tree_sum<0, N>(f);
    } else {
        constexpr int NC = N > C ? N / C : 1;
        static_assert(N % NC == 0, "GDN_CHAIN must split N evenly");
        float acc[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[c] = f(c);
#pragma unroll
        for (int j = NC; j < N; j += NC)
#pragma unroll
            for (int c = 0; c < NC; ++c) acc[c] += f(j + c);
        return tree_sum<0, NC>([&](int c) { return acc[c]; });
    }
}

// A lane's slice of the dot product of two rows it holds as NV vectors of VEC elements.
template <int NV, int VEC>
__device__ __forceinline__ float vec_dot(const float (&x)[NV][VEC], const float (&y)[NV][VEC]) {
    return dot_sum<NV * VEC>([&](int j) { return x[j / VEC][j % VEC] * y[j / VEC][j % VEC]; });
}

// A lane's slices of k.q and, with the L2 norm, of q.q and k.k (the caller's butterfly adds the
// LPR slices of a row).
template <int NV, int VEC>
__device__ __forceinline__ void qk_dots(const float (&kv)[NV][VEC], const float (&qv)[NV][VEC],
                                        float& kq, float& qq, float& kk) {
    constexpr int NE = NV * VEC;
    kq = dot_sum<NE>([&](int j) { return kv[j / VEC][j % VEC] * qv[j / VEC][j % VEC]; });
    qq = 0.0f;
    kk = 0.0f;
    if (GDN_L2NORM) {
        qq = dot_sum<NE>([&](int j) { return qv[j / VEC][j % VEC] * qv[j / VEC][j % VEC]; });
        kk = dot_sum<NE>([&](int j) { return kv[j / VEC][j % VEC] * kv[j / VEC][j % VEC]; });
    }
}

// One butterfly step (lanes ``off`` apart) of those three sums.
__device__ __forceinline__ void qk_shfl(float& kq, float& qq, float& kk, int off) {
    kq += __shfl_xor_sync(FULL, kq, off);
    if (GDN_L2NORM) {
        qq += __shfl_xor_sync(FULL, qq, off);
        kk += __shfl_xor_sync(FULL, kk, off);
    }
}

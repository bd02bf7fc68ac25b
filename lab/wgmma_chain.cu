// A sequential (chain) kernel for the chunked prefill on Hopper's warpgroup MMAs (wgmma) and TMA
// copies, a lab prototype for issue 52: triton-chunk's chunk_state_kernel with "bf16" products
// (backends/_triton_chunk_kernel.py), on the workspace its prep kernel (or cuda-chunk's) wrote
// with precision "bf16".  Per chunk of C = 64 tokens, on a [64, K] tile of the state S0 (K = 128):
//
//     X = S0 k^T,  R = v^T diag(beta) - X diag(beta rk e^G),  V'^T = R T^T,
//     O^T = (S0 q^T) diag(scale rq e^G) + R M^T,  S = e^G_last S0 + V'^T diag(rk e^(G_last-G)) k
//
// One CTA = one warpgroup (128 threads) per (sequence, value head, 64 state rows).  The state
// tile lives in wgmma accumulators (warp w: rows 16 w + lane / 4 and + 8; registers 4 j .. 4 j + 3:
// columns 8 j + 2 (lane % 4), + 1), and every product takes its A operand from registers: the
// accumulator of one product, rounded to bf16, is the next one's A fragment (C of two 8-column
// chunks = A of one 16-wide k-step, as with mma.sync).  The B operands (k, q, the workspace rows
// of T^T and M^T) and v come by TMA tensor copies (one thread issues seven boxes of [64 tokens,
// 64 columns] a chunk, 128-byte swizzle, counted on a stage's mbarrier); the k tile serves X
// (K-major) and the update (MN-major, imm-trans-b 1) alike.  Tokens past the tensor's end are
// zero-filled by TMA; those past the sequence's end (the next sequence's rows) meet zero factors
// (copied by cp.async with a mask), which zero every term they would enter.  GDN_STAGES stages.
//
// A full chunk's outputs go through shared memory to one TMA store; a sequence's last, partial
// chunk is stored directly (a box would write the next sequence's rows).
//
// (The first form copied with cp.async, 16 bytes a thread: ~1.8 us a chunk for its 58 KB at one
// CTA an SM, whatever the order, depth or index arithmetic: lab/notebook/h200/wgmma_chain_2026-11-29.)
//
// Dense states only (no pools), fp32 k-last [N, HV, V, K]; has_initial_state by GDN_STATE0.
// -D constants: GDN_STATE0 (1: read ``state``, 0: zeros), GDN_SMEM (checked against the layout),
// GDN_STAGES; for timing ablations only (they compute something else): GDN_NO_OUT (no Y, O
// products, no stores), GDN_NO_LOAD (every chunk reuses the first chunk's operands),
// GDN_ONLY_LOAD (the copies and their waits, no products).
#ifndef GDN_NO_OUT
#define GDN_NO_OUT 0
#endif
#ifndef GDN_NO_LOAD
#define GDN_NO_LOAD 0
#endif
#ifndef GDN_ONLY_LOAD
#define GDN_ONLY_LOAD 0
#endif
#ifndef GDN_STAGES
#define GDN_STAGES 2
#endif

typedef unsigned short bf16_t;

#define C_ 64
#define K_ 128
#define ROWS 64
#define BOX (C_ * 64)            // bf16 elements of a [64 tokens, 64 columns] box (8 KB)

struct alignas(64) TMap { unsigned long long v[16]; };      // a CUtensorMap
struct ChainParams {       // by value (lab/wgmma_chain.py packs it)
    TMap tk, tq, tm, tv;   // [T, H, K] k and q, [T, HV, 2 C] workspace rows, [T, HV, V] v
    TMap to;               // [T, HV, V] out
    const long long* cu; const float* vecs; bf16_t* out; const float* state; float* new_state;
    long long N, T_all, so_t, so_h, H, HV, V;
};

// Every box 1024-byte aligned (the swizzle's 8-row groups).
struct alignas(1024) Stage {
    bf16_t k[2 * BOX];          // columns 0..63, then 64..127
    bf16_t q[2 * BOX];
    bf16_t t[BOX];              // T^T rows
    bf16_t m[BOX];              // M^T rows
    bf16_t v[BOX];              // the chunk's v rows of the tile's 64 state rows
    float f[4][C_];             // beta, beta rk e^G, scale rq e^G, rk e^(G_last - G)
    float glast[4];
};
struct alignas(1024) ChainSmem {
    Stage st[GDN_STAGES];
    bf16_t ob[2][BOX];          // a full chunk's outputs [64 tokens, 64 rows] (swizzled), for TMA
    unsigned long long bar[GDN_STAGES];
};
static_assert(sizeof(ChainSmem) <= GDN_SMEM, "GDN_SMEM too small");
#define TMA_BYTES (7 * BOX * 2)

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp4(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf2f(bf16_t x) {
    return __uint_as_float(static_cast<unsigned>(x) << 16);
}
// the matrix descriptor of a tile TMA wrote with the 128-byte swizzle (rows of 128 bytes, each
// 8-row group 1024 bytes): K-major, the start ``bytes`` into it (k-step s of a 64-column box at
// 32 s), SBO 1024; MN-major, k-step s at 2048 s, LBO 8192 (the next 64-wide box along N), SBO
// 1024 (lab/tma_probe.py settled these on the H200)
__device__ __forceinline__ unsigned long long desc(const void* p, unsigned bytes, unsigned lbo) {
    return (unsigned long long)(((smem_u32(p) + bytes) & 0x3FFFF) >> 4)
         | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
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

// d (+)= A B, A [64, 16] from registers, B [16, 64] by descriptor; m64n64k16
template <int TB>
__device__ __forceinline__ void mma64(float (&d)[32], const unsigned (&a)[4],
                                      unsigned long long db, int acc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
// d += A B, A [64, 16] from registers, B [16, 128] N-major by descriptor; m64n128k16
__device__ __forceinline__ void mma128t(float (&d)[64], const unsigned (&a)[4],
                                        unsigned long long db) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "
                 "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
                 "%62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// A fragments of k-step s (columns 16 s .. 16 s + 15) from an accumulator's registers
template <int R>
__device__ __forceinline__ void frag(unsigned (&a)[4], const float (&d)[R], int s) {
    a[0] = pack2(d[8 * s + 0], d[8 * s + 1]);
    a[1] = pack2(d[8 * s + 2], d[8 * s + 3]);
    a[2] = pack2(d[8 * s + 4], d[8 * s + 5]);
    a[3] = pack2(d[8 * s + 6], d[8 * s + 7]);
}

__device__ __forceinline__ void tma3(void* dst, const TMap& map, int c0, int c1, int c2,
                                     unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0),
                    "r"(c1), "r"(c2), "r"(bar) : "memory");
}
__device__ __forceinline__ void wait_bar(unsigned bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred P1;\n\tWAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
                 "@!P1 bra WAIT_%=;\n}" :: "r"(bar), "r"(parity) : "memory");
}
// the place of (token i, tile row r) in a swizzled [64, 64] box (16-byte piece r / 8 of row i
// at piece (r / 8) ^ (i % 8))
__device__ __forceinline__ int sw(int i, int r) {
    return i * 64 + ((((r >> 3) ^ (i & 7))) << 3) + (r & 7);
}
__device__ __forceinline__ void tma_store3(const TMap& map, int c0, int c1, int c2,
                                           const void* src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
                 :: "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2),
                    "r"(smem_u32(src)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// chunk jc's operands into stage ``s``: the boxes by thread 0, the factors by cp.async (zeros
// past the sequence's end)
__device__ __forceinline__ void load_chunk(ChainSmem& sm, int s, const ChainParams& p,
                                           long long t0, long long eos, int i_h, int i_hv,
                                           int row0, int tid) {
    Stage& st = sm.st[s];
    if (tid == 0) {
        const unsigned bar = smem_u32(&sm.bar[s]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(bar), "r"(TMA_BYTES) : "memory");
        const int t = (int)t0;
        tma3(st.k, p.tk, 0, i_h, t, bar);
        tma3(st.k + BOX, p.tk, 64, i_h, t, bar);
        tma3(st.q, p.tq, 0, i_h, t, bar);
        tma3(st.q + BOX, p.tq, 64, i_h, t, bar);
        tma3(st.t, p.tm, 0, i_hv, t, bar);
        tma3(st.m, p.tm, C_, i_hv, t, bar);
        tma3(st.v, p.tv, row0, i_hv, t, bar);
    }
    const long long rem = eos - t0;
    const int i = tid & 63;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int f = 2 * r + (tid >> 6);
        cp4(&st.f[f][i], p.vecs + (i_hv * 5 + f) * p.T_all + t0 + (i < rem ? i : 0), i < rem);
    }
    if (tid == 0) cp4(&st.glast[0], p.vecs + (i_hv * 5 + 4) * p.T_all + t0, rem > 0);
}

extern "C" __global__ void __launch_bounds__(128, 1) gdn_wgmma_chain(const __grid_constant__ ChainParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    ChainSmem& sm = *reinterpret_cast<ChainSmem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int HV = (int)p.HV, NV = (int)(p.V / ROWS);
    const int i_v = (int)(blockIdx.x % NV);
    const long long i_nh = blockIdx.x / NV;
    const long long i_n = i_nh / HV;
    const int i_hv = (int)(i_nh % HV);
    const int i_h = i_hv / (HV / (int)p.H);
    const long long bos = p.cu[i_n], eos = p.cu[i_n + 1];
    const int row0 = i_v * ROWS;
    const int r0 = 16 * w + g;                  // this thread's rows r0, r0 + 8 of the tile
    float S[64];                                // the state tile [64, 128] as an m64n128 accumulator
    const long long sbase = ((i_n * HV + i_hv) * p.V + row0) * K_;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            S[4 * j + e] = GDN_STATE0 ? p.state[sbase + (r0 + 8 * (e >> 1)) * K_ + 8 * j + 2 * t4
                                                + (e & 1)] : 0.f;
    const long long n_chunks = (eos - bos + C_ - 1) / C_;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < GDN_STAGES; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&sm.bar[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // chunks 0 .. GDN_STAGES - 2 ahead, then chunk jc + GDN_STAGES - 1 during chunk jc
#pragma unroll
    for (int s = 0; s < GDN_STAGES - 1; ++s) {
        if (s < n_chunks && (s == 0 || !GDN_NO_LOAD))
            load_chunk(sm, s, p, bos + s * C_, eos, i_h, i_hv, row0, tid);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (long long jc = 0; jc < n_chunks; ++jc) {
        const long long t0 = bos + jc * C_;
        const long long ja = jc + GDN_STAGES - 1;
        if (ja < n_chunks && !GDN_NO_LOAD)
            load_chunk(sm, (int)(ja % GDN_STAGES), p, bos + ja * C_, eos, i_h, i_hv, row0, tid);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" :: "n"(GDN_STAGES - 1) : "memory");
        // the output store of chunk jc - 2 has read its buffer (released by the barrier below)
        if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        const int sj = GDN_NO_LOAD ? 0 : (int)(jc % GDN_STAGES);
        if (!GDN_NO_LOAD || jc == 0)
            wait_bar(smem_u32(&sm.bar[sj]), (unsigned)((jc / GDN_STAGES) & 1));
        __syncthreads();                        // the factors, copied by every thread
        if (GDN_ONLY_LOAD) {
            __syncthreads();
            continue;
        }
        const Stage& st = sm.st[sj];
        // X = S0 k^T and Y = S0 q^T
        unsigned sa[8][4];
#pragma unroll
        for (int s = 0; s < 8; ++s) frag(sa[s], S, s);
        float X[32], Y[32];
        wg_fence();
#pragma unroll
        for (int s = 0; s < 8; ++s) mma64<0>(X, sa[s], desc(st.k + (s >> 2) * BOX, 32 * (s & 3), 16), s);
        wg_commit();
        if (!GDN_NO_OUT) {
#pragma unroll
            for (int s = 0; s < 8; ++s) mma64<0>(Y, sa[s], desc(st.q + (s >> 2) * BOX, 32 * (s & 3), 16), s);
        }
        wg_commit();
        wg_wait<1>();
        pin(X);
        // R = v^T diag(beta) - X diag(bk), in X's registers
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 8 * j + 2 * t4 + (e & 1), r = r0 + 8 * (e >> 1);
                X[4 * j + e] = bf2f(st.v[sw(i, r)]) * st.f[0][i] - X[4 * j + e] * st.f[1][i];
            }
        unsigned ra[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) frag(ra[s], X, s);
        // V'^T = R T^T (into X's registers)
        wg_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) mma64<1>(X, ra[s], desc(st.t, 2048 * s, 8192), s);
        wg_commit();
        wg_wait<1>();                           // Y
        pin(Y);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) Y[4 * j + e] *= st.f[2][8 * j + 2 * t4 + (e & 1)];
        // O^T = Y diag(fq) + R M^T
        wg_fence();
        if (!GDN_NO_OUT) {
#pragma unroll
            for (int s = 0; s < 4; ++s) mma64<1>(Y, ra[s], desc(st.m, 2048 * s, 8192), 1);
        }
        wg_commit();
        wg_wait<1>();                           // V'^T
        pin(X);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) X[4 * j + e] *= st.f[3][8 * j + 2 * t4 + (e & 1)];
        unsigned va[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) frag(va[s], X, s);
        const float gl = st.glast[0];
#pragma unroll
        for (int i = 0; i < 64; ++i) S[i] *= gl;
        // S = e^G_last S0 + V'^T diag(fk) k
        wg_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) mma128t(S, va[s], desc(st.k, 2048 * s, 8192));
        wg_commit();
        wg_wait<1>();                           // O
        pin(Y);
        const long long rem = eos - t0;
        const bool full = rem >= C_;
        bf16_t* ob = sm.ob[jc & 1];
        if (GDN_NO_OUT) {
        } else if (full) {                      // staged, then one TMA store (below)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    ob[sw(8 * j + 2 * t4 + (e & 1), r0 + 8 * (e >> 1))]
                        = (bf16_t)(pack2(Y[4 * j + e], 0.f) & 0xFFFF);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        } else {                                // a sequence's last, partial chunk
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = 8 * j + 2 * t4 + (e & 1), r = r0 + 8 * (e >> 1);
                    if (i < rem)
                        p.out[(t0 + i) * p.so_t + i_hv * p.so_h + row0 + r]
                            = (bf16_t)(pack2(Y[4 * j + e], 0.f) & 0xFFFF);
                }
        }
        wg_wait<0>();
        pin(S);
        __syncthreads();                        // the stage is free for the copy two chunks on
        if (tid == 0 && full && !GDN_NO_OUT) tma_store3(p.to, row0, i_hv, (int)t0, ob);
    }
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            p.new_state[sbase + (r0 + 8 * (e >> 1)) * K_ + 8 * j + 2 * t4 + (e & 1)] = S[4 * j + e];
}

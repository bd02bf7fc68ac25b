// A sequential (chain) kernel for the chunked prefill on Hopper's warpgroup MMAs (wgmma), a lab
// prototype for issue 52: triton-chunk's chunk_state_kernel with "bf16" products
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
// of T^T and M^T) are read by the tensor cores from shared memory in the no-swizzle core-matrix
// layout (8 rows of 16 bytes a core matrix): the k tile serves X (K-major) and the update
// (N-major, imm-trans-b 1) alike.  A chunk's operands are copied with cp.async one chunk ahead
// (GDN_STAGES stages, two by default).
//
// Dense states only (no pools), fp32 k-last [N, HV, V, K]; has_initial_state by GDN_STATE0.
// -D constants: GDN_STATE0 (1: read ``state``, 0: zeros), GDN_SMEM (checked against the layout);
// for timing ablations only (they compute something else): GDN_NO_OUT (no Y, O products, no
// stores), GDN_NO_LOAD (every chunk reuses the first chunk's operands), GDN_NO_R (R = X).
#ifndef GDN_NO_OUT
#define GDN_NO_OUT 0
#endif
#ifndef GDN_NO_LOAD
#define GDN_NO_LOAD 0
#endif
#ifndef GDN_NO_R
#define GDN_NO_R 0
#endif
#ifndef GDN_NO_WAIT
#define GDN_NO_WAIT 0        // timing only: no wait for the copies (a race)
#endif
#ifndef GDN_ONLY_LOAD
#define GDN_ONLY_LOAD 0      // timing only: the copies and their waits, no products
#endif
#ifndef GDN_NO_FENCE
#define GDN_NO_FENCE 0       // timing only: no generic-to-async proxy fence after the copies
#endif
#ifndef GDN_LOAD_LATE
#define GDN_LOAD_LATE 0      // 1: a chunk's copy issued after X and Y are, not before
#endif

typedef unsigned short bf16_t;

#define C_ 64
#define K_ 128
#define ROWS 64
#define VPITCH 72          // the v tile's row (a token's 64 state rows) padded: conflict-free reads

struct ChainParams {       // by value, every field 8 bytes (lab/wgmma_chain.py packs it)
    const bf16_t* q; const bf16_t* k; const bf16_t* v; const long long* cu; const bf16_t* mats;
    const float* vecs; bf16_t* out; const float* state; float* new_state;
    long long N, T_all, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, H, HV, V;
};

// core-matrix layouts (bytes): k and q [C tokens i][K columns c]: core (i / 8, c / 8) at
// ((i / 8) * 16 + c / 8) * 128; T^T and M^T rows [C tokens i][C columns j]: core (i / 8, j / 8)
// at ((i / 8) * 8 + j / 8) * 128; inside a core matrix row i % 8 at 16 bytes, column % 8 at 2.
struct alignas(1024) Stage {
    bf16_t k[C_ * K_];
    bf16_t q[C_ * K_];
    bf16_t t[C_ * C_];
    bf16_t m[C_ * C_];
    bf16_t v[C_ * VPITCH];
    float f[4][C_];             // beta, beta rk e^G, scale rq e^G, rk e^(G_last - G)
    float glast[4];
};
#ifndef GDN_STAGES
#define GDN_STAGES 2
#endif
struct alignas(1024) ChainSmem { Stage st[GDN_STAGES]; };
static_assert(sizeof(ChainSmem) <= GDN_SMEM, "GDN_SMEM too small");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0) : "memory");
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
// the matrix descriptor: start address, leading (K-direction) and stride (M/N-direction) byte
// offsets between core matrices, no swizzle (lab/wgmma_probe.cu settled the roles)
__device__ __forceinline__ unsigned long long desc(const void* p, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((smem_u32(p) & 0x3FFFF) >> 4)
         | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
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

// The copies of a chunk's operands.  Each thread's rows and 16-byte pieces are the same every
// chunk (a warp's lanes take 8 rows of a core matrix, then the next core matrix along the row:
// each 8 lanes fill 128 contiguous bytes of shared memory), so the copier keeps one global
// pointer per operand, advanced a chunk at a time, and 32-bit steps between its rows: a chunk
// costs its 31 copies and a few adds.  (Per-piece index arithmetic, 64-bit products and all,
// cost ~1000 instructions a thread a chunk: ~2 us at one warp per scheduler.)
struct Copier {
    const char* k; const char* q; const char* m; const char* v; const char* f;
    long long k_c, q_c, m_c, v_c;        // bytes a chunk
    unsigned k_s, q_s, m_s, v_s, f_s;    // bytes between a thread's successive rows
    unsigned sk, st, sv, sf;             // this thread's shared-memory offsets in a stage
    int i_kq, i_m, i_v, i_f, glast;      // its first rows; glast: bytes from f to e^G_last
    __device__ Copier(const ChainParams& p, long long bos, int i_h, int i_hv, int row0, int tid) {
        const int lo = tid & 7;
        i_kq = lo;                       // k, q: rows 8 r + lo, piece tid >> 3 (of 16)
        k = reinterpret_cast<const char*>(p.k + (bos + lo) * p.sk_t + i_h * p.sk_h + (tid >> 3) * 8);
        q = reinterpret_cast<const char*>(p.q + (bos + lo) * p.sq_t + i_h * p.sq_h + (tid >> 3) * 8);
        k_c = C_ * p.sk_t * 2; q_c = C_ * p.sq_t * 2;
        k_s = (unsigned)(8 * p.sk_t * 2); q_s = (unsigned)(8 * p.sq_t * 2);
        sk = (tid >> 3) * 128 + lo * 16;
        const long long mt = p.HV * 2 * C_;
        i_m = 8 * (tid >> 6) + lo;       // T^T, M^T: rows 16 r + i_m, piece (tid >> 3) & 7
        m = reinterpret_cast<const char*>(p.mats + (bos + i_m) * mt + i_hv * 2 * C_
                                          + ((tid >> 3) & 7) * 8);
        m_c = C_ * mt * 2; m_s = (unsigned)(16 * mt * 2);
        st = ((tid >> 6) * 8 + ((tid >> 3) & 7)) * 128 + lo * 16;
        i_v = tid >> 3;                  // v: rows 16 r + i_v, piece lo
        v = reinterpret_cast<const char*>(p.v + (bos + i_v) * p.sv_t + i_hv * p.sv_h + row0 + lo * 8);
        v_c = C_ * p.sv_t * 2; v_s = (unsigned)(16 * p.sv_t * 2);
        sv = (i_v * VPITCH + lo * 8) * 2;
        i_f = tid & 63;                  // factors 2 r + (tid >> 6), token i_f
        f = reinterpret_cast<const char*>(p.vecs + (i_hv * 5 + (tid >> 6)) * p.T_all + bos + i_f);
        f_s = (unsigned)(2 * p.T_all * 4);
        sf = ((tid >> 6) * C_ + i_f) * 4;
        glast = (int)((4 * p.T_all - i_f) * 4);      // thread 0 only
    }
    // chunk jc into ``st`` (``rem``: its tokens before the sequence's end; zeros past it)
    __device__ __forceinline__ void load(Stage& stg, long long jc, long long rem, int tid) const {
        const char* kr = k + jc * k_c;
        const char* qr = q + jc * q_c;
        const char* mr = m + jc * m_c;
        const char* vr = v + jc * v_c;
        const char* fr = f + jc * (C_ * 4);
        const bool full = rem >= C_;
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const bool ok = full || 8 * r + i_kq < rem;
            cp16(reinterpret_cast<unsigned char*>(&stg.k[0]) + sk + r * 2048, ok ? kr + r * k_s : k, ok);
            cp16(reinterpret_cast<unsigned char*>(&stg.q[0]) + sk + r * 2048, ok ? qr + r * q_s : q, ok);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool ok = full || 16 * r + i_m < rem;
            const char* src = ok ? mr + r * m_s : m;
            cp16(reinterpret_cast<unsigned char*>(&stg.t[0]) + st + r * 2048, src, ok);
            cp16(reinterpret_cast<unsigned char*>(&stg.m[0]) + st + r * 2048, src + 2 * C_, ok);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool ok = full || 16 * r + i_v < rem;
            cp16(reinterpret_cast<unsigned char*>(&stg.v[0]) + sv + r * (16 * VPITCH * 2), ok ? vr + r * v_s : v, ok);
        }
        const bool okf = full || i_f < rem;
#pragma unroll
        for (int r = 0; r < 2; ++r)
            cp4(reinterpret_cast<unsigned char*>(&stg.f[0]) + sf + r * (2 * C_ * 4), okf ? fr + r * f_s : f, okf);
        if (tid == 0)      // e^G_last: factor 4 of the chunk's first token
            cp4(reinterpret_cast<unsigned char*>(&stg.glast[0]), fr + glast, rem > 0);
    }
};

extern "C" __global__ void __launch_bounds__(128, 1) gdn_wgmma_chain(const ChainParams p) {
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
    const Copier cp(p, bos, i_h, i_hv, row0, tid);
    // chunks 0 .. GDN_STAGES - 2 ahead, then chunk jc + GDN_STAGES - 1 during chunk jc
#pragma unroll
    for (int s = 0; s < GDN_STAGES - 1; ++s) {
        if (s < n_chunks && (s == 0 || !GDN_NO_LOAD))
            cp.load(sm.st[s], s, eos - bos - s * C_, tid);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (long long jc = 0; jc < n_chunks; ++jc) {
        const long long t0 = bos + jc * C_;
        const long long ja = jc + GDN_STAGES - 1;
        if (!GDN_LOAD_LATE) {
            if (ja < n_chunks && !GDN_NO_LOAD)
                cp.load(sm.st[ja % GDN_STAGES], ja, eos - bos - ja * C_, tid);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        if (!GDN_NO_WAIT)
            asm volatile("cp.async.wait_group %0;" :: "n"(GDN_STAGES - 1 - GDN_LOAD_LATE) : "memory");
        if (!GDN_NO_FENCE) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (GDN_ONLY_LOAD) {
            __syncthreads();
            continue;
        }
        const Stage& st = sm.st[GDN_NO_LOAD ? 0 : jc % GDN_STAGES];
        // X = S0 k^T and Y = S0 q^T
        unsigned sa[8][4];
#pragma unroll
        for (int s = 0; s < 8; ++s) frag(sa[s], S, s);
        float X[32], Y[32];
        wg_fence();
#pragma unroll
        for (int s = 0; s < 8; ++s) mma64<0>(X, sa[s], desc(st.k + 128 * s, 128, 2048), s);
        wg_commit();
        if (!GDN_NO_OUT) {
#pragma unroll
            for (int s = 0; s < 8; ++s) mma64<0>(Y, sa[s], desc(st.q + 128 * s, 128, 2048), s);
        }
        wg_commit();
        if (GDN_LOAD_LATE) {                    // the next copy issued behind the products
            if (ja < n_chunks && !GDN_NO_LOAD)
                cp.load(sm.st[ja % GDN_STAGES], ja, eos - bos - ja * C_, tid);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        wg_wait<1>();
        pin(X);
        // R = v^T diag(beta) - X diag(bk), in X's registers
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 8 * j + 2 * t4 + (e & 1), r = r0 + 8 * (e >> 1);
                if (!GDN_NO_R)
                    X[4 * j + e] = bf2f(st.v[i * VPITCH + r]) * st.f[0][i]
                                 - X[4 * j + e] * st.f[1][i];
            }
        unsigned ra[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) frag(ra[s], X, s);
        // V'^T = R T^T (into X's registers)
        wg_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) mma64<1>(X, ra[s], desc(st.t + 1024 * s, 1024, 128), s);
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
            for (int s = 0; s < 4; ++s) mma64<1>(Y, ra[s], desc(st.m + 1024 * s, 1024, 128), 1);
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
        for (int s = 0; s < 4; ++s) mma128t(S, va[s], desc(st.k + 16 * K_ * s, 2048, 128));
        wg_commit();
        wg_wait<1>();                           // O
        pin(Y);
        const long long rem = eos - t0;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = 8 * j + 2 * t4 + (e & 1), r = r0 + 8 * (e >> 1);
                if (i < rem && !GDN_NO_OUT) {
                    const unsigned h = pack2(Y[4 * j + e], 0.f) & 0xFFFF;
                    p.out[(t0 + i) * p.so_t + i_hv * p.so_h + row0 + r] = (bf16_t)h;
                }
            }
        wg_wait<0>();
        pin(S);
        __syncthreads();                        // the stage is free for the copy two chunks on
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            p.new_state[sbase + (r0 + 8 * (e >> 1)) * K_ + 8 * j + 2 * t4 + (e & 1)] = S[4 * j + e];
}

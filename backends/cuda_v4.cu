// cuda-v4: latency-optimized GDN decode (the math of gdnzoo/reference.py).
//
// At small batch the step is latency-bound: what counts is how soon the state loads issue, how
// many are in flight at once and how many SMs issue them.  So:
//  * everything that shapes the index math is a compile-time constant (HV, HV/H, V, T, warps per
//    block, rows per warp): the block index splits with 32-bit multiply-shift, not the 64-bit
//    division subroutine that used to sit between the kernel start and the first state load;
//  * each head's V rows are split over BPH blocks of W warps, so even B=1 spreads over every SM;
//  * a row is read along its contiguous K axis with 16-byte loads by LPR lanes; a warp-wide
//    load covers RPW = 32/LPR whole rows, perfectly coalesced;
//  * all RW row groups of a warp are loaded before any is used (independent, fully unrolled),
//    and the gate inputs, q, k and v loads are issued right behind them;
//  * per row, k.S and q.S come from one pass and one interleaved butterfly; the output uses
//    o = scale*(g*(q.S) + u*(k.q)), so the new row is never re-read;
//  * the gates are computed by every lane of each warp, redundantly: a few instructions hidden
//    behind the state loads, where a per-block computation would put a __syncthreads on the
//    critical path (at T > 1 they are T times as many, with the norms and k.q of every token:
//    there GDN_HSC computes them once per block, behind one barrier);
//  * where one wave of register-bound blocks cannot hold the state (measured: B*HV 257-384 on
//    the H100), GDN_SMEM stages every row group through shared memory with cp.async and updates
//    one group at a time, so fewer registers per warp let more blocks keep loads in flight.
//
// Compile-time (-D, backends/_cuda_build.py): GDN_K, GDN_V, GDN_T, GDN_HV, GDN_GVA (HV/H),
// GDN_STATE_DT, GDN_IO_DT, GDN_A_DT, GDN_B_DT, GDN_DTB_DT, GDN_L2NORM (0/1), GDN_W (warps per
// block), GDN_RW (row groups per warp), GDN_LPR (lanes per row), GDN_VEC16 (1: 16-byte vectors,
// picked by the host only when every state/q/k row is 16-byte aligned; 0: element loads),
// GDN_HINT (bit 0: state loads ld.global.nc.L1::no_allocate, bit 1: state stores st.global.cs),
// GDN_FASTGATE (0/1: gates with fast intrinsics), GDN_DENSE (1: every tensor has the dense
// layout of its shape, so strides are compile-time constants; 2: the call's own strides are
// compile-time constants, -DGDN_SC_<field> for every stride field of GdnParams and the verify
// i_n, i_t: the engines' views of one fused activation tensor, a page-strided pool, get the
// constant index math of a dense call; 0: strides from the parameters),
// GDN_CHAIN (0: each lane's slice of a dot product as one balanced tree, the shortest chain;
// c > 0: chains of c fused multiply-adds, then a tree over the chains, about half the
// instructions, which wins where one warp per scheduler issues everything itself),
// GDN_SMEM (1, T = 1 with 16-byte vectors: the state is copied into shared memory with
// cp.async and updated one row group at a time, so a warp holds one group in registers and
// more blocks fit on an SM; 0: all row groups in registers),
// GDN_QKS (1, 16-byte vectors: each token's q and k rows are read from global memory once per
// block into shared memory, behind one __syncthreads, and every warp reads them from there;
// 2, 16-byte vectors and LPR <= 16: the two rows of a lane pair (lanes l and l ^ LPR) split the
// loads, one reads q and the other k, and they swap them with one shuffle per 32-bit word, half
// the q/k load instructions and no barrier; 0: every lane reads its q and k slices itself),
// GDN_POOL (0: a dense state batch; 1: a state pool, sequence n reading and writing slot idx[n];
// 2: a state pool with separate write slots new_idx[n]; see gdn_pool_slots for padding),
// GDN_IDX64 (with a pool; bit 0: idx is int64, else int32; bit 1: new_idx is int64).  With a
// pool, GDN_DENSE=1 means every other tensor is dense and each slot a dense [HV, V, K] block:
// the slot stride stays a runtime value.
// Speculative verify (gdnzoo/verify.py), one pass over the tokens with the state in registers,
// each token's state stored once from them: GDN_INTER (0: none; 1: the state after token t to
// intermediate row n, step t; 2: to row inter_idx[n]), GDN_UPDATE (0: the final store is
// compiled out, deferred commit), GDN_POOL 3 (per-token slots: idx is [B, T], the state is read
// from slot idx[n, 0] and the state after token t stored to slot idx[n, t]) and 4 (the same,
// read from column accepted[n] - 1), GDN_IDX64 bit 2: inter_idx is int64, bit 3: accepted is.
// A plain decode passes neither GDN_INTER nor GDN_UPDATE (the kernel is then the one above); a
// verify variant passes both; its fields are GdnParams' verify fields (gdn_common.cuh).
// GDN_CHUNK (1, T > 1, 16-byte vectors, state in registers; any form, a plain multi-token decode
// too): every token at once instead of a token loop with two butterflies a token.  The tokens'
// q and k rows are copied to shared memory (cp.async) and their Gram entries (k_j.k_t, k_j.q_t,
// the norms) computed by the block while the state loads are in flight; each row then takes its
// 2T dot products with the initial state in one butterfly, solves the per-token corrections
// as a scalar recurrence over those entries, and makes and stores its T states with one
// multiply-add an element each.  At small batch this takes the T - 1 shuffle chains (and the
// per-token loads) off the critical path.  2 (T <= 4): the same, with no shared memory and no
// barrier: each lane loads its own q and k slices of every token, and the Gram entries of
// those slices are summed in the butterfly of the state's dot products, one reduction for all.
// GDN_AHEAD (T > 1, the token loop with the state in registers, q/k not staged per block): the
// loads that do not depend on the state leave the token's own step, so a token waits on its dot
// products and butterflies, not on a load.  1: v, a, b, the gates (and the per-token slots) of
// every token before the loop, each token's q and k one token ahead, the loop unrolled; 2: all
// of them one token ahead, the loop not unrolled (T times less code: profiled at one warp per
// scheduler, the unrolled loop stalls on instruction-cache misses); 3: as 1, with every token's
// q and k before the loop too (T times the q/k registers: no token waits on a load).
// GDN_HSC (1, T > 1, the token loop): the scalars of a token that every row of the head shares
// (the decay and beta gates, the inverse norms of q and k, k.q) are computed once per block, each
// warp taking its share of the tokens with a lane group a token, and read from shared memory
// behind one barrier; 0: every lane computes them for its row, every token (T times the gates,
// norms and k.q of a head in every warp, a quarter of a B = 1 warp's instructions at T = 8).
// Programmatic dependent launch (sm_90+, launched with cuLaunchKernelEx by the host): GDN_PDL
// (0 or absent: none, the code of a plain launch; 1 wait-first: griddepcontrol.wait before any
// global load or store; 2 state-early: the slot indices, the state, A_log and dt_bias are
// loaded before the wait, q, k, v, a, b and every store after it; both then trigger the
// dependent launch at once: a dependent waits for our completion before reading our output).
// Runtime: B (the grid), strides, pointers, scale; with a pool its slot counts and null_slot.
#include "gdn_common.cuh"

#if defined(GDN_INTER) != defined(GDN_UPDATE)
#error "GDN_INTER and GDN_UPDATE: both (a verify variant) or neither (a plain decode)"
#endif
#ifndef GDN_INTER
#define GDN_INTER 0
#define GDN_UPDATE 1
#endif
#ifndef GDN_PDL
#define GDN_PDL 0
#endif
#ifndef GDN_CHUNK
#define GDN_CHUNK 0
#endif
#ifndef GDN_AHEAD
#define GDN_AHEAD 0
#endif
#ifndef GDN_HSC
#define GDN_HSC 0
#endif
// GDN_AHEAD 1 and 3: every token's v, gates and slots before the loop, the loop unrolled.
#define GDN_AHEAD_ALL (GDN_AHEAD == 1 || GDN_AHEAD == 3)
#if GDN_PDL < 0 || GDN_PDL > 2
#error "GDN_PDL: 0 off, 1 wait-first, 2 state-early"
#endif
#if GDN_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "GDN_PDL: programmatic dependent launch (griddepcontrol) needs sm_90 or newer"
#endif

#if !defined(GDN_K) || !defined(GDN_V) || !defined(GDN_T) || !defined(GDN_HV) || \
    !defined(GDN_GVA) || !defined(GDN_STATE_DT) || !defined(GDN_IO_DT) || !defined(GDN_A_DT) || \
    !defined(GDN_B_DT) || !defined(GDN_DTB_DT) || !defined(GDN_L2NORM) || !defined(GDN_W) || \
    !defined(GDN_RW) || !defined(GDN_LPR) || !defined(GDN_VEC16) || !defined(GDN_HINT) || \
    !defined(GDN_FASTGATE) || !defined(GDN_DENSE) || !defined(GDN_CHAIN) || !defined(GDN_SMEM) || \
    !defined(GDN_QKS) || !defined(GDN_POOL) || ((GDN_POOL || GDN_INTER == 2) && !defined(GDN_IDX64))
#error "compile with the -D options of backends/_cuda_build.py"
#endif

constexpr int K = GDN_K;
constexpr int V = GDN_V;
constexpr int T = GDN_T;
constexpr unsigned HV = GDN_HV;
constexpr unsigned GVA = GDN_GVA;
constexpr int SD = GDN_STATE_DT;
constexpr int IOD = GDN_IO_DT;
constexpr int SBYTES = SD == GDN_F32 ? 4 : 2;
constexpr int IOBYTES = IOD == GDN_F32 ? 4 : 2;
constexpr int VEC = GDN_VEC16 ? 16 / SBYTES : 1;   // state elements per lane per load
constexpr int LPR = GDN_LPR;                       // lanes that share one row
constexpr int NV = K / (LPR * VEC);                // loads per lane per row
constexpr int RPW = 32 / LPR;                      // rows covered by one warp-wide load
constexpr int RW = GDN_RW;                         // row groups per warp
constexpr int W = GDN_W;                           // warps per block
constexpr int ROWS_PER_BLOCK = W * RW * RPW;
constexpr unsigned BPH = (V + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;   // blocks per head
constexpr bool TAIL = V % ROWS_PER_BLOCK != 0;     // only then can a row be out of range
constexpr unsigned FULL = 0xffffffffu;
static_assert(32 % LPR == 0 && NV >= 1 && NV * LPR * VEC == K, "unsupported K / LPR");
static_assert(RW >= 1 && RW * RPW <= 32, "a warp owns at most 32 rows");
static_assert(W >= 1 && W <= 8 && T >= 1 && HV % GVA == 0, "bad launch constants");
static_assert(!GDN_SMEM || (T == 1 && GDN_VEC16), "GDN_SMEM: T = 1 with 16-byte vectors");
static_assert(!GDN_QKS || GDN_VEC16, "GDN_QKS: q/k rows 16-byte aligned (the vec16 variant)");
constexpr int QK_CH = K * IOBYTES / 16;            // 16-byte chunks of one q or k row
constexpr int QK_CP = (2 * QK_CH + 32 * W - 1) / (32 * W);   // chunks of q and k per thread
constexpr bool QKX = GDN_QKS == 2;                 // q/k split over a lane pair (see GDN_QKS)
constexpr int QW = QKX ? VEC * IOBYTES / 4 : 1;    // 32-bit words of a lane's q (or k) vector
static_assert(!QKX || (RPW >= 2 && (QW == 2 || QW % 4 == 0)), "GDN_QKS=2: LPR <= 16, 16-byte vectors");
static_assert(GDN_AHEAD >= 0 && GDN_AHEAD <= 3, "GDN_AHEAD: 0, 1, 2 or 3");
static_assert(!GDN_AHEAD || (T > 1 && !GDN_SMEM && GDN_QKS != 1 && !GDN_CHUNK),
              "GDN_AHEAD: T > 1, the token loop with the state in registers, q/k not staged");
static_assert((GDN_HSC == 0 || GDN_HSC == 1) && (!GDN_HSC || (T > 1 && !GDN_SMEM && !GDN_CHUNK)),
              "GDN_HSC: 0 or 1; 1 with T > 1 and the token loop with the state in registers");

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

// Strides and state offsets: GDN_STRIDE, GDN_SLOT_STRIDE, GDN_READ_OFFSET, GDN_WRITE_OFFSET
// (gdn_common.cuh, shared with cuda_v4_tc.cu).

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

// ---- speculative verify (GDN_INTER, GDN_UPDATE, GDN_POOL 3/4) ------------------------------
// FINAL: the final state is stored; not with per-token slots (token T-1's slot holds it) nor
// when the commit is deferred (GDN_UPDATE 0).
#define GDN_FINAL (GDN_UPDATE && GDN_POOL < 3)
static_assert(GDN_POOL >= 0 && GDN_POOL <= 4 && GDN_INTER >= 0 && GDN_INTER <= 2, "bad switches");
static_assert(GDN_POOL < 3 || (GDN_UPDATE && !GDN_INTER),
              "per-token slots keep every token's state: no intermediate rows, no deferral");

#if GDN_INTER
// Sequence n's intermediate block of head h: row n or inter_idx[n]; a row outside 0..S-1
// stores nothing (keep false; its address stays at row 0).  Each [HV, V, K] block is contiguous.
template <typename ST>
__device__ __forceinline__ ST* intermediate_block(const GdnParams& p, unsigned n,
                                                  unsigned h, bool& keep) {
#if GDN_INTER == 1
    const long long irow = n;
#else
    const long long irow = gdn_index_at<(GDN_IDX64 & 4) != 0>(p.inter_idx, n);
#endif
    keep = (unsigned long long)irow < (unsigned long long)p.S;
    return static_cast<ST*>(p.inter) + (keep ? irow : 0) * GDN_SLOT_STRIDE(i_n) + h * (V * K);
}
#endif

#if GDN_PDL
// Wait until the kernel before this one in the stream has completed and its writes are
// visible, then let the kernel after this one launch.  Only reads that the kernel before us
// cannot have written may precede the call (GDN_PDL 2: the state, see cuda_v4.py).
__device__ __forceinline__ void pdl_wait_and_trigger() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#endif

#if GDN_CHUNK
// The Gram entries of GDN_CHUNK, over the raw q and k rows of the T tokens: k_j.k_t at
// chunk_pair(j, t) (j <= t; j == t is k_t's squared norm), k_j.q_t at CH_KQ + chunk_pair(j, t),
// and with the L2 norm q_t.q_t at CH_QQ + t.
static_assert(!GDN_CHUNK || (T > 1 && GDN_VEC16 && !GDN_SMEM && !GDN_QKS),
              "GDN_CHUNK: T > 1, 16-byte vectors, state in registers, its own q/k staging");
static_assert(GDN_CHUNK >= 0 && GDN_CHUNK <= 2 && (GDN_CHUNK != 2 || T <= 4),
              "GDN_CHUNK: 1, or 2 with T <= 4 (its Gram entries in every lane's registers)");
constexpr int CH_NP = T * (T + 1) / 2;
constexpr int CH_KQ = CH_NP;
constexpr int CH_QQ = 2 * CH_NP;
constexpr int CH_NENT = CH_QQ + (GDN_L2NORM ? T : 0);
__device__ __forceinline__ constexpr int chunk_pair(int j, int t) { return t * (t + 1) / 2 + j; }

// Every entry by a group of CH_GL lanes (K / CH_GL elements each, a 3-step butterfly); the
// groups of the block take the entries in turn.  Every lane runs every round (full-warp
// shuffles); a lane past the last entry computes entry 0 again and stores nothing.
constexpr int CH_GL = 8;
#if GDN_CHUNK == 1
__device__ __forceinline__ void chunk_gram(const uint4 (&cqk)[T][2][QK_CH], float* cgram) {
    constexpr int NG = 32 * W / CH_GL, KE = K / CH_GL;
    const int grp = (int)threadIdx.x / CH_GL, gl = (int)threadIdx.x % CH_GL;
#pragma unroll
    for (int r = 0; r < (CH_NENT + NG - 1) / NG; ++r) {
        const int e0 = grp + r * NG, e = e0 < CH_NENT ? e0 : 0;
        int x, xk, y, yk;                                  // rows (token, is k) of the pair
        if (e < CH_QQ) {
            const int f = e < CH_NP ? e : e - CH_NP;
            const int t = (int)((sqrtf(8.0f * f + 1.0f) - 1.0f) * 0.5f);
            x = f - t * (t + 1) / 2; xk = 1; y = t; yk = e < CH_NP;
        } else {
            x = y = e - CH_QQ; xk = yk = 0;
        }
        float xs[KE], ys[KE];
        ld_vec<IOD, KE>(&cqk[x][xk][0], gl * KE, xs);
        ld_vec<IOD, KE>(&cqk[y][yk][0], gl * KE, ys);
        float d = dot_sum<KE>([&](int i) { return xs[i] * ys[i]; });
#pragma unroll
        for (int off = CH_GL / 2; off > 0; off >>= 1) d += __shfl_xor_sync(FULL, d, off);
        if (gl == 0 && e0 < CH_NENT) cgram[e0] = d;
    }
}
#endif
#endif

// The inputs of every token that do not depend on the state (GDN_CHUNK, GDN_AHEAD): this
// lane's v of each row group (0 past V) and the raw gate inputs a + dt_bias and b ...
template <typename Params>
__device__ __forceinline__ void token_inputs(const Params& p, long long v0, long long v_t,
                                             long long a0, long long a_t, long long b0,
                                             long long b_t, const bool (&live)[RW], float dtb,
                                             float (&vr)[T][RW], float (&gd)[T], float (&beta)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int g = 0; g < RW; ++g)
            vr[t][g] = live[g] ? gdn_ld<IOD>(p.v, v0 + t * v_t + g * RPW) : 0.0f;
        if (!GDN_HSC) {                        // GDN_HSC: the block's head_scalars
            gd[t] = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
            beta[t] = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
        }
    }
}

// ... and from those the decay and beta gates, in place.
__device__ __forceinline__ void token_gates(float A_log, float (&gd)[T], float (&beta)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
        gd[t] = GDN_FASTGATE ? gdn_decay_fast(A_log, gd[t]) : gdn_decay(A_log, gd[t]);
        beta[t] = GDN_FASTGATE ? gdn_sigmoid_fast(beta[t]) : gdn_sigmoid(beta[t]);
    }
}

#if GDN_POOL >= 3
// Every token's slot idx[n, t] (per-token slots).
__device__ __forceinline__ void token_slots(const GdnParams& p, unsigned n, long long (&ts)[T]) {
#pragma unroll
    for (int t = 0; t < T; ++t) ts[t] = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T + t);
}
#endif

#if GDN_HSC
// GDN_HSC: warp w computes tokens w, w + W, ...; a round takes HS_NG of them at once, one group
// of HS_GS lanes a token.  The sums do not depend on the launch shape (a PDL launch may double
// W, and must write what the plain launch writes): a token's q and k are always 16 chunks of
// HS_CE elements, each chunk's products summed as a balanced tree, the 16 chunk sums as the
// tree of a 16-lane butterfly; a lane of a smaller group holds 16 / HS_GS chunks and adds them
// in that tree's order before its group's butterfly.
__host__ __device__ constexpr int pow2_at_least(int x) { return x <= 1 ? 1 : 2 * pow2_at_least((x + 1) / 2); }
constexpr int HS_TPW = (T + W - 1) / W;
constexpr int HS_NG = pow2_at_least(HS_TPW) < 2 ? 2 : pow2_at_least(HS_TPW) < 8 ? pow2_at_least(HS_TPW) : 8;
constexpr int HS_GS = 32 / HS_NG;                  // 16, 8 or 4 lanes a token
constexpr int HS_RND = (HS_TPW + HS_NG - 1) / HS_NG;
constexpr int HS_CE = K / 16;                      // elements of a chunk
constexpr int HS_CPL = 16 / HS_GS;                 // chunks a lane
static_assert(HS_CE >= 1 && HS_CE * 16 == K, "GDN_HSC: K a multiple of 16");

// Token t's shared scalars in hs[t]: {g, beta, rk, g rk} and {scale g rq, scale (k.q) rq rk},
// rq and rk the inverse norms of the raw q and k (1 without the L2 norm), so a row's step is
// u = beta (v - g rk s.k), s += u rk k, o = scale g rq s.q + scale (k.q) rq rk u.  Ends with the
// block's barrier: every warp reads every token's scalars.
template <typename Params>
__device__ __forceinline__ void head_scalars(const Params& p, long long q0, long long q_t,
                                             long long k0, long long k_t, long long a0,
                                             long long a_t, long long b0, long long b_t,
                                             float A_log, float dtb, float scale, unsigned warp,
                                             unsigned lane, float4 (*hs)[2]) {
    const int grp = (int)lane / HS_GS, gl = (int)lane % HS_GS;
#pragma unroll
    for (int r = 0; r < HS_RND; ++r) {
        const int t0 = (r * HS_NG + grp) * W + (int)warp;
        const int t = t0 < T ? t0 : 0;             // past the last token: token 0, not stored
        const float xa = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
        const float xb = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
        // Chunk j of this lane is chunk gl + HS_GS * j of the row.
        float kq[HS_CPL], qq[HS_CPL], kk[HS_CPL];
#pragma unroll
        for (int j = 0; j < HS_CPL; ++j) {
            const long long e0 = (long long)(gl + HS_GS * j) * HS_CE;
            float qs[HS_CE], ks[HS_CE];
            if constexpr (GDN_VEC16) {             // the rows are 16-byte aligned
                ld_vec<IOD, HS_CE>(p.q, q0 + t * q_t + e0, qs);
                ld_vec<IOD, HS_CE>(p.k, k0 + t * k_t + e0, ks);
            } else {
#pragma unroll
                for (int e = 0; e < HS_CE; ++e) {
                    qs[e] = gdn_ld<IOD>(p.q, q0 + t * q_t + e0 + e);
                    ks[e] = gdn_ld<IOD>(p.k, k0 + t * k_t + e0 + e);
                }
            }
            kq[j] = tree_sum<0, HS_CE>([&](int i) { return ks[i] * qs[i]; });
            qq[j] = GDN_L2NORM ? tree_sum<0, HS_CE>([&](int i) { return qs[i] * qs[i]; }) : 0.0f;
            kk[j] = GDN_L2NORM ? tree_sum<0, HS_CE>([&](int i) { return ks[i] * ks[i]; }) : 0.0f;
        }
        // The 16-lane butterfly's levels 8 .. HS_GS within the lane, the rest across lanes.
#pragma unroll
        for (int h = HS_CPL / 2; h > 0; h >>= 1)
#pragma unroll
            for (int j = 0; j < h; ++j) {
                kq[j] += kq[j + h];
                qq[j] += qq[j + h];
                kk[j] += kk[j + h];
            }
#pragma unroll
        for (int off = HS_GS / 2; off > 0; off >>= 1) qk_shfl(kq[0], qq[0], kk[0], off);
        const float g = GDN_FASTGATE ? gdn_decay_fast(A_log, xa) : gdn_decay(A_log, xa);
        const float beta = GDN_FASTGATE ? gdn_sigmoid_fast(xb) : gdn_sigmoid(xb);
        const float rq = GDN_L2NORM ? rsqrtf(qq[0] + 1e-6f) : 1.0f;
        const float rk = GDN_L2NORM ? rsqrtf(kk[0] + 1e-6f) : 1.0f;
        if (gl == 0 && t0 < T) {
            hs[t][0] = make_float4(g, beta, rk, g * rk);
            hs[t][1] = make_float4(scale * g * rq, scale * (kq[0] * rq * rk), 0.0f, 0.0f);
        }
    }
    if constexpr (W > 1) __syncthreads();
    else __syncwarp();
}
#endif

// This lane's slices of one state row to row ``row`` of a [V, K] block with row stride rs.
template <bool CS, typename ST>
__device__ __forceinline__ void store_row(ST* block, long long rs, int row, unsigned kl,
                                          const float (&x)[NV][VEC]) {
#pragma unroll
    for (int i = 0; i < NV; ++i) st_vec<SD, VEC, CS>(block, row * rs + (i * LPR + kl) * VEC, x[i]);
}

extern "C" __global__ void __launch_bounds__(32 * W) gdn_decode_v4(const GdnParams p) {
    using ST = typename GdnStorage<SD>::type;
    constexpr bool NC = GDN_VEC16 && (GDN_HINT & 1);
    constexpr bool CS = GDN_VEC16 && (GDN_HINT & 2);
    constexpr unsigned H = HV / GVA;
    const unsigned lane = threadIdx.x & 31;
    const unsigned warp = threadIdx.x >> 5;
    // Constant divisors: multiply-shift (or a shift), a few cycles before the first load.
    const unsigned nh = blockIdx.x / BPH;
    const unsigned part = blockIdx.x - nh * BPH;
    const unsigned n = nh / HV;
    const unsigned h = nh - n * HV;
    const unsigned hq = h / GVA;                       // GVA: repeat_interleave mapping
    const unsigned sub = lane / LPR;                   // which row of a warp-wide load
    const unsigned kl = lane % LPR;                    // position along K within that row
    // This warp owns rows wbase .. wbase + RW*RPW - 1; lane handles wbase + g*RPW + sub.
    const int wbase = (int)(part * ROWS_PER_BLOCK + warp * (RW * RPW));
#if GDN_PDL == 1
    pdl_wait_and_trigger();                            // wait-first: before any global access
#endif

#if GDN_POOL
    // The slots first: the state addresses wait on them.  A padded sequence (block-uniform)
    // writes zeros to this block's out rows and leaves: no state read or written.  Measured on
    // the H100, this early exit issues the state loads sooner than a branch or predicate around
    // the loads alone.  Per-token slots: the read slot here, the write slots per token in the
    // token loop.
    const GdnSlots slot = gdn_sequence_slots<GDN_POOL, T, GDN_IDX64>(p, n);
    if (!slot.rd) {
#if GDN_PDL == 2
        pdl_wait_and_trigger();                        // the zero out rows are stores
#endif
        if (kl == 0) {
            const long long o0 = n * GDN_STRIDE(o_n, T * HV * V) + h * GDN_STRIDE(o_h, V)
                                 + wbase + sub;
#pragma unroll 1
            for (int t = 0; t < T; ++t)
#pragma unroll
                for (int g = 0; g < RW; ++g)
                    if (!TAIL || wbase + g * RPW + (int)sub < V)
                        gdn_st<IOD>(p.out, o0 + t * GDN_STRIDE(o_t, HV * V) + g * RPW, 0.0f);
        }
        return;
    }
#endif
#if !GDN_FINAL
    constexpr bool store = false;                      // verify: no final store
#elif GDN_POOL
    const bool store = slot.wr;                        // else out only: no state written
#else
    constexpr bool store = true;
#endif

    // State first: its loads are the long pole, everything else hides behind them.
    const long long s_v = GDN_STRIDE(s_v, K), ns_v = GDN_STRIDE(ns_v, K);
#if GDN_POOL
    const long long s_head = GDN_READ_OFFSET(slot.read, h);
    const long long ns_head = GDN_WRITE_OFFSET(slot.write, h);
#elif GDN_DENSE
    const long long s_head = (long long)nh * (V * K), ns_head = s_head;
#else
    const long long s_head = GDN_READ_OFFSET(n, h);
    const long long ns_head = GDN_WRITE_OFFSET(n, h);
#endif
    const ST* src = static_cast<const ST*>(p.state) + s_head;
    ST* dst = static_cast<ST*>(p.new_state) + ns_head;

    // Lane's i-th vector holds K elements [(i*LPR + kl)*VEC, +VEC): consecutive lanes read
    // consecutive 16-byte chunks of a row.
    float S[GDN_SMEM ? 1 : RW][NV][VEC];
    bool live[RW];
#if GDN_SMEM
    // Each lane's 16-byte vectors, lane-contiguous per (group, vector): conflict-free reads.
    __shared__ uint4 stage[W][RW][NV][32];
#endif
#if GDN_QKS == 1
    __shared__ uint4 qk_s[T > 1 ? 2 : 1][2][QK_CH];   // [token parity][q, k][chunk]
#endif
#pragma unroll
    for (int g = 0; g < RW; ++g) {
        const int row = wbase + g * RPW + (int)sub;
        live[g] = !TAIL || row < V;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
#if GDN_SMEM
            if (live[g]) {
                const unsigned to = (unsigned)__cvta_generic_to_shared(&stage[warp][g][i][lane]);
                const ST* from = src + row * s_v + (i * LPR + kl) * VEC;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(to), "l"(from)
                             : "memory");
            }
#else
            if (live[g]) {
                ld_vec<SD, VEC, NC>(src, row * s_v + (i * LPR + kl) * VEC, S[g][i]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) S[g][i][e] = 0.0f;
            }
#endif
        }
    }

    // Keep the state loads first in issue order: without this fence the compiler hoists the
    // small loads above them, delaying the long pole by their address math.
    asm volatile("" ::: "memory");
#if GDN_SMEM
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
#if GDN_INTER && GDN_PDL != 2
    bool ikeep;                                        // the intermediate row, behind the state
    ST* const inter = intermediate_block<ST>(p, n, h, ikeep);
#endif

    const float A_log = p.A_log[h * GDN_STRIDE(A_log_h, 1)];
    const float dtb = gdn_ld<GDN_DTB_DT>(p.dt_bias, h * GDN_STRIDE(dtb_h, 1));
#if GDN_PDL == 2
    pdl_wait_and_trigger();        // state-early: q, k, v, a, b, inter_idx and every store after
#if GDN_INTER
    bool ikeep;
    ST* const inter = intermediate_block<ST>(p, n, h, ikeep);
#endif
#endif
    const float scale = (float)p.scale;
    const long long q_t = GDN_STRIDE(q_t, H * K), k_t = GDN_STRIDE(k_t, H * K);
    const long long v_t = GDN_STRIDE(v_t, HV * V), o_t = GDN_STRIDE(o_t, HV * V);
    const long long a_t = GDN_STRIDE(a_t, HV), b_t = GDN_STRIDE(b_t, HV);
    const long long q0 = n * GDN_STRIDE(q_n, T * H * K) + hq * GDN_STRIDE(q_h, K);
    const long long k0 = n * GDN_STRIDE(k_n, T * H * K) + hq * GDN_STRIDE(k_h, K);
    const long long v0 = n * GDN_STRIDE(v_n, T * HV * V) + h * GDN_STRIDE(v_h, V) + wbase + sub;
    const long long o0 = n * GDN_STRIDE(o_n, T * HV * V) + h * GDN_STRIDE(o_h, V) + wbase + sub;
    const long long a0 = n * GDN_STRIDE(a_n, T * HV) + h * GDN_STRIDE(a_h, 1);
    const long long b0 = n * GDN_STRIDE(b_n, T * HV) + h * GDN_STRIDE(b_h, 1);

#if GDN_QKS != 1
    // This lane's q and k slices of token t; QKX: its q or its k words, swapped in the loop.
    const auto load_qk = [&](int t, float (&qv)[NV][VEC], float (&kv)[NV][VEC],
                             unsigned (&qkw)[QKX ? NV : 1][QW]) {
        if constexpr (QKX) {
            // Rows sub and sub^1 share q and k: the even one loads q, the odd one k, and they
            // swap through one shuffle per word.
            const char* qk = (sub & 1) ? static_cast<const char*>(p.k) + (k0 + t * k_t) * IOBYTES
                                       : static_cast<const char*>(p.q) + (q0 + t * q_t) * IOBYTES;
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const char* at = qk + (i * LPR + kl) * VEC * IOBYTES;
                if constexpr (QW % 4 == 0) {
#pragma unroll
                    for (int c = 0; c < QW / 4; ++c) {
                        const uint4 u = reinterpret_cast<const uint4*>(at)[c];
                        qkw[i][4 * c] = u.x; qkw[i][4 * c + 1] = u.y;
                        qkw[i][4 * c + 2] = u.z; qkw[i][4 * c + 3] = u.w;
                    }
                } else {                          // QW == 2: 4 bf16/fp16 elements
                    const uint2 u = *reinterpret_cast<const uint2*>(at);
                    qkw[i][0] = u.x; qkw[i][1] = u.y;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const int kofs = (i * LPR + kl) * VEC;
                ld_vec<IOD, VEC>(p.q, q0 + t * q_t + kofs, qv[i]);
                ld_vec<IOD, VEC>(p.k, k0 + t * k_t + kofs, kv[i]);
            }
        }
    };
#endif
#if GDN_CHUNK
    // ---- every token at once (GDN_CHUNK) ----------------------------------------------------
    // A row's state after token t is g_t s_{t-1} + u_t k^_t, so s_{t-1}.k^_t and s_t.q^_t are
    // sums of s_0.k^_t, s_0.q^_t and u_j times the k^_j.k^_t, k^_j.q^_t of the earlier tokens:
    // one butterfly for all 2T dot products with the initial state, the u_t from a T-step scalar
    // recurrence with no shuffle in it, then T plain updates each stored at once.  GDN_CHUNK 1:
    // the q and k rows of every token land in shared memory (cp.async, behind the state loads),
    // the Gram entries come from the whole block, behind three barriers.  GDN_CHUNK 2: each lane
    // loads its own q and k slices of every token and adds its slices of the Gram entries to
    // the butterfly of the state's dot products: no shared memory, no barrier (measured on the
    // H100 at B = 1, T = 4: 3.3 us where GDN_CHUNK 1 took 3.8 to 4.1 at the same launch shape).
#if GDN_CHUNK == 1
    __shared__ __align__(16) uint4 cqk[T][2][QK_CH];       // [token][q, k][16-byte chunk]
    __shared__ float cgram[CH_NENT];                       // see chunk_pair
#pragma unroll
    for (int j = 0; j < (T * 2 * QK_CH + 32 * W - 1) / (32 * W); ++j) {
        const int c = (int)threadIdx.x + j * 32 * W;
        if (c < T * 2 * QK_CH) {
            const int t = c / (2 * QK_CH), isk = (c / QK_CH) & 1, ch = c % QK_CH;
            const char* from = static_cast<const char*>(isk ? p.k : p.q)
                + ((isk ? k0 + t * k_t : q0 + t * q_t) * IOBYTES + ch * 16);
            const unsigned to = (unsigned)__cvta_generic_to_shared(&cqk[t][isk][ch]);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(to), "l"(from)
                         : "memory");
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
#else
    // GDN_CHUNK 2: this lane's q and k slices of every token, behind the state loads.
    float qa[T][NV][VEC], ka[T][NV][VEC];
    unsigned qkw[1][QW];                                   // unused: no q/k split (QKX)
#pragma unroll
    for (int t = 0; t < T; ++t) load_qk(t, qa[t], ka[t], qkw);
#endif
    float vr[T][RW], gd[T], beta[T];
    token_inputs(p, v0, v_t, a0, a_t, b0, b_t, live, dtb, vr, gd, beta);
#if GDN_POOL >= 3
    long long ts[T];                                       // token t's slot idx[n, t]
    token_slots(p, n, ts);
#endif
    token_gates(A_log, gd, beta);
#if GDN_CHUNK == 1
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    chunk_gram(cqk, cgram);
    __syncthreads();
    const float* const gram = cgram;
    // Token t's q and k slices of this lane, from shared memory.
    const auto qk_of = [&](int t, float (&qv)[NV][VEC], float (&kv)[NV][VEC]) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            ld_vec<IOD, VEC>(&cqk[t][0][0], (i * LPR + kl) * VEC, qv[i]);
            ld_vec<IOD, VEC>(&cqk[t][1][0], (i * LPR + kl) * VEC, kv[i]);
        }
    };
#else
    // This lane's slices of the Gram entries (see chunk_pair), summed by the butterfly below.
    float gram[CH_NENT];
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int j = 0; j <= t; ++j) {
            gram[chunk_pair(j, t)] = vec_dot(ka[j], ka[t]);
            gram[CH_KQ + chunk_pair(j, t)] = vec_dot(ka[j], qa[t]);
        }
        if (GDN_L2NORM) gram[CH_QQ + t] = vec_dot(qa[t], qa[t]);
    }
    const auto qk_of = [&](int t, float (&qv)[NV][VEC], float (&kv)[NV][VEC]) {
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
            for (int e = 0; e < VEC; ++e) { qv[i][e] = qa[t][i][e]; kv[i][e] = ka[t][i][e]; }
    };
#endif
    // This lane's slices of s_0.k_t and s_0.q_t (raw q, k), then one interleaved butterfly.
    float sk[RW][T], sq[RW][T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        float qv[NV][VEC], kv[NV][VEC];
        qk_of(t, qv, kv);
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            sk[g][t] = vec_dot(S[g], kv);
            sq[g][t] = vec_dot(S[g], qv);
        }
    }
#pragma unroll
    for (int off = LPR / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int g = 0; g < RW; ++g)
#pragma unroll
            for (int t = 0; t < T; ++t) {
                sk[g][t] += __shfl_xor_sync(FULL, sk[g][t], off);
                sq[g][t] += __shfl_xor_sync(FULL, sq[g][t], off);
            }
#if GDN_CHUNK == 2
#pragma unroll
        for (int e = 0; e < CH_NENT; ++e) gram[e] += __shfl_xor_sync(FULL, gram[e], off);
#endif
    }
    float rq[T], rk[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
        rq[t] = GDN_L2NORM ? rsqrtf(gram[CH_QQ + t] + 1e-6f) : 1.0f;
        rk[t] = GDN_L2NORM ? rsqrtf(gram[chunk_pair(t, t)] + 1e-6f) : 1.0f;
    }
    // The recurrence, per row (every lane of the row's group alike).  At token t, E is the
    // decay g_0..g_t of the initial state and w[j] = u_j rk_j times g_{j+1}..g_t, so
    // g_t s_{t-1}.k^_t = rk_t (E s_0.k_t + sum_j w[j] k_j.k_t) and s_t.q^_t likewise; w[t]
    // (u_t rk_t) is the coefficient of the raw k_t in the update, kept in sk[g][t].
#pragma unroll
    for (int g = 0; g < RW; ++g) {
        float E = 1.0f, w[T];
#pragma unroll
        for (int t = 0; t < T; ++t) {
            E *= gd[t];
            float bk = E * sk[g][t], oq = E * sq[g][t];
#pragma unroll
            for (int j = 0; j < t; ++j) {
                w[j] *= gd[t];
                bk += w[j] * gram[chunk_pair(j, t)];
                oq += w[j] * gram[CH_KQ + chunk_pair(j, t)];
            }
            const float u = beta[t] * (vr[t][g] - rk[t] * bk);
            w[t] = u * rk[t];
            oq += w[t] * gram[CH_KQ + chunk_pair(t, t)];
            if (kl == 0 && live[g]) gdn_st<IOD>(p.out, o0 + t * o_t + g * RPW, scale * rq[t] * oq);
            sk[g][t] = w[t];
        }
    }
    // The states, token by token: each stored from the registers as soon as it is made.
#pragma unroll
    for (int t = 0; t < T; ++t) {
        float qv[NV][VEC], kv[NV][VEC];
        qk_of(t, qv, kv);
#if GDN_POOL >= 3
        const bool wr = gdn_token_slot_ok(p, ts[t]);
        ST* const tok = static_cast<ST*>(p.new_state) + GDN_WRITE_OFFSET(wr ? ts[t] : 0, h);
#endif
#pragma unroll
        for (int g = 0; g < RW; ++g) {
#pragma unroll
            for (int i = 0; i < NV; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e) S[g][i][e] = gd[t] * S[g][i][e] + sk[g][t] * kv[i][e];
            if (!live[g]) continue;
            const int row = wbase + g * RPW + (int)sub;
#if GDN_INTER
            if (ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, S[g]);
#elif GDN_POOL >= 3
            if (wr) store_row<CS>(tok, ns_v, row, kl, S[g]);
#endif
        }
    }
#else
#if GDN_AHEAD_ALL
    // Every token's v, gates (and slots) now, behind the state loads.
    float va[T][RW], ga[T], ba[T];
    token_inputs(p, v0, v_t, a0, a_t, b0, b_t, live, dtb, va, ga, ba);
#if GDN_POOL >= 3
    long long tsa[T];
    token_slots(p, n, tsa);
#endif
#if !GDN_HSC
    token_gates(A_log, ga, ba);
#endif
#elif GDN_AHEAD == 2
    // Token t's v and gate inputs: loaded while token t - 1 runs.
    const auto load_vab = [&](int t, float (&vr)[RW], float& xa, float& xb) {
#pragma unroll
        for (int g = 0; g < RW; ++g) vr[g] = live[g] ? gdn_ld<IOD>(p.v, v0 + t * v_t + g * RPW) : 0.0f;
        if (!GDN_HSC) {
            xa = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
            xb = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
        }
    };
    float vn[RW], xan, xbn;
    load_vab(0, vn, xan, xbn);
#if GDN_POOL >= 3
    long long tsn = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T);
#endif
#endif
#if GDN_AHEAD == 3
    // Every token's q and k (QKX: this lane's words of them) now, behind the state loads.
    float qa[T][NV][VEC], ka[T][NV][VEC];
    unsigned qkwa[T][QKX ? NV : 1][QW];
#pragma unroll
    for (int t = 0; t < T; ++t) load_qk(t, qa[t], ka[t], qkwa[t]);
#elif GDN_AHEAD
    float qa[NV][VEC], ka[NV][VEC];                    // q and k a token ahead
    unsigned qkwa[QKX ? NV : 1][QW];
    load_qk(0, qa, ka, qkwa);
#endif
#if GDN_HSC
    // Every token's shared scalars from the block (behind the loads above).
    __shared__ float4 hsc[T][2];
    head_scalars(p, q0, q_t, k0, k_t, a0, a_t, b0, b_t, A_log, dtb, scale, warp, lane, hsc);
#endif
#if GDN_AHEAD_ALL
#pragma unroll
#else
#pragma unroll 1
#endif
    for (int t = 0; t < T; ++t) {
#if GDN_POOL >= 3
        // Token t's slot idx[n, t]: padding (negative, null_slot, >= PN) stores nothing.
#if GDN_AHEAD_ALL
        const long long ts = tsa[t];
#elif GDN_AHEAD == 2
        const long long ts = tsn;
        if (t + 1 < T) tsn = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T + t + 1);
#else
        const long long ts = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T + t);
#endif
        const bool wr = gdn_token_slot_ok(p, ts);
        ST* const tok = static_cast<ST*>(p.new_state) + GDN_WRITE_OFFSET(wr ? ts : 0, h);
#endif
        float qv[NV][VEC], kv[NV][VEC];
        unsigned qkw[QKX ? NV : 1][QW];                // QKX: this lane's q or k words
#if GDN_QKS == 1
        // Chunk c < QK_CH of q, else chunk c - QK_CH of k: loaded now, stored to shared memory
        // after the v and gate loads have issued.
        uint4 qkx[QK_CP];
#pragma unroll
        for (int j = 0; j < QK_CP; ++j) {
            const int c = (int)threadIdx.x + j * 32 * W;
            if (c < 2 * QK_CH) {
                const bool isk = c >= QK_CH;
                const long long e = (isk ? k0 + t * k_t : q0 + t * q_t) + (c % QK_CH) * (16 / IOBYTES);
                qkx[j] = *reinterpret_cast<const uint4*>(
                    static_cast<const char*>(isk ? p.k : p.q) + e * IOBYTES);
            }
        }
#elif GDN_AHEAD
        // Token t's q and k from the registers (3: loaded before the loop; else a token ahead,
        // token t + 1's loads issued before any of token t's stores).
#if GDN_AHEAD == 3
        const auto &qt = qa[t], &kt = ka[t];
        const auto& wt = qkwa[t];
#else
        const auto &qt = qa, &kt = ka;
        const auto& wt = qkwa;
#endif
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            if constexpr (QKX) {
#pragma unroll
                for (int j = 0; j < QW; ++j) qkw[i][j] = wt[i][j];
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) { qv[i][e] = qt[i][e]; kv[i][e] = kt[i][e]; }
            }
        }
#if GDN_AHEAD != 3
        if (t + 1 < T) load_qk(t + 1, qa, ka, qkwa);
#endif
#else
        load_qk(t, qv, kv, qkw);
#endif
#if GDN_AHEAD_ALL
        const float (&vr)[RW] = va[t];
#if !GDN_HSC
        const float gd = ga[t], beta = ba[t];
#endif
#elif GDN_AHEAD == 2
        float vr[RW];
#pragma unroll
        for (int g = 0; g < RW; ++g) vr[g] = vn[g];
        const float xa = xan, xb = xbn;
        if (t + 1 < T) load_vab(t + 1, vn, xan, xbn);
#else
        float vr[RW];
#pragma unroll
        for (int g = 0; g < RW; ++g) vr[g] = live[g] ? gdn_ld<IOD>(p.v, v0 + t * v_t + g * RPW) : 0.0f;
#if !GDN_HSC
        const float xa = gdn_ld<GDN_A_DT>(p.a, a0 + t * a_t) + dtb;
        const float xb = gdn_ld<GDN_B_DT>(p.b, b0 + t * b_t);
#endif
#endif
        if constexpr (QKX) {               // after the v and gate loads have issued
#pragma unroll
            for (int i = 0; i < NV; ++i) {
#pragma unroll
                for (int j = 0; j < QW; ++j) {
                    const unsigned o = __shfl_xor_sync(FULL, qkw[i][j], LPR);
                    const unsigned wq = (sub & 1) ? o : qkw[i][j], wk = (sub & 1) ? qkw[i][j] : o;
                    if constexpr (IOD == GDN_F32) {
                        qv[i][j] = __uint_as_float(wq); kv[i][j] = __uint_as_float(wk);
                    } else {
                        gdn_unpack2<IOD>(wq, qv[i][2 * j], qv[i][2 * j + 1]);
                        gdn_unpack2<IOD>(wk, kv[i][2 * j], kv[i][2 * j + 1]);
                    }
                }
            }
        }
#if GDN_QKS == 1
        {
            // Two buffers: a thread writes token t's buffer only after every thread passed
            // token t-1's barrier, so nobody still reads the buffer of token t-2.
            uint4 (&buf)[2][QK_CH] = qk_s[T > 1 ? (t & 1) : 0];
#pragma unroll
            for (int j = 0; j < QK_CP; ++j) {
                const int c = (int)threadIdx.x + j * 32 * W;
                if (c < 2 * QK_CH) buf[c / QK_CH][c % QK_CH] = qkx[j];
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const int kofs = (i * LPR + kl) * VEC;
                ld_vec<IOD, VEC>(&buf[0][0], kofs, qv[i]);
                ld_vec<IOD, VEC>(&buf[1][0], kofs, kv[i]);
            }
        }
#endif
#if GDN_HSC
        const float4 hs0 = hsc[t][0], hs1 = hsc[t][1];        // see head_scalars
        const float gd = hs0.x, beta = hs0.y;
#elif !GDN_AHEAD_ALL
        const float gd = GDN_FASTGATE ? gdn_decay_fast(A_log, xa) : gdn_decay(A_log, xa);
        const float beta = GDN_FASTGATE ? gdn_sigmoid_fast(xb) : gdn_sigmoid(xb);
#endif
#if GDN_SMEM
        constexpr int NE = NV * VEC;
        float kq, qq, kk;
        qk_dots(kv, qv, kq, qq, kk);
#pragma unroll
        for (int off = LPR / 2; off > 0; off >>= 1) qk_shfl(kq, qq, kk, off);
        float rq = 1.0f, rk = 1.0f;
        if (GDN_L2NORM) {
            rq = rsqrtf(qq + 1e-6f);
            rk = rsqrtf(kk + 1e-6f);
        }
        const float kqn = kq * rq * rk;
        asm volatile("cp.async.wait_all;" ::: "memory");   // this thread's copies have landed
        // One row group at a time (not unrolled: one group's state in registers).
#pragma unroll 1
        for (int g = 0; g < RW; ++g) {
            const int row = wbase + g * RPW + (int)sub;
            float vg = 0.0f;                               // vr[g] without a local-memory array
#pragma unroll
            for (int j = 0; j < RW; ++j) vg = j == g ? vr[j] : vg;
            float Sg[NV][VEC];
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const uint4 w = stage[warp][g][i][lane];
                const unsigned ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if constexpr (SD == GDN_F32) Sg[i][e] = __uint_as_float(ws[e]);
                    else gdn_unpack2<SD>(ws[e], Sg[i][2 * e], Sg[i][2 * e + 1]);
                }
            }
            float sk = dot_sum<NE>([&](int j) { return Sg[j / VEC][j % VEC] * kv[j / VEC][j % VEC]; });
            float sq = dot_sum<NE>([&](int j) { return Sg[j / VEC][j % VEC] * qv[j / VEC][j % VEC]; });
#pragma unroll
            for (int off = LPR / 2; off > 0; off >>= 1) {
                sk += __shfl_xor_sync(FULL, sk, off);
                sq += __shfl_xor_sync(FULL, sq, off);
            }
            const float u = beta * (vg - gd * sk * rk);
            const float uk = u * rk;
#pragma unroll
            for (int i = 0; i < NV; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e) Sg[i][e] = gd * Sg[i][e] + uk * kv[i][e];
            if (!TAIL || row < V) {
                if (store) {
#pragma unroll
                    for (int i = 0; i < NV; ++i)
                        st_vec<SD, VEC, CS>(dst, row * ns_v + (i * LPR + kl) * VEC, Sg[i]);
                }
#if GDN_INTER
                if (ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, Sg);
#elif GDN_POOL >= 3
                if (wr) store_row<CS>(tok, ns_v, row, kl, Sg);
#endif
                if (kl == 0) gdn_st<IOD>(p.out, o0 + g * RPW, scale * (gd * sq * rq + u * kqn));
            }
        }
#else
        // This lane's slice of every dot product (dot_sum); the butterfly below adds the
        // LPR slices of a row.
        constexpr int NE = NV * VEC;
        float kq = 0.0f, qq = 0.0f, kk = 0.0f, sk[RW], sq[RW];
        if (!GDN_HSC) qk_dots(kv, qv, kq, qq, kk);
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            sk[g] = dot_sum<NE>([&](int j) { return S[g][j / VEC][j % VEC] * kv[j / VEC][j % VEC]; });
            sq[g] = dot_sum<NE>([&](int j) { return S[g][j / VEC][j % VEC] * qv[j / VEC][j % VEC]; });
        }
        // xor offsets below LPR stay inside a row's lane group; all chains are interleaved so
        // the shuffles of different rows overlap.
#pragma unroll
        for (int off = LPR / 2; off > 0; off >>= 1) {
            if (!GDN_HSC) qk_shfl(kq, qq, kk, off);
#pragma unroll
            for (int g = 0; g < RW; ++g) {
                sk[g] += __shfl_xor_sync(FULL, sk[g], off);
                sq[g] += __shfl_xor_sync(FULL, sq[g], off);
            }
        }
        // With the L2 norm, q.S, k.S and k.q of the raw vectors are rescaled instead of
        // normalizing q and k first, which keeps the norms off the dot products' path.
#if GDN_HSC
        const float rk = hs0.z, gdrk = hs0.w, oq = hs1.x, ou = hs1.y;
#else
        float rq = 1.0f, rk = 1.0f;
        if (GDN_L2NORM) {
            rq = rsqrtf(qq + 1e-6f);
            rk = rsqrtf(kk + 1e-6f);
        }
        const float kqn = kq * rq * rk;
#endif
#pragma unroll
        for (int g = 0; g < RW; ++g) {
#if GDN_HSC
            const float u = beta * (vr[g] - gdrk * sk[g]);
#else
            const float u = beta * (vr[g] - gd * sk[g] * rk);   // k read from the decayed row
#endif
            const float uk = u * rk;
#pragma unroll
            for (int i = 0; i < NV; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e) S[g][i][e] = gd * S[g][i][e] + uk * kv[i][e];
            // q read from the updated row; the first lane of the row's group stores it.
#if GDN_HSC
            if (kl == 0 && live[g]) gdn_st<IOD>(p.out, o0 + t * o_t + g * RPW, oq * sq[g] + ou * u);
#else
            if (kl == 0 && live[g])
                gdn_st<IOD>(p.out, o0 + t * o_t + g * RPW, scale * (gd * sq[g] * rq + u * kqn));
#endif
        }
#if GDN_INTER || GDN_POOL >= 3
        // The state after token t, from the registers: to its intermediate step or its slot.
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            if (!live[g]) continue;
            const int row = wbase + g * RPW + (int)sub;
#if GDN_INTER
            if (ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, S[g]);
#else
            if (wr) store_row<CS>(tok, ns_v, row, kl, S[g]);
#endif
        }
#endif
#endif
    }
#endif  // GDN_CHUNK

#if !GDN_SMEM
#pragma unroll
    for (int g = 0; g < RW; ++g) {
        if (!live[g] || !store) continue;
        const int row = wbase + g * RPW + (int)sub;
#pragma unroll
        for (int i = 0; i < NV; ++i)
            st_vec<SD, VEC, CS>(dst, row * ns_v + (i * LPR + kl) * VEC, S[g][i]);
    }
#endif
}

// cuda-v4: latency-optimized GDN decode (the math of gdnzoo/reference.py): T tokens a call, in
// place or into new_state, a dense state batch or a pool, and the speculative verify's stores;
// backends/cuda_v4.py picks the variant of each call (its launch rows).
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
// Each switch below is one line; what its launch field buys, when it serves and what it costs
// are written once, at cuda_v4.py's CONFIG.  The pieces the kernel calls: cuda_v4_lane.cuh (a
// lane's vectors and dot products), cuda_v4_tokens.cuh (what the multi-token forms share),
// gdn_common.cuh (parameters, dtypes, gates, strides, slots).  Runtime: B (the grid), strides,
// pointers, scale; with a pool its slot counts and null_slot.
#include "gdn_common.cuh"

// ---- compile-time switches (-D, backends/_cuda_build.py) ----------------------------------------
// Shapes and dtypes
//   GDN_K, GDN_V, GDN_T        head dims, tokens a call
//   GDN_HV, GDN_GVA            value heads, value heads a q/k head (HV / H, repeat_interleave)
//   GDN_STATE_DT, GDN_IO_DT, GDN_A_DT, GDN_B_DT, GDN_DTB_DT    dtype codes (gdn_common.cuh)
//   GDN_L2NORM                 1: q and k L2-normalized
// Launch shape (CONFIG warps, row_groups, lanes_per_row, hint, fast_gates, chain)
//   GDN_W, GDN_RW, GDN_LPR     warps a block, row groups a warp, lanes a row
//   GDN_VEC16                  1: 16-byte vectors (every state, q and k row 16-byte aligned);
//                              0: element loads
//   GDN_HINT                   bit 0: state loads ld.global.nc.L1::no_allocate; bit 1: state
//                              stores st.global.cs (16-byte vectors only)
//   GDN_FASTGATE               1: gates with fast intrinsics; 0: precise
//   GDN_CHAIN                  c > 0: a lane's dot-product slices as chains of c FMAs; 0: trees
// Layout (gdn_common.cuh)
//   GDN_DENSE                  1: every tensor dense (a pool: each slot), strides from the
//                              shapes; 2: the call's strides, -DGDN_SC_<field>; 0: at run time
// The step's form (CONFIG smem, qk_mode, chunk, ahead, head_scalars)
//   GDN_SMEM                   1: the state staged through shared memory (T = 1)
//   GDN_QKS                    1: q and k through shared memory once a block; 2: split over a
//                              lane pair, swapped by shuffles; 0: every lane its own slices
//   GDN_CHUNK     (default 0)  1, 2: every token at once, its Gram entries from the block (1) or
//                              in every lane's registers (2, T <= 4); 0: the token loop
//   GDN_AHEAD     (default 0)  the token loop's state-free loads ahead: 1 every token's v, gates
//                              and slots first, q, k a token ahead; 2 all a token ahead, rolled;
//                              3 as 1 with every token's q, k first
//   GDN_HSC       (default 0)  1: a head's per-token scalars once a block, from shared memory
// Where the state comes from and goes (gdnzoo/pool.py, gdnzoo/verify.py)
//   GDN_POOL                   0: a dense batch; 1: a pool, sequence n's slot idx[n]; 2: read
//                              idx[n], write new_idx[n]; 3: per-token slots, read idx[n, 0],
//                              token t's state to idx[n, t]; 4: as 3, read column accepted[n]-1
//   GDN_IDX64                  with index tensors: int64 where bit 0 idx, 1 new_idx,
//                              2 inter_idx, 3 accepted (else int32)
//   GDN_INTER     (default 0)  verify: the state after token t to intermediate row n (1) or
//                              inter_idx[n] (2), step t
//   GDN_UPDATE    (default 1)  0: no final store (a deferred commit); a verify variant passes
//                              both GDN_INTER and GDN_UPDATE, a plain decode neither
//   GDN_PDL       (default 0)  programmatic dependent launch: 1 wait first, 2 the state early
//                              (cuda_v4.py's docstring: which loads may precede the wait)
#include "cuda_v4_switches.cuh"               // GDN_INTER, GDN_UPDATE, GDN_PDL defaults
#ifndef GDN_CHUNK
#define GDN_CHUNK 0
#endif
#ifndef GDN_AHEAD
#define GDN_AHEAD 0
#endif
#ifndef GDN_HSC
#define GDN_HSC 0
#endif
#if !defined(GDN_K) || !defined(GDN_V) || !defined(GDN_T) || !defined(GDN_HV) || \
    !defined(GDN_GVA) || !defined(GDN_STATE_DT) || !defined(GDN_IO_DT) || !defined(GDN_A_DT) || \
    !defined(GDN_B_DT) || !defined(GDN_DTB_DT) || !defined(GDN_L2NORM) || !defined(GDN_W) || \
    !defined(GDN_RW) || !defined(GDN_LPR) || !defined(GDN_VEC16) || !defined(GDN_HINT) || \
    !defined(GDN_FASTGATE) || !defined(GDN_DENSE) || !defined(GDN_CHAIN) || !defined(GDN_SMEM) || \
    !defined(GDN_QKS) || !defined(GDN_POOL) || ((GDN_POOL || GDN_INTER == 2) && !defined(GDN_IDX64))
#error "compile with the -D options of backends/_cuda_build.py"
#endif
#if GDN_PDL < 0 || GDN_PDL > 2
#error "GDN_PDL: 0 off, 1 wait-first, 2 state-early"
#endif
#if GDN_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "GDN_PDL: programmatic dependent launch (griddepcontrol) needs sm_90 or newer"
#endif
// GDN_AHEAD 1 and 3: every token's v, gates and slots before the loop, the loop unrolled.
#define GDN_AHEAD_ALL (GDN_AHEAD == 1 || GDN_AHEAD == 3)
// FINAL: the final state is stored; not with per-token slots (token T-1's slot holds it) nor
// when the commit is deferred (GDN_UPDATE 0).
#define GDN_FINAL (GDN_UPDATE && GDN_POOL < 3)

// ---- launch constants ---------------------------------------------------------------------------
#include "cuda_v4_shape.cuh"                        // K, V, T, HV, GVA, SD, IOD, sizes
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
constexpr int QK_CH = K * IOBYTES / 16;            // 16-byte chunks of one q or k row
#if GDN_QKS == 1
constexpr int QK_CP = (2 * QK_CH + 32 * W - 1) / (32 * W);   // chunks of q and k per thread
#endif
constexpr bool QKX = GDN_QKS == 2;                 // q/k split over a lane pair (see GDN_QKS)
constexpr int QW = QKX ? VEC * IOBYTES / 4 : 1;    // 32-bit words of a lane's q (or k) vector
static_assert(!QKX || (RPW >= 2 && (QW == 2 || QW % 4 == 0)), "GDN_QKS=2: LPR <= 16, 16-byte vectors");

// ---- which switches go together -----------------------------------------------------------------
static_assert(!GDN_SMEM || (T == 1 && GDN_VEC16), "GDN_SMEM: T = 1 with 16-byte vectors");
static_assert(!GDN_QKS || GDN_VEC16, "GDN_QKS: q/k rows 16-byte aligned (the vec16 variant)");
static_assert(GDN_AHEAD >= 0 && GDN_AHEAD <= 3, "GDN_AHEAD: 0, 1, 2 or 3");
static_assert(!GDN_AHEAD || (T > 1 && !GDN_SMEM && GDN_QKS != 1 && !GDN_CHUNK),
              "GDN_AHEAD: T > 1, the token loop with the state in registers, q/k not staged");
static_assert((GDN_HSC == 0 || GDN_HSC == 1) && (!GDN_HSC || (T > 1 && !GDN_SMEM && !GDN_CHUNK)),
              "GDN_HSC: 0 or 1; 1 with T > 1 and the token loop with the state in registers");
static_assert(!GDN_CHUNK || (T > 1 && GDN_VEC16 && !GDN_SMEM && !GDN_QKS),
              "GDN_CHUNK: T > 1, 16-byte vectors, state in registers, its own q/k staging");
static_assert(GDN_CHUNK >= 0 && GDN_CHUNK <= 2 && (GDN_CHUNK != 2 || T <= 4),
              "GDN_CHUNK: 1, or 2 with T <= 4 (its Gram entries in every lane's registers)");
static_assert(GDN_POOL >= 0 && GDN_POOL <= 4 && GDN_INTER >= 0 && GDN_INTER <= 2, "bad switches");
static_assert(GDN_POOL < 3 || (GDN_UPDATE && !GDN_INTER),
              "per-token slots keep every token's state: no intermediate rows, no deferral");

#include "cuda_v4_lane.cuh"
#include "cuda_v4_tokens.cuh"

// This lane's slices of one state row to row ``row`` of a [V, K] block with row stride rs.
template <bool CS, typename ST>
__device__ __forceinline__ void store_row(ST* block, long long rs, int row, unsigned kl,
                                          const float (&x)[NV][VEC]) {
#pragma unroll
    for (int i = 0; i < NV; ++i) st_vec<SD, VEC, CS>(block, row * rs + (i * LPR + kl) * VEC, x[i]);
}

#if GDN_PDL
// Wait until the kernel before this one in the stream has completed and its writes are
// visible, then let the kernel after this one launch.  Only reads that the kernel before us
// cannot have written may precede the call (GDN_PDL 2: the state, see cuda_v4.py).
__device__ __forceinline__ void pdl_wait_and_trigger() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#endif

// One block: part `part` of head h of sequence n, ROWS_PER_BLOCK state rows.  Its phases, in
// this order in every variant: the block's rows, the slots (pools), the state loads, the
// inputs' offsets, the step (every token at once, or the token loop), the final store.
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

    // ---- the slots (pools) ----------------------------------------------------------------------
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

    // ---- the state loads ------------------------------------------------------------------------
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

    // ---- the inputs' offsets (their loads issue behind the state's) -----------------------------
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
    // ---- every token at once (GDN_CHUNK) --------------------------------------------------------
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
    // ---- the token loop (GDN_CHUNK 0): the state in registers (GDN_SMEM: staged) ----------------
    // Each token: its q, k (by q/k mode, or from registers loaded ahead), v and gates; the
    // row's k.S and q.S in one butterfly; the update and output; its state stored (verify).
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
        const float gd = gdn_gate_decay<GDN_FASTGATE>(A_log, xa);
        const float beta = gdn_gate_beta<GDN_FASTGATE>(xb);
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

    // ---- the final state (GDN_SMEM stored each row group in its loop) ---------------------------
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

// cuda-chunk-bf16's sequential (chain) kernel: the chunked prefill's chain of state updates on
// Hopper's warpgroup MMAs (wgmma) and TMA copies, warp-specialized (sm_90a only).  It computes
// what triton-chunk's chunk_state_kernel computes with "bf16" products
// (backends/_triton_chunk_kernel.py; bit-identical outputs and states in every form measured on
// an H200), on the workspace the prep kernel wrote with precision "bf16".  Per chunk of C = 64
// tokens, on a [64, K] tile of the state S0 (K = 128):
//
//     X = S0 k^T,  R = v^T diag(beta) - X diag(beta rk e^G),  V'^T = R T^T,
//     O^T = (S0 q^T) diag(scale rq e^G) + R M^T,  S = e^G_last S0 + V'^T diag(rk e^(G_last-G)) k
//
// One CTA per (sequence, value head, 64 state rows), the sequences taken longest first (CTA
// order: a ragged batch's longest chains start in the first wave), three roles:
// * warpgroup 0, the chain: the state tile in wgmma accumulators (warp w: rows 16 w + lane / 4
//   and + 8; registers 4 j .. 4 j + 3: columns 8 j + 2 (lane % 4), + 1); X, R, V'^T and the
//   update, each product's A operand from registers (the previous accumulator rounded to bf16:
//   C of two 8-column chunks = A of one k-step).  It hands S0 and R (bf16) to warpgroup 1
//   through shared memory (no-swizzle core-matrix tiles, two buffers).
// * warpgroup 1, the outputs, a chunk behind: Y = S0 q^T and O = Y diag(fq) + R M^T with both
//   operands from shared memory, then the chunk's [64 tokens, 64 rows] outputs through a
//   swizzled buffer to one TMA store (a sequence's last, partial chunk stored directly: a box
//   would write the next sequence's rows).
// * warp 8, the producer: per chunk seven TMA boxes of [64 tokens, 64 columns] (k twice, q
//   twice, the workspace rows of T^T and M^T, v), 128-byte swizzle, and the factors by cp.async
//   (zeros past the sequence's end), all counted on the stage's "full" mbarrier; a stage is
//   refilled once both warpgroups released it ("empty").
// GDN_SOLO 1, the form for grids past two waves of that one (_cuda_chunk_chain.pick_solo): one
// warpgroup of 128 threads computes the chain and the chunk's outputs (Y = S0 q^T from the same A
// fragments as X, R M^T from R's) with no handover; two stages of the chain's inputs (k, T^T, v,
// the factors: chunk jc + 2's copied in once chunk jc is done) and one of the outputs' (q, M^T:
// the next chunk's copied in once this one's outputs products are done), issued by its warp 0;
// 109 KB, two CTAs an SM, each hiding the other's copies and MMA latencies.  Same products, same
// outputs and states.
// Tokens past the tensor's end are zero-filled by TMA; those past the sequence's end (the next
// sequence's rows) meet zero factors, which zero every term they would enter.
// Descriptors (settled by lab/tma_probe.py and lab/wgmma_probe.cu): swizzled K-major: SBO 1024,
// k-steps at +32 bytes in a 64-column box; swizzled MN-major: LBO 8192 (the next box along N),
// SBO 1024, k-steps at +2048; no swizzle: LBO the core-matrix stride along K, SBO along M/N.
//
// The state's rules are triton-chunk's: pools (GDN_POOL 0 dense, 1 the read slots written, 2
// separate write slots; a negative index, ``null_slot`` or one past the pool pads the sequence:
// zero outputs, no state read or written, no checkpoint), GDN_HAS_INIT (a False row starts from
// zeros, its slot unread), GDN_STATE0 (0: no state, zeros), k-last or K-first by strides,
// GDN_S_DT / GDN_NS_DT / GDN_C_DT (state, new state, checkpoint dtypes: 0 fp32, 1 bf16),
// GDN_CKPT (the state after every ``every`` tokens of a real sequence, rows counted over
// cu_seqlens), GDN_PDL (1: wait for the kernel before, then let the next one launch; 2: launched
// right after the CUDA prep kernel as its programmatic dependent, so that its CTAs start on the
// SMs the prep's last CTAs leave: only the warp that copies the prep's workspace waits for it,
// before its first copy; every other input, the state among them, is read at once, since the
// prep's CTAs let this kernel launch only after their own wait for the kernel before them),
// GDN_CU64 / GDN_IDX64 / GDN_NIDX64 (int64 cu_seqlens and slot indices).  GDN_SMEM: the dynamic
// shared memory the host sizes (checked against the layout).
// GDN_SEG = S > 1: triton-chunk's segmented form (backends/_triton_chunk_cp.py): the grid holds
// 2 S - 1 tasks of N * HV * V / 64 CTAs each, the segments' chains over their chunks (segment 0
// from the state, the others from zeros) and the identity chains of segments 1..S-1 (v = 0: its
// tiles cleared once, never loaded); the segments' outputs straight into ``out`` (segment 0's
// final, the others' completed in place by the output pass), the identity chains' (w) into a
// bf16 [T, HV, V] buffer; final tiles Z into fp32 [N, S, HV, V, K] and Phi into p.ckpt's buffer
// of that shape (GDN_C_DT) for the combine kernel.
// GDN_X3 1 (with GDN_SOLO): triton-chunk's "bf16x3" products, the fp32-accurate
// chain of cuda-chunk (the automatic choice): every product's operands in bf16 hi and lo parts
// (hi = bf16(x), lo = bf16(x - hi)), a_hi b_hi + a_lo b_hi + a_hi b_lo (k and q are bf16 already:
// two passes), on the workspace the prep writes with precision "bf16x3" (per token and value
// head the rows T^T hi, T^T lo, M^T hi, M^T lo: the lo rows copied into tiles of their own);
// 133 KB, one CTA an SM (lab/notebook/h200/chain_split_prec_2026-12-01/).  With GDN_SEG its
// outputs (o, and an identity chain's w) go to fp32 buffers by plain stores and Phi is fp32
// (GDN_C_DT 0): the join and the output pass then round nothing the unsegmented form keeps.
// GDN_X3_PAIR 1 (with GDN_SEG, for grids past one wave): the segmented x3 form in 109 KB, two
// CTAs an SM: no output staging (its outputs are stored plainly) and T^T's lo rows in one tile
// with the outputs' inputs, the next chunk's copied in once every warp's V'^T is done (their own
// barrier, ``tlfull``); eight segments of 16 chunks at 4/8 heads 1 x 32768 tokens 668.7 us a
// call against 757.3 in four unpaired (lab/notebook/h200/x3_seg2_2026-12-01/).
// GDN_NO_OUT (timing only, lab/wgmma_chain.py --no-out): no outputs computed (warpgroup 1
// releases every chunk at once; with GDN_SOLO the products Y are skipped).
// GDN_OVERLAP 1 (the 185 KB form, one segment; _cuda_chunk_chain.pick_overlap): the prep kernel
// runs beside this one on the SMs it leaves free, launched after it as its programmatic
// dependent.  Each CTA clears the flags of its chunks (``flags[slot * HV + head]``, the prep's
// chunk slots) and CTA 0 the prep's count of finished CTAs, then lets the prep start; the
// producer warp waits for a chunk's flag (set by the prep once its rows and factors are
// stored) before it copies them.  A flag never set (the prep kernel unable to run) traps
// after ~9 s of waiting instead of hanging.
#ifndef GDN_NO_OUT
#define GDN_NO_OUT 0
#endif
#ifndef GDN_SOLO
#define GDN_SOLO 0
#endif
#ifndef GDN_OVERLAP
#define GDN_OVERLAP 0
#endif
#include "gdn_common.cuh"             // gdn_ld, gdn_st (fp32 / bf16 states)
#include "wgmma.cuh"                  // the wgmma wrappers
#ifndef GDN_STATE0
#define GDN_STATE0 1
#endif
#ifndef GDN_POOL
#define GDN_POOL 0
#endif
#ifndef GDN_HAS_INIT
#define GDN_HAS_INIT 0
#endif
#ifndef GDN_CKPT
#define GDN_CKPT 0
#endif
#ifndef GDN_PDL
#define GDN_PDL 0
#endif
#ifndef GDN_S_DT
#define GDN_S_DT 0
#endif
#ifndef GDN_NS_DT
#define GDN_NS_DT 0
#endif
#ifndef GDN_C_DT
#define GDN_C_DT 0
#endif
#ifndef GDN_CU64
#define GDN_CU64 1
#endif
#ifndef GDN_IDX64
#define GDN_IDX64 1
#endif
#ifndef GDN_NIDX64
#define GDN_NIDX64 1
#endif
#ifndef GDN_SEG
#define GDN_SEG 0
#endif
#ifndef GDN_X3
#define GDN_X3 0
#endif
#ifndef GDN_X3_PAIR
#define GDN_X3_PAIR 0
#endif
#if GDN_X3 && (!GDN_SOLO || GDN_OVERLAP)
#error "GDN_X3: the solo form only"
#endif
#if GDN_X3_PAIR && (!GDN_X3 || !GDN_SEG || GDN_NO_OUT)
#error "GDN_X3_PAIR: the segmented x3 form, with its outputs"
#endif
// the x3 chain's T^T lo rows in each chain stage (unpaired), or in one tile beside q (paired)
#define X3_TL_STAGED (GDN_X3 && !GDN_X3_PAIR)
#if GDN_SEG && (GDN_CKPT || GDN_PDL == 1)
#error "GDN_SEG: no checkpoints, no PDL but after the prep (the launcher runs one segment then)"
#endif
#if GDN_OVERLAP && GDN_PDL == 2
#error "GDN_OVERLAP: the chain is launched first, before the prep"
#endif
#if GDN_OVERLAP && (GDN_SEG || GDN_SOLO)
#error "GDN_OVERLAP: the 185 KB form of one segment only"
#endif

typedef unsigned short bf16_t;

#define C_ 64
#define K_ 128
#define ROWS 64
#define BOX (C_ * 64)            // bf16 elements of a [64 tokens, 64 columns] box (8 KB)
#define STAGES 2
#define MCOL (GDN_X3 ? 2 * C_ : C_)   // the M^T rows' first column in a workspace row
#if GDN_SOLO
#define NTHR 128                 // one warpgroup, its warp 0 the producer too
#define CTAS_SM (GDN_X3 && !GDN_X3_PAIR ? 1 : 2)   // x3: 133 KB, one an SM; paired 109 KB
#else
#define NTHR 288                 // two warpgroups and the producer warp
#define CTAS_SM 1
#endif

struct alignas(64) TMap { unsigned long long v[16]; };      // a CUtensorMap
struct ChainParams {       // by value (backends/_cuda_chunk_chain.py packs it)
    TMap tk, tq, tm, tv;   // [T, H, K] k and q, [T, HV, 2 C] workspace rows (GDN_X3: 4 C),
                           // [T, HV, V] v
    TMap to;               // [T, HV, V] out
    TMap tw;               // GDN_SEG: [T, HV, V] the identity chains' outputs (w); else as to
    const void* cu; const float* vecs; bf16_t* out; bf16_t* wout; const void* state;
    void* new_state;
    const void* idx; const void* new_idx; const unsigned char* has_init; void* ckpt;
    int* flags;            // GDN_OVERLAP: [slots * HV] chunk flags, then the prep's count
    long long N, T_all, so_t, so_h, H, HV, V;
    long long ss_n, ss_h, ss_v, ss_k, sn_n, sn_h, sn_v, sn_k, sc_n, sc_h, sc_v, sc_k;
    long long P, PN, null_slot, every;
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
struct alignas(1024) Handover {  // chain -> outputs, no swizzle: core (r / 8, c / 8) rows of 16 B
    bf16_t s0[ROWS * K_];       // S0 [64, 128]: core at (r / 8) 2048 + (c / 8) 128 bytes
    bf16_t r[ROWS * C_];        // R [64, 64]: core at (r / 8) 1024 + (i / 8) 128 bytes
};
#if GDN_SOLO
struct alignas(1024) CStage {   // the chain's inputs of a chunk (two of them: the next one lands
    bf16_t k[2 * BOX];          // while this one is used)
    bf16_t t[BOX];
#if X3_TL_STAGED
    bf16_t tl[BOX];             // the T^T rows' lo parts (GDN_X3_PAIR: in OStage)
#endif
    bf16_t v[BOX];
    float f[4][C_];
    float glast[4];
};
struct alignas(1024) OStage {   // the outputs' inputs (one: the next chunk's land once the
    bf16_t q[2 * BOX];          // outputs' products are done)
    bf16_t m[BOX];
#if GDN_X3
    bf16_t ml[BOX];             // the M^T rows' lo parts
#endif
#if GDN_X3_PAIR
    bf16_t tl[BOX];             // the T^T rows' lo parts: the next chunk's copied in once this
#endif                          // one's V'^T is done (``tlfull``)
};
struct alignas(1024) ChainSmem {
    CStage st[2];
    OStage os;
#if !GDN_X3_PAIR
    bf16_t ob[2][BOX];          // (the paired x3 form stores its fp32 outputs plainly)
#endif
    unsigned long long full[2], qfull;
#if GDN_X3_PAIR
    unsigned long long tlfull;
#endif
};
#else
struct alignas(1024) ChainSmem {
    Stage st[STAGES];
    Handover hb[2];
    bf16_t ob[2][BOX];          // a full chunk's outputs [64 tokens, 64 rows] (swizzled)
    unsigned long long full[STAGES], empty[STAGES], hfull[2], hempty[2];
};
#endif
static_assert(sizeof(ChainSmem) <= GDN_SMEM, "GDN_SMEM too small");

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
    return wg_desc(smem_u32(p) + bytes, lbo, 1024, 1);
}
// the bf16 remainders x - bf16(x) of a pair, packed as pack2 packs the pair (GDN_X3's lo parts)
__device__ __forceinline__ unsigned lo2(float x0, float x1) {
    const unsigned h = pack2(x0, x1);
    return pack2(x0 - __uint_as_float(h << 16), x1 - __uint_as_float(h & 0xffff0000u));
}
// A fragments of k-step s (columns 16 s .. 16 s + 15) from an accumulator's registers (LO: of
// their remainders d - bf16(d))
template <bool LO = false, int R>
__device__ __forceinline__ void frag(unsigned (&a)[4], const float (&d)[R], int s) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
        a[i] = LO ? lo2(d[8 * s + 2 * i], d[8 * s + 2 * i + 1])
                  : pack2(d[8 * s + 2 * i], d[8 * s + 2 * i + 1]);
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

// the descriptor of a no-swizzle core-matrix tile (LBO along K, SBO along M/N)
__device__ __forceinline__ unsigned long long desc_ns(const void* p, unsigned bytes,
                                                      unsigned lbo, unsigned sbo) {
    return wg_desc(smem_u32(p) + bytes, lbo, sbo, 0);
}
__device__ __forceinline__ void sts32(void* p, unsigned x) {
    asm volatile("st.shared.b32 [%0], %1;" :: "r"(smem_u32(p)), "r"(x) : "memory");
}
// the A fragments of k-step k (rows r0, r0 + 8 of the thread; columns of n-chunks 2k, 2k + 1)
// into a no-swizzle handover tile whose 8-row groups are ``group`` bytes apart; ``at``: the
// thread's word of row r0, column 2 t4 of n-chunk 0
__device__ __forceinline__ void put_frag(unsigned char* at, const unsigned (&a)[4], int k,
                                         int group) {
    sts32(at + (2 * k) * 128, a[0]);
    sts32(at + group + (2 * k) * 128, a[1]);
    sts32(at + (2 * k + 1) * 128, a[2]);
    sts32(at + group + (2 * k + 1) * 128, a[3]);
}
// an m64n64 accumulator's columns (the chunk's tokens) times one factor each
__device__ __forceinline__ void scale_tokens(float (&d)[32], const float* f, int t4) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[4 * j + e] *= f[8 * j + 2 * t4 + (e & 1)];
}
__device__ __forceinline__ void bar_init(unsigned long long* b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void bar_arrive(unsigned long long* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void out_sync() {       // the outputs warpgroup's own barrier
    asm volatile("bar.sync 1, 128;" ::: "memory");
}
// the chunk's factors 0..3 (beta, beta rk e^G, scale rq e^G, rk e^(G_last - G)) into the
// stage's ``f`` by the producer warp's lanes (zeros past the sequence's end)
template <class St>
__device__ __forceinline__ void load_factors(St& st, const ChainParams& p, int i_hv, long long t0,
                                             long long rem, int lane) {
#pragma unroll
    for (int x = 0; x < 8; ++x) {               // factor x / 2, tokens 32 (x % 2) + lane
        const int f = x >> 1, i = 32 * (x & 1) + lane;
        cp4(&st.f[f][i], p.vecs + (i_hv * 5 + f) * p.T_all + t0 + (i < rem ? i : 0), i < rem);
    }
}
#if GDN_OVERLAP
__device__ __noinline__ void flag_timeout() {
    printf("gdnzoo: the chain kernel waited ~9 s for the prep kernel beside it (run one kernel "
           "at a time, as ncu does? then set GDNZOO_PREFILL_OVERLAP=0)\n");
    __trap();
}
// until the prep kernel has set ``*flag`` (every lane acquires it: their copies of the rows and
// factors follow); trap after ~2^24 polls of 512 ns (~9 s), never hang
__device__ __forceinline__ void wait_flag(const int* flag, int lane) {
    int v = 0;
    for (unsigned n = 0;; ++n) {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
        if (v) break;
        if (n == (1u << 24)) flag_timeout();
        __nanosleep(512);
    }
    __syncwarp();
    if (lane == 0) asm volatile("fence.proxy.async.global;" ::: "memory");   // the TMA reads
}
#endif
// arrives on ``bar`` expecting ``bytes`` more of copies
__device__ __forceinline__ void arrive_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar), "r"(bytes) : "memory");
}
// the chain's inputs of a chunk into ``st`` by one warp (``lane``): k (two boxes), the T^T rows
// and v (not for an identity chain) by TMA from lane 0, the factors and the last gate by
// cp.async, all counted on the ``full`` barrier with ``extra`` bytes more (the caller's copies)
template <class St>
__device__ __forceinline__ void load_chain_in(St& st, const ChainParams& p, unsigned full,
                                              long long t0, long long rem, int i_h, int i_hv,
                                              int row0, bool ident, int lane, unsigned extra) {
    if (lane == 0) {
        arrive_expect(full, ((ident ? 3 : 4) + X3_TL_STAGED) * BOX * 2 + extra);
        const int t = (int)t0;
        tma3(st.k, p.tk, 0, i_h, t, full);
        tma3(st.k + BOX, p.tk, 64, i_h, t, full);
        tma3(st.t, p.tm, 0, i_hv, t, full);
#if X3_TL_STAGED
        tma3(st.tl, p.tm, C_, i_hv, t, full);
#endif
        if (!ident) tma3(st.v, p.tv, row0, i_hv, t, full);
    }
    load_factors(st, p, i_hv, t0, rem, lane);
    if (lane == 0) cp4(&st.glast[0], p.vecs + (i_hv * 5 + 4) * p.T_all + t0, rem > 0);
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(full) : "memory");
}
#define OUT_BYTES ((3 + GDN_X3) * BOX * 2)
// the outputs' inputs of the chunk at token t (q, two boxes, and the M^T rows) by TMA from one
// thread, counted on ``full`` (OUT_BYTES; ``expect``: this thread's arrival expects them)
template <class St>
__device__ __forceinline__ void load_out_in(St& st, const ChainParams& p, unsigned full, int t,
                                            int i_h, int i_hv, bool expect = false) {
    if (expect) arrive_expect(full, OUT_BYTES);
    tma3(st.q, p.tq, 0, i_h, t, full);
    tma3(st.q + BOX, p.tq, 64, i_h, t, full);
    tma3(st.m, p.tm, MCOL, i_hv, t, full);
#if GDN_X3
    tma3(st.ml, p.tm, 3 * C_, i_hv, t, full);
#endif
}
#if GDN_X3_PAIR
// the T^T rows' lo parts of the chunk at token t into ``tl`` by TMA from one thread (``full``)
__device__ __forceinline__ void load_tl(bf16_t* tl, const ChainParams& p, unsigned full, int t,
                                        int i_hv) {
    arrive_expect(full, BOX * 2);
    tma3(tl, p.tm, C_, i_hv, t, full);
}
#endif
// R = v^T diag(beta) - X diag(beta rk e^G) in X's registers (v: the chunk's swizzled box)
__device__ __forceinline__ void form_r(float (&X)[32], const bf16_t* v, const float* f0,
                                       const float* f1, int r0, int t4) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = 8 * j + 2 * t4 + (e & 1), r = r0 + 8 * (e >> 1);
            X[4 * j + e] = bf2f(v[sw(i, r)]) * f0[i] - X[4 * j + e] * f1[i];
        }
}
// R's A fragments from X's registers, then V'^T = R T^T issued into X's registers (committed,
// not waited for); T^T the chunk's workspace rows
__device__ __forceinline__ void issue_vp(float (&X)[32], unsigned (&ra)[4][4], const bf16_t* t) {
#pragma unroll
    for (int k = 0; k < 4; ++k) frag(ra[k], X, k);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), k);
    wg_commit();
}
#if GDN_X3
// issue_vp with R in hi (ra) and lo (rl) fragments and T^T's lo rows tl: R_hi T^T + R_lo T^T +
// R_hi T^T_lo
__device__ __forceinline__ void issue_vp_x3(float (&X)[32], unsigned (&ra)[4][4],
                                            unsigned (&rl)[4][4], const bf16_t* t,
                                            const bf16_t* tl) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        frag(ra[k], X, k);
        frag<true>(rl[k], X, k);
    }
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), k);
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, rl[k], desc(t, 2048 * k, 8192), 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(tl, 2048 * k, 8192), 1);
    wg_commit();
}
#endif
// Y = S0 q^T, S0 from its no-swizzle handover tile, q the chunk's two swizzled boxes
__device__ __forceinline__ void outputs_y(float (&Y)[32], const void* s0, const bf16_t* q) {
    wg_fence();
#pragma unroll
    for (int k = 0; k < 8; ++k)
        mma64ss<0>(Y, desc_ns(s0, 256 * k, 128, 2048), desc(q + (k >> 2) * BOX, 32 * (k & 3), 16),
                   k);
    wg_commit();
    wg_wait<0>();
    pin(Y);
}
// the chunk's outputs (keep Y) [64 tokens, 64 rows] at token ``tw`` of ``out``: a whole chunk
// staged in ``ob`` for one TMA store (once the store two chunks back has read it), a sequence's
// last, partial chunk stored directly (a box would write the next sequence's rows); the outputs
// warpgroup's threads (``ti``: 0..127)
template <class T> __device__ __forceinline__ T to_out(float x);
template <> __device__ __forceinline__ bf16_t to_out<bf16_t>(float x) {
    return (bf16_t)(pack2(x, 0.f) & 0xFFFF);
}
template <> __device__ __forceinline__ float to_out<float>(float x) { return x; }
// A chunk's outputs (keep Y; its first token's row tw) by each thread's own stores of its rows
// r0, r0 + 8 of the tokens before ``rem`` (eight lanes: contiguous rows): into ``out``, or (an
// identity chain) into the w buffer, contiguous [T, HV, V]; bf16 (as pack2 rounds), or fp32
// (the segmented x3 form's o and w, read unrounded by the join's "bf16x3" products)
template <class T>
__device__ __forceinline__ void store_rows(const ChainParams& p, const float (&Y)[32], float keep,
                                           long long rem, long long tw, int row0, int i_hv,
                                           int r0, int t4, bool ident) {
    T* dst = reinterpret_cast<T*>(ident ? p.wout : p.out);
    const long long s_t = ident ? p.HV * p.V : p.so_t, s_h = ident ? p.V : p.so_h;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = 8 * j + 2 * t4 + (e & 1), r = r0 + 8 * (e >> 1);
            if (i < rem)
                dst[(tw + i) * s_t + i_hv * s_h + row0 + r] = to_out<T>(keep * Y[4 * j + e]);
        }
}
// A chunk's outputs (its first token's row tw): into ``out``, or (an identity chain) into the
// w buffer, contiguous [T, HV, V]
__device__ __forceinline__ void store_chunk(const ChainParams& p, bf16_t* ob, const float (&Y)[32],
                                            float keep, long long rem, long long tw, int row0,
                                            int i_hv, int r0, int t4, int ti, bool ident) {
    if (rem >= C_) {
        if (ti == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        out_sync();
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                ob[sw(8 * j + 2 * t4 + (e & 1), r0 + 8 * (e >> 1))]
                    = (bf16_t)(pack2(keep * Y[4 * j + e], 0.f) & 0xFFFF);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        out_sync();
        if (ti == 0) tma_store3(ident ? p.tw : p.to, row0, i_hv, (int)tw, ob);
    } else {
        store_rows<bf16_t>(p, Y, keep, rem, tw, row0, i_hv, r0, t4, ident);
    }
}
// Y += R M^T, R from its no-swizzle handover tile, M^T the chunk's workspace rows
__device__ __forceinline__ void outputs_rm(float (&Y)[32], const void* r, const bf16_t* m) {
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
        mma64ss<1>(Y, desc_ns(r, 256 * k, 128, 1024), desc(m, 2048 * k, 8192), 1);
    wg_commit();
    wg_wait<0>();
    pin(Y);
}

// S = e^G_last S0 + V'^T diag(rk e^(G_last - G)) k, V'^T in X's registers (issued and committed,
// not waited for)
template <class St>
__device__ __forceinline__ void issue_update(float (&S)[64], float (&X)[32], const St& st,
                                             int t4) {
    scale_tokens(X, st.f[3], t4);
    unsigned va[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) frag(va[k], X, k);
#if GDN_X3
    unsigned vl[4][4];                          // V'^T's lo parts (k is bf16: two passes)
#pragma unroll
    for (int k = 0; k < 4; ++k) frag<true>(vl[k], X, k);
#endif
    const float gl = st.glast[0];
#pragma unroll
    for (int i = 0; i < 64; ++i) S[i] *= gl;
    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma128rs<1>(S, va[k], desc(st.k, 2048 * k, 8192), 1);
#if GDN_X3
#pragma unroll
    for (int k = 0; k < 4; ++k) mma128rs<1>(S, vl[k], desc(st.k, 2048 * k, 8192), 1);
#endif
    wg_commit();
}

__device__ __forceinline__ long long cu_at(const ChainParams& p, long long i) {
    return GDN_CU64 ? static_cast<const long long*>(p.cu)[i] : static_cast<const int*>(p.cu)[i];
}
// a sequence's bounds held inside [0, T] (cu_seqlens values are the caller's, checked on request)
__device__ __forceinline__ void held(long long& bos, long long& eos, long long T) {
    bos = bos < 0 ? 0 : (bos > T ? T : bos);
    eos = eos < bos ? bos : (eos > T ? T : eos);
}
// The sequence of rank ``rank`` in the order longest first (ties: the earlier first), N < the
// CTA's threads: a CTA's sequence by its place in the grid, so that the CTAs the scheduler
// places first (one an SM) hold the longest chains and a later wave, or a second CTA on an SM,
// the shortest.  ``scratch``: N + 1 words of shared memory no copy has reached yet.  Every
// thread calls it (two barriers).
__device__ __forceinline__ long long longest_first(const ChainParams& p, long long rank,
                                                   long long* scratch, int tid) {
    const int N = (int)p.N;
    long long mine = 0;
    if (tid < N) {
        long long b = cu_at(p, tid), e = cu_at(p, tid + 1);
        held(b, e, p.T_all);
        scratch[tid] = mine = e - b;
    }
    __syncthreads();
    if (tid < N) {
        long long r = 0;
        for (int u = 0; u < N; ++u) {
            const long long o = scratch[u];
            r += o > mine || (o == mine && u < tid);
        }
        if (r == rank) scratch[N] = tid;
    }
    __syncthreads();
    return scratch[N];
}
// the first checkpoint row of sequence n: the sum of L_i // every over i < n
__device__ __forceinline__ long long checkpoint_row0(const ChainParams& p, long long n) {
    long long row = 0;
    for (long long i = 0; i < n; ++i) {
        long long b = cu_at(p, i), e = cu_at(p, i + 1);
        held(b, e, p.T_all);
        row += (e - b) / p.every;
    }
    return row;
}
// this thread's fragments of the tile (rows r0, r0 + 8; columns 8 j + 2 t4, + 1) at ``base`` of
// a [.., V, K] (or, by the strides, K-first) tensor of dtype DT
template <int DT>
__device__ __forceinline__ void store_tile(const float (&S)[64], void* dst, long long base,
                                           long long s_v, long long s_k, int r0, int t4) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            gdn_st<DT>(dst, base + (r0 + 8 * (e >> 1)) * s_v + (8 * j + 2 * t4 + (e & 1)) * s_k,
                       S[4 * j + e]);
}

extern "C" __global__ void __launch_bounds__(NTHR, CTAS_SM) gdn_wgmma_chain(
        const __grid_constant__ ChainParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    ChainSmem& sm = *reinterpret_cast<ChainSmem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w = (tid >> 5) & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int HV = (int)p.HV, NV = (int)(p.V / ROWS);
    const int i_v = (int)(blockIdx.x % NV);
    const long long i_nh = blockIdx.x / NV;
#if GDN_SEG
    // task-major, as triton-chunk's cp_chain_kernel: tasks 0..S-1 the segments' chains, S..2S-2
    // the identity chains of segments 1..S-1
    const long long i_n = (i_nh / HV) % p.N;
    const int task = (int)(i_nh / HV / p.N);
    const bool ident = task >= GDN_SEG;
    const int seg = ident ? task - GDN_SEG + 1 : task;
#else
    long long i_n = i_nh / HV;       // its rank among the sequences, longest first (below)
    constexpr bool ident = false;
    constexpr int seg = 0;
#endif
    const int i_hv = (int)(i_nh % HV);
    const int i_h = i_hv / (HV / (int)p.H);
#if GDN_PDL == 1
    // the kernel before: the prep's workspace (beside the prep: the producer of the inputs)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if GDN_PDL && !GDN_OVERLAP
    asm volatile("griddepcontrol.launch_dependents;");
#endif
#if !GDN_SEG && !GDN_OVERLAP
    if (p.N > 1 && p.N < NTHR)
        i_n = longest_first(p, i_n, reinterpret_cast<long long*>(sm.st[0].k), tid);
#endif
    long long bos = cu_at(p, i_n), eos = cu_at(p, i_n + 1);
    held(bos, eos, p.T_all);
    long long slot_r = i_n, slot_w = i_n;
    bool rd = true, wr = true;
#if GDN_POOL
    {
        const long long r = GDN_IDX64 ? static_cast<const long long*>(p.idx)[i_n]
                                      : static_cast<const int*>(p.idx)[i_n];
        long long wv = r;
        if (GDN_POOL == 2)
            wv = GDN_NIDX64 ? static_cast<const long long*>(p.new_idx)[i_n]
                            : static_cast<const int*>(p.new_idx)[i_n];
        rd = r >= 0 && r < p.P && r != p.null_slot;
        wr = rd && wv >= 0 && wv < p.PN && wv != p.null_slot;
        slot_r = rd ? r : 0;
        slot_w = wr ? wv : 0;
    }
#endif
    const int row0 = i_v * ROWS;
    const int r0 = 16 * w + g;                  // a warpgroup thread's rows r0, r0 + 8
    // this CTA's chunks: all of the sequence's, or those of its segment (ceil(chunks / S) a
    // segment; later segments may be empty); c0: the first one's first token
    long long n_chunks = (eos - bos + C_ - 1) / C_, c0 = bos;
#if GDN_SEG
    {
        const long long per = (n_chunks + GDN_SEG - 1) / GDN_SEG;
        const long long j0 = seg * per < n_chunks ? seg * per : n_chunks;
        const long long j1 = j0 + per < n_chunks ? j0 + per : n_chunks;
        c0 = bos + j0 * C_;
        n_chunks = j1 - j0;
    }
#endif
#if GDN_OVERLAP
    // the prep's chunk slots of this sequence: its first token's chunk, plus one a sequence
    // before it (backends/cuda_chunk_prep.cu)
    const long long slot0 = bos / C_ + i_n;
    for (long long j = tid; j < n_chunks; j += NTHR) p.flags[(slot0 + j) * HV + i_hv] = 0;
    if (blockIdx.x == 0 && tid == 0) p.flags[(p.T_all / C_ + p.N) * HV] = 0;
    __threadfence();
#endif
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s)
            bar_init(&sm.full[s], 1 + 32);      // the producer's expect_tx + its lanes' copies
#if GDN_SOLO
        bar_init(&sm.qfull, 1);
#if GDN_X3_PAIR
        bar_init(&sm.tlfull, 1);
#endif
#else
        for (int s = 0; s < STAGES; ++s) bar_init(&sm.empty[s], 256);   // both warpgroups
        for (int b = 0; b < 2; ++b) {
            bar_init(&sm.hfull[b], 128);
            bar_init(&sm.hempty[b], 128);
        }
#endif
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (ident) {    // an identity chain's v is zeros: its tiles cleared once, never loaded
        for (int x = tid; x < STAGES * BOX / 8; x += NTHR)
            reinterpret_cast<uint4*>(sm.st[x / (BOX / 8)].v)[x % (BOX / 8)] =
                make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
#if GDN_OVERLAP
    asm volatile("griddepcontrol.launch_dependents;");    // every flag of this CTA cleared
#endif

#if GDN_SOLO
    // the chain's inputs of chunks 0 and 1, the outputs' of chunk 0
    if (GDN_PDL == 2 && w == 0) asm volatile("griddepcontrol.wait;" ::: "memory");   // the prep
    for (int j = 0; j < 2; ++j)
        if (w == 0 && j < n_chunks)
            load_chain_in(sm.st[j], p, smem_u32(&sm.full[j]), c0 + j * C_, eos - c0 - j * C_, i_h,
                          i_hv, row0, ident, lane, 0);
    if (!GDN_NO_OUT && tid == 0 && n_chunks > 0) {
        load_out_in(sm.os, p, smem_u32(&sm.qfull), (int)c0, i_h, i_hv, true);
#if GDN_X3_PAIR
        load_tl(sm.os.tl, p, smem_u32(&sm.tlfull), (int)c0, i_hv);
#endif
    }
#else
    if (wg == 2) {                              // the producer warp
        if (GDN_PDL == 2) asm volatile("griddepcontrol.wait;" ::: "memory");   // the prep
        for (long long jc = 0; jc < n_chunks; ++jc) {
            const int s = (int)(jc % STAGES);
            if (jc >= STAGES) wait_bar(smem_u32(&sm.empty[s]), (unsigned)((jc / STAGES - 1) & 1));
            const long long t0 = c0 + jc * C_;
            const unsigned full = smem_u32(&sm.full[s]);
#if GDN_OVERLAP
            wait_flag(p.flags + (slot0 + jc) * HV + i_hv, lane);
#endif
            load_chain_in(sm.st[s], p, full, t0, eos - t0, i_h, i_hv, row0, ident, lane,
                          OUT_BYTES);
            if (lane == 0) load_out_in(sm.st[s], p, full, (int)t0, i_h, i_hv);
        }
        return;
    }
#endif

#if !GDN_SOLO
    if (wg == 1) {                              // the outputs, a chunk behind the chain
        const int ti = tid - 128;
        for (long long jc = 0; jc < n_chunks; ++jc) {
            const int s = (int)(jc % STAGES), b = (int)(jc & 1);
            const long long t0 = c0 + jc * C_, rem = eos - t0;
            wait_bar(smem_u32(&sm.full[s]), (unsigned)((jc / STAGES) & 1));
            wait_bar(smem_u32(&sm.hfull[b]), (unsigned)((jc >> 1) & 1));
            const Stage& st = sm.st[s];
            const Handover& hb = sm.hb[b];
            if (GDN_NO_OUT) {
                bar_arrive(&sm.hempty[b]);
                bar_arrive(&sm.empty[s]);
                continue;
            }
            float Y[32];
            outputs_y(Y, hb.s0, st.q);
            scale_tokens(Y, st.f[2], t4);
            const float keep = rd ? 1.f : 0.f;        // a padded sequence's outputs are zeros
            outputs_rm(Y, hb.r, st.m);
            bar_arrive(&sm.hempty[b]);          // S0 and R of this chunk read
            bar_arrive(&sm.empty[s]);           // q, M^T and fq read
            store_chunk(p, sm.ob[b], Y, keep, rem, t0, row0, i_hv, r0, t4, ti, ident);
        }
        if (ti == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }
#endif

    // warpgroup 0: the chain (in the solo form the outputs too)
    float S[64];                                // the state tile [64, 128] as an m64n128 accumulator
    bool init = rd && GDN_STATE0 && seg == 0 && !ident;
#if GDN_HAS_INIT
    init = init && p.has_init[i_n] != 0;
#endif
    const long long rbase = slot_r * p.ss_n + i_hv * p.ss_h + row0 * p.ss_v;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            S[4 * j + e] = init ? gdn_ld<GDN_S_DT>(p.state, rbase + (r0 + 8 * (e >> 1)) * p.ss_v
                                                   + (8 * j + 2 * t4 + (e & 1)) * p.ss_k)
                         // an identity chain starts from the rows row0.. of I_K (K == V)
                         : (ident && row0 + r0 + 8 * (e >> 1) == 8 * j + 2 * t4 + (e & 1)) ? 1.f
                         : 0.f;
#if GDN_CKPT
    // checkpoints by counters: chunks to the next one (``every`` is a multiple of C_), its row,
    // the buffer's rows, the chunks that end inside the sequence
    const int ev = (int)(p.every / C_);
    int left = ev;
    long long crow = checkpoint_row0(p, i_n);
    const long long crows = p.T_all / p.every, full = (eos - bos) / C_;
#endif
#if !GDN_SOLO
    // this thread's words in the handover tiles: rows r0 (+ 8), columns 8 j + 2 t4 (+ 1)
    const int hs = (2 * w) * 2048 + g * 16 + t4 * 4, hr = (2 * w) * 1024 + g * 16 + t4 * 4;
#endif
    for (long long jc = 0; jc < n_chunks; ++jc) {
        const int s = (int)(jc % STAGES);
        wait_bar(smem_u32(&sm.full[s]), (unsigned)((jc / STAGES) & 1));
        const auto& st = sm.st[s];
        unsigned sa[8][4];
#pragma unroll
        for (int k = 0; k < 8; ++k) frag(sa[k], S, k);
#if GDN_X3
        unsigned sl[8][4];                      // S0's lo parts (k and q are bf16: two passes)
#pragma unroll
        for (int k = 0; k < 8; ++k) frag<true>(sl[k], S, k);
#endif
        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
#if GDN_X3
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sl[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), 1);
#endif
        wg_commit();
#if GDN_SOLO
        // Y = S0 q^T from the same fragments, then R M^T into it; the update of S issued before
        // the outputs are stored
        float Y[32];
        if (!GDN_NO_OUT) {
            wait_bar(smem_u32(&sm.qfull), (unsigned)(jc & 1));
            wg_fence();                         // (a branch since the fence before X)
#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sa[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), k);
#if GDN_X3
#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sl[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), 1);
#endif
            wg_commit();
        }
        wg_wait<GDN_NO_OUT ? 0 : 1>();         // X (Y may still run)
        pin(X);
        form_r(X, st.v, st.f[0], st.f[1], r0, t4);
        unsigned ra[4][4];
#if GDN_X3
        unsigned rl[4][4];
#if GDN_X3_PAIR
        wait_bar(smem_u32(&sm.tlfull), (unsigned)(jc & 1));
        issue_vp_x3(X, ra, rl, st.t, sm.os.tl); // V'^T = R T^T (into X's registers)
#else
        issue_vp_x3(X, ra, rl, st.t, st.tl);    // V'^T = R T^T (into X's registers)
#endif
#else
        issue_vp(X, ra, st.t);                  // V'^T = R T^T (into X's registers)
#endif
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // Y (V'^T may still run)
            pin(Y);
            scale_tokens(Y, st.f[2], t4);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, ra[k], desc(sm.os.m, 2048 * k, 8192), 1);
#if GDN_X3
#pragma unroll
            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, rl[k], desc(sm.os.m, 2048 * k, 8192), 1);
#pragma unroll
            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, ra[k], desc(sm.os.ml, 2048 * k, 8192), 1);
#endif
            wg_commit();
        }
        wg_wait<GDN_NO_OUT ? 0 : 1>();         // V'^T (R M^T may still run)
        pin(X);
        issue_update(S, X, st, t4);
#if GDN_X3_PAIR
        out_sync();                             // every warp's V'^T read T^T's lo rows
        if (tid == 0 && jc + 1 < n_chunks)
            load_tl(sm.os.tl, p, smem_u32(&sm.tlfull), (int)(c0 + (jc + 1) * C_), i_hv);
#endif
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // R M^T (the update may still run)
            pin(Y);
            out_sync();                         // q and M^T read: the next chunk's
            if (tid == 0 && jc + 1 < n_chunks)
                load_out_in(sm.os, p, smem_u32(&sm.qfull), (int)(c0 + (jc + 1) * C_), i_h, i_hv,
                            true);
            const long long t0 = c0 + jc * C_;
#if GDN_X3 && GDN_SEG
            store_rows<float>(p, Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4, ident);
#else
            store_chunk(p, sm.ob[jc & 1], Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4,
                        tid, ident);
#endif
        }
        wg_wait<0>();
        pin(S);
        out_sync();                             // the stage read: chunk jc + 2's inputs into it
        if (w == 0 && jc + 2 < n_chunks)
            load_chain_in(sm.st[s], p, smem_u32(&sm.full[s]), c0 + (jc + 2) * C_,
                          eos - c0 - (jc + 2) * C_, i_h, i_hv, row0, ident, lane, 0);
#else
        // S0 to the handover buffer (free once the outputs of chunk jc - 2 are done)
        const int b = (int)(jc & 1);
        if (jc >= 2) wait_bar(smem_u32(&sm.hempty[b]), (unsigned)(((jc >> 1) - 1) & 1));
        unsigned char* h = reinterpret_cast<unsigned char*>(&sm.hb[b]);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            put_frag(h + hs, sa[k], k, 2048);
        }
        wg_wait<0>();
        pin(X);
        form_r(X, st.v, st.f[0], st.f[1], r0, t4);
        unsigned ra[4][4];
        issue_vp(X, ra, st.t);                  // V'^T = R T^T (into X's registers)
        unsigned char* hrb = reinterpret_cast<unsigned char*>(sm.hb[b].r);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            put_frag(hrb + hr, ra[k], k, 1024);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bar_arrive(&sm.hfull[b]);               // S0 and R of chunk jc for the outputs
        wg_wait<0>();
        pin(X);
        issue_update(S, X, st, t4);
        wg_wait<0>();
        pin(S);
        bar_arrive(&sm.empty[s]);               // k, T^T, v and the factors read
#endif
#if GDN_CKPT
        if (--left == 0) {   // the state after chunk jc, at a checkpoint inside the sequence
            left = ev;
            if (rd && jc < full && crow < crows)
                store_tile<GDN_C_DT>(S, p.ckpt, crow * p.sc_n + i_hv * p.sc_h + row0 * p.sc_v,
                                     p.sc_v, p.sc_k, r0, t4);
            ++crow;
        }
#endif
    }
#if GDN_SOLO
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");   // ob read
#endif
#if GDN_SEG
    // Z (a segment's chain from zeros, or segment 0's from the state) into the fp32
    // [N, S, HV, V, K] buffer the combine reads, or Phi (an identity chain) into its buffer of
    // the same shape in p.ckpt (bf16: the combine's products round it so)
    const long long at = ((i_n * GDN_SEG + seg) * HV + i_hv) * p.V * K_ + row0 * K_;
    if (ident)
        store_tile<GDN_C_DT>(S, p.ckpt, at, K_, 1, r0, t4);
    else
        store_tile<0>(S, p.new_state, at, K_, 1, r0, t4);
#else
    if (wr)
        store_tile<GDN_NS_DT>(S, p.new_state, slot_w * p.sn_n + i_hv * p.sn_h + row0 * p.sn_v,
                              p.sn_v, p.sn_k, r0, t4);
#endif
}

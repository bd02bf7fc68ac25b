// cuda-v4's tensor-core verify (launch rows with kernel tc-verify; _cuda_v4_tc.py decides where
// it serves): the speculative-verify forms that store every token's state (intermediate_states,
// with or without the final state, on a dense state or a pool; vLLM's per-token slots with or
// without num_accepted_tokens), K = V = 128, T <= 8, bf16 q/k/v.
// Measured on the H100 at B = 1 (lab/notebook/h100-80gb-hbm3/verify/ab-wy/), where the token
// loop of cuda_v4.cu waits on T dependent dot products a token.
//
// The algebra (every token at once).  For one row s of a head, with k^_t = rk_t k_t and
// q^_t = rq_t q_t the normalised rows, the state after token t is
//   s_t = g_t s_{t-1} + u_t k^_t,   u_t = beta_t (v_t - g_t s_{t-1}.k^_t),
// so u = (I + L)^-1 y with y_t = beta_t v_t - beta_t E_t rk_t s_0.k_t (E_t = g_0 .. g_t) and
// L[t][i] = beta_t rk_t rk_i D(t, i) k_i.k_t for i < t (D(t, i) = g_{i+1} .. g_t), and the
// output o_t = scale rq_t E_t s_0.q_t + sum_{i <= t} N[t][i] u_i, N[t][i] = scale rq_t D(t, i)
// rk_i k_i.q_t.  Only the 2T dot products s_0.k_t, s_0.q_t need the state; L, N and the gates
// need the tokens only.
//
// The block: 8 rows of one head (16 blocks a head), 8 compute warps and warp 8, the loader; with
// the MMAs (LOADER_GRAM: every case but an fp32 state up to T = 4) also warp 9, the flags warp.
// The loader alone waits for the sequence's slot, copies the 8 state rows into shared memory
// (cp.async; its addresses are made while the slot is in flight, and a padded sequence's copies
// read nothing and fill zeros, so no branch waits on the slot) and arrives on a named barrier.
// With LOADER_GRAM it also loads the T tokens' k and q while the slot is in flight and, once its
// copies have issued, makes the head's Gram entries (k_i.k_t, k_i.q_t, q_t.q_t: sixteen
// m16n8k16 MMAs over the whole K, in four chains), handed to the compute warps through shared
// memory behind a barrier of their own; the flags warp reads the intermediate row and the write
// slot (per-token slots: the T write slots) from the block's third line.  Without it the compute
// warps make the Gram entries (two MMAs a warp over its 16-wide K slice, summed over the warps
// through shared memory) and the loader reads the third line after its copies.  The 8 compute
// warps never wait for the slot: the gates, the Gram entries, each warp's own copy of L and N
// (in registers) and its k rows are ready while the slot and the state are in flight.  At the
// barrier the state arrives: warp w holds a 16-wide K slice of the 8 rows as an MMA A fragment
// (K permuted within the slice so a lane's 4 elements are contiguous) for two MMAs (an fp32
// state is split into three bf16 parts: four, none chained), the sums over the warps behind
// one barrier, then warp w takes row w: y, then token by token u_t (forward substitution by
// columns), the state after token t and its store (lane l: K [4l, 4l + 4)), a scheduling fence
// (sched_fence) so that the stores stream out from token 0 on (the final state's store beside
// token T - 1's); the outputs last, their terms N[t][j] u_j summed in the loop as each u_j is
// made (with the MMAs).
// The loader's Gram, measured on the H100 at B = 1 (lab/notebook/h100-80gb-hbm3/verify/ab-tc-lg/,
// one A/B of 7 interleaved rounds against the compute warps' Gram): bf16 T = 4 states 0.16 us
// faster, bf16 T = 8 states and states+update and fp32 T = 8 states+update one or two CUPTI
// ticks faster, the per-token slots at T = 8 two (fp32) or three (bf16) ticks slower.
// An fp32 state up to T = 4 (WARP_DOTS) skips the MMAs and their barrier: warp w makes its own
// row's T products s_0.k_t from the update layout and sums them within the warp (warp_sums:
// P - 1 + 5 - log2 P shuffles for P sums), and the T with q after the stores.  Measured on the
// H100 at B = 1 (lab/notebook/h100-80gb-hbm3/verify/ab-tc-warp/): at fp32 T = 4, states and
// states+update 0.1 to 0.19 µs faster in six A/B runs; at bf16 T = 4 and at T = 8 slower or
// the same (the warp's 9 shuffles at T = 8 take about twice as long as the MMAs and their
// barrier), so the MMAs stay there.
// The stores set the kernel's time at B = 1: a verify floor whose T stores a thread are spread
// 40 or 80 SM cycles apart reads 0.16 or 0.32 µs slower than with them back to back, about
// what its first store starting that much later costs (fp32 T = 8; ab-tc-ld/floor_delay.py).
// So each token's store issues as soon as its state is made, and above T = 4 with an fp32 state
// (OWN_STORES) each token's store reads registers of its own (St4): a store reads its data and
// address registers after it issues, and with the state's registers reused, the next token's
// update waited for the previous store (long-scoreboard stalls on those FMAs in Nsight
// Compute); the block's outputs are also gathered in shared memory and stored 16 bytes a token,
// where each warp stored 8 scattered bf16 values.  Measured on the H100 at B = 1
// (lab/notebook/h100-80gb-hbm3/verify/ab-tc-ld/): fp32 T = 8 0.06 to 0.1 µs faster in every
// form; with bf16, or at T = 4, the same or slower, so only there.  Those outputs go out before
// the sink that keeps St4's registers (ptxas put its chain of folds ahead of them), with the
// output's terms summed in the token loop: one CUPTI tick (32 ns) faster at fp32 T = 8 states
// and slots and at bf16 T = 8, nowhere slower, in three A/B runs (ab-tc-out/).
//
// Compile-time: cuda_v4.cu's switches (its block lists them), of which this kernel takes the
// shapes (K = V = 128, T <= 8) and dtypes (bf16 q/k/v), GDN_L2NORM, GDN_FASTGATE, GDN_DENSE (1
// or 2), GDN_POOL, GDN_IDX64, GDN_INTER and GDN_UPDATE (intermediate states, or per-token slots,
// GDN_POOL 3 and 4), and no other; strides and state offsets as in cuda_v4.cu (gdn_common.cuh).
// Runtime: the GdnParams block (gdn_common.cuh), whose first line holds what the loader reads
// first and whose second the compute warps' inputs; dt_bias and new_state come in fields their
// form leaves unused (TC_DT_BIAS, TC_NEW_STATE; _cuda_v4_tc.py's note says which and why).
// Its instruction-level pieces (the MMA, predicated stores, the fence): cuda_v4_tc_parts.cuh.
#include "gdn_common.cuh"

#if !defined(GDN_K) || !defined(GDN_V) || !defined(GDN_T) || !defined(GDN_HV) || \
    !defined(GDN_GVA) || !defined(GDN_STATE_DT) || !defined(GDN_IO_DT) || !defined(GDN_A_DT) || \
    !defined(GDN_B_DT) || !defined(GDN_DTB_DT) || !defined(GDN_L2NORM) || \
    !defined(GDN_FASTGATE) || !defined(GDN_DENSE) || !defined(GDN_POOL) || !defined(GDN_INTER) || \
    !defined(GDN_UPDATE) || ((GDN_POOL || GDN_INTER == 2) && !defined(GDN_IDX64))
#error "cuda_v4_tc.cu: missing -D options (backends/_cuda_build.py defines them)"
#endif
static_assert(GDN_K == 128 && GDN_V == 128, "the tensor-core verify: K = V = 128");
static_assert(GDN_T >= 1 && GDN_T <= 8, "the tensor-core verify: T <= 8 (the MMA's 8 columns)");
static_assert(GDN_IO_DT == GDN_BF16, "the tensor-core verify: bf16 q, k, v (the MMA's inputs)");
static_assert(GDN_POOL >= 0 && GDN_POOL <= 4, "the tensor-core verify: GDN_POOL 0 to 4");
static_assert(GDN_POOL < 3 ? GDN_INTER == 1 || GDN_INTER == 2 : !GDN_INTER && GDN_UPDATE,
              "the tensor-core verify: intermediate states or per-token slots");
static_assert(GDN_DENSE == 1 || GDN_DENSE == 2, "GDN_DENSE: 1 or 2");

namespace {
constexpr int T = GDN_T, HV = GDN_HV, GVA = GDN_GVA, K = 128, V = 128;
constexpr int SD = GDN_STATE_DT;
constexpr int R = 8, NW = 8;                       // rows a block, compute warps
constexpr int PARTS = V / R;                       // blocks a head
constexpr unsigned FULL = 0xffffffffu;
constexpr bool SLOTS = GDN_POOL >= 3;              // per-token slots
#ifdef GDN_IDX64
constexpr int IDX64 = GDN_IDX64;
#else
constexpr int IDX64 = 0;                           // a dense state: no index tensors
#endif
// The state's 2T dot products: by MMA, summed over the warps through shared memory, or (an fp32
// state up to T = 4) each warp its own row's, summed within the warp (see the head comment).
constexpr bool WARP_DOTS = SD == GDN_F32 && T <= 4;
// With the MMAs the loader also makes the head's Gram entries, and a tenth warp (the flags warp)
// reads the block's third line; with WARP_DOTS the compute warps make the Gram entries (each over
// its K slice, summed) and the loader reads the third line (see the head comment).
constexpr bool LOADER_GRAM = !WARP_DOTS;
constexpr int NL = 32 * (NW + 1);                  // the compute warps and the loader
constexpr int NT = NL + (LOADER_GRAM ? 32 : 0);    // the block (_cuda_v4_tc.threads mirrors it)
constexpr int NSUM = T > 2 ? 4 : T;                // WARP_DOTS: sums a lane reduces
// WARP_DOTS: lane l ends with sum l >> SUM_SH.
constexpr int SUM_SH = NSUM == 4 ? 3 : NSUM == 2 ? 4 : 5;
// An fp32 state above T = 4: each token's store reads registers of its own (St4), and the block's
// outputs are stored 16 bytes a token (see the head comment).
constexpr bool OWN_STORES = SD == GDN_F32 && T > 4;
}
// Where this kernel finds dt_bias and new_state (_cuda_v4_tc.py's note on the parameter block).
#if GDN_POOL >= 3
#define TC_DT_BIAS p.new_state
#define TC_NEW_STATE p.inter
#else
#define TC_DT_BIAS p.accepted
#define TC_NEW_STATE p.new_state
#endif

#include "cuda_v4_tc_parts.cuh"

extern "C" __global__ void __launch_bounds__(NT, 1) gdn_verify_tc(const GdnParams p) {
    using ST = typename GdnStorage<SD>::type;
    constexpr int SB = (int)sizeof(ST);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const unsigned part = blockIdx.x % PARTS, nh = blockIdx.x / PARTS;
    const unsigned h = nh % HV, n = nh / HV, hq = h / GVA;
    // The block's state rows, padded so that both layouts' reads take the fewest wavefronts
    // (bf16 8-byte reads, fp32 16-byte reads).
    constexpr int SROW = K * SB + (SB == 2 ? 32 : 64);
    __shared__ __align__(16) unsigned char stile[R * SROW];
    // From the flags warp (WARP_DOTS: the loader): read ok, the final state's head block and the
    // intermediate row's (0: none), the intermediate step stride, the scale.  The compute warps
    // then read nothing of the block's third line, which only that warp brings into the constant
    // cache.  [4]: LOADER_GRAM, the loader's clock read (sched_fence's sink).
    __shared__ long long sflags[5];
    __shared__ float sscale;
    __shared__ long long stok[T];                      // per-token slots: token t's rows (0: none)
    __shared__ __align__(16) unsigned short so[T][R];  // OWN_STORES: the block's outputs
    // The head's Gram entries: value j of the MMA's lane L at gt[j * 34 + L] (rows of 34: the
    // reads are free of bank conflicts).  Lane L = 4 i + t / 2 holds k_i.k_t, k_i.k_t (values 0,
    // 1: t even, odd), q_i.k_t (2, 3), k_i.q_t (4, 5), q_i.q_t (6, 7).
    __shared__ float gt[8 * 34];
    const long long q0 = n * GDN_STRIDE(q_n, T * (HV / GVA) * K) + hq * GDN_STRIDE(q_h, K);
    const long long k0 = n * GDN_STRIDE(k_n, T * (HV / GVA) * K) + hq * GDN_STRIDE(k_h, K);
    const long long q_t = GDN_STRIDE(q_t, (HV / GVA) * K);
    const long long k_t = GDN_STRIDE(k_t, (HV / GVA) * K);
    const unsigned short* const qb = static_cast<const unsigned short*>(p.q);
    const unsigned short* const kb = static_cast<const unsigned short*>(p.k);

    // What the compute warps need from the block's third line (the flags warp's or, with
    // WARP_DOTS, the loader's): lane 0 the flags and the scale; per-token slots, lane t < T token
    // t's rows of new_state (0: a padded slot).  Its loads issue after the copies (a constant-cache
    // miss on that line must not delay them: inside these branches the compiler does not hoist
    // the intermediate row's load above them).
    const auto publish = [&](const GdnSlots& s) {
#if GDN_POOL >= 3
        if (lane < T) {
            const long long ts = gdn_index_at<(GDN_IDX64 & 1) != 0>(p.idx, (long long)n * T + lane);
            stok[lane] = gdn_token_slot_ok(p, ts) ? reinterpret_cast<long long>(
                static_cast<ST*>(TC_NEW_STATE) + GDN_WRITE_OFFSET(ts, h)) : 0;
        }
        if (lane == 0) {
            sflags[0] = s.rd;
            sflags[1] = sflags[2] = sflags[3] = 0;
            sscale = (float)p.scale;
        }
#else
        if (lane == 0) {
#if GDN_INTER == 1
            const long long irow = n;
#else
            const long long irow = gdn_slot_at<(GDN_IDX64 & 4) != 0>(p.inter_idx, n);
#endif
            ST* fin = nullptr;
#if GDN_UPDATE
#if GDN_POOL
            // The write slot here (again): its bound is on the third line too.
            const GdnSlots sw = gdn_pool_slots<GDN_POOL, GDN_IDX64>(p, n);
#else
            const GdnSlots& sw = s;
#endif
            if (sw.wr) fin = static_cast<ST*>(TC_NEW_STATE) + GDN_WRITE_OFFSET(sw.write, h);
#endif
            ST* ib = nullptr;
            if ((unsigned long long)irow < (unsigned long long)p.S)
                ib = static_cast<ST*>(p.inter) + irow * GDN_SLOT_STRIDE(i_n)
                     + (long long)h * V * K;
            sflags[0] = s.rd;
            sflags[1] = reinterpret_cast<long long>(fin);
            sflags[2] = reinterpret_cast<long long>(ib);
            sflags[3] = GDN_SLOT_STRIDE(i_t);
            sscale = (float)p.scale;
        }
#endif
    };

    if (LOADER_GRAM && w == NW + 1) {
        // ---- the flags warp -----------------------------------------------------------------
        publish(gdn_sequence_slots<GDN_POOL, T, IDX64>(p, n));
        asm volatile("bar.arrive 1, %0;" :: "n"(NT) : "memory");
        return;
    }

    if (w == NW) {
        // ---- the loader: the slots, then the block's state rows into shared memory ----------
        const long long first = gdn_first_index<GDN_POOL, T, IDX64>(p, n);
        // LOADER_GRAM: the Gram's k and q, loaded while the first index is in flight.  Lane
        // (g, c): token g's K [32 m + 8 c, 32 m + 8 c + 8) in its m-th 16 bytes, the K of MMA
        // slices 2m and 2m + 1 (any order of K within a row serves, A and B taking the same).
        // A clock read after them keeps ptxas from issuing them after the index's compare.
        uint4 gk[LOADER_GRAM ? 4 : 1], gq[LOADER_GRAM ? 4 : 1];
        unsigned early = 0;
        if constexpr (LOADER_GRAM) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                gk[m] = gq[m] = make_uint4(0u, 0u, 0u, 0u);
                if (g < T) {
                    gk[m] = *reinterpret_cast<const uint4*>(kb + k0 + g * k_t + 32 * m + 8 * c);
                    gq[m] = *reinterpret_cast<const uint4*>(qb + q0 + g * q_t + 32 * m + 8 * c);
                }
            }
            sched_fence(early);
        }
        const GdnSlots s = gdn_slots_from<GDN_POOL, T, IDX64>(p, n, first);
        {
            // The addresses made while the slot is in flight (no branch on it), then the copies,
            // zero-filled (nothing read) for a padded sequence.
            const long long s_v = GDN_STRIDE(s_v, K);
            const char* src = reinterpret_cast<const char*>(
                static_cast<const ST*>(p.state) + GDN_READ_OFFSET(s.read, h)
                + (long long)part * R * s_v);
            const unsigned bytes = s.rd ? 16u : 0u;
            constexpr int CPR = K * SB / 16;           // 16-byte chunks a row
#pragma unroll
            for (int j = 0; j < R * CPR / 32; ++j) {
                const int ch = lane + 32 * j, r = ch / CPR, cc = ch % CPR;
                const unsigned to = (unsigned)__cvta_generic_to_shared(stile + r * SROW + cc * 16);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                             :: "r"(to), "l"(src + r * s_v * SB + cc * 16), "r"(bytes) : "memory");
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        if constexpr (LOADER_GRAM) {
            // A clock read after the copies: ptxas had hoisted register moves of the Gram's MMA
            // fragments above them, each waiting for its k or q load, so the copies waited too.
            // Measured on the H100 at B = 1 (lab/notebook/h100-80gb-hbm3/verify/ab-tc-lf/, two
            // A/Bs): bf16 T = 4 states+update 0.1 us faster, bf16 T = 4 and 8 states and fp32
            // T = 8 states a tick faster in one of them, bf16 T = 4 slots a tick slower in one,
            // the rest the same.
            sched_fence(early);
            // The head's Gram entries: A = [k_0..k_7; q_0..q_7] (rows g, g + 8), B = k (c1) or q
            // (c2), columns = tokens; four chains of four MMAs.
            float c1[2][4] = {}, c2[2][4] = {};
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                mma16816(c1[0], gk[m].x, gq[m].x, gk[m].y, gq[m].y, gk[m].x, gk[m].y);
                mma16816(c2[0], gk[m].x, gq[m].x, gk[m].y, gq[m].y, gq[m].x, gq[m].y);
                mma16816(c1[1], gk[m].z, gq[m].z, gk[m].w, gq[m].w, gk[m].z, gk[m].w);
                mma16816(c2[1], gk[m].z, gq[m].z, gk[m].w, gq[m].w, gq[m].z, gq[m].w);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                gt[e * 34 + lane] = c1[0][e] + c1[1][e];
                gt[(4 + e) * 34 + lane] = c2[0][e] + c2[1][e];
            }
            if (lane == 0) sflags[4] = early;
            asm volatile("bar.arrive 3, %0;" :: "n"(NL) : "memory");
        } else {
            publish(s);
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        asm volatile("bar.arrive 1, %0;" :: "n"(NT) : "memory");
        return;
    }

    // ---- the compute warps: nothing here waits for the slot until the state's barrier -------
    const int wrow = (int)part * R + w;                // the update layout's row (warp w)
    const int kp = 16 * w + 4 * c;                     // the MMA layout's K (warp w's slice)
    const int kr = 4 * lane;                           // the update layout's K
    uint2 kx[T];                                       // k_t at kr, every token
#pragma unroll
    for (int t = 0; t < T; ++t) kx[t] = ld8(kb + k0 + t * k_t + kr);
    uint2 qx[WARP_DOTS ? T : 1];                       // WARP_DOTS: q_t at kr, every token
#pragma unroll
    for (int t = 0; t < (WARP_DOTS ? T : 0); ++t) qx[t] = ld8(qb + q0 + t * q_t + kr);
    uint2 bk = make_uint2(0u, 0u), bq = make_uint2(0u, 0u);   // the MMA's B: token g's k, q
    if (g < T) {
        bk = ld8(kb + k0 + g * k_t + kp);
        bq = ld8(qb + q0 + g * q_t + kp);
    }
    float vv[T];                                       // v_t of row wrow
    const long long v0 = n * GDN_STRIDE(v_n, T * HV * V) + h * GDN_STRIDE(v_h, V) + wrow;
#pragma unroll
    for (int t = 0; t < T; ++t) vv[t] = gdn_ld<GDN_IO_DT>(p.v, v0 + t * GDN_STRIDE(v_t, HV * V));
    // Lane t < T: token t's gate inputs.  Every lane loads (lanes >= T token 0's): no branch,
    // which would take A_log's load into it, issued only once the other inputs are in.
    const int tl = lane < T ? lane : 0;
    const float xa = gdn_ld<GDN_A_DT>(p.a, n * GDN_STRIDE(a_n, T * HV) + tl * GDN_STRIDE(a_t, HV)
                                           + h * GDN_STRIDE(a_h, 1))
                     + gdn_ld<GDN_DTB_DT>(TC_DT_BIAS, h * GDN_STRIDE(dtb_h, 1));
    const float xb = gdn_ld<GDN_B_DT>(p.b, n * GDN_STRIDE(b_n, T * HV) + tl * GDN_STRIDE(b_t, HV)
                                           + h * GDN_STRIDE(b_h, 1));
    const float A_log = p.A_log[h * GDN_STRIDE(A_log_h, 1)];

    // ---- the gates (lane t: token t), E_t and this lane's D(t, i) -------------------------
    const float gl = gdn_gate_decay<GDN_FASTGATE>(A_log, xa);
    const float bl = gdn_gate_beta<GDN_FASTGATE>(xb);
    // D(t, i) for this lane's pairs (t, i) = (e / T, e % T), e = lane + 32 r; E_t for lane t:
    // products of the shuffled gates, no division.
    constexpr int NP = (T * T + 31) / 32;              // pairs a lane
    float Dp[NP], El = 1.f;
#pragma unroll
    for (int r = 0; r < NP; ++r) Dp[r] = 1.f;
#pragma unroll
    for (int m = 0; m < T; ++m) {
        const float gm = __shfl_sync(FULL, gl, m);
        if (m <= lane) El *= gm;
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int e = lane + 32 * r, t = e / T, i = e % T;
            if (m > i && m <= t) Dp[r] *= gm;
        }
    }

    // ---- the head's Gram entries (WARP_DOTS: per warp over its K slice, then summed) ------
    __shared__ float4 gp[LOADER_GRAM ? 1 : NW][32][2];
    __shared__ float4 sp[NW][R][4];
    __shared__ __align__(16) float wL[NW][T][8], wN[NW][T][8];   // per warp
    if constexpr (!LOADER_GRAM) {
        {
            float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
            // A = [k_0..k_7; q_0..q_7] (rows g, g + 8), B = k (c1) or q (c2), columns = tokens.
            mma16816(c1, bk.x, bq.x, bk.y, bq.y, bk.x, bk.y);
            mma16816(c2, bk.x, bq.x, bk.y, bq.y, bq.x, bq.y);
            gp[w][lane][0] = make_float4(c1[0], c1[1], c1[2], c1[3]);
            gp[w][lane][1] = make_float4(c2[0], c2[1], c2[2], c2[3]);
        }
        bar_sync(2, 32 * NW);
        // Thread x sums value j = x % 8 of lane L = x / 8 over the warps into gt[j * 34 + L].
        const int x = threadIdx.x;
        const float* base = reinterpret_cast<const float*>(&gp[0][0][0]) + x;
        float sum = 0.f;
#pragma unroll
        for (int ww = 0; ww < NW; ++ww) sum += base[ww * 256];
        gt[(x & 7) * 34 + (x >> 3)] = sum;
    }
    // What the coefficients take of the gates, made while the Gram entries are summed: this
    // lane's pairs' beta_t, beta of its sum's token tv (lane j < 16 later holds sum j: c = j / 4,
    // s.k_2c, s.k_2c+1, s.q_2c, s.q_2c+1), every token's gate (ws, per warp).
    // (WARP_DOTS: lane l holds the sums of token tv0 = l >> SUM_SH.)
    const int jv = lane & 15, tv0 = WARP_DOTS ? lane >> SUM_SH : 2 * (jv >> 2) + (jv & 1);
    const int tv = tv0 < T ? tv0 : 0;
    const bool isq = (jv & 2) != 0;
    float btp[NP];
#pragma unroll
    for (int r = 0; r < NP; ++r) {
        const int t = (lane + 32 * r) / T;
        btp[r] = __shfl_sync(FULL, bl, t < T ? t : 0);
    }
    const float btv = __shfl_sync(FULL, bl, tv);
    __shared__ __align__(16) float ws[NW][4][8];       // per warp: g_t, rk_t, ye_t, ew_t
    if (lane < T) ws[w][0][lane] = gl;
    if constexpr (LOADER_GRAM) bar_sync(3, NL);         // the loader's Gram entries
    else bar_sync(2, 32 * NW);
#define KK(i, t) gt[((t) & 1) * 34 + (i) * 4 + (t) / 2]
#define KQ(i, t) gt[(4 + ((t) & 1)) * 34 + (i) * 4 + (t) / 2]
#define QQ(t) gt[(6 + ((t) & 1)) * 34 + (t) * 4 + (t) / 2]
    // ---- the head's coefficients, each warp its own copy (no block barrier) ----------------
    // Each lane makes the norms it needs from the Gram entries itself (no shuffle between
    // lanes on this path).  N and ew leave out the scale, which the outputs take at the end
    // (from the loader: it sits on the block's third line).
    {
        // Every pair's entries made (no branch: the loads and norms issue together), then
        // stored (after all the loads: the compiler keeps shared loads behind shared stores).
        float l[NP], nq[NP];
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int e = lane + 32 * r, t = e / T, i = e % T;
            const int ts = t < T ? t : 0;
            const float rkt = rnorm(KK(ts, ts)), rki = rnorm(KK(i, i)), rqt = rnorm(QQ(ts));
            l[r] = btp[r] * rkt * rki * Dp[r] * KK(i, ts);
            nq[r] = rqt * Dp[r] * rki * KQ(i, ts);
        }
        // Lane t < T: rk_t, ye_t = beta_t E_t rk_t and ew_t / scale = rq_t E_t (read back
        // from shared memory below: loads stay before the state's barrier, where the
        // compiler would move a multiply or a norm behind it).
        const float rkl = rnorm(KK(tl, tl)), rql = rnorm(QQ(tl));
        if (lane < T) {
            ws[w][1][lane] = rkl;
            ws[w][2][lane] = bl * El * rkl;
            ws[w][3][lane] = rql * El;
        }
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int e = lane + 32 * r, t = e / T, i = e % T;
            if (e < T * T) {
                wL[w][t][i] = i < t ? l[r] : 0.f;
                wN[w][t][i] = i <= t ? nq[r] : 0.f;
            }
        }
        __syncwarp();
    }
    const float yetv = ws[w][2][tv], ewtv = ws[w][3][tv];
    // This lane's coefficients, into registers before the state is needed (16-byte reads).
    constexpr int T4 = (T + 3) / 4;
    float Lr[T][T], gr[T], rkr[T], Nr[T];
    {
        const float4* L4 = reinterpret_cast<const float4*>(&wL[w][0][0]);
        const float4* N4 = reinterpret_cast<const float4*>(&wN[w][tv][0]);
        const float4* g4 = reinterpret_cast<const float4*>(&ws[w][0][0]);
        const float4* r4 = reinterpret_cast<const float4*>(&ws[w][1][0]);
#pragma unroll
        for (int q4 = 0; q4 < T4; ++q4) {
            const float4 a = g4[q4], b = r4[q4], d = N4[q4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
            const float dv[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * q4 + e < T) {
                    gr[4 * q4 + e] = av[e];
                    rkr[4 * q4 + e] = bv[e];
                    Nr[4 * q4 + e] = dv[e];
                }
        }
#pragma unroll
        for (int t = 1; t < T; ++t)
#pragma unroll
            for (int q4 = 0; q4 < (t + 3) / 4; ++q4) {
                const float4 a = L4[t * 2 + q4];
                const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (4 * q4 + e < t) Lr[t][4 * q4 + e] = av[e];
            }
    }
    float vt = vv[0];
#pragma unroll
    for (int t = 1; t < T; ++t)
        if (t == tv) vt = vv[t];
    float bv = btv * vt;
    float kf[T][4];                                    // k_t at kr, unpacked
#pragma unroll
    for (int t = 0; t < T; ++t) {
        gdn_unpack2<GDN_BF16>(kx[t].x, kf[t][0], kf[t][1]);
        gdn_unpack2<GDN_BF16>(kx[t].y, kf[t][2], kf[t][3]);
    }
    // Made here, not after the barrier (the compiler would sink them to their first use).
    asm volatile("" : "+f"(bv));
#pragma unroll
    for (int t = 0; t < T; ++t)
        asm volatile("" : "+f"(kf[t][0]), "+f"(kf[t][1]), "+f"(kf[t][2]), "+f"(kf[t][3]));

    // ---- the state: wait for the loader -----------------------------------------------------
    bar_sync(1, NT);
    const long long rd = sflags[0], i_t = sflags[3];
    // The final state's and the intermediate row's head blocks, as addresses (0: none).
    const unsigned long long fin = sflags[1], iblk = sflags[2];
    const float scale = sscale;
    uint2 sx;                                          // MMA layout, bf16
    float sm[4], s[4], s0[4];                          // MMA layout (fp32), update layout
    if constexpr (SD == GDN_BF16) {
        sx = *reinterpret_cast<const uint2*>(stile + g * SROW + kp * 2);
        const uint2 u = *reinterpret_cast<const uint2*>(stile + w * SROW + kr * 2);
        gdn_unpack2<GDN_BF16>(u.x, s[0], s[1]);
        gdn_unpack2<GDN_BF16>(u.y, s[2], s[3]);
    } else {
        if constexpr (!WARP_DOTS) {
            const float4 f = *reinterpret_cast<const float4*>(stile + g * SROW + kp * 4);
            sm[0] = f.x; sm[1] = f.y; sm[2] = f.z; sm[3] = f.w;
        }
        const float4 u = *reinterpret_cast<const float4*>(stile + w * SROW + kr * 4);
        s[0] = u.x; s[1] = u.y; s[2] = u.z; s[3] = u.w;
    }
    const long long o0 = n * GDN_STRIDE(o_n, T * HV * V) + h * GDN_STRIDE(o_h, V) + wrow;
    const long long o_t = GDN_STRIDE(o_t, HV * V);
    // A padded sequence (!rd) zeroes its out rows and stores nothing.  Checked here up to T = 4
    // and after the sums' shared store above that, so that the state's loads and MMAs do not
    // wait for the check (measured on the H100 at B = 1: faster at T = 8, slower at T = 4);
    // with WARP_DOTS by predicates (``ok``), with no branch (faster there, measured alike).
    constexpr bool LATE_PAD = T > 4;
    const auto zero_out = [&] { if (lane < T) gdn_st<GDN_IO_DT>(p.out, o0 + lane * o_t, 0.0f); };
    const bool ok = !WARP_DOTS || rd;
    if (!LATE_PAD && !WARP_DOTS && !rd) {
        zero_out();
        return;
    }

    // ---- its 2T dot products (WARP_DOTS: the T with k now, the T with q after the stores) ------
    float sum = 0.f;
    if constexpr (WARP_DOTS) {
        float d[16];
#pragma unroll
        for (int t = 0; t < NSUM; ++t) d[t] = t < T ? dot4(s, kf[t]) : 0.f;
        sum = warp_sums<NSUM>(d, lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) s0[e] = s[e];
    } else {
        float d1[4] = {0.f, 0.f, 0.f, 0.f}, d2[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (SD == GDN_BF16) {
            mma16816(d1, sx.x, 0u, sx.y, 0u, bk.x, bk.y);
            mma16816(d2, sx.x, 0u, sx.y, 0u, bq.x, bq.y);
        } else {
            unsigned h0, m0, l0, h1, m1, l1;
            split3(sm[0], sm[1], h0, m0, l0);
            split3(sm[2], sm[3], h1, m1, l1);
            // hi in rows g, mid in rows g + 8 of one MMA, lo in another: four MMAs, none chained.
            float e1[4] = {0.f, 0.f, 0.f, 0.f}, e2[4] = {0.f, 0.f, 0.f, 0.f};
            mma16816(d1, h0, m0, h1, m1, bk.x, bk.y);
            mma16816(d2, h0, m0, h1, m1, bq.x, bq.y);
            mma16816(e1, l0, 0u, l1, 0u, bk.x, bk.y);
            mma16816(e2, l0, 0u, l1, 0u, bq.x, bq.y);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                d1[j] = (e1[j] + d1[j + 2]) + d1[j];
                d2[j] = (e2[j] + d2[j + 2]) + d2[j];
            }
        }
        // s.k_2c, s.k_2c+1, s.q_2c, s.q_2c+1
        sp[w][g][c] = make_float4(d1[0], d1[1], d2[0], d2[1]);
        if (LATE_PAD && !rd) {
            zero_out();
            return;
        }
        bar_sync(2, 32 * NW);
        // Warp w: row wrow's 16 sums (lane j < 16 sum j), then y_t = beta_t v_t - ye_t s.k_t
        // gathered into every lane.
        {
            const float* base = reinterpret_cast<const float*>(&sp[0][w][0]) + jv;
            static_assert(NW == 8, "the sums' tree: 8 warps");
            float pw[NW];
#pragma unroll
            for (int ww = 0; ww < NW; ++ww) pw[ww] = base[ww * R * 16];
            sum = ((pw[0] + pw[1]) + (pw[2] + pw[3])) + ((pw[4] + pw[5]) + (pw[6] + pw[7]));
        }
    }
    const float ylv = bv - yetv * sum;
    float y[T];
#pragma unroll
    for (int t = 0; t < T; ++t)
        y[t] = __shfl_sync(FULL, ylv, WARP_DOTS ? t << SUM_SH : 4 * (t >> 1) + (t & 1));
    float u[T];
    // ---- the states, token by token (warp w: row wrow, lane: K [4 lane, 4 lane + 4)) ---------
    // u_t, w_t = rk_t u_t (the coefficient of the raw k_t), the state after token t, its store,
    // then a fence (sched_fence), so that token 0's store issues as soon as its state is made.
    // Addresses as integers, each store predicated (no branch in the loop).
    const unsigned long long lrow = (unsigned long long)(wrow * GDN_STRIDE(ns_v, K) + kr) * SB;
    unsigned long long ia = iblk + (unsigned long long)(wrow * K + kr) * SB;
    const unsigned long long istep = (unsigned long long)i_t * SB;
    unsigned fence = LOADER_GRAM ? (unsigned)sflags[4] : 0u;   // the loader's clock read
#pragma unroll
    for (int t = 0; t < T; ++t) u[t] = y[t];
    float oa = WARP_DOTS ? 0.f : ewtv * sum;           // the output, its terms as u_t is made
    St4 sv[OWN_STORES ? T : 1];                        // OWN_STORES: each token's store
    const unsigned long long fa = fin + lrow;          // the final state's (GDN_UPDATE)
    const bool fput = ok && fin != 0;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        // u_t is complete: u = (I + L)^-1 y by columns, column t taken out of every later row
        // at once, so u_{t+1} is one FMA behind u_t.
        const float ut = u[t];
#pragma unroll
        for (int j = t + 1; j < T; ++j) u[j] -= Lr[j][t] * ut;
        const float wt = rkr[t] * ut;
        if constexpr (!WARP_DOTS) oa += Nr[t] * ut;
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = gr[t] * s[e] + wt * kf[t][e];
        const unsigned long long to = SLOTS ? (unsigned long long)stok[t] + lrow : ia;
        const bool put = ok && (SLOTS ? stok[t] != 0 : iblk != 0);
        if constexpr (OWN_STORES) {
#pragma unroll
            for (int e = 0; e < 4; ++e) sv[t].x[e] = s[e];
            sv[t].to = to;
            sv[t].store(put);
        } else {
            st4_global<ST>(to, put, s);
        }
        if constexpr (!SLOTS && GDN_UPDATE)            // the final state, with token T - 1's
            if (t == T - 1) st4_global<ST>(fa, fput, s);
        if constexpr (!SLOTS) ia += istep;
        sched_fence(fence);
    }
    // Whether this lane holds row wrow's output of token tv (when tv0 < T), made where it is used
    // (as a bool made here, ptxas computed it inside the bf16 token loop).
    const auto mine = [&] {
        return WARP_DOTS ? (lane & ((1 << SUM_SH) - 1)) == 0 : lane < 16 && isq;
    };
    if constexpr (OWN_STORES) {
        // The block's outputs gathered in shared memory, each token's 8 rows (16 bytes) stored by
        // one lane of warp 0 (a scalar fallback when out is not 16-byte aligned there), before
        // the registers' sink (a fence keeps the sink after).
        st_shared_b16(&so[tv][w], mine() && tv0 < T, gdn_f32_to_bf16(scale * oa));
        bar_sync(2, 32 * NW);
        if (w == 0 && lane < T) {
            unsigned short* to = static_cast<unsigned short*>(p.out) + (o0 - w) + lane * o_t;
            if ((reinterpret_cast<unsigned long long>(to) & 15) == 0) {
                *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(so[lane]);
            } else {
#pragma unroll
                for (int r = 0; r < R; ++r) to[r] = so[lane][r];
            }
        }
        sched_fence(fence);
    }
#pragma unroll
    for (int t = 0; t < (OWN_STORES ? T : 0); ++t) sv[t].keep(fence);
    // sched_fence's sink (and OWN_STORES's registers, folded in): a store into sscale on a
    // condition never met in practice.  With the MMAs, every compute warp read sscale before the
    // sums' barrier and nothing reads it after; WARP_DOTS has no barrier after that read, so it
    // stores the value sscale already holds.
    if (fence == 0x7fffffffu) sscale = WARP_DOTS ? scale : 0.f;

    // Without OWN_STORES: output o_t of row wrow by the lane holding s.q_t, ew_t s.q_t +
    // sum_{j <= t} N[t][j] u_j (WARP_DOTS: made here, after the stores, with the T products s.q_t;
    // with the MMAs: oa), times the scale.
    if constexpr (!OWN_STORES) {
        float o = oa;
        if constexpr (WARP_DOTS) {
            float d[16];
#pragma unroll
            for (int t = 0; t < NSUM; ++t) {
                d[t] = 0.f;
                if (t < T) {
                    float q4[4];
                    gdn_unpack2<GDN_BF16>(qx[t].x, q4[0], q4[1]);
                    gdn_unpack2<GDN_BF16>(qx[t].y, q4[2], q4[3]);
                    d[t] = dot4(s0, q4);
                }
            }
            o = ewtv * warp_sums<NSUM>(d, lane);
#pragma unroll
            for (int j = 0; j < T; ++j) o += Nr[j] * u[j];
        }
        st_bf16_global(static_cast<unsigned short*>(p.out) + o0 + tv * o_t, mine() && tv0 < T,
                       ok ? scale * o : 0.f);
    }
}

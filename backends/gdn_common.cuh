// Shared by the CUDA backends (cuda-v1, cuda-v4): the kernel parameter block, dtype
// conversions, the gates, and the one place a sequence's state address is computed.
//
// Self-contained on purpose: no CUDA headers, so NVRTC (at run time) and nvcc (in the tests)
// see exactly the same text, and compiling takes a fraction of a second.
#pragma once

// dtype codes, passed as -D constants by backends/_cuda_build.py
#define GDN_F32 0
#define GDN_BF16 1
#define GDN_F16 2

// The kernel's only argument, passed by value.  Every field is 8 bytes so the layout has no
// padding and the host packs it with one struct (backends/_cuda_build.py PARAM_FIELDS mirrors
// this list in order; tests/test_cuda_sources.py checks they agree).
// Ordered by when a kernel first reads a field.  The block sits in the constant bank, read
// through a cache of 64-byte lines, and each line is a miss on the first read of a launch: a
// uniform load (ULDC) that misses stalls the warp (measured on the H100 with Nsight Compute, a
// B = 1 verify step spent an eighth of its warp time on four such misses in a row before its
// first state load).  So the first line, which the launch's memory descriptor shares (sm_90:
// offset 0x208, the block from 0x210), holds what is read before the state loads: a pool's
// slot check and slot stride, the state pointer, the index pointers.  The second holds the
// inputs' pointers, whose loads the compiler issues next to the state's (in the measured B = 1
// verify step, before them), and the two output pointers, so a step's last stores find their
// line in the cache.  The third holds the rest of what a call sets (dt_bias, read early through
// a non-blocking load, brings it in), then come what cuda-v4 compiles in, sizes and strides.
// The host writes the 15 pointers, state .. inter, on every call.
// Strides are in elements; the innermost (K or V) axis is contiguous, validated on the host.
struct GdnParams {
    long long P;              // state pools: slots of state
    long long null_slot;      // state pools: a slot that is padding too; -1 when none
    long long s_n;            // state's batch stride (a pool's slot stride)
    const void* state;        // [B, HV, V, K], or a pool [P, HV, V, K]
    const void* idx;          // state pools: [B] int32 | int64 slot each sequence reads
                              // (cuda-v4 per-token slots: [B, T])
    const void* accepted;     // cuda-v4 GDN_POOL 4: [B] int32 | int64 num_accepted_tokens
    const void* q;            // [B, T, H, K]
    const void* k;            // [B, T, H, K]
    const void* v;            // [B, T, HV, V]
    const void* a;            // [B, T, HV]
    const void* b;            // [B, T, HV]
    const float* A_log;       // [HV]
    void* new_state;          // [B, HV, V, K] (or a pool [PN, HV, V, K]); state when in place
    void* out;                // [B, T, HV, V]
    const void* dt_bias;      // [HV]
    const void* inter_idx;    // cuda-v4 GDN_INTER 2: [B] int32 | int64 intermediate row
    const void* new_idx;      // state pools: [B] slot it writes (idx itself by default)
    void* inter;              // cuda-v4 verify: intermediate_states [S, T_max, HV, V, K],
                              // each [HV, V, K] block contiguous
    long long PN;             // state pools: slots of new_state
    long long ns_n;           // new_state's batch stride (a pool's slot stride)
    double scale;
    long long S;              // cuda-v4 verify: intermediate rows
    long long i_n, i_t;       // cuda-v4 verify: intermediate strides of a row and a step
    long long B, T, H, HV, V;
    long long q_n, q_t, q_h;
    long long k_n, k_t, k_h;
    long long v_n, v_t, v_h;
    long long a_n, a_t, a_h;
    long long b_n, b_t, b_h;
    long long o_n, o_t, o_h;
    long long s_h, s_v;
    long long ns_h, ns_v;
    long long A_log_h, dtb_h;
};

// ---- dtype conversions (inline PTX, sm_80+) -------------------------------------------------
__device__ __forceinline__ float gdn_bf16_to_f32(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);  // exact
}
__device__ __forceinline__ unsigned short gdn_f32_to_bf16(float f) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));  // round to nearest even, as torch
    return r;
}
__device__ __forceinline__ float gdn_f16_to_f32(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
__device__ __forceinline__ unsigned short gdn_f32_to_f16(float f) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two adjacent 16-bit elements (one 32-bit word, low half first) to fp32 and back, one
// instruction per element or pair: bf16 is the top half of an fp32; cvt.rn.bf16x2 packs a pair.
template <int DT>
__device__ __forceinline__ void gdn_unpack2(unsigned w, float& lo, float& hi) {
    if constexpr (DT == GDN_BF16) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    } else {
        lo = gdn_f16_to_f32((unsigned short)(w & 0xffffu));
        hi = gdn_f16_to_f32((unsigned short)(w >> 16));
    }
}
template <int DT>
__device__ __forceinline__ unsigned gdn_pack2(float lo, float hi) {
    unsigned r;
    if constexpr (DT == GDN_BF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));   // hi in the top half
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <int DT> struct GdnStorage { typedef unsigned short type; };   // bf16, fp16
template <> struct GdnStorage<GDN_F32> { typedef float type; };

template <int DT>
__device__ __forceinline__ float gdn_to_f32(typename GdnStorage<DT>::type x) {
    if constexpr (DT == GDN_F32) return x;
    else if constexpr (DT == GDN_BF16) return gdn_bf16_to_f32(x);
    else return gdn_f16_to_f32(x);
}
template <int DT>
__device__ __forceinline__ typename GdnStorage<DT>::type gdn_from_f32(float x) {
    if constexpr (DT == GDN_F32) return x;
    else if constexpr (DT == GDN_BF16) return gdn_f32_to_bf16(x);
    else return gdn_f32_to_f16(x);
}

// Load element i (64-bit offset) of a tensor of dtype DT as fp32; store likewise.
template <int DT>
__device__ __forceinline__ float gdn_ld(const void* p, long long i) {
    return gdn_to_f32<DT>(static_cast<const typename GdnStorage<DT>::type*>(p)[i]);
}
template <int DT>
__device__ __forceinline__ void gdn_st(void* p, long long i, float x) {
    static_cast<typename GdnStorage<DT>::type*>(p)[i] = gdn_from_f32<DT>(x);
}

// ---- tensor cores (cuda-v4's verify, cuda-chunk's prep) ---------------------------------------
// d += A B: A 16x16 bf16 (a0..a3, row-major fragments), B 16x8 bf16 (b0, b1), d 16x8 fp32.
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- gates (gdnzoo/reference.py) --------------------------------------------------------------
// g = exp(-exp(A_log) * softplus(a + dt_bias)); softplus with beta 1 and threshold 20 as torch.
__device__ __forceinline__ float gdn_decay(float A_log, float x) {
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    return expf(-expf(A_log) * sp);
}
__device__ __forceinline__ float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Fast-intrinsic gates (cuda-v4 with GDN_FASTGATE=1).  exp via ex2.approx; softplus keeps its
// relative accuracy for very negative x (log1p(e) ~ e - e^2/2 + e^3/3 when e = exp(x) < 2^-6)
// and uses lg2.approx above that, where log1p(e) >= 0.015.  lab/cuda_report.py measures the
// error on g against the float64 reference.
__device__ __forceinline__ float gdn_decay_fast(float A_log, float x) {
    const float e = __expf(x);
    const float small = e * (1.0f - e * (0.5f - e * (1.0f / 3.0f)));
    const float sp = x > 20.0f ? x : (e < 0.015625f ? small : __logf(1.0f + e));
    return __expf(-__expf(A_log) * sp);
}
__device__ __forceinline__ float gdn_sigmoid_fast(float x) {
    return __fdividef(1.0f, 1.0f + __expf(-x));
}

// The gate form.  GDN_GATES 1: the a pointer holds the precomputed log decay g and b the
// post-sigmoid beta (FLA's form; the host passes zeros for A_log and dt_bias, so x = g + 0);
// GDN_NEG 1: beta = 2 sigmoid(b) (allow_neg_eigval).  At 0 each is the code of before.
#ifndef GDN_GATES
#define GDN_GATES 0
#endif
#ifndef GDN_NEG
#define GDN_NEG 0
#endif
// A token's decay from x = a + dt_bias (or g) and its beta from b, FAST the fast intrinsics.
template <int FAST>
__device__ __forceinline__ float gdn_gate_decay(float A_log, float x) {
    if (GDN_GATES) return FAST ? __expf(x) : expf(x);
    return FAST ? gdn_decay_fast(A_log, x) : gdn_decay(A_log, x);
}
template <int FAST>
__device__ __forceinline__ float gdn_gate_beta(float b) {
    if (GDN_GATES) return b;
    const float s = FAST ? gdn_sigmoid_fast(b) : gdn_sigmoid(b);
    return GDN_NEG ? 2.0f * s : s;
}

// ---- state addressing -----------------------------------------------------------------------
// THE place a sequence's state rows are located: head h of entry `slot` of the state (the
// sequence n of a dense batch, or its slot in a state pool, see gdn_pool_slots) starts at element
// slot * s_n + h * s_h, in 64 bits: a pool slot times a page stride passes 2^31 elements after a
// few thousand slots.
__device__ __forceinline__ long long gdn_state_read_offset(const GdnParams& p, long long slot,
                                                          long long h) {
    return slot * p.s_n + h * p.s_h;
}
__device__ __forceinline__ long long gdn_state_write_offset(const GdnParams& p, long long slot,
                                                           long long h) {
    return slot * p.ns_n + h * p.ns_h;
}

// The cuda-v4 kernels (cuda_v4.cu, cuda_v4_tc.cu), whose -D options include GDN_DENSE, locate
// their tensors through these; they define K and V before using them.
#ifdef GDN_DENSE
// A stride: the compile-time value of the dense layout when the host found every tensor dense
// (GDN_DENSE=1: offsets become 32-bit constant multiplies, so the first state load issues a few
// instructions into the kernel), the call's own value compiled in (GDN_DENSE=2: measured on the
// H100 at B = 1 and 4, 0.1-0.7 us faster than reading it from the parameter block), else the
// runtime value from the parameter block.  GDN_SLOT_STRIDE: the intermediate store's strides,
// which GDN_DENSE=1 leaves to the parameter block as it does the state's slot strides.
#if GDN_DENSE == 2
#define GDN_STRIDE(field, dense) ((long long)(GDN_SC_##field))
#define GDN_SLOT_STRIDE(field) ((long long)(GDN_SC_##field))
#elif GDN_DENSE
#define GDN_STRIDE(field, dense) ((long long)(dense))
#define GDN_SLOT_STRIDE(field) (p.field)
#else
#define GDN_STRIDE(field, dense) (p.field)
#define GDN_SLOT_STRIDE(field) (p.field)
#endif
// The offsets of slot (or sequence) `slot`'s head h in state and in new_state; GDN_DENSE=1 with
// a pool: each slot a dense [HV, V, K] block, only the slot strides read from the block.
#if GDN_DENSE == 2
#define GDN_READ_OFFSET(slot, h) ((long long)(slot) * GDN_SC_s_n + (long long)(h) * GDN_SC_s_h)
#define GDN_WRITE_OFFSET(slot, h) ((long long)(slot) * GDN_SC_ns_n + (long long)(h) * GDN_SC_ns_h)
#elif GDN_DENSE
#define GDN_READ_OFFSET(slot, h) ((long long)(slot) * p.s_n + (long long)(h) * (V * K))
#define GDN_WRITE_OFFSET(slot, h) ((long long)(slot) * p.ns_n + (long long)(h) * (V * K))
#else
#define GDN_READ_OFFSET(slot, h) gdn_state_read_offset(p, slot, h)
#define GDN_WRITE_OFFSET(slot, h) gdn_state_write_offset(p, slot, h)
#endif
#endif

// ---- state pools (gdnzoo/pool.py) -----------------------------------------------------------
// Sequence n reads slot idx[n] of state and writes slot new_idx[n] of new_state.  Padding: a
// negative slot, null_slot, or a read slot >= P (never dereferenced) means no state is read or
// written and the sequence's out rows are zeros (rd false); a real read slot whose write slot is
// padding or >= PN gets its out rows and writes no state (wr false).
struct GdnSlots {
    long long read;           // the read slot: an address only where rd
    long long write;          // the write slot; 0 where wr is false, so an address formed from
    bool rd, wr;              // it stays in the pool even where nothing is stored
};

template <bool I64>
__device__ __forceinline__ long long gdn_slot_at(const void* idx, unsigned n) {
    if constexpr (I64) return static_cast<const long long*>(idx)[n];
    else return static_cast<const int*>(idx)[n];
}

// POOL 1: one index tensor (new_idx == idx, loaded once); 2: separate write indices.  IDX64 bit 0:
// idx is int64 (else int32), bit 1: new_idx is int64.  gdn_pool_slots_from takes the read slot
// r = idx[n] already loaded (a kernel may issue other loads between).
template <int POOL, int IDX64>
__device__ __forceinline__ GdnSlots gdn_pool_slots_from(const GdnParams& p, unsigned n,
                                                       long long r) {
    static_assert(POOL == 1 || POOL == 2, "POOL: 1 (read = write indices) or 2 (separate)");
    const long long w = POOL == 1 ? r : gdn_slot_at<(IDX64 & 2) != 0>(p.new_idx, n);
    GdnSlots s;
    // unsigned compares: a negative slot is a huge one, so one compare checks both bounds
    s.rd = (unsigned long long)r < (unsigned long long)p.P && r != p.null_slot;
    s.wr = s.rd && (unsigned long long)w < (unsigned long long)p.PN && w != p.null_slot;
    s.read = r;
    s.write = s.wr ? w : 0;
    return s;
}
template <int POOL, int IDX64>
__device__ __forceinline__ GdnSlots gdn_pool_slots(const GdnParams& p, unsigned n) {
    return gdn_pool_slots_from<POOL, IDX64>(p, n, gdn_slot_at<(IDX64 & 1) != 0>(p.idx, n));
}

// Element i of an int32 / int64 index tensor, in 64 bits.
template <bool I64>
__device__ __forceinline__ long long gdn_index_at(const void* x, long long i) {
    if constexpr (I64) return static_cast<const long long*>(x)[i];
    else return static_cast<const int*>(x)[i];
}

// Per-token slots (cuda-v4's GDN_POOL 3 and 4: idx is [B, T], vLLM's verify contract): the slot
// sequence n reads, idx[n, c] with c = accepted[n] - 1 (POOL 4; column 0 for 3).  A count
// outside 1..T pads the sequence like a padded read slot (rd false).  The state after token t
// goes to slot idx[n, t] (gdn_token_slot_ok says which store), so wr stays false here.
// IDX64 bit 0: idx is int64, bit 3: accepted is.  gdn_token_read_slot_from takes the first
// index already loaded (gdn_token_first: accepted[n] for POOL 4, idx[n, 0] for 3).
template <int POOL, int T, int IDX64>
__device__ __forceinline__ long long gdn_token_first(const GdnParams& p, unsigned n) {
    static_assert(POOL == 3 || POOL == 4, "POOL: 3 (read column 0) or 4 (accepted[n] - 1)");
    if constexpr (POOL == 4) return gdn_index_at<(IDX64 & 8) != 0>(p.accepted, n);
    else return gdn_index_at<(IDX64 & 1) != 0>(p.idx, (long long)n * T);
}
template <int POOL, int T, int IDX64>
__device__ __forceinline__ GdnSlots gdn_token_read_slot_from(const GdnParams& p, unsigned n,
                                                             long long first) {
    static_assert(POOL == 3 || POOL == 4, "POOL: 3 (read column 0) or 4 (accepted[n] - 1)");
    long long r = first;
    bool ok = true;
    if constexpr (POOL == 4) {
        ok = (unsigned long long)(first - 1) < (unsigned long long)T;
        r = gdn_index_at<(IDX64 & 1) != 0>(p.idx, (long long)n * T + (ok ? first - 1 : 0));
    }
    GdnSlots s;
    s.rd = ok && (unsigned long long)r < (unsigned long long)p.P && r != p.null_slot;
    s.wr = false;
    s.read = r;
    s.write = 0;
    return s;
}

// Any GDN_POOL (0: a dense state, sequence n's own block; 1, 2: a pool; 3, 4: per-token slots):
// the index sequence n's slots start from, then its slots from that index once it is loaded (a
// kernel may issue other loads between), or both at once.
template <int POOL, int T, int IDX64>
__device__ __forceinline__ long long gdn_first_index(const GdnParams& p, unsigned n) {
    if constexpr (POOL >= 3) return gdn_token_first<POOL, T, IDX64>(p, n);
    else if constexpr (POOL > 0) return gdn_slot_at<(IDX64 & 1) != 0>(p.idx, n);
    else return n;
}
template <int POOL, int T, int IDX64>
__device__ __forceinline__ GdnSlots gdn_slots_from(const GdnParams& p, unsigned n,
                                                   long long first) {
    if constexpr (POOL >= 3) {
        return gdn_token_read_slot_from<POOL, T, IDX64>(p, n, first);
    } else if constexpr (POOL > 0) {
        return gdn_pool_slots_from<POOL, IDX64>(p, n, first);
    } else {
        GdnSlots s;
        s.read = s.write = first;
        s.rd = s.wr = true;
        return s;
    }
}
template <int POOL, int T, int IDX64>
__device__ __forceinline__ GdnSlots gdn_sequence_slots(const GdnParams& p, unsigned n) {
    return gdn_slots_from<POOL, T, IDX64>(p, n, gdn_first_index<POOL, T, IDX64>(p, n));
}

// Whether token slot ts of per-token slots is stored to: padding (negative, null_slot, >= PN)
// is not.
__device__ __forceinline__ bool gdn_token_slot_ok(const GdnParams& p, long long ts) {
    return (unsigned long long)ts < (unsigned long long)p.PN && ts != p.null_slot;
}

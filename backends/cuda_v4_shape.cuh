// The -D shape and dtype constants of cuda-v4's kernels (cuda_v4.cu, cuda_v4_kfirst.cu), as
// compile-time values: head sizes, tokens a call, value heads and the GVA ratio, the state's
// and q/k/v's dtype codes and element sizes (backends/_cuda_build.py writes the -D options);
// and with GDN_INTER (a verify variant) the intermediate states' addresses.
#pragma once

constexpr int K = GDN_K;
constexpr int V = GDN_V;
constexpr int T = GDN_T;
constexpr unsigned HV = GDN_HV;
constexpr unsigned GVA = GDN_GVA;
constexpr int SD = GDN_STATE_DT;
constexpr int IOD = GDN_IO_DT;
constexpr int SBYTES = SD == GDN_F32 ? 4 : 2;
constexpr int IOBYTES = IOD == GDN_F32 ? 4 : 2;

#if GDN_INTER
// Sequence n's intermediate block of head h: row n or inter_idx[n]; a row outside 0..S-1
// stores nothing (keep false; its address stays at row 0).  Each [HV, V, K] block (K-first:
// [HV, K, V]) is contiguous.
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

"""Device copy only: GDN_XPF=1 adds L1 prefetches of a verify call's token inputs (every
token's q and k rows, a, b, and the warp's v values) before the slot index is known."""
p = "backends/cuda_v4.cu"
s = open(p).read()
old = """    const GdnSlots slot = sequence_slots<GDN_POOL>(p, n);
"""
assert s.count(old) == 1
new = old + """#if GDN_XPF && GDN_PDL != 2 && GDN_T > 1
    {
        const unsigned hq_ = h / GVA;
        const long long q0_ = n * GDN_STRIDE(q_n, T * H * K) + hq_ * GDN_STRIDE(q_h, K);
        const long long k0_ = n * GDN_STRIDE(k_n, T * H * K) + hq_ * GDN_STRIDE(k_h, K);
        if (lane < 2 * T) {
            const int t_ = (int)lane >> 1;
            const char* row_ = (lane & 1)
                ? static_cast<const char*>(p.k) + (k0_ + t_ * GDN_STRIDE(k_t, H * K)) * IOBYTES
                : static_cast<const char*>(p.q) + (q0_ + t_ * GDN_STRIDE(q_t, H * K)) * IOBYTES;
#pragma unroll
            for (int b_ = 0; b_ < K * IOBYTES; b_ += 128)
                asm volatile("prefetch.global.L1 [%0];" :: "l"(row_ + b_));
        } else if (lane < 3 * T) {
            const int t_ = (int)lane - 2 * T;
            const long long a0_ = n * GDN_STRIDE(a_n, T * HV) + h * GDN_STRIDE(a_h, 1);
            const long long b0_ = n * GDN_STRIDE(b_n, T * HV) + h * GDN_STRIDE(b_h, 1);
            asm volatile("prefetch.global.L1 [%0];" :: "l"(static_cast<const char*>(p.a)
                         + (a0_ + t_ * GDN_STRIDE(a_t, HV)) * (GDN_A_DT == GDN_F32 ? 4 : 2)));
            asm volatile("prefetch.global.L1 [%0];" :: "l"(static_cast<const char*>(p.b)
                         + (b0_ + t_ * GDN_STRIDE(b_t, HV)) * (GDN_B_DT == GDN_F32 ? 4 : 2)));
        } else if (lane < 4 * T) {
            const int t_ = (int)lane - 3 * T;
            const long long v0_ = n * GDN_STRIDE(v_n, T * HV * V) + h * GDN_STRIDE(v_h, V) + wbase;
            asm volatile("prefetch.global.L1 [%0];" :: "l"(static_cast<const char*>(p.v)
                         + (v0_ + t_ * GDN_STRIDE(v_t, HV * V)) * IOBYTES));
        }
    }
#endif
"""
s = s.replace(old, new)
s = s.replace("#ifndef GDN_CHUNK\n", "#ifndef GDN_XPF\n#define GDN_XPF 0\n#endif\n#ifndef GDN_CHUNK\n", 1)
open(p, "w").write(s)
print("patched")

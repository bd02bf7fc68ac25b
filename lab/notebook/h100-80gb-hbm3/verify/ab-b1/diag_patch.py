"""Patch the device copy of backends/cuda_v4.cu (run from the checkout's root) with the diagnostic
switches of diag.py and timeline.py, each off unless defined to 1 (b1.py adds the defines):
GDN_XNOSTORE, no per-token state store; GDN_XNOBFLY, no butterfly shuffles; GDN_XLATE, every
state held in registers and stored after the loop; GDN_XTIME, clock64 per warp into gdn_xt."""
p = "backends/cuda_v4.cu"
s = open(p).read()
def rep(old, new, count=1, last=False):
    global s
    n = s.count(old)
    assert n >= 1, old
    if last:
        i = s.rfind(old); s = s[:i] + new + s[i + len(old):]
    else:
        assert n == count, (old, n); s = s.replace(old, new)
rep('#include "gdn_common.cuh"\n', '#include "gdn_common.cuh"\n#ifndef GDN_XNOSTORE\n#define GDN_XNOSTORE 0\n#endif\n#ifndef GDN_XNOBFLY\n#define GDN_XNOBFLY 0\n#endif\n#ifndef GDN_XLATE\n#define GDN_XLATE 0\n#endif\n')
rep("if (ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, S[g]);",
    "if (!GDN_XNOSTORE && ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, S[g]);", last=True)
rep("                sk[g] += __shfl_xor_sync(FULL, sk[g], off);\n                sq[g] += __shfl_xor_sync(FULL, sq[g], off);",
    "                if (!GDN_XNOBFLY) { sk[g] += __shfl_xor_sync(FULL, sk[g], off);\n                sq[g] += __shfl_xor_sync(FULL, sq[g], off); }")
rep("#if GDN_AHEAD_ALL\n#pragma unroll\n#else\n#pragma unroll 1\n#endif\n    for (int t = 0; t < T; ++t) {\n",
    "#if GDN_XLATE\n    float Sh[T][RW][NV][VEC];\n#endif\n#if GDN_AHEAD_ALL\n#pragma unroll\n#else\n#pragma unroll 1\n#endif\n    for (int t = 0; t < T; ++t) {\n")
rep("if (!GDN_XNOSTORE && ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, S[g]);",
    "\n#if GDN_XLATE\n            for (int i = 0; i < NV; ++i) for (int e = 0; e < VEC; ++e) Sh[t][g][i][e] = S[g][i][e];\n#else\n            if (!GDN_XNOSTORE && ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, S[g]);\n#endif\n")
rep("#endif  // GDN_CHUNK\n", """#if GDN_XLATE && GDN_INTER
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int g = 0; g < RW; ++g) {
            const int row = wbase + g * RPW + (int)sub;
            if (live[g] && ikeep) store_row<CS>(inter + t * GDN_SLOT_STRIDE(i_t), K, row, kl, Sh[t][g]);
        }
#endif
#endif  // GDN_CHUNK
""")
rep("#ifndef GDN_XLATE\n", "#ifndef GDN_XTIME\n#define GDN_XTIME 0\n#endif\n#if GDN_XTIME\n__device__ unsigned long long gdn_xt[4096][12];\n#define XCLK(i) { unsigned long long c_; asm volatile(\"mov.u64 %0, %%clock64;\" : \"=l\"(c_) :: \"memory\"); xt[i] = c_; }\n#endif\n#ifndef GDN_XLATE\n")
rep("    const unsigned lane = threadIdx.x & 31;\n    const unsigned warp = threadIdx.x >> 5;\n",
    "    const unsigned lane = threadIdx.x & 31;\n    const unsigned warp = threadIdx.x >> 5;\n#if GDN_XTIME\n    unsigned long long xt[12];\n    XCLK(0);\n#endif\n")
rep("    for (int t = 0; t < T; ++t) {\n#if GDN_POOL >= 3\n        // Token t's slot idx[n, t]",
    "    for (int t = 0; t < T; ++t) {\n#if GDN_XTIME\n        if (t == 0) { unsigned d_; asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(d_) : \"f\"(S[0][0][0]) : \"memory\"); if (d_ == 0x7fffffffu) xt[11] = 1; }\n        XCLK(1 + t);\n#endif\n#if GDN_POOL >= 3\n        // Token t's slot idx[n, t]")
rep("#endif  // GDN_CHUNK\n", """#if GDN_XTIME
    XCLK(T + 2);
    if (lane == 0) {
        const unsigned slot_ = blockIdx.x * W + warp;
        if (slot_ < 4096) for (int i = 0; i < T + 3; ++i) gdn_xt[slot_][i] = xt[i];
    }
#endif
#endif  // GDN_CHUNK
""")
rep("#if GDN_XLATE && GDN_INTER\n", "#if GDN_XTIME\n    XCLK(T + 1);\n#endif\n#if GDN_XLATE && GDN_INTER\n")
open(p, "w").write(s)
print("patched")

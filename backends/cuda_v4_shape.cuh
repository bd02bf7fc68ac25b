// The -D shape and dtype constants of cuda-v4's kernels (cuda_v4.cu, cuda_v4_kfirst.cu), as
// compile-time values: head sizes, tokens a call, value heads and the GVA ratio, the state's
// and q/k/v's dtype codes and element sizes (backends/_cuda_build.py writes the -D options).
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

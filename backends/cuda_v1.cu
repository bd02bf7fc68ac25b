// cuda-v1: the straightforward GDN decode kernel (the math of gdnzoo/reference.py).
//
// One block per (sequence n, value head h); thread r owns V-row r of the state and keeps it in
// registers for all T tokens (each row evolves independently of the others).  q, k and the
// gates of up to CH tokens are staged in shared memory, shared by all rows.
//
// Compile-time constants (-D, set by backends/_cuda_build.py): GDN_K, GDN_STATE_DT, GDN_IO_DT,
// GDN_A_DT, GDN_B_DT, GDN_DTB_DT (dtype codes of gdn_common.cuh), GDN_L2NORM (0/1).
// Runtime: B, T, H, HV, V, strides, in place or not (new_state == state).
#include "gdn_common.cuh"

#if !defined(GDN_K) || !defined(GDN_STATE_DT) || !defined(GDN_IO_DT) || !defined(GDN_A_DT) || \
    !defined(GDN_B_DT) || !defined(GDN_DTB_DT) || !defined(GDN_L2NORM)
#error "compile with the -D options of backends/_cuda_build.py"
#endif

constexpr int K = GDN_K;
constexpr int CH = 8;                 // tokens staged per chunk; T > CH runs in chunks
constexpr int MAX_THREADS = 256;      // V <= 256; caps registers at 255 so S[K] stays in them

extern "C" __global__ void __launch_bounds__(MAX_THREADS) gdn_decode_v1(const GdnParams p) {
    __shared__ float sh_q[CH][K];
    __shared__ float sh_k[CH][K];
    __shared__ float sh_g[CH];
    __shared__ float sh_beta[CH];

    using ST = typename GdnStorage<GDN_STATE_DT>::type;
    const long long n = blockIdx.x / p.HV;
    const long long h = blockIdx.x - n * p.HV;
    const long long hq = h / (p.HV / p.H);        // GVA: head h reads q/k head h // (HV/H)
    const int r = threadIdx.x;
    const bool live = r < p.V;                    // the block is V rounded up to a warp
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;

    const ST* src = static_cast<const ST*>(p.state) + gdn_state_read_offset(p, n, h);
    ST* dst = static_cast<ST*>(p.new_state) + gdn_state_write_offset(p, n, h);

    // The whole row is read before any of it is written, and no other thread touches it:
    // in place (dst == src) needs no extra care.
    float S[K];
#pragma unroll
    for (int j = 0; j < K; ++j) S[j] = live ? gdn_to_f32<GDN_STATE_DT>(src[r * p.s_v + j]) : 0.0f;

    const float A_log = p.A_log[h * p.A_log_h];
    const float dtb = gdn_ld<GDN_DTB_DT>(p.dt_bias, h * p.dtb_h);
    const float scale = (float)p.scale;

    for (long long t0 = 0; t0 < p.T; t0 += CH) {
        const int nt = (int)(p.T - t0 < CH ? p.T - t0 : CH);
        __syncthreads();                          // every row is done with the previous chunk
        for (int i = threadIdx.x; i < nt * K; i += blockDim.x) {
            const int tt = i / K, j = i - tt * K;
            const long long t = t0 + tt;
            sh_q[tt][j] = gdn_ld<GDN_IO_DT>(p.q, n * p.q_n + t * p.q_t + hq * p.q_h + j);
            sh_k[tt][j] = gdn_ld<GDN_IO_DT>(p.k, n * p.k_n + t * p.k_t + hq * p.k_h + j);
        }
        if (threadIdx.x < nt) {
            const long long t = t0 + threadIdx.x;
            const float a = gdn_ld<GDN_A_DT>(p.a, n * p.a_n + t * p.a_t + h * p.a_h);
            const float b = gdn_ld<GDN_B_DT>(p.b, n * p.b_n + t * p.b_t + h * p.b_h);
            sh_g[threadIdx.x] = gdn_decay(A_log, a + dtb);
            sh_beta[threadIdx.x] = gdn_sigmoid(b);
        }
        __syncthreads();
#if GDN_L2NORM
        // x * rsqrt(sum x^2 + 1e-6) for q and k, one warp per staged token.
        for (int tt = warp; tt < nt; tt += nwarps) {
            float qq = 0.0f, kk = 0.0f;
            for (int j = lane; j < K; j += 32) {
                qq += sh_q[tt][j] * sh_q[tt][j];
                kk += sh_k[tt][j] * sh_k[tt][j];
            }
            for (int off = 16; off > 0; off >>= 1) {
                qq += __shfl_xor_sync(0xffffffffu, qq, off);
                kk += __shfl_xor_sync(0xffffffffu, kk, off);
            }
            const float rq = rsqrtf(qq + 1e-6f), rk = rsqrtf(kk + 1e-6f);
            for (int j = lane; j < K; j += 32) {
                sh_q[tt][j] *= rq;
                sh_k[tt][j] *= rk;
            }
        }
        __syncthreads();
#endif
        if (live) {
            for (int tt = 0; tt < nt; ++tt) {
                const long long t = t0 + tt;
                const float g = sh_g[tt], beta = sh_beta[tt];
                float sk = 0.0f;
#pragma unroll
                for (int j = 0; j < K; ++j) {     // 1) decay first, 2) read k from decayed row
                    S[j] *= g;
                    sk += S[j] * sh_k[tt][j];
                }
                const float vr = gdn_ld<GDN_IO_DT>(p.v, n * p.v_n + t * p.v_t + h * p.v_h + r);
                const float u = beta * (vr - sk);
                float o = 0.0f;
#pragma unroll
                for (int j = 0; j < K; ++j) {     // 3) rank-1 update, 4) output from the new row
                    S[j] += u * sh_k[tt][j];
                    o += S[j] * sh_q[tt][j];
                }
                gdn_st<GDN_IO_DT>(p.out, n * p.o_n + t * p.o_t + h * p.o_h + r, scale * o);
            }
        }
    }
    if (live) {
#pragma unroll
        for (int j = 0; j < K; ++j) dst[r * p.ns_v + j] = gdn_from_f32<GDN_STATE_DT>(S[j]);
    }
}

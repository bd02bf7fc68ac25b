// A prototype (measured on an H200 2026-11-30, not kept: README.md) of a persistent chain kernel: cuda-chunk-bf16's
// chain (backends/cuda_chunk_chain.cu, whose helpers and structs it includes) with one CTA an SM
// running task after task (sequence, value head, 64 state rows) in the product's grid order, so
// that a task's start overlaps the one before's end: the producer runs ahead into the next
// task's chunks, the outputs warpgroup finishes a task's last chunk while the chain warpgroup
// starts the next, and the chain warpgroup copies the next task's state tile into shared memory
// (cp.async) during the current one.  A chain CTA of the product spends ~3.5k cycles from entry
// to its state in registers and ~3.3k after its last update
// (lab/notebook/h200/chain_cta_2026-11-30/).  Same products in the same order: outputs and
// states bit-identical to the product chain's.  Dense calls only (a state of fp32 or bf16 rows
// [N, HV, V, K] with K contiguous and 16-byte rows, or none), no pools, checkpoints, segments
// or PDL.  Barrier phases count a CTA's chunks over all its tasks.  (nvcc, sm_90a: 168 registers,
// 8-12 bytes spilled once a task, outside the chunk loop.)
#include "cuda_chunk_chain.cu"

#define PC_LD (GDN_S_DT == 0 ? K_ + 4 : K_ + 8)     // the state buffer's row, in elements
typedef typename GdnStorage<GDN_S_DT == 0 ? GDN_F32 : GDN_BF16>::type pc_elem;

struct alignas(1024) PcSmem {
    ChainSmem c;
    pc_elem s[ROWS * PC_LD];    // the next task's state tile, rows padded
};
static_assert(sizeof(PcSmem) <= PC_SMEM, "PC_SMEM too small");

__device__ __forceinline__ void pc_sync() {        // the chain warpgroup's own barrier
    asm volatile("bar.sync 2, 128;" ::: "memory");
}
// a task's place: (sequence, value head, rows), its tokens and chunks (none past the last task)
struct PcTask {
    long long i_n, bos, eos, n;
    int i_hv, i_h, row0;
};
__device__ __forceinline__ PcTask pc_place(const ChainParams& p, long long task) {
    const int NV = (int)(p.V / ROWS), HV = (int)p.HV;
    PcTask t;
    const long long i_nh = task / NV;
    t.row0 = (int)(task % NV) * ROWS;
    t.i_n = i_nh / HV;
    t.i_hv = (int)(i_nh % HV);
    t.i_h = t.i_hv / (HV / (int)p.H);
    t.bos = t.eos = t.n = 0;
    return t;
}
__device__ __forceinline__ void pc_bounds(const ChainParams& p, PcTask& t, long long bos,
                                          long long eos) {
    held(bos, eos, p.T_all);
    t.bos = bos;
    t.eos = eos;
    t.n = (eos - bos + C_ - 1) / C_;
}
__device__ __forceinline__ PcTask pc_task(const ChainParams& p, long long task) {
    PcTask t = pc_place(p, task);
    pc_bounds(p, t, cu_at(p, t.i_n), cu_at(p, t.i_n + 1));
    return t;
}
// the chain warpgroup's copies of a task's state tile into the buffer (16 bytes each)
__device__ __forceinline__ void pc_copy_state(const ChainParams& p, pc_elem* buf,
                                              const PcTask& t, int ti) {
    constexpr int PER_ROW = K_ * (int)sizeof(pc_elem) / 16;
    const pc_elem* src = static_cast<const pc_elem*>(p.state)
                         + t.i_n * p.ss_n + t.i_hv * p.ss_h + t.row0 * p.ss_v;
    for (int x = ti; x < ROWS * PER_ROW; x += 128) {
        const int r = x / PER_ROW, c = (x % PER_ROW) * (16 / (int)sizeof(pc_elem));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                     :: "r"(smem_u32(buf + r * PC_LD + c)), "l"(src + r * p.ss_v + c) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(NTHR, 1) gdn_persistent_chain(
        const __grid_constant__ ChainParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    PcSmem& ps = *reinterpret_cast<PcSmem*>(smem_raw);
    ChainSmem& sm = ps.c;
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w = (tid >> 5) & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const long long tasks = p.N * p.HV * (p.V / ROWS);
    const int r0 = 16 * w + g;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(&sm.full[s], 1 + 32);
            bar_init(&sm.empty[s], 256);
        }
        for (int b = 0; b < 2; ++b) {
            bar_init(&sm.hfull[b], 128);
            bar_init(&sm.hempty[b], 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 2) {                              // the producer warp
        long long g0 = 0;                       // the CTA's chunks before this task's
        for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
            const PcTask t = pc_task(p, task);
            for (long long jc = 0; jc < t.n; ++jc) {
                const long long gc = g0 + jc;
                const int s = (int)(gc % STAGES);
                if (gc >= STAGES) wait_bar(smem_u32(&sm.empty[s]),
                                           (unsigned)((gc / STAGES - 1) & 1));
                Stage& st = sm.st[s];
                const long long t0 = t.bos + jc * C_, rem = t.eos - t0;
                const unsigned full = smem_u32(&sm.full[s]);
                if (lane == 0) {
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                                 :: "r"(full), "r"(TMA_BYTES) : "memory");
                    const int tt = (int)t0;
                    tma3(st.k, p.tk, 0, t.i_h, tt, full);
                    tma3(st.k + BOX, p.tk, 64, t.i_h, tt, full);
                    tma3(st.q, p.tq, 0, t.i_h, tt, full);
                    tma3(st.q + BOX, p.tq, 64, t.i_h, tt, full);
                    tma3(st.t, p.tm, 0, t.i_hv, tt, full);
                    tma3(st.m, p.tm, C_, t.i_hv, tt, full);
                    tma3(st.v, p.tv, t.row0, t.i_hv, tt, full);
                }
                load_factors(st, p, t.i_hv, t0, rem, lane);
                if (lane == 0) cp4(&st.glast[0], p.vecs + (t.i_hv * 5 + 4) * p.T_all + t0,
                                   rem > 0);
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(full)
                             : "memory");
            }
            g0 += t.n;
        }
        return;
    }

    if (wg == 1) {                              // the outputs, a chunk behind the chain
        const int ti = tid - 128;
        long long g0 = 0;
        for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
            const PcTask t = pc_task(p, task);
            for (long long jc = 0; jc < t.n; ++jc) {
                const long long gc = g0 + jc;
                const int s = (int)(gc % STAGES), b = (int)(gc & 1);
                const long long t0 = t.bos + jc * C_, rem = t.eos - t0;
                wait_bar(smem_u32(&sm.full[s]), (unsigned)((gc / STAGES) & 1));
                wait_bar(smem_u32(&sm.hfull[b]), (unsigned)((gc >> 1) & 1));
                const Stage& st = sm.st[s];
                const Handover& hb = sm.hb[b];
                float Y[32];
                outputs_y(Y, hb.s0, st.q);
                scale_tokens(Y, st.f[2], t4);
                outputs_rm(Y, hb.r, st.m);
                bar_arrive(&sm.hempty[b]);
                bar_arrive(&sm.empty[s]);
                store_chunk(p, sm.ob[b], Y, 1.f, rem, t0, t.row0, t.i_hv, r0, t4, ti);
            }
            g0 += t.n;
        }
        if (ti == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }

    // warpgroup 0: the chain
    const int hs = (2 * w) * 2048 + g * 16 + t4 * 4, hr = (2 * w) * 1024 + g * 16 + t4 * 4;
    long long g0 = 0;
    PcTask t = pc_task(p, blockIdx.x);
    if (GDN_STATE0 && blockIdx.x < tasks) pc_copy_state(p, ps.s, t, tid);
    for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
        float S[64];
        if (GDN_STATE0) {                       // this task's tile, copied during the last one
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            pc_sync();
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const pc_elem* at = ps.s + (r0 + 8 * (e >> 1)) * PC_LD + 8 * j + 2 * t4;
                    S[4 * j + e] = gdn_to_f32<GDN_S_DT == 0 ? GDN_F32 : GDN_BF16>(at[0]);
                    S[4 * j + e + 1] = gdn_to_f32<GDN_S_DT == 0 ? GDN_F32 : GDN_BF16>(at[1]);
                }
            pc_sync();                        // every thread's reads done: the buffer is free
        } else {
#pragma unroll
            for (int i = 0; i < 64; ++i) S[i] = 0.f;
        }
        // the next task: its tile's copies issued now (its place is arithmetic), its
        // cu_seqlens bounds loaded now and used after this task's chunks
        const bool more = task + gridDim.x < tasks;
        const PcTask np = pc_place(p, more ? task + gridDim.x : task);
        if (GDN_STATE0 && more) pc_copy_state(p, ps.s, np, tid);
        const long long nb = more ? cu_at(p, np.i_n) : 0, ne = more ? cu_at(p, np.i_n + 1) : 0;
        for (long long jc = 0; jc < t.n; ++jc) {
            const long long gc = g0 + jc;
            const int s = (int)(gc % STAGES), b = (int)(gc & 1);
            wait_bar(smem_u32(&sm.full[s]), (unsigned)((gc / STAGES) & 1));
            const Stage& st = sm.st[s];
            unsigned sa[8][4];
#pragma unroll
            for (int k = 0; k < 8; ++k) frag(sa[k], S, k);
            float X[32];
            wg_fence();
#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
            wg_commit();
            if (gc >= 2) wait_bar(smem_u32(&sm.hempty[b]), (unsigned)(((gc >> 1) - 1) & 1));
            unsigned char* h = reinterpret_cast<unsigned char*>(&sm.hb[b]);
#pragma unroll
            for (int k = 0; k < 8; ++k) put_frag(h + hs, sa[k], k, 2048);
            wg_wait<0>();
            pin(X);
            form_r(X, st.v, st.f[0], st.f[1], r0, t4);
            unsigned ra[4][4];
            issue_vp(X, ra, st.t);
            unsigned char* hrb = reinterpret_cast<unsigned char*>(sm.hb[b].r);
#pragma unroll
            for (int k = 0; k < 4; ++k) put_frag(hrb + hr, ra[k], k, 1024);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_arrive(&sm.hfull[b]);
            wg_wait<0>();
            pin(X);
            scale_tokens(X, st.f[3], t4);
            unsigned va[4][4];
#pragma unroll
            for (int k = 0; k < 4; ++k) frag(va[k], X, k);
            const float gl = st.glast[0];
#pragma unroll
            for (int i = 0; i < 64; ++i) S[i] *= gl;
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) mma128rs<1>(S, va[k], desc(st.k, 2048 * k, 8192), 1);
            wg_commit();
            wg_wait<0>();
            pin(S);
            bar_arrive(&sm.empty[s]);
        }
        store_tile<GDN_NS_DT>(S, p.new_state, t.i_n * p.sn_n + t.i_hv * p.sn_h + t.row0 * p.sn_v,
                              p.sn_v, p.sn_k, r0, t4);
        g0 += t.n;
        t = np;
        pc_bounds(p, t, nb, ne);
    }
}

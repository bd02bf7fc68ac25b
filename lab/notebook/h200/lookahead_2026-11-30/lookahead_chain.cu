// A prototype (lab only; correct and slower, session.log) of the lookahead chain:
// cuda-chunk-bf16's chain with each chunk's X = S0 k^T formed from the chunk before,
//
//     X_c = e^G_last,c-1 (S0_{c-1} k_c^T) + (V'^T diag fk)_{c-1} (k_{c-1} k_c^T),
//
// so the chain warpgroup's dependent products a chunk are two (V'^T = R T^T, then the next X's
// correction) instead of three; the state's update and the next S0 k^T run in a warpgroup of
// their own (lab/notebook/h200/chain_anatomy_2026-11-30/session.log, sections 3 and 7; its
// numerics: lab/chain_lookahead.py).  Dense calls only (a state or none, fp32 or bf16 by
// GDN_S_DT / GDN_NS_DT, k-last), no pools, checkpoints, segments or PDL.  The product kernel's
// helpers come from including it (its own kernel compiles alongside, unused).
//
// One CTA of 384 threads per (sequence, value head, 64 state rows):
// * warpgroup 0, the state: S in its accumulators.  Chunk c: S0 (bf16) to the outputs; the next
//   chunk's Xpre = S0 k_{c+1}^T to the chain (fp32, 16 KB); once the chain hands over
//   va = bf16(V'^T diag fk), S = e^G_last S + va k_c.
// * warpgroup 1, the chain: X_c = e^G_last,c-1 Xpre_c + va_{c-1} B_{c-1}, R = v^T diag(beta) -
//   X diag(bk) (to the outputs), V'^T = R T^T, va to the state.
// * warpgroup 2, the outputs (as the product's) and B_c = bf16(k_{c+1} k_c^T) a chunk ahead; its
//   warp 0 is the producer: k (three stages) and the rest of a chunk's inputs (two stages).
#include "cuda_chunk_chain.cu"

#define KS 3
#define RS 2
#define LA_THREADS 384
// variants (lab): LA_S0X2 two S0 handover buffers (the state no longer waits for the outputs'
// chunk before); LA_BCHAIN B_c formed by the chain warpgroup (after V'^T, overlapping va's
// handover) instead of the outputs; LA_MARKS clock64 marks (LA_CTAS x LA_CHUNKS x 24 slots)
#ifndef LA_S0X2
#define LA_S0X2 0
#endif
#ifndef LA_BCHAIN
#define LA_BCHAIN 0
#endif
#ifndef LA_NO_OUT           // LA_NO_OUT: no Y, R M^T or store (the handovers still paced)
#define LA_NO_OUT 0
#endif
#ifdef LA_MARKS
__device__ unsigned long long la_marks[LA_CTAS * LA_CHUNKS * 24];
#define LA_MARK(who, c, k) do { \
    if (tid == (who) && blockIdx.x < LA_CTAS && (c) >= 0 && (c) < LA_CHUNKS) \
        la_marks[(blockIdx.x * LA_CHUNKS + (c)) * 24 + (k)] = clock64(); } while (0)
#else
#define LA_MARK(who, c, k) do { } while (0)
#endif

struct alignas(1024) KStage {
    bf16_t k[2 * BOX];
    float glast[4];
};
struct alignas(1024) RStage {
    bf16_t q[2 * BOX];
    bf16_t t[BOX];              // T^T rows
    bf16_t m[BOX];              // M^T rows
    bf16_t v[BOX];
    float f[4][C_];             // beta, beta rk e^G, scale rq e^G, rk e^(G_last - G)
    float glast[4];
};
struct alignas(1024) LaSmem {
    KStage ks[KS];
    RStage rs[RS];
    bf16_t s0[1 + LA_S0X2][ROWS * K_];  // no swizzle: core (r / 8, c / 8) at (r / 8) 2048
                                        // + (c / 8) 128
    bf16_t r[ROWS * C_];        // no swizzle: core (r / 8, i / 8) at (r / 8) 1024 + (i / 8) 128
    bf16_t va[ROWS * C_];       // as r
    bf16_t bt[C_ * C_];         // B_c^T = k_{c+1} k_c^T (rows: tokens of c + 1), as r
    float xpre[32][128];        // an m64n64 accumulator, value-major, thread-minor
    bf16_t ob[2][BOX];
    unsigned long long kfull[KS], kempty[KS], rfull[RS], rempty[RS];
    unsigned long long sfull[2], s0empty[2];
    unsigned long long hfull, hempty, xfull, xempty, vfull, vempty, bfull, bempty;
};
static_assert(sizeof(LaSmem) <= LA_SMEM, "LA_SMEM too small");
#define K_BYTES (2 * BOX * 2)
#define R_BYTES (5 * BOX * 2)

extern "C" __global__ void __launch_bounds__(LA_THREADS, 1) gdn_lookahead_chain(
        const __grid_constant__ ChainParams p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    LaSmem& sm = *reinterpret_cast<LaSmem*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w = (tid >> 5) & 3;
    const int g = lane >> 2, t4 = lane & 3, ti = tid & 127;
    const int HV = (int)p.HV, NV = (int)(p.V / ROWS);
    const int i_v = (int)(blockIdx.x % NV);
    const long long i_nh = blockIdx.x / NV;
    const long long i_n = i_nh / HV;
    const int i_hv = (int)(i_nh % HV);
    const int i_h = i_hv / (HV / (int)p.H);
    long long bos = cu_at(p, i_n), eos = cu_at(p, i_n + 1);
    held(bos, eos, p.T_all);
    const int row0 = i_v * ROWS, r0 = 16 * w + g;
    const long long n = (eos - bos + C_ - 1) / C_;
    if (tid == 0) {
        for (int s = 0; s < KS; ++s) {
            bar_init(&sm.kfull[s], 1 + 32);
            bar_init(&sm.kempty[s], 256);      // the state and the outputs (or the chain)
        }
        for (int s = 0; s < RS; ++s) {
            bar_init(&sm.rfull[s], 1 + 32);
            bar_init(&sm.rempty[s], 256);      // the chain and the outputs
        }
        unsigned long long* one[] = {&sm.sfull[0], &sm.sfull[1], &sm.s0empty[0],
                                     &sm.s0empty[1], &sm.hfull, &sm.hempty, &sm.xfull, &sm.xempty,
                                     &sm.vfull, &sm.vempty, &sm.bfull, &sm.bempty};
        for (unsigned long long* b : one) bar_init(b, 128);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // this thread's words in the no-swizzle tiles: rows r0 (+ 8), columns 8 j + 2 t4 (+ 1)
    const int hs = (2 * w) * 2048 + g * 16 + t4 * 4, hr = (2 * w) * 1024 + g * 16 + t4 * 4;

    if (wg == 2) {                              // the outputs, B, and (warp 0) the producer
        auto load_k = [&](long long j) {
            const int s = (int)(j % KS);
            if (j >= KS) wait_bar(smem_u32(&sm.kempty[s]), (unsigned)((j / KS - 1) & 1));
            KStage& st = sm.ks[s];
            const long long t0 = bos + j * C_;
            const unsigned full = smem_u32(&sm.kfull[s]);
            if (lane == 0) {
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                             :: "r"(full), "r"(K_BYTES) : "memory");
                tma3(st.k, p.tk, 0, i_h, (int)t0, full);
                tma3(st.k + BOX, p.tk, 64, i_h, (int)t0, full);
                cp4(&st.glast[0], p.vecs + (i_hv * 5 + 4) * p.T_all + t0, eos > t0);
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(full)
                         : "memory");
        };
        auto load_r = [&](long long j) {
            const int s = (int)(j % RS);
            if (j >= RS) wait_bar(smem_u32(&sm.rempty[s]), (unsigned)((j / RS - 1) & 1));
            RStage& st = sm.rs[s];
            const long long t0 = bos + j * C_, rem = eos - t0;
            const unsigned full = smem_u32(&sm.rfull[s]);
            if (lane == 0) {
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                             :: "r"(full), "r"(R_BYTES) : "memory");
                const int t = (int)t0;
                tma3(st.q, p.tq, 0, i_h, t, full);
                tma3(st.q + BOX, p.tq, 64, i_h, t, full);
                tma3(st.t, p.tm, 0, i_hv, t, full);
                tma3(st.m, p.tm, C_, i_hv, t, full);
                tma3(st.v, p.tv, row0, i_hv, t, full);
                cp4(&st.glast[0], p.vecs + (i_hv * 5 + 4) * p.T_all + t0, rem > 0);
            }
            load_factors(st, p, i_hv, t0, rem, lane);
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(full)
                         : "memory");
        };
        if (ti < 32) {
            for (long long j = 0; j < 2 && j < n; ++j) {
                load_k(j);
                load_r(j);
            }
            if (n > 2) load_k(2);
        }
        for (long long c = 0; c < n; ++c) {
            const RStage& rs = sm.rs[c % RS];
            const long long t0 = bos + c * C_, rem = eos - t0;
            const unsigned ph = (unsigned)(c & 1);
            LA_MARK(256, c, 13);
#if !LA_BCHAIN
            wait_bar(smem_u32(&sm.kfull[c % KS]), (unsigned)((c / KS) & 1));
            // first B_c^T = k_{c+1} k_c^T, which the chain's next X waits for
            if (c + 1 < n) {
                const KStage& kc = sm.ks[c % KS];
                const KStage& kn = sm.ks[(c + 1) % KS];
                wait_bar(smem_u32(&sm.kfull[(c + 1) % KS]), (unsigned)(((c + 1) / KS) & 1));
                float D[32];
                wg_fence();
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    mma64ss<0>(D, desc(kn.k + (k >> 2) * BOX, 32 * (k & 3), 16),
                               desc(kc.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
                wg_commit();
                wg_wait<0>();
                pin(D);
                LA_MARK(256, c, 14);
                unsigned da[4][4];
#pragma unroll
                for (int k = 0; k < 4; ++k) frag(da[k], D, k);
                if (c >= 1) wait_bar(smem_u32(&sm.bempty), (unsigned)((c - 1) & 1));
                LA_MARK(256, c, 15);
                unsigned char* bt = reinterpret_cast<unsigned char*>(sm.bt);
#pragma unroll
                for (int k = 0; k < 4; ++k) put_frag(bt + hr, da[k], k, 1024);
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                bar_arrive(&sm.bfull);
            }
            bar_arrive(&sm.kempty[c % KS]);     // k_c read (B_{c-1} and B_c)
#endif
            // Y = S0 q^T, then O = Y diag(fq) + R M^T
            wait_bar(smem_u32(&sm.rfull[c % RS]), (unsigned)((c / RS) & 1));
            const int sb = LA_S0X2 ? (int)(c & 1) : 0;
            const unsigned sph = LA_S0X2 ? (unsigned)((c >> 1) & 1) : ph;
            wait_bar(smem_u32(&sm.sfull[sb]), sph);
            LA_MARK(256, c, 16);
            float Y[32];
            if (LA_NO_OUT) {
                if (LA_S0X2) bar_arrive(&sm.s0empty[sb]);
                wait_bar(smem_u32(&sm.hfull), ph);
                bar_arrive(&sm.hempty);
                bar_arrive(&sm.rempty[c % RS]);
                if (ti < 32) {
                    if (c + 2 < n) load_r(c + 2);
                    if (c + 3 < n) load_k(c + 3);
                }
                continue;
            }
            outputs_y(Y, sm.s0[sb], rs.q);
            if (LA_S0X2) bar_arrive(&sm.s0empty[sb]);
            LA_MARK(256, c, 17);
            scale_tokens(Y, rs.f[2], t4);
            wait_bar(smem_u32(&sm.hfull), ph);
            LA_MARK(256, c, 18);
            outputs_rm(Y, sm.r, rs.m);
            LA_MARK(256, c, 19);
            bar_arrive(&sm.hempty);             // R (and S0 unless LA_S0X2) of chunk c read
            bar_arrive(&sm.rempty[c % RS]);     // q, M^T and fq read
            if (ti < 32) {                      // the producer, two chunks ahead
                if (c + 2 < n) load_r(c + 2);
                if (c + 3 < n) load_k(c + 3);
            }
            LA_MARK(256, c, 21);
            LA_MARK(288, c, 22);
            store_chunk(p, sm.ob[c & 1], Y, 1.f, rem, t0, row0, i_hv, r0, t4, ti);
            LA_MARK(256, c, 20);
            LA_MARK(288, c, 23);
        }
        if (ti == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        return;
    }

    if (wg == 1) {                              // the chain
        unsigned vp[4][4] = {};                 // va of the chunk before (A fragments)
        float gprev = 0.f;                      // e^G_last of the chunk before
        for (long long c = 0; c < n; ++c) {
            const unsigned ph = (unsigned)(c & 1);
            float X[32];
            wait_bar(smem_u32(&sm.xfull), ph);
            LA_MARK(128, c, 6);
#pragma unroll
            for (int i = 0; i < 32; ++i) X[i] = sm.xpre[i][ti];
            bar_arrive(&sm.xempty);
            if (c >= 1) {                       // X_c = e^G_last Xpre_c + va_{c-1} B_{c-1}
#pragma unroll
                for (int i = 0; i < 32; ++i) X[i] *= gprev;
#if LA_BCHAIN
                asm volatile("bar.sync 2, 128;" ::: "memory");   // the chain's B_{c-1} stored
#else
                wait_bar(smem_u32(&sm.bfull), (unsigned)((c - 1) & 1));
#endif
                LA_MARK(128, c, 7);
                wg_fence();
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    mma64rs<0>(X, vp[k], desc_ns(sm.bt, 256 * k, 128, 1024), 1);
                wg_commit();
                wg_wait<0>();
                pin(X);
                if (!LA_BCHAIN) bar_arrive(&sm.bempty);
                LA_MARK(128, c, 8);
            }
            const RStage& st = sm.rs[c % RS];
            wait_bar(smem_u32(&sm.rfull[c % RS]), (unsigned)((c / RS) & 1));
            LA_MARK(128, c, 9);
            form_r(X, st.v, st.f[0], st.f[1], r0, t4);
            unsigned ra[4][4];
            issue_vp(X, ra, st.t);              // V'^T = R T^T (into X's registers)
#if LA_BCHAIN
            float D[32];                        // B_c = k_{c+1} k_c^T behind it
            const bool nb = c + 1 < n;
            if (nb) {
                const KStage& kc = sm.ks[c % KS];
                const KStage& kn = sm.ks[(c + 1) % KS];
                wait_bar(smem_u32(&sm.kfull[c % KS]), (unsigned)((c / KS) & 1));
                wait_bar(smem_u32(&sm.kfull[(c + 1) % KS]), (unsigned)(((c + 1) / KS) & 1));
                wg_fence();
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    mma64ss<0>(D, desc(kn.k + (k >> 2) * BOX, 32 * (k & 3), 16),
                               desc(kc.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
                wg_commit();
            }
#endif
            if (c >= 1) wait_bar(smem_u32(&sm.hempty), (unsigned)((c - 1) & 1));
            LA_MARK(128, c, 10);
            unsigned char* hrb = reinterpret_cast<unsigned char*>(sm.r);
#pragma unroll
            for (int k = 0; k < 4; ++k) put_frag(hrb + hr, ra[k], k, 1024);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_arrive(&sm.hfull);              // R of chunk c for the outputs
#if LA_BCHAIN
            if (nb) wg_wait<1>(); else wg_wait<0>();
#else
            wg_wait<0>();
#endif
            pin(X);
            LA_MARK(128, c, 11);
            scale_tokens(X, st.f[3], t4);
#pragma unroll
            for (int k = 0; k < 4; ++k) frag(vp[k], X, k);
            if (c >= 1) wait_bar(smem_u32(&sm.vempty), (unsigned)((c - 1) & 1));
            unsigned char* vab = reinterpret_cast<unsigned char*>(sm.va);
#pragma unroll
            for (int k = 0; k < 4; ++k) put_frag(vab + hr, vp[k], k, 1024);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_arrive(&sm.vfull);              // va of chunk c for the state
            LA_MARK(128, c, 12);
            gprev = st.glast[0];
            bar_arrive(&sm.rempty[c % RS]);     // T^T, v and the factors read
#if LA_BCHAIN
            if (nb) {                           // B_c^T into its tile for the next correction
                wg_wait<0>();
                pin(D);
                unsigned da[4][4];
#pragma unroll
                for (int k = 0; k < 4; ++k) frag(da[k], D, k);
                unsigned char* bt = reinterpret_cast<unsigned char*>(sm.bt);
#pragma unroll
                for (int k = 0; k < 4; ++k) put_frag(bt + hr, da[k], k, 1024);
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            }
            bar_arrive(&sm.kempty[c % KS]);     // k_c read (B_{c-1} and B_c)
#endif
        }
        return;
    }

    // warpgroup 0: the state
    float S[64];
    const long long rbase = i_n * p.ss_n + i_hv * p.ss_h + row0 * p.ss_v;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            S[4 * j + e] = GDN_STATE0 ? gdn_ld<GDN_S_DT>(p.state, rbase + (r0 + 8 * (e >> 1))
                                                        * p.ss_v + (8 * j + 2 * t4 + (e & 1))
                                                        * p.ss_k)
                                      : 0.f;
    // Xpre = sa k_j^T into the chain's buffer (its chunk j - 1 consumed), from A fragments
    auto xpre = [&](const unsigned (&sa)[8][4], long long j) {
        const KStage& kj = sm.ks[j % KS];
        wait_bar(smem_u32(&sm.kfull[j % KS]), (unsigned)((j / KS) & 1));
        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(kj.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
        wg_commit();
        wg_wait<0>();
        pin(X);
        LA_MARK(0, j - 1, 2);
        if (j >= 1) wait_bar(smem_u32(&sm.xempty), (unsigned)((j - 1) & 1));
#pragma unroll
        for (int i = 0; i < 32; ++i) sm.xpre[i][ti] = X[i];
        bar_arrive(&sm.xfull);
    };
    for (long long c = 0; c < n; ++c) {
        LA_MARK(0, c, 0);
        unsigned sa[8][4];
#pragma unroll
        for (int k = 0; k < 8; ++k) frag(sa[k], S, k);
        if (c == 0) xpre(sa, 0);
        // S0 to the outputs (the handover free once they are done with chunk c - 1)
        const int sb = LA_S0X2 ? (int)(c & 1) : 0;
        if (LA_S0X2 && c >= 2) wait_bar(smem_u32(&sm.s0empty[sb]), (unsigned)(((c >> 1) - 1) & 1));
        if (!LA_S0X2 && c >= 1) wait_bar(smem_u32(&sm.hempty), (unsigned)((c - 1) & 1));
        LA_MARK(0, c, 1);
        unsigned char* h = reinterpret_cast<unsigned char*>(sm.s0[sb]);
#pragma unroll
        for (int k = 0; k < 8; ++k) put_frag(h + hs, sa[k], k, 2048);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bar_arrive(&sm.sfull[sb]);
        if (c + 1 < n) xpre(sa, c + 1);
        LA_MARK(0, c, 3);
        // S = e^G_last S + va k_c
        const KStage& kc = sm.ks[c % KS];
        const float gl = kc.glast[0];
#pragma unroll
        for (int i = 0; i < 64; ++i) S[i] *= gl;
        wait_bar(smem_u32(&sm.vfull), (unsigned)(c & 1));
        LA_MARK(0, c, 4);
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k)
            mma128ss<1>(S, desc_ns(sm.va, 256 * k, 128, 1024), desc(kc.k, 2048 * k, 8192), 1);
        wg_commit();
        wg_wait<0>();
        pin(S);
        LA_MARK(0, c, 5);
        bar_arrive(&sm.vempty);
        bar_arrive(&sm.kempty[c % KS]);         // k_c read (Xpre_c and the update)
    }
    store_tile<GDN_NS_DT>(S, p.new_state, i_n * p.sn_n + i_hv * p.sn_h + row0 * p.sn_v,
                          p.sn_v, p.sn_k, r0, t4);
}

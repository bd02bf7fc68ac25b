"""Edits of backends/cuda_chunk_chain.cu for lab/x3_ab.py (its x3 chain, GDN_X3).

x3slo: S0's lo parts (32 registers a thread, live through X's and Y's products) written into a
16 KB no-swizzle tile of shared memory once X's hi pass is issued, and read by X's and Y's lo
passes by descriptor (A "ss"), so that 32 registers fewer are live at the chunk's peak.  The
shared memory grows by 16 KB (x3_ab.py launches it with X3_SMEM + 16384)."""

SLO_SMEM = 64 * 128 * 2

EDITS = {
    "x3slo": [
        ("""    OStage os;
    bf16_t ob[2][BOX];
    unsigned long long full[2], qfull;""",
         """    OStage os;
    bf16_t ob[2][BOX];
#if GDN_X3
    bf16_t sl[ROWS * K_];       // S0's lo parts, no swizzle (as Handover's s0)
#endif
    unsigned long long full[2], qfull;"""),
        ("""#if GDN_X3
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
#endif""",
         """        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
#if GDN_X3
        {   // S0's lo parts into sm.sl (the last chunk's products that read it are done)
            unsigned char* h = reinterpret_cast<unsigned char*>(sm.sl) + (2 * w) * 2048
                               + g * 16 + t4 * 4;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                unsigned a[4];
                frag<true>(a, S, k);
                put_frag(h, a, k, 2048);
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            out_sync();
        }
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64ss<0>(X, desc_ns(sm.sl, 256 * k, 128, 2048),
                       desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), 1);
#endif"""),
        ("""#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sl[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), 1);""",
         """#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64ss<0>(Y, desc_ns(sm.sl, 256 * k, 128, 2048),
                           desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), 1);"""),
    ],
}

SMEM_MORE = {"x3slo": SLO_SMEM, "x3slo+keep1": SLO_SMEM, "x3slo+ckptlean": SLO_SMEM}

# keep1 (diagnosis only, wrong for padded sequences): the solo form's outputs stored with
# keep = 1 whatever the slot, as in the dense form, to see whether the pool form's per-chunk
# cost is the multiply by keep
EDITS["keep1"] = [("store_chunk(p, sm.ob[jc & 1], Y, rd ? 1.f : 0.f,",
                   "store_chunk(p, sm.ob[jc & 1], Y, 1.f,")]

# ckptlean: the checkpoint bookkeeping by counters set once (the chunks to the next checkpoint,
# its row, the rows of the buffer, the chunks that end inside the sequence) instead of 64-bit
# divisions and products every chunk; the same checkpoints by construction
EDITS["ckptlean"] = [
    ("""#if GDN_CKPT
    const long long crow0 = checkpoint_row0(p, i_n), n_tok = eos - bos;
#endif""",
     """#if GDN_CKPT
    // checkpoints by counters: chunks to the next one (``every`` is a multiple of C_), its row,
    // the buffer's rows, the chunks that end inside the sequence
    const int ev = (int)(p.every / C_);
    int left = ev;
    long long crow = checkpoint_row0(p, i_n);
    const long long crows = p.T_all / p.every, full = (eos - bos) / C_;
#endif"""),
    ("""        {   // the state after chunk jc, where a checkpoint falls inside the sequence
            const long long end = (jc + 1) * C_;
            if (rd && end % p.every == 0 && crow0 + end / p.every <= p.T_all / p.every
                    && end <= n_tok)
                store_tile<GDN_C_DT>(S, p.ckpt, (crow0 + end / p.every - 1) * p.sc_n
                                     + i_hv * p.sc_h + row0 * p.sc_v, p.sc_v, p.sc_k, r0, t4);
        }""",
     """        if (--left == 0) {   // the state after chunk jc, at a checkpoint inside the sequence
            left = ev;
            if (rd && jc < full && crow < crows)
                store_tile<GDN_C_DT>(S, p.ckpt, crow * p.sc_n + i_hv * p.sc_h + row0 * p.sc_v,
                                     p.sc_v, p.sc_k, r0, t4);
            ++crow;
        }"""),
]

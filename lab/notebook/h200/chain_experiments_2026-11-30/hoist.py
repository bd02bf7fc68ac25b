"""The "hoist" variant of lab.chain_ab (measured 2026-11-30 on an H200, not kept: bit-identical
and no faster, ``chain_ab.log`` here): the chain warpgroup's state loads issued before
cu_seqlens is read and before the CTA barrier.  Run it with

    python -m lab.chain_ab --edits lab/notebook/h200/chain_experiments_2026-11-30/hoist.py \\
        --variants hoist --cells 16/32:8x1024,16/32:16x256,4/8:1x8192

(the edits match cuda_chunk_chain.cu as at commit 14ef66e).
"""
# the state's loads, as the chain warpgroup has them after the role split
LOADS = ("    float S[64];" + " " * 32 + "// the state tile [64, 128] as an m64n128 accumulator\n"
         """    bool init = rd && GDN_STATE0 && seg == 0 && !ident;
#if GDN_HAS_INIT
    init = init && p.has_init[i_n] != 0;
#endif
    const long long rbase = slot_r * p.ss_n + i_hv * p.ss_h + row0 * p.ss_v;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            S[4 * j + e] = init ? gdn_ld<GDN_S_DT>(p.state, rbase + (r0 + 8 * (e >> 1)) * p.ss_v
                                                   + (8 * j + 2 * t4 + (e & 1)) * p.ss_k)
                         // an identity chain starts from the rows row0.. of I_K (K == V)
                         : (ident && row0 + r0 + 8 * (e >> 1) == 8 * j + 2 * t4 + (e & 1)) ? 1.f
                         : 0.f;
""")
CU = """    long long bos = cu_at(p, i_n), eos = cu_at(p, i_n + 1);
    held(bos, eos, p.T_all);
"""
ROWS = """    const int row0 = i_v * ROWS;
    const int r0 = 16 * w + g;                  // a warpgroup thread's rows r0, r0 + 8
"""
HOISTED = ROWS + """    float S[64];                // the state tile, loaded by the chain warpgroup
    if (wg == 0) {
        bool init = rd && GDN_STATE0 && seg == 0 && !ident;
#if GDN_HAS_INIT
        init = init && p.has_init[i_n] != 0;
#endif
        const long long rbase = slot_r * p.ss_n + i_hv * p.ss_h + row0 * p.ss_v;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                S[4 * j + e] = init ? gdn_ld<GDN_S_DT>(p.state, rbase + (r0 + 8 * (e >> 1))
                                                       * p.ss_v + (8 * j + 2 * t4 + (e & 1))
                                                       * p.ss_k)
                             : (ident && row0 + r0 + 8 * (e >> 1) == 8 * j + 2 * t4 + (e & 1))
                             ? 1.f : 0.f;
    }
""" + CU
EDITS = {"hoist": [(LOADS, ""), (CU, ""), (ROWS, HOISTED)]}

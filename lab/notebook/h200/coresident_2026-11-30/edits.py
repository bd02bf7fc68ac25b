"""The chain kernel's edit for ``python -m lab.coresident_ab`` (written in the nineteenth session
after its device time ran out; not run): GDN_OVERLAP 2, the prep kernel on the same SMs as a
multi-wave solo chain.

* The solo form may wait for the prep's flags: warp 0 acquires chunk j's flag before it copies
  chunk j's chain inputs (the prologue's chunks 0 and 1, then chunk jc + 2 after chunk jc); the
  outputs' inputs of a chunk (q, the M^T rows, by thread 0 of warp 0) follow its chain inputs'
  flag, already acquired by that thread.
* GDN_OVERLAP 2: the flags and the prep's count are cleared by the host before either kernel
  (a CTA of a later wave would clear flags the prep had already set), not by the chain's CTAs.
"""
EDITS = {"cores": [
    ("""#if GDN_OVERLAP && (GDN_SEG || GDN_SOLO)
#error "GDN_OVERLAP: the 185 KB form of one segment only"
#endif""", """#if GDN_OVERLAP && GDN_SEG
#error "GDN_OVERLAP: one segment only"
#endif"""),
    ("""    const long long slot0 = bos / C_ + i_n;
    for (long long j = tid; j < n_chunks; j += NTHR) p.flags[(slot0 + j) * HV + i_hv] = 0;
    if (blockIdx.x == 0 && tid == 0) p.flags[(p.T_all / C_ + p.N) * HV] = 0;
    __threadfence();""", """    const long long slot0 = bos / C_ + i_n;
#if GDN_OVERLAP == 1
    for (long long j = tid; j < n_chunks; j += NTHR) p.flags[(slot0 + j) * HV + i_hv] = 0;
    if (blockIdx.x == 0 && tid == 0) p.flags[(p.T_all / C_ + p.N) * HV] = 0;
    __threadfence();
#endif"""),
    ("""    for (int j = 0; j < 2; ++j)
        if (w == 0 && j < n_chunks)
            load_chain_in(sm.st[j], p, smem_u32(&sm.full[j]), c0 + j * C_, eos - c0 - j * C_, i_h,
                          i_hv, row0, ident, lane, 0);""", """    for (int j = 0; j < 2; ++j)
        if (w == 0 && j < n_chunks) {
#if GDN_OVERLAP
            wait_flag(p.flags + (slot0 + j) * HV + i_hv, lane);
#endif
            load_chain_in(sm.st[j], p, smem_u32(&sm.full[j]), c0 + j * C_, eos - c0 - j * C_, i_h,
                          i_hv, row0, ident, lane, 0);
        }"""),
    ("""        if (w == 0 && jc + 2 < n_chunks)
            load_chain_in(sm.st[s], p, smem_u32(&sm.full[s]), c0 + (jc + 2) * C_,
                          eos - c0 - (jc + 2) * C_, i_h, i_hv, row0, ident, lane, 0);""",
     """        if (w == 0 && jc + 2 < n_chunks) {
#if GDN_OVERLAP
            wait_flag(p.flags + (slot0 + jc + 2) * HV + i_hv, lane);
#endif
            load_chain_in(sm.st[s], p, smem_u32(&sm.full[s]), c0 + (jc + 2) * C_,
                          eos - c0 - (jc + 2) * C_, i_h, i_hv, row0, ident, lane, 0);
        }"""),
]}

"""Probes of the solo chain's memory traffic (``python -m lab.chain_ab --solo --edits`` this
file ``--variants solo_q_once,solo_k_half,solo_both``): the same products on fewer copies, the
outputs wrong.  "solo_q_once": q and the M^T rows copied for a CTA's first chunk only (the
later chunks' barrier phases completed by a plain arrival), -24 KB of a chunk's 57; "solo_k_half":
k copied only where the chunk's first token is < 128 within each 256 (half the chunks of the
8x1024 and 16x256 mixes), -8 KB; "solo_both": both."""
Q_OLD = """            if (tid == 0 && jc + 1 < n_chunks)
                load_out_in(sm.os, p, smem_u32(&sm.qfull), (int)(c0 + (jc + 1) * C_), i_h, i_hv,
                            true);"""
Q_NEW = """            if (tid == 0 && jc + 1 < n_chunks) bar_arrive(&sm.qfull);"""
K_OLD = """        arrive_expect(full, (ident ? 3 : 4) * BOX * 2 + extra);
        const int t = (int)t0;
        tma3(st.k, p.tk, 0, i_h, t, full);
        tma3(st.k + BOX, p.tk, 64, i_h, t, full);"""
K_NEW = """        const bool kk = (t0 % 256) < 128;
        arrive_expect(full, ((ident ? 1 : 2) + (kk ? 2 : 0)) * BOX * 2 + extra);
        const int t = (int)t0;
        if (kk) tma3(st.k, p.tk, 0, i_h, t, full);
        if (kk) tma3(st.k + BOX, p.tk, 64, i_h, t, full);"""
EDITS = {
    "solo_q_once": [(Q_OLD, Q_NEW)],
    "solo_k_half": [(K_OLD, K_NEW)],
    "solo_both": [(Q_OLD, Q_NEW), (K_OLD, K_NEW)],
}

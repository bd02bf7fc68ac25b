"""Orders of the solo form's products (``python -m lab.chain_ab --solo --edits`` this file
``--variants solo_late_y``; variants named solo* launch the solo form): "solo_late_y" issues
Y = S0 q^T after the update of S, so the chain's three products never queue behind the outputs'
(the product's solo form issues Y beside X)."""
OLD = """        if (!GDN_NO_OUT) {
            wait_bar(smem_u32(&sm.qfull), (unsigned)(jc & 1));
            wg_fence();                         // (a branch since the fence before X)
#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sa[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), k);
            wg_commit();
        }
        wg_wait<GDN_NO_OUT ? 0 : 1>();         // X (Y may still run)
        pin(X);
        form_r(X, st.v, st.f[0], st.f[1], r0, t4);
        unsigned ra[4][4];
        issue_vp(X, ra, st.t);                  // V'^T = R T^T (into X's registers)
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // Y (V'^T may still run)
            pin(Y);
            scale_tokens(Y, st.f[2], t4);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, ra[k], desc(sm.os.m, 2048 * k, 8192), 1);
            wg_commit();
        }
        wg_wait<GDN_NO_OUT ? 0 : 1>();         // V'^T (R M^T may still run)
        pin(X);
        issue_update(S, X, st, t4);
        if (!GDN_NO_OUT) {
            wg_wait<1>();                       // R M^T (the update may still run)
            pin(Y);
"""
NEW = """        wg_wait<0>();
        pin(X);
        form_r(X, st.v, st.f[0], st.f[1], r0, t4);
        unsigned ra[4][4];
        issue_vp(X, ra, st.t);
        wg_wait<0>();
        pin(X);
        issue_update(S, X, st, t4);
        if (!GDN_NO_OUT) {
            wait_bar(smem_u32(&sm.qfull), (unsigned)(jc & 1));
            wg_fence();
#pragma unroll
            for (int k = 0; k < 8; ++k)
                mma64rs<0>(Y, sa[k], desc(sm.os.q + (k >> 2) * BOX, 32 * (k & 3), 16), k);
            wg_commit();
            wg_wait<0>();
            pin(Y);
            pin(S);
            scale_tokens(Y, st.f[2], t4);
            wg_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) mma64rs<1>(Y, ra[k], desc(sm.os.m, 2048 * k, 8192), 1);
            wg_commit();
            wg_wait<0>();
            pin(Y);
"""
EDITS = {"solo_late_y": [(OLD, NEW)]}

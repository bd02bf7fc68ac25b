"""An edit of cuda-chunk's prep kernel, written without a GPU (2026-11-30, twenty-third
session) for the next A/B; it compiles for sm_90a and sm_80 with 128 registers and no spills
(``python -m lab.prep_wgmma_edits``: ptxas's registers and spills, the SASS's opcode counts).  On a GPU:

    python -m lab.prep_ab --rev '' --edits lab/prep_wgmma_edits.py --precision bf16 \
        --variants wgmma,wgmma+bf16mma --cells 16/32:8x1024,16/64:16x256,16/48:16x256,4/8:1x8192
    (the same with --errors for the whole call's errors against float64)

    wgmma  q and k staged as no-swizzle core-matrix tiles ([64, 128] bf16: core (r / 8, c / 8)
           at (r / 8) 2048 + (c / 8) 128 bytes, rows of 16 bytes), and k k^T and q k^T as two
           warpgroup MMAs (m64n64k16, both operands by descriptor, 8 k-steps each) on cc 9.0
           (which backends/_cuda_build.py always builds as sm_90a: a plain sm_90 build fails loudly)
           instead of 160 mma.sync and 48 ldmatrix a warp; k's norms from k k^T's diagonal
           blocks, q's from q q^T's by mma.sync as before, issued while the warpgroup MMAs run.
           Elsewhere (no sm_90a) the same tiles by ldmatrix and mma.sync.
(T's blocks below the diagonal by halves, the other idea staged first, is the block-inverse
form prep_cuts measured and dropped: lab/notebook/h200/prep_cuts_2026-11-30/, "blkinv".)
It is not expected to write the tree's workspace bit for bit (other sums' order); prep_ab
prints the largest difference.
"""
from __future__ import annotations

_STRUCT_OLD = "        struct { bf16_t q[C_][KP]; bf16_t k[C_][KP]; } in;\n"
_STRUCT_NEW = ("        struct { bf16_t q[C_ * K_]; bf16_t k[C_ * K_]; } in;   "
               "// core-matrix tiles (cm)\n")

_HELPERS_OLD = """__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
"""
_HELPERS_NEW = """#include "wgmma.cuh"                  // smem_u32, the warpgroup MMA wrappers
// byte offset of (row r, column c; c a multiple of 8) in a [64, 128] bf16 no-swizzle tile:
// core matrix (r / 8, c / 8) at (r / 8) 2048 + (c / 8) 128 bytes, its rows 16 bytes apart
__device__ __forceinline__ int cm(int r, int c) {
    return (r >> 3) * 2048 + (c >> 3) * 128 + (r & 7) * 16;
}
"""

_COPY_OLD = """        cp16(&sm.u.in.q[r][c], p.q + t * p.sq_t + i_h * p.sq_h + c, ok);
        cp16(&sm.u.in.k[r][c], p.k + t * p.sk_t + i_h * p.sk_h + c, ok);
"""
_COPY_NEW = """        cp16(reinterpret_cast<unsigned char*>(sm.u.in.q) + cm(r, c),
             p.q + t * p.sq_t + i_h * p.sq_h + c, ok);
        cp16(reinterpret_cast<unsigned char*>(sm.u.in.k) + cm(r, c),
             p.k + t * p.sk_t + i_h * p.sk_h + c, ok);
"""

_PRODUCTS_OLD = """    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    // k k^T and q k^T, rows [16 w, 16 w + 16), all 64 columns; q q^T's diagonal block
    const int a_r = (lane & 7) + 8 * ((lane >> 3) & 1), a_c = 8 * (lane >> 4);
    const int b_r = (lane & 7) + 8 * (lane >> 4), b_c = 8 * ((lane >> 3) & 1);
    float KK[8][4] = {}, QK[8][4] = {}, QQ[2][4] = {}, KD[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < K_ / 16; ++ks) {
        unsigned ak[4], aq[4], bq[4], bd[4];
        ldm4(ak, &sm.u.in.k[16 * w + a_r][ks * 16 + a_c]);
        ldm4(aq, &sm.u.in.q[16 * w + a_r][ks * 16 + a_c]);
        ldm4(bq, &sm.u.in.q[16 * w + b_r][ks * 16 + b_c]);
        ldm4(bd, &sm.u.in.k[16 * w + b_r][ks * 16 + b_c]);
        mma(QQ[0], aq, bq[0], bq[1]);
        mma(QQ[1], aq, bq[2], bq[3]);
        mma(KD[0], ak, bd[0], bd[1]);
        mma(KD[1], ak, bd[2], bd[3]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            unsigned bk[4];
            ldm4(bk, &sm.u.in.k[16 * np + b_r][ks * 16 + b_c]);
            mma(KK[2 * np], ak, bk[0], bk[1]);
            mma(KK[2 * np + 1], ak, bk[2], bk[3]);
            mma(QK[2 * np], aq, bk[0], bk[1]);
            mma(QK[2 * np + 1], aq, bk[2], bk[3]);
        }
    }
"""
_PRODUCTS_NEW = """    asm volatile("cp.async.wait_all;" ::: "memory");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900   // built as sm_90a
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // for the warpgroup MMAs
#endif
    __syncthreads();
    // k k^T and q k^T, rows [16 w, 16 w + 16), all 64 columns; q q^T's diagonal block
    const int a_r = (lane & 7) + 8 * ((lane >> 3) & 1), a_c = 8 * (lane >> 4);
    const int b_r = (lane & 7) + 8 * (lane >> 4), b_c = 8 * ((lane >> 3) & 1);
    const unsigned char* qt = reinterpret_cast<const unsigned char*>(sm.u.in.q);
    const unsigned char* kt = reinterpret_cast<const unsigned char*>(sm.u.in.k);
    float KK[8][4] = {}, QK[8][4] = {}, QQ[2][4] = {}, KD[2][4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900   // built as sm_90a
    {   // the warpgroup's two products (the accumulators' layout is mma.sync's: warp w's rows
        // 16 w + g and + 8, n-tile j in registers 4 j .. 4 j + 3)
        float (&kk)[32] = reinterpret_cast<float (&)[32]>(KK);
        float (&qk)[32] = reinterpret_cast<float (&)[32]>(QK);
        wg_fence();
#pragma unroll
        for (int s = 0; s < K_ / 16; ++s)
            mma64ss<0>(kk, wg_desc(smem_u32(kt) + 256 * s, 128, 2048, 0),
                       wg_desc(smem_u32(kt) + 256 * s, 128, 2048, 0), s);
#pragma unroll
        for (int s = 0; s < K_ / 16; ++s)
            mma64ss<0>(qk, wg_desc(smem_u32(qt) + 256 * s, 128, 2048, 0),
                       wg_desc(smem_u32(kt) + 256 * s, 128, 2048, 0), s);
        wg_commit();
#pragma unroll
        for (int ks = 0; ks < K_ / 16; ++ks) {      // q q^T's diagonal block meanwhile
            unsigned aq[4], bq[4];
            ldm4(aq, reinterpret_cast<const bf16_t*>(qt + cm(16 * w + a_r, ks * 16 + a_c)));
            ldm4(bq, reinterpret_cast<const bf16_t*>(qt + cm(16 * w + b_r, ks * 16 + b_c)));
            mma(QQ[0], aq, bq[0], bq[1]);
            mma(QQ[1], aq, bq[2], bq[3]);
        }
        wg_wait<0>();
        pin(kk);
        pin(qk);
    }
#else
#pragma unroll
    for (int ks = 0; ks < K_ / 16; ++ks) {
        unsigned ak[4], aq[4], bq[4];
        ldm4(ak, reinterpret_cast<const bf16_t*>(kt + cm(16 * w + a_r, ks * 16 + a_c)));
        ldm4(aq, reinterpret_cast<const bf16_t*>(qt + cm(16 * w + a_r, ks * 16 + a_c)));
        ldm4(bq, reinterpret_cast<const bf16_t*>(qt + cm(16 * w + b_r, ks * 16 + b_c)));
        mma(QQ[0], aq, bq[0], bq[1]);
        mma(QQ[1], aq, bq[2], bq[3]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            unsigned bk[4];
            ldm4(bk, reinterpret_cast<const bf16_t*>(kt + cm(16 * np + b_r, ks * 16 + b_c)));
            mma(KK[2 * np], ak, bk[0], bk[1]);
            mma(KK[2 * np + 1], ak, bk[2], bk[3]);
            mma(QK[2 * np], aq, bk[0], bk[1]);
            mma(QK[2 * np + 1], aq, bk[2], bk[3]);
        }
    }
#endif
    // k k^T's diagonal block of the warp's rows: its n-tiles 2 w and 2 w + 1
#pragma unroll
    for (int ww = 0; ww < 4; ++ww)
        if (w == ww)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) KD[h][e] = KK[2 * ww + h][e];
"""

EDITS = {"wgmma": [(_STRUCT_OLD, _STRUCT_NEW), (_HELPERS_OLD, _HELPERS_NEW),
                   (_COPY_OLD, _COPY_NEW), (_PRODUCTS_OLD, _PRODUCTS_NEW)]}


def main():
    """The edited kernel and the tree's, built as the product builds them for cc 9.0 (sm_90a) and
    8.0 (``_cuda_build.nvcc_args``): registers and spills (ptxas); at 9.0 the SASS opcode counts
    (``lab.sass_lines.per_line``)."""
    import re
    import subprocess
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gdnzoo.backends import _cuda_build as cb
    from lab.sass_lines import per_line
    from lab.source_edits import edited
    tree = Path(__file__).resolve().parents[1] / "backends" / "cuda_chunk_prep.cu"
    for name, src in (("tree", tree), ("wgmma", edited(tree, EDITS, "wgmma"))):
        for cc in ((9, 0), (8, 0)):
            defs = tuple(dict(GDN_GATES=0, GDN_A_DT=1, GDN_B_DT=1, GDN_ALOG_DT=0, GDN_DTB_DT=0,
                              GDN_NEG=0, GDN_PDL=int(cc >= (9, 0)), GDN_STORE3=0, GDN_HEADS=1,
                              GDN_MIN_CTAS=4, GDN_FLAGS=0).items())
            ptxas = subprocess.run(["nvcc", *cb.nvcc_args(defs, cc), "-Xptxas", "-v",
                                    "-diag-suppress", "177", "--cubin", "-o", "/dev/null",
                                    str(src)], capture_output=True, text=True).stderr
            regs = re.findall(r"Used (\d+) registers", ptxas)
            spills = re.findall(r"(\d+) bytes spill stores", ptxas)
            line = f"{name:6s} cc {cc[0]}.{cc[1]}: registers {regs} spill stores {spills}"
            if cc == (9, 0):                      # per_line builds for sm_90a
                ops = {}
                for (_, op), n in per_line(src, defs).items():
                    ops[op] = ops.get(op, 0) + n
                line += ", " + ", ".join(f"{op} {ops.get(op, 0)}" for op in ("HGMMA", "HMMA",
                                                                               "LDSM"))
                line += f", instructions {sum(ops.values())}"
            print(line)


if __name__ == "__main__":
    main()

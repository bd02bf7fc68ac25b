"""Does cuda-chunk-bf16's chain wait on dependent warpgroup MMAs?  Variants of
``backends/cuda_chunk_chain.cu`` (copies made here, in a temporary folder) whose chain products
accumulate into two independent accumulators, summed after, instead of one:

    X      X = S0 k^T: k-steps 0..3 and 4..7 (+32 registers)
    V      V'^T = R T^T: k-steps 0, 1 and 2, 3 (+32 registers)
    U      S = e^G_last S + va k: k-steps 0, 1 into S and 2, 3 into a fresh tile (+64)

Each variant's errors against float64 beside the product's (the sums' order changes, so not
bit-identical), then each chain kernel alone (torch.profiler medians), with and without the
outputs warpgroup.  Every variant was slower (``session.log``, section 4).  As it was run, on
an sm_90 GPU with cupy, from the repository root (tree of 2026-11-30):

    python lab/notebook/h200/lookahead_2026-11-30/chain_split.py --variants X,V,U,X+V,X+V+U \
        --cells 4/8:1x8192,16/32:8x1024
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import triton_chunk as tc
from lab.prefill_gpu import make, oracle
from lab.wgmma_chain import config, medians, parse, rel, workspace

X_OLD = """        float X[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 8; ++k)
            mma64rs<0>(X, sa[k], desc(st.k + (k >> 2) * BOX, 32 * (k & 3), 16), k);
        wg_commit();"""
X_NEW = """        float X[32], X2[32];
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            mma64rs<0>(X, sa[k], desc(st.k, 32 * k, 16), k);
            mma64rs<0>(X2, sa[k + 4], desc(st.k + BOX, 32 * k, 16), k);
        }
        wg_commit();"""
X_WAIT_OLD = """        wg_wait<0>();
        pin(X);
        form_r("""
X_WAIT_NEW = """        wg_wait<0>();
        pin(X);
        pin(X2);
#pragma unroll
        for (int i = 0; i < 32; ++i) X[i] += X2[i];
        form_r("""
V_OLD = """    wg_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) mma64rs<1>(X, ra[k], desc(t, 2048 * k, 8192), k);
    wg_commit();
}"""
V_NEW = """    wg_fence();
    mma64rs<1>(X, ra[0], desc(t, 0, 8192), 0);
    mma64rs<1>(X2, ra[2], desc(t, 4096, 8192), 0);
    mma64rs<1>(X, ra[1], desc(t, 2048, 8192), 1);
    mma64rs<1>(X2, ra[3], desc(t, 6144, 8192), 1);
    wg_commit();
}"""
V_SIG_OLD = ("__device__ __forceinline__ void issue_vp(float (&X)[32], unsigned (&ra)[4][4], "
             "const bf16_t* t) {")
V_SIG_NEW = ("__device__ __forceinline__ void issue_vp(float (&X)[32], unsigned (&ra)[4][4], "
             "const bf16_t* t, float (&X2)[32]) {")
V_CALL_OLD = """        unsigned ra[4][4];
        issue_vp(X, ra, st.t);                  // V'^T = R T^T (into X's registers)"""
V_CALL_NEW = """        unsigned ra[4][4];
        float V2[32];
        issue_vp(X, ra, st.t, V2);              // V'^T = R T^T (into X's registers)"""
V_WAIT_OLD = """        wg_wait<0>();
        pin(X);
        scale_tokens(X, st.f[3], t4);"""
V_WAIT_NEW = """        wg_wait<0>();
        pin(X);
        pin(V2);
#pragma unroll
        for (int i = 0; i < 32; ++i) X[i] += V2[i];
        scale_tokens(X, st.f[3], t4);"""
U_OLD = """        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) mma128rs<1>(S, va[k], desc(st.k, 2048 * k, 8192), 1);
        wg_commit();
        wg_wait<0>();
        pin(S);"""
U_NEW = """        float U[64];
        wg_fence();
        mma128rs<1>(S, va[0], desc(st.k, 0, 8192), 1);
        mma128rs<1>(U, va[2], desc(st.k, 4096, 8192), 0);
        mma128rs<1>(S, va[1], desc(st.k, 2048, 8192), 1);
        mma128rs<1>(U, va[3], desc(st.k, 6144, 8192), 1);
        wg_commit();
        wg_wait<0>();
        pin(S);
        pin(U);
#pragma unroll
        for (int i = 0; i < 64; ++i) S[i] += U[i];"""
EDITS = {"X": [(X_OLD, X_NEW), (X_WAIT_OLD, X_WAIT_NEW)],
         "V": [(V_OLD, V_NEW), (V_SIG_OLD, V_SIG_NEW), (V_CALL_OLD, V_CALL_NEW),
               (V_WAIT_OLD, V_WAIT_NEW)],
         "U": [(U_OLD, U_NEW)]}


def variant_source(name: str) -> Path:
    """The product source with the edits of ``name`` ("X+V": both)."""
    text = chain.SOURCE.read_text()
    for part in name.split("+"):
        for old, new in EDITS[part]:
            if text.count(old) != 1:
                raise SystemExit(f"variant {part}: its anchor is not in the source once: the "
                                 "kernel changed")
            text = text.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"chain_{name.replace('+', '_')}.cu"
    path.write_text(text)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="4/8:1x8192,16/32:8x1024")
    ap.add_argument("--variants", default="X,V,U,X+V,X+V+U")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    product = chain.SOURCE
    sources = {"product": product, **{v: variant_source(v) for v in a.variants.split(",")}}
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        ws, mats, vecs = workspace(x, config(x))
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True,
                  config=dict(precision="bf16", prep="cuda", chain="cuda", segments=1),
                  workspace=ws)
        o64, s64 = oracle(x, True)
        out, ns = torch.empty_like(x["out"]), torch.empty_like(x["new_state"])
        args = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)
        calls = {}
        for name, src in sources.items():
            chain.SOURCE = src
            out.fill_(float("nan"))
            ns.fill_(float("nan"))
            chain.launch(*args)
            torch.cuda.synchronize()
            print(f"{cell:14s} {name:8s} out {rel(out, o64):.3e} state {rel(ns, s64):.3e} | "
                  f"apart from the product: out {rel(out, x['out']):.2e} state "
                  f"{rel(ns, x['new_state']):.2e} | nan "
                  f"{int(out.isnan().sum() + ns.isnan().sum())}", flush=True)
            for no_out in (False, True):
                def call(s=src, o=no_out):
                    chain.SOURCE = s
                    chain.launch(*args, no_out=o)
                calls[f"{name}{' no-out' if no_out else ''}"] = call
        t = medians(calls, a.reps)
        chain.SOURCE = product
        print(f"{cell:14s} chain alone (us): " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)


if __name__ == "__main__":
    main()

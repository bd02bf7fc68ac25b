"""The lookahead chain prototype (``lookahead_chain.cu`` beside this file; correct, slower: see
``session.log``) beside cuda-chunk-bf16's chain on one workspace (cuda-chunk's prep, "bf16"):
errors of each against float64 (outputs and final states), their difference, and each chain
kernel alone (torch.profiler records, medians); ``--variants`` picks the prototype's define sets,
``--marks`` prints one variant's clock64 marks.  Dense calls, one state per sequence.  As it was
run, on an sm_90 GPU with cupy, from the repository root (tree of 2026-11-30):

    python lab/notebook/h200/lookahead_2026-11-30/lookahead_chain.py --variants base,S0X2 \
        --marks base --cells 4/8:1x8192,16/32:8x1024

The kernel source is the product chain's source followed by the prototype's (its ``#include``
of it dropped), written to a temporary file, so the compile cache sees both.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from lab.clock_marks import clear, read_u64
from lab.harness import profiled
from lab.prefill_gpu import make, oracle
from lab.wgmma_chain import config, parse, workspace

LAB = Path(__file__).with_name("lookahead_chain.cu")
NAME = "gdn_lookahead_chain"
THREADS = 384
SMEM = 232448          # the opt-in limit, >= sizeof(LaSmem) of every variant (static_assert)
VARIANTS = {"base": (), "S0X2": (("LA_S0X2", 1),), "BCHAIN": (("LA_BCHAIN", 1),),
            "S0X2+BCHAIN": (("LA_S0X2", 1), ("LA_BCHAIN", 1)),
            "S0X2+BCHAIN+NO_OUT": (("LA_S0X2", 1), ("LA_BCHAIN", 1), ("LA_NO_OUT", 1))}
CTAS, CHUNKS = 512, 128         # the marks' CTAs and chunks (LA_MARKS)
# the marks' slots: (warpgroup, slot, what it follows)
MARKS = [("state", 0, "chunk c begins"), ("state", 1, "S0 handover free"),
         ("state", 2, "Xpre_c+1 = S0 k^T done"), ("state", 3, "Xpre_c+1 handed over"),
         ("state", 4, "va_c arrived"), ("state", 5, "update done"),
         ("chain", 6, "Xpre_c arrived"), ("chain", 7, "B_c-1 arrived"),
         ("chain", 8, "correction done"), ("chain", 9, "inputs arrived"),
         ("chain", 10, "R handover free"), ("chain", 11, "V'^T done"),
         ("chain", 12, "va handed over"), ("outputs", 13, "chunk c begins"),
         ("outputs", 14, "B_c done"), ("outputs", 15, "B handover free"),
         ("outputs", 16, "S0 arrived"), ("outputs", 17, "Y done"), ("outputs", 18, "R arrived"),
         ("outputs", 19, "R M^T done"), ("outputs", 21, "loads issued (warp 0)"),
         ("outputs", 20, "stored (warp 0)"), ("outputs", 22, "loads issued (warp 1)"),
         ("outputs", 23, "stored (warp 1)")]


def source() -> Path:
    text = chain.SOURCE.read_text() + "\n" + "\n".join(
        line for line in LAB.read_text().split("\n")
        if line.strip() != '#include "cuda_chunk_chain.cu"')
    path = Path(tempfile.mkdtemp()) / "lookahead_chain_full.cu"
    path.write_text(text)
    return path


def launch(src, q, k, v, cu, mats, vecs, out, state, new_state, extra=()):
    """The prototype on the workspace: dense, ``state`` [N, HV, V, K] (or None: zeros);
    ``extra``: the variant's defines.  Returns the compiled kernel."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    dev = q.device.index or 0
    _, idx, new_idx, init, st, ss = tlaunch.chain_slots(cu, state, new_state, None, None, None,
                                                        False)
    code = cuda_build.DTYPE_CODE
    defs = (("GDN_SMEM", chain.SMEM), ("LA_SMEM", SMEM), ("GDN_STATE0", int(state is not None)),
            ("GDN_S_DT", code[st.dtype]), ("GDN_NS_DT", code[new_state.dtype]),
            ("GDN_CU64", int(cu.dtype == torch.int64))) + tuple(extra)
    kern = cuda_build.get_kernel(src, NAME, defs, dev, SMEM)
    func = kern.func
    body = chain.tensor_maps(q, k, v, mats, out) + chain.PARAMS.pack(
        cu.data_ptr(), vecs.data_ptr(), out.data_ptr(), st.data_ptr(), new_state.data_ptr(),
        idx.data_ptr(), new_idx.data_ptr(), init.data_ptr(), new_state.data_ptr(), N, T,
        out.stride(0), out.stride(1), H, HV, V, *ss, *tlaunch.state_strides(new_state, False),
        *tlaunch.state_strides(new_state, False), st.shape[0], new_state.shape[0], -1, 1)
    params = ctypes.create_string_buffer(body + bytes(-len(body) % 64))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    cuda_build.launch_raw(func, N * HV * (V // chain.ROWS), THREADS, dev,
                          ctypes.addressof(argv), SMEM)
    return kern


def marks(src, args, variant, chunks):
    """Each mark's mean cycles after the chain's "Xpre_c arrived" of the same chunk, over every
    chunk but a CTA's first two and last (CTAs with at least five chunks), and the period."""
    extra = VARIANTS[variant] + (("LA_MARKS", 1), ("LA_CTAS", CTAS), ("LA_CHUNKS", CHUNKS))
    kern = launch(src, *args, extra=extra)
    torch.cuda.synchronize()
    clear(kern.module, "la_marks")
    launch(src, *args, extra=extra)
    m = read_u64(kern.module, "la_marks").reshape(CTAS, CHUNKS, 24).astype(np.int64)
    rows = []
    for b in range(min(CTAS, len(chunks))):
        n = min(chunks[b], CHUNKS)
        if n >= 5:
            rows.append(m[b, 2:n - 1] - m[b, 2:n - 1, 6:7])
            rows.append(np.diff(m[b, 1:n - 1, 6])[:, None] * np.ones((1, 24), np.int64))
    mid = np.concatenate(rows[0::2])
    period = float(np.concatenate(rows[1::2])[:, 0].mean())
    print(f"  marks ({variant}, {len(mid)} chunks): period {period:.0f} cycles; each mark after "
          "the chain's Xpre_c arrived:")
    for who, k, what in MARKS:
        print(f"    {who:8s} {k:2d} {what:28s} {mid[:, k].mean():8.0f}")


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="2/4:1000+64+0+130+7,4/8:1x8192,16/32:8x1024,16/32:1x8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="base", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--marks", default="", help="a variant whose clock64 marks to print")
    a = ap.parse_args()
    src = source()
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        cfg = config(x)
        ws, mats, vecs = workspace(x, cfg)
        # the product's call fills the workspace and gives its chain's outputs and states
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True,
                  config=dict(precision="bf16", prep="cuda", chain="cuda", segments=1),
                  workspace=ws)
        o64, s64 = oracle(x, True)
        print(f"{cell:22s} product:     out {rel(x['out'], o64):.3e} state "
              f"{rel(x['new_state'], s64):.3e}", flush=True)
        out = torch.empty_like(x["out"])
        ns = torch.empty_like(x["new_state"])
        args = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)
        for var in a.variants.split(","):
            out.fill_(float("nan"))
            ns.fill_(float("nan"))
            launch(src, *args, extra=VARIANTS[var])
            torch.cuda.synchronize()
            print(f"{cell:22s} {var:12s} out {rel(out, o64):.3e} state {rel(ns, s64):.3e} | "
                  f"apart from the product: out {rel(out, x['out']):.2e} state "
                  f"{rel(ns, x['new_state']):.2e} | nan "
                  f"{int(out.isnan().sum() + ns.isnan().sum())}", flush=True)
        if sum(lens) < 4096:
            continue
        ns2 = torch.empty_like(ns)
        calls = {"product": lambda: chain.launch(x["q"], x["k"], x["v"], x["cu"], mats, vecs,
                                                 out, x["state"], ns2)}
        for var in a.variants.split(","):
            calls[var] = lambda e=VARIANTS[var]: launch(src, *args, extra=e)
        t = {n: statistics.median([v for vs in profiled(c, a.reps).values() for v in vs])
             for n, c in calls.items()}
        print(f"{cell:22s} chain alone (us): " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)
        if a.marks:
            per_cta = HV * (x["v"].shape[2] // chain.ROWS)
            marks(src, args, a.marks, [-(-lens[b // per_cta] // 64)
                                       for b in range(len(lens) * per_cta)])

if __name__ == "__main__":
    main()

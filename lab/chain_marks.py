"""Where a chunk's time goes in cuda-chunk-bf16's chain kernel: a copy of
``backends/cuda_chunk_chain.cu`` whose chain warpgroup (thread 0) and outputs warpgroup
(thread 128) write clock64 marks at each step of every chunk (the first 64 chunks of the first
1024 CTAs; the copy is made here, in a temporary folder), launched once per cell after a warm
launch.  Prints each step's mean cycles over every chunk but a CTA's first (it fills the
pipeline) and last; then a CTA's life: entry to the state in registers, the chunk
loop, the outputs' tail after it, and the SMs' idle time between one CTA's end and the next
one's start (``%globaltimer``, ns).  The marks change the code a little: a breakdown, not a timing.  On an H100/H200
with cupy:

    python -m lab.chain_marks --cells 16/32:8x1024,4/8:1x8192
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _cuda_chunk_chain as chain    # noqa: E402
from gdnzoo.backends import triton_chunk as tc            # noqa: E402
from lab.clock_marks import clear, read_u64                      # noqa: E402
from lab.wgmma_chain import config, make, parse, workspace  # noqa: E402

CTAS, CHUNKS, SLOTS = 1024, 64, 10
MARK = (f"__device__ unsigned long long gdn_marks[{CTAS * CHUNKS * SLOTS}];\n"
        "#define GDN_MARK(who, k) do { if (tid == (who) && blockIdx.x < " f"{CTAS}"
        f" && jc < {CHUNKS}) gdn_marks[(blockIdx.x * {CHUNKS} + jc) * {SLOTS} + (k)] = "
        "clock64(); } while (0)\n"
        # a CTA's life: clock64 at entry, state loaded, chain loop done, outputs done; then
        # the globaltimer at entry and at the outputs' end, the SM, the chunks
        f"__device__ unsigned long long gdn_cta[{CTAS * 8}];\n"
        "#define GDN_CMARK(who, k) do { if (tid == (who) && blockIdx.x < " f"{CTAS}"
        ") gdn_cta[blockIdx.x * 8 + (k)] = clock64(); } while (0)\n"
        "#define GDN_GMARK(who, k) do { if (tid == (who) && blockIdx.x < " f"{CTAS}"
        ") { unsigned long long t; unsigned sm_; asm volatile(\"mov.u64 %0, %%globaltimer;\" "
        ": \"=l\"(t)); asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(sm_)); "
        "gdn_cta[blockIdx.x * 8 + (k)] = t; gdn_cta[blockIdx.x * 8 + 6] = sm_; } } while (0)\n")
# (the line a mark follows, its indent telling the chain's loop (8) from the outputs' (12);
# the mark; which occurrence of the line, 0 the first)
ANCHORS = [
    ("        const int s = (int)(jc % STAGES), b = (int)(jc & 1);", "GDN_MARK(0, 0)", 0),
    ("        wait_bar(smem_u32(&sm.full[s]), (unsigned)((jc / STAGES) & 1));", "GDN_MARK(0, 1)", 0),
    ("        pin(X);", "GDN_MARK(0, 2)", 0),
    ("        pin(X);", "GDN_MARK(0, 3)", 1),
    ("        pin(S);", "GDN_MARK(0, 4)", 0),
    ("            const int s = (int)(jc % STAGES), b = (int)(jc & 1);", "GDN_MARK(128, 5)", 0),
    ("            wait_bar(smem_u32(&sm.hfull[b]), (unsigned)((jc >> 1) & 1));",
     "GDN_MARK(128, 6)", 0),
    ("            outputs_y(Y, hb.s0, st.q);", "GDN_MARK(128, 7)", 0),
    ("            outputs_rm(Y, hb.r, st.m);", "GDN_MARK(128, 8)", 0),
    ("    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w = (tid >> 5) & 3;",
     "GDN_CMARK(0, 0); GDN_GMARK(0, 4)", 0),
    ("    // this thread's words in the handover tiles: rows r0 (+ 8), columns 8 j + 2 t4 (+ 1)",
     "GDN_CMARK(0, 1)", 0),
    ("        if (ti == 0) asm volatile(\"cp.async.bulk.wait_group 0;\" ::: \"memory\");",
     "GDN_CMARK(128, 3); GDN_GMARK(128, 5); "
     "if (tid == 128 && blockIdx.x < " f"{CTAS}" ") gdn_cta[blockIdx.x * 8 + 7] = n_chunks", 0),
]
# marks that go before their line (a statement's own first line)
BEFORE = [("    if (wr)", "GDN_CMARK(0, 2)")]


def marked_source() -> Path:
    out, seen = [], {}
    for line in chain.SOURCE.read_text().split("\n"):
        out.append(line)
        if line.startswith('#include "wgmma.cuh"'):
            out.append(MARK)
        for anchor, mark in BEFORE:
            if line == anchor:
                out.insert(len(out) - 1, " " * 4 + mark + ";")
        n = seen.get(line, 0)
        for anchor, mark, occ in ANCHORS:
            if line == anchor and occ == n:
                out.append(" " * (len(line) - len(line.lstrip())) + mark + ";")
        seen[line] = n + 1
    missing = [m for a, m, *_ in ANCHORS + BEFORE if not any(m in x for x in out)]
    if missing:
        raise SystemExit(f"anchors not found for {missing}: the kernel changed")
    path = Path(tempfile.mkdtemp()) / "cuda_chunk_chain_marks.cu"
    path.write_text("\n".join(out))
    return path


STEPS = ("chain: wait inputs", "X = S0 k^T (+ S0 out)", "R, V' = R T^T", "S update",
         "to next chunk", "outputs: wait S0, R", "Y = S0 q^T", "O += R M^T",
         "store, to next")


def breakdown(m):
    """(CTAs counted, the mean period, each step's mean) from marks [CTAs, chunks, slots]: a
    chunk counts when it is neither a CTA's first nor its last (chunk 0 fills the pipeline;
    the last has no next), whatever the number of chunks each CTA ran."""
    has = m[:, :, 0] > 0
    use = has[:, :-1] & has[:, 1:]
    use[:, 0] = False
    cur, nxt = m[:, :-1][use], m[:, 1:][use]            # [chunks counted, slots]
    c, o = cur[:, :5], cur[:, 5:9]
    steps = [*np.diff(c, axis=1).mean(0), (nxt[:, 0] - c[:, 4]).mean(),
             *np.diff(o, axis=1).mean(0), (nxt[:, 5] - o[:, 3]).mean()]
    return int(use.any(1).sum()), float((nxt[:, 0] - c[:, 0]).mean()), steps


def cta_life(c):
    """A CTA's life from ``gdn_cta`` [CTAs, 8] (CTAs that marked every step): mean chunks, mean
    cycles from entry to the state in registers, of the chunk loop, of the outputs' tail after
    it and of the whole; the mean idle cycles of an SM between one CTA's outputs end and the next
    CTA's entry there (clock64 is the SM's); the kernel's span by the globaltimer (us)."""
    ran = c[(c[:, 0] > 0) & (c[:, 1] > 0) & (c[:, 2] > 0) & (c[:, 3] > 0)]
    gaps = []
    for sm in np.unique(ran[:, 6]):
        r = ran[ran[:, 6] == sm]
        r = r[np.argsort(r[:, 0])]
        gaps += list(r[1:, 0] - r[:-1, 3])
    return dict(ctas=len(ran), chunks=ran[:, 7].mean(), load=(ran[:, 1] - ran[:, 0]).mean(),
                loop=(ran[:, 2] - ran[:, 1]).mean(), tail=(ran[:, 3] - ran[:, 2]).mean(),
                span=(ran[:, 3] - ran[:, 0]).mean(), gap=float(np.mean(gaps)) if gaps else 0.0,
                wall=(ran[:, 5].max() - ran[:, 4].min()) / 1e3,
                per_sm=len(ran) / max(len(np.unique(ran[:, 6])), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="16/32:8x1024,4/8:1x8192")
    a = ap.parse_args()
    chain.SOURCE = marked_source()
    life = []
    print(f"{'cell':14s} {'CTAs':>5s} {'period':>7s} " + " ".join(f"{s:>12.12s}" for s in STEPS))
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        cfg = config(x)
        ws, mats, vecs = workspace(x, cfg)
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                  x["b"], x["cu"], None, x["out"], x["new_state"], True, config=cfg,
                  workspace=ws)
        args = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, x["out"], x["state"],
                x["new_state"])
        chain.launch(*args)                                # compiles, warms
        torch.cuda.synchronize()
        # the marked kernels compiled so far (one per define set): the call's is the one marked
        mods = [k.module for key, k in chain.cuda_build._kernels.items()
                if key[1] == str(chain.SOURCE)]
        for mod in mods:
            clear(mod, "gdn_marks")
            clear(mod, "gdn_cta")
        chain.launch(*args)
        mod = max(mods, key=lambda md: int((read_u64(md, "gdn_cta") > 0).sum()))
        m = read_u64(mod, "gdn_marks").reshape(CTAS, CHUNKS, SLOTS).astype(np.int64)
        ctas, period, steps = breakdown(m)
        print(f"{cell:14s} {ctas:5d} {period:7.0f} " + " ".join(f"{v:12.0f}" for v in steps),
              flush=True)
        life.append((cell, cta_life(read_u64(mod, "gdn_cta").reshape(CTAS, 8).astype(np.int64))))
    print(f"\n{'cell':14s} {'CTAs':>5s} {'a SM':>5s} {'chunks':>6s} {'to state':>9s} "
          f"{'loop':>8s} {'a chunk':>8s} {'tail':>7s} {'span':>8s} {'SM idle':>8s} {'wall us':>8s}")
    for cell, d in life:
        print(f"{cell:14s} {d['ctas']:5d} {d['per_sm']:5.1f} {d['chunks']:6.1f} {d['load']:9.0f} "
              f"{d['loop']:8.0f} {d['loop'] / max(d['chunks'], 1):8.0f} {d['tail']:7.0f} "
              f"{d['span']:8.0f} {d['gap']:8.0f} {d['wall']:8.1f}")


if __name__ == "__main__":
    main()

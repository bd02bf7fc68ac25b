"""Where triton-chunk's time goes, by ablation: each variant patches the kernel module's source
(timing only: most variants compute something else), and each of the two kernels is timed
alone (torch.profiler kernel records, median over --reps calls).  From the repository root:

    python -m lab.chunk_ablate                     # every variant at the default cells
    python -m lab.chunk_ablate --cells 4/8:1x8192 --variants base,prep_no_inverse
    git show HEAD~1:backends/_triton_chunk_kernel.py > /tmp/before.py
    CHUNK_BEFORE=/tmp/before.py python -m lab.chunk_ablate --variants before,base  # A/B

Prints one line per (cell, variant): prep and state kernel medians in us.
"""
from __future__ import annotations

import argparse
import os
import importlib.util
import statistics
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import triton_chunk as tc        # noqa: E402
from lab.harness import profiled                         # noqa: E402
from lab.prefill_gpu import make, oracle               # noqa: E402

KMOD = "gdnzoo.backends._triton_chunk_kernel"
SRC = (ROOT / "backends" / "_triton_chunk_kernel.py").read_text()

O = "o = mm(h, tl.trans(qr), PREC) * fq[None, :] + mm_split(R, m_hi, m_lo, PREC)"
X = "X = mm(h, tl.trans(kr), PREC)"
VN = "Vn = mm_split(R, t_hi, t_lo, PREC)"
UPD = "return g_last * h + mm(Vn * fk[None, :], kr, PREC)"
UPD_SUM = "return g_last * h + tl.sum(Vn * fk[None, :], 1)[:, None]"
# name -> (source substitutions, config overrides)
VARIANTS = {
    "base": ([], {}),
    "before": ([], dict(stages=2, v_ahead=0)),
    "before_stages3": ([], dict(stages=3, v_ahead=0)),
    "prep_no_inverse": ([("Tm = unit_lower_inverse(A, C, BS, PREC)", "Tm = A")], {}),
    "prep_no_merge": ([("for lvl in tl.static_range(MAX_MERGE_LEVELS):",
                        "for lvl in tl.static_range(0):")], {}),
    "prep_no_subst": ([("for s in tl.static_range(1, BS):", "for s in tl.static_range(1, 1):")],
                      {}),
    "prep_merge_bf16": ([("D = D - mm(mm(D, tl.where(below, A, 0.0), PREC), D, PREC)",
                          'D = D - mm(mm(D, tl.where(below, A, 0.0), "bf16"), D, "bf16")')], {}),
    "before_same": ([], {}),
    "base8": ([], dict(base=8)),
    "prep_no_M": ([("store_cc(pm + NP * C, tl.trans(mm(P, Tm, PREC)), m[:, None], C, STORE)",
                    "store_cc(pm + NP * C, tl.trans(P), m[:, None], C, STORE)")], {}),
    "base16": ([], dict(base=16)),
    "prep_w2": ([], dict(prep_warps=2)),
    "prep_w8": ([], dict(prep_warps=8)),
    "base32": ([], dict(base=32)),
    "state_no_out": ([("o = mm(h, tl.trans(qr), PREC) * fq[None, :] + mm_split(R, m_hi, m_lo, PREC)",
                       "o = R")], {}),
    "state_no_Mout": ([("o = mm(h, tl.trans(qr), PREC) * fq[None, :] + mm_split(R, m_hi, m_lo, PREC)",
                        "o = mm(h, tl.trans(qr), PREC) * fq[None, :]")], {}),
    "bf16": ([], dict(precision="bf16")),
    # The outputs' products at lower precision (the output is rounded to bf16 anyway).
    "out_bf16": ([(O, 'o = mm(h, tl.trans(qr), "bf16") * fq[None, :] + mm_split(R, m_hi, m_lo, "bf16")')], {}),
    "out_RM_bf16": ([(O, 'o = mm(h, tl.trans(qr), PREC) * fq[None, :] + mm_split(R, m_hi, m_lo, "bf16")')], {}),
    "out_hq_bf16": ([(O, 'o = mm(h, tl.trans(qr), "bf16") * fq[None, :] + mm_split(R, m_hi, m_lo, PREC)')], {}),
    "stages1": ([], dict(stages=1)),
    "stages3": ([], dict(stages=3)),
    "stages4": ([], dict(stages=4)),
    "warps4": ([], dict(warps=4)),
    # chunk j+1's v rows loaded during chunk j at any tile size (auto: block_v 16 only)
    "ahead": ([], dict(v_ahead=1, stages=3)),
    "ahead_s2": ([], dict(v_ahead=1, stages=2)),
    "bv16": ([], dict(block_v=16)),
    "bv16w4": ([], dict(block_v=16, warps=4)),
    "bv64w8": ([], dict(block_v=64, warps=8)),
    "bv64w4": ([], dict(block_v=64, warps=4)),
    # 8 warps at 32 rows: no spills under Triton 3.6 (4 warps: 136 B of stack; lab.chunk_resources)
    "bv32w8": ([], dict(block_v=32, warps=8)),
    "bv32w4": ([], dict(block_v=32, warps=4)),
    "bf16_bv32w4": ([], dict(precision="bf16", block_v=32, warps=4)),
    "bf16_bv32w8": ([], dict(precision="bf16", block_v=32, warps=8)),
    # one warpgroup of 64 rows: Triton emits warpgroup MMAs (28 HGMMA a chunk, no spills at
    # "bf16" under Triton 3.9; lab.chunk_resources)
    "bf16_bv16": ([], dict(precision="bf16", block_v=16)),
    "bf16_bv64w4": ([], dict(precision="bf16", block_v=64, warps=4)),
    "bf16_bv64w4s1": ([], dict(precision="bf16", block_v=64, warps=4, stages=1)),
    "bf16_bv64w4s3": ([], dict(precision="bf16", block_v=64, warps=4, stages=3)),
    "bf16_bv64w4_seg2": ([], dict(precision="bf16", block_v=64, warps=4, segments=2)),
    "bf16_bv64w4_seg4": ([], dict(precision="bf16", block_v=64, warps=4, segments=4)),
    "bf16_bv32w4_seg2": ([], dict(precision="bf16", block_v=32, warps=4, segments=2)),
    # each sequence in segments run side by side (4 warps: two programs an SM)
    "seg2": ([], dict(segments=2)),
    "seg2w4": ([], dict(segments=2, warps=4)),
    "seg2w4s2": ([], dict(segments=2, warps=4, stages=2, v_ahead=0)),
    "seg3w4": ([], dict(segments=3, warps=4)),
    "seg4w4": ([], dict(segments=4, warps=4)),
    # The state's chain alone (no outputs), one stage at a time taken out of it: where its
    # 2.5 us a chunk goes at one long sequence.
    "chain_no_T": ([(O, "o = R"), (VN, "Vn = R")], {}),
    "chain_no_X": ([(O, "o = R"), (X, "X = vt * 0.5")], {}),
    "chain_no_upd": ([(O, "o = R"), (UPD, UPD_SUM)], {}),
    "chain_upd_bf16": ([(O, "o = R"), (UPD, UPD.replace("PREC)", '"bf16")'))], {}),
    "chain_no_dots": ([(O, "o = R"), (VN, "Vn = R"), (X, "X = vt * 0.5"), (UPD, UPD_SUM)], {}),
}
CELLS = ["4/8:1x8192", "16/32:1x8192", "16/32:8x1024", "4/8:16x256", "16/64:8x1024"]


def load_variant(name, subs):
    # "before*": the kernel module as it was, from the file CHUNK_BEFORE names (e.g. made by
    # `git show HEAD:backends/_triton_chunk_kernel.py`), timed beside the current one.
    src = Path(os.environ["CHUNK_BEFORE"]).read_text() if name.startswith("before") else SRC
    for old, new in subs:
        if old not in src:
            raise SystemExit(f"patch target not found: {old!r}")
        src = src.replace(old, new)
    path = Path(f"/tmp/chunk_ablate_{name}.py")     # one file a variant: parallel warm runs
    path.write_text(src)
    sys.modules.pop("gdnzoo.backends._triton_chunk_cp", None)   # re-imported against it
    spec = importlib.util.spec_from_file_location(KMOD, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[KMOD] = mod
    spec.loader.exec_module(mod)


def kernel_medians(call, reps):
    by = {n: t for n, t in profiled(call, reps).items() if "chunk_" in n or "cp_" in n}
    med = {name: statistics.median(v) for name, v in by.items()}
    # "state": the sequential kernel, or the segmented form's three kernels summed
    return {"prep": sum(t for n, t in med.items() if "prep" in n),
            "state": sum(t for n, t in med.items() if "prep" not in n)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--errors", action="store_true",
                    help="also each variant's relative RMS error against a float64 oracle")
    args = ap.parse_args()
    for cell in args.cells.split(","):
        geom, mix = cell.split(":")
        H, HV = map(int, geom.split("/"))
        n, L = map(int, mix.split("x"))
        x = make([L] * n, H, HV, seed=0)
        ref = oracle(x, True) if args.errors else None
        for name in args.variants.split(","):
            subs, cfg = VARIANTS[name]
            load_variant(name, subs)

            def call():
                tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                          x["b"], x["cu"], None, x["out"], x["new_state"], True, config=cfg)
            t = kernel_medians(call, args.reps)
            err = ""
            if ref is not None:
                call()
                e = [float((got.double() - want).norm() / want.norm())
                     for got, want in ((x["out"], ref[0]), (x["new_state"], ref[1]))]
                err = f"   err out {e[0]:.3e} state {e[1]:.3e}"
            print(f"{cell:14s} {name:16s} prep {t.get('prep', 0):8.1f} us   "
                  f"state {t.get('state', 0):8.1f} us   sum {sum(t.values()):8.1f}{err}", flush=True)


if __name__ == "__main__":
    main()

"""cuda-chunk's "bf16x3" chain on warpgroup MMAs (chain "cuda", one CTA an SM) against
triton-chunk's Triton chain (chain "triton", segments as cuda-chunk picks them), both after the
CUDA prep on the same call: errors against float64, each kernel's median (torch.profiler) and
the call's sum; then what cuda-chunk's automatic config picks.  From the repository root, on an
sm_90 GPU with cupy:

    python lab/notebook/h200/chain_split_prec_2026-12-01/x3_rule.py 16/32:8x1024,4/8:1x8192
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import gdnzoo                                                         # noqa: E402
from gdnzoo.backends import _cuda_build, triton_chunk as tc           # noqa: E402
from lab.harness import profiled, rel                                 # noqa: E402
from lab.prefill_gpu import lens_of, make, oracle                     # noqa: E402

CELLS = ("4/8:1x8192,4/8:8x1024,4/8:16x256,4/8:64x64,4/8:ragged,16/32:1x8192,16/32:2x4096,"
         "16/32:8x1024,16/32:16x256,16/32:64x64,16/64:8x1024,16/48:1x8192,8/16:2x4096,2/8:8x1024")
n_sm = _cuda_build.sm_count(torch.device("cuda"))
for cell in (sys.argv[1] if len(sys.argv) > 1 else CELLS).split(","):
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    lens = lens_of(mix)
    x = make(lens, H, HV, seed=0)
    o64, s64 = oracle(x, True)
    T, N = x["q"].shape[0], len(lens)
    line = []
    for chain in ("triton", "cuda", None):
        cfg = None if chain is None else dict(precision="bf16x3", prep="cuda", chain=chain)

        def call(cfg=cfg):
            if cfg is None:                                   # the product call, automatic
                gdnzoo.prefill(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"],
                               x["dt_bias"], x["b"], x["cu"], out=x["out"],
                               new_state=x["new_state"], use_qk_l2norm=True, algo="cuda-chunk")
            else:
                tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                          x["b"], x["cu"], None, x["out"], x["new_state"], True, config=cfg)
        x["out"].fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        err = f"out {rel(x['out'], o64):.2e} state {rel(x['new_state'], s64):.2e}"
        by = profiled(call, reps=20)
        parts = {n.split("(")[0][:22]: statistics.median(t) for n, t in by.items()}
        line.append(f"{chain or 'auto'}: {sum(parts.values()):.1f} us ({err}; "
                    + ", ".join(f"{n} {t:.1f}" for n, t in parts.items()) + ")")
    grid = N * HV * 2
    print(f"{cell:16s} grid {grid:5d} (n_sm {n_sm}) | " + " | ".join(line), flush=True)

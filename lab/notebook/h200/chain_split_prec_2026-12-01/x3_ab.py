"""The fp32-accurate warpgroup-MMA chain (``split_edits.py``'s ``solox3``: every product's
operands split into bf16 hi and lo parts, the workspace's lo rows copied into tiles of their
own) on the workspace triton-chunk's CUDA prep writes with precision "bf16x3" (what cuda-chunk,
the automatic choice, runs): its errors against float64 beside cuda-chunk's whole call (the Triton
chain), then the chain kernels alone (torch.profiler medians): the x3 chain (one CTA an SM, 133 KB
of shared memory), the product's bf16 solo form at one and at two CTAs an SM and its 185 KB form.
From the repository root, on an sm_90 GPU with cupy:

    python lab/notebook/h200/chain_split_prec_2026-12-01/x3_ab.py 16/32:8x1024,4/8:1x8192
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.backends import _cuda_chunk_chain as chain, _tma, triton_chunk as tc  # noqa: E402
from lab.harness import rel                                                       # noqa: E402
from lab.prefill_gpu import make, oracle                                          # noqa: E402
from lab.source_edits import edited, load                                         # noqa: E402
from lab.wgmma_chain import config, medians, parse, workspace                     # noqa: E402

HERE = Path(__file__).resolve().parent
X3 = edited(chain.SOURCE, load(str(HERE / "split_edits.py")), "solox3")
PRODUCT, SOLO_SMEM, MAPS = chain.SOURCE, chain.SOLO_SMEM, chain.tensor_maps
X3_SMEM = 136 * 1024


def x3_maps(q, k, v, mats, out, w):
    """The product's six maps with the rows' map over 4 x 64 columns (hi, lo of T^T and M^T)."""
    T, HV, C = q.shape[0], v.shape[1], chain.CHUNK
    maps = MAPS(q, k, v, mats, out, w)
    size = len(maps) // 6
    rows = _tma.tensor_map(mats.data_ptr(), (4 * C, HV, T), (4 * C * 2, HV * 4 * C * 2),
                           (64, 1, 64))
    return maps[:2 * size] + rows + maps[3 * size:]


def use(source, smem, maps):
    chain.SOURCE, chain.SOLO_SMEM, chain.tensor_maps = source, smem, maps


for cell in (sys.argv[1] if len(sys.argv) > 1 else "16/32:8x1024,4/8:1x8192").split(","):
    H, HV, lens = parse(cell)
    x = make(lens, H, HV, seed=0)
    T, N, dev = x["q"].shape[0], len(lens), x["q"].device
    o64, s64 = oracle(x, True)
    args = (x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"], x["cu"],
            None)
    # cuda-chunk's call (CUDA prep "bf16x3", Triton chain), one segment: its workspace kept
    c3 = tc.resolve(dict(precision="bf16x3", prep="cuda", segments=1), N, HV, 128, dev, tokens=T)
    ws3 = torch.empty(tc.workspace_numel(T, HV, c3), dtype=torch.float32, device=dev)
    tc.launch(*args, x["out"], x["new_state"], True, config=c3._asdict(), workspace=ws3)
    torch.cuda.synchronize()
    print(f"{cell:14s} cuda-chunk (Triton chain)  out {rel(x['out'], o64):.3e} state "
          f"{rel(x['new_state'], s64):.3e}", flush=True)
    mats3, vecs3 = tc._workspace(ws3, T, HV, c3, dev)
    out, ns = torch.full_like(x["out"], float("nan")), torch.full_like(x["new_state"], float("nan"))
    cargs = (x["q"], x["k"], x["v"], x["cu"], mats3, vecs3, out, x["state"], ns)
    use(X3, X3_SMEM, x3_maps)
    chain.launch(*cargs, solo=True)
    torch.cuda.synchronize()
    use(PRODUCT, SOLO_SMEM, MAPS)
    print(f"{cell:14s} x3 wgmma chain             out {rel(out, o64):.3e} state {rel(ns, s64):.3e}",
          flush=True)
    # the bf16 chain on its own workspace ("bf16" rows), for the times
    ws, mats, vecs = workspace(x, config(x))
    tc.launch(*args, torch.empty_like(out), torch.empty_like(ns), True,
              config=dict(precision="bf16", prep="cuda", chain="cuda", segments=1), workspace=ws)
    bargs = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)

    def run(source, smem, maps, a, solo):
        def call():
            use(source, smem, maps)
            chain.launch(*a, solo=solo)
        return call
    t = medians({"x3 (1 CTA/SM)": run(X3, X3_SMEM, x3_maps, cargs, True),
                 "bf16 solo (1 CTA/SM)": run(PRODUCT, X3_SMEM, MAPS, bargs, True),
                 "bf16 solo (2 CTAs/SM)": run(PRODUCT, SOLO_SMEM, MAPS, bargs, True),
                 "bf16 185 KB form": run(PRODUCT, SOLO_SMEM, MAPS, bargs, False)}, 20)
    use(PRODUCT, SOLO_SMEM, MAPS)
    print(f"{cell:14s} chain alone (us): " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
          flush=True)

"""The persistent chain prototype (``persistent_chain.cu`` beside this file; bit-identical,
faster only with many short tasks: see ``README.md``) beside cuda-chunk-bf16's chain on one
workspace (cuda-chunk's prep, "bf16", one segment): whether its outputs and final states are
bit-identical to the product chain's, its errors against float64, and both kernels alone
(torch.profiler records, medians).  Dense calls, one fp32 state per sequence (``--no-state``:
none).  As it was run, on an sm_90 GPU with cupy, from the repository root (tree 14ef66e):

    python lab/notebook/h200/chain_experiments_2026-11-30/persistent_chain.py \\
        --cells 16/32:16x256,16/32:8x1024,4/8:1x8192,2/4:1000+64+0+130+7

The kernel source is the product chain's source followed by the prototype's (its ``#include``
of it dropped), written to a temporary file, so the compile cache sees both.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from lab.prefill_gpu import make, oracle
from lab.wgmma_chain import config, medians, parse, rel, workspace

LAB = Path(__file__).with_name("persistent_chain.cu")
NAME = "gdn_persistent_chain"
SMEM = 232448          # the opt-in limit, >= sizeof(PcSmem) (the kernel's static_assert checks it)


def source() -> Path:
    text = chain.SOURCE.read_text() + "\n" + "\n".join(
        line for line in LAB.read_text().split("\n")
        if line.strip() != '#include "cuda_chunk_chain.cu"')
    path = Path(tempfile.mkdtemp()) / "persistent_chain_full.cu"
    path.write_text(text)
    return path


def launch(src, q, k, v, cu, mats, vecs, out, state, new_state):
    """The prototype on the workspace: dense, ``state`` [N, HV, V, K] k-last with 16-byte rows
    (or None: zeros); one CTA an SM, at most one a task."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    dev = q.device.index or 0
    if state is not None and (state.stride(-1) != 1 or state.data_ptr() % 16 or any(
            state.stride(d) * state.element_size() % 16 for d in (0, 1, 2))):
        raise ValueError("the prototype copies the state's rows in 16-byte pieces")
    _, idx, new_idx, init, st, ss = tlaunch.chain_slots(cu, state, new_state, None, None, None,
                                                        False)
    code = cuda_build.DTYPE_CODE
    defs = (("GDN_SMEM", chain.SMEM), ("PC_SMEM", SMEM), ("GDN_STATE0", int(state is not None)),
            ("GDN_S_DT", code[st.dtype]), ("GDN_NS_DT", code[new_state.dtype]),
            ("GDN_CU64", int(cu.dtype == torch.int64)))
    func = cuda_build.get_kernel(src, NAME, defs, dev, SMEM).func
    body = chain.tensor_maps(q, k, v, mats, out) + chain.PARAMS.pack(
        cu.data_ptr(), vecs.data_ptr(), out.data_ptr(), st.data_ptr(), new_state.data_ptr(),
        idx.data_ptr(), new_idx.data_ptr(), init.data_ptr(), new_state.data_ptr(), N, T,
        out.stride(0), out.stride(1), H, HV, V, *ss, *tlaunch.state_strides(new_state, False),
        *tlaunch.state_strides(new_state, False), st.shape[0], new_state.shape[0], -1, 1)
    params = ctypes.create_string_buffer(body + bytes(-len(body) % 64))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    grid = min(N * HV * (V // chain.ROWS), cuda_build.sm_count(dev))
    cuda_build.launch_raw(func, grid, chain.THREADS, dev, ctypes.addressof(argv), SMEM)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="2/4:1000+64+0+130+7,16/32:16x256,16/32:8x1024,4/8:1x8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-state", action="store_true", help="no initial state (zeros)")
    a = ap.parse_args()
    src = source()
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x = make(lens, H, HV, seed=0)
        if a.no_state:
            x["state"] = None
        ws, mats, vecs = workspace(x, config(x))
        # the product's call fills the workspace and gives its chain's outputs and states
        tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu"], None, x["out"], x["new_state"], True,
                  config=dict(precision="bf16", prep="cuda", chain="cuda", segments=1),
                  workspace=ws)
        out = torch.full_like(x["out"], float("nan"))
        ns = torch.full_like(x["new_state"], float("nan"))
        args = (x["q"], x["k"], x["v"], x["cu"], mats, vecs, out, x["state"], ns)
        launch(src, *args)
        torch.cuda.synchronize()
        o64, s64 = oracle(x, True, init=torch.zeros_like(x["new_state"]) if a.no_state
                          else None)
        same = torch.equal(out, x["out"]) and torch.equal(ns, x["new_state"])
        print(f"{cell:22s} bit-identical to the product chain: {same} | persistent: out "
              f"{rel(out, o64):.3e} state {rel(ns, s64):.3e} | product: out "
              f"{rel(x['out'], o64):.3e} state {rel(x['new_state'], s64):.3e} | nan "
              f"{int(out.isnan().sum() + ns.isnan().sum())}", flush=True)
        ns2 = torch.empty_like(ns)
        t = medians({"product": lambda: chain.launch(x["q"], x["k"], x["v"], x["cu"], mats,
                                                     vecs, out, x["state"], ns2),
                     "persistent": lambda: launch(src, *args)}, a.reps)
        print(f"{cell:22s} chain alone (us): " + " | ".join(f"{n} {v:.1f}" for n, v in t.items()),
              flush=True)


if __name__ == "__main__":
    main()

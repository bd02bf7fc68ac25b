"""The x3 chain against the Triton "bf16x3" chain in the forms whose kernels spill more (nvcc
-Xptxas -v, X3 solo form: dense 20 bytes, pools 48, checkpoints 108): whole calls after the CUDA
prep (torch.profiler medians) and the two results' relative difference.  From the repository
root, on an sm_90 GPU with cupy:

    python lab/notebook/h200/chain_split_prec_2026-12-01/x3_forms.py
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.backends import triton_chunk as tc                        # noqa: E402
from lab.harness import profiled, rel                                 # noqa: E402
from lab.prefill_gpu import lens_of, make                             # noqa: E402

for cell in (sys.argv[1] if len(sys.argv) > 1 else "16/32:1x8192,16/32:8x1024").split(","):
    geom, mix = cell.split(":")
    H, HV = map(int, geom.split("/"))
    x = make(lens_of(mix), H, HV, seed=0)
    T, N = x["q"].shape[0], x["cu"].shape[0] - 1
    pool = torch.randn(2 * N + 3, HV, 128, 128, device="cuda") * 0.05
    slots = torch.randperm(2 * N + 3, device="cuda")[:N].to(torch.int32)
    ck = torch.empty(T // 512 + N, HV, 128, 128, device="cuda")
    forms = {"dense": (x["state"], x["new_state"], {}),
             "pool": (pool, pool, dict(state_indices=slots)),
             "ckpt": (x["state"], x["new_state"], dict(checkpoints=ck, checkpoint_every=512))}
    for form, (st, ns, kw) in forms.items():
        res, line = {}, []
        for chain in ("triton", "cuda"):
            def call(chain=chain):
                tc.launch(x["q"], x["k"], x["v"], st, x["A_log"], x["a"], x["dt_bias"], x["b"],
                          x["cu"], None, x["out"], ns, True, **kw,
                          config=dict(precision="bf16x3", prep="cuda", chain=chain))
            keep = st.clone()
            call()
            torch.cuda.synchronize()
            res[chain] = (x["out"].clone(), ns.clone(), ck.clone() if "checkpoints" in kw else None)
            st.copy_(keep)
            by = profiled(call, reps=10)
            st.copy_(keep)
            line.append(f"{chain} {sum(statistics.median(t) for t in by.values()):.1f} us")
        d = [rel(res["cuda"][i], res["triton"][i]) for i in range(3) if res["cuda"][i] is not None]
        print(f"{cell:14s} {form:6s} " + " | ".join(line) + " | x3 vs triton rel diff "
              + ", ".join(f"{v:.1e}" for v in d), flush=True)

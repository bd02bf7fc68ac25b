"""Three calls of cuda-chunk's x3 chain (triton-chunk with the CUDA prep and chain, "bf16x3") in
one state form, for ncu: python one_call.py FORM CELL (FORM dense or pool, CELL e.g.
16/32:1x8192), from the repository root."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.backends import triton_chunk as tc                        # noqa: E402
from lab.prefill_gpu import lens_of, make                             # noqa: E402
from lab.x3_ab import forms_of                                        # noqa: E402

form, cell = sys.argv[1], sys.argv[2]
geom, mix = cell.split(":")
H, HV = map(int, geom.split("/"))
x = make(lens_of(mix), H, HV, seed=0)
st, ns, kw = forms_of(x, [form])[form]
for _ in range(3):
    tc.launch(x["q"], x["k"], x["v"], st, x["A_log"], x["a"], x["dt_bias"], x["b"], x["cu"],
              None, x["out"], ns, True, **kw,
              config=dict(precision="bf16x3", prep="cuda", chain="cuda"))
torch.cuda.synchronize()

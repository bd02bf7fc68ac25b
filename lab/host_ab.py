"""Warm host time per gdnzoo.decode call (µs), one process per tree: median of 40 batches of
1000 calls after 3000 warm-up calls, B=1 contest shape, the GPU kernel far shorter than the
host time so the queue never fills."""
import statistics
import sys
import time

import torch

import gdnzoo
from gdnzoo.inputs import make_inputs

algo, variant = sys.argv[1], sys.argv[2]
x = make_inputs(B=1, device="cuda")
kw = {}
if variant in ("out", "dest"):
    kw["out"] = torch.empty(1, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
if variant == "dest":
    kw["new_state"] = torch.empty_like(x.state)
args = x.args()
for _ in range(3000):
    gdnzoo.decode(*args, algo=algo, **kw)
torch.cuda.synchronize()
res = []
for _ in range(40):
    t0 = time.perf_counter()
    for _ in range(1000):
        gdnzoo.decode(*args, algo=algo, **kw)
    res.append((time.perf_counter() - t0) * 1e3)
torch.cuda.synchronize()
print(f"{statistics.median(res):.3f} {min(res):.3f}")

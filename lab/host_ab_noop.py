"""Warm host time per gdnzoo.decode call (µs) through a no-op backend on CPU tensors: gdnzoo's
own dispatch alone, no GPU needed.  Run by lab/host_ab_noop.sh, one process per tree: median
and min of 40 batches of 1000 calls after 3000 warm-up calls, B=1 contest shape."""
import statistics
import sys
import time

import torch

import gdnzoo
from gdnzoo.inputs import make_inputs

variant = sys.argv[1]
x = make_inputs(B=1, seed=0)
kw = {}
if variant in ("out", "dest"):
    kw["out"] = torch.empty(1, 1, 8, 128, dtype=torch.bfloat16)
if variant == "dest":
    kw["new_state"] = torch.empty_like(x.state)
args = x.args()
for _ in range(3000):
    gdnzoo.decode(*args, algo="noop", **kw)
res = []
for _ in range(40):
    t0 = time.perf_counter()
    for _ in range(1000):
        gdnzoo.decode(*args, algo="noop", **kw)
    res.append((time.perf_counter() - t0) * 1e3)
print(f"{statistics.median(res):.3f} {min(res):.3f}")

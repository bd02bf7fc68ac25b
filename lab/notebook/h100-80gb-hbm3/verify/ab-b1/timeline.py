"""In-kernel clock64 timeline of the B=1 verify rows (diagnostic, patched copy): per warp, the
load phase (kernel start to the state in registers), each token, the late stores, in cycles.
From the checkout's root, after diag_patch.py:  python3 .../ab-b1/timeline.py"""
import itertools
import statistics

import numpy as np
import torch

from b1 import cb, cells, use
from bench import pool as serving
from bench import verify as vb
from lab.clock_marks import read_u64

def read_xt(module):
    return read_u64(module, "gdn_xt")[:4096 * 12].reshape(4096, 12)

for sd, T, ctx, row in itertools.chain(cells(("bf16", "fp32"), (8,)), cells(("bf16",), (4,))):
    nw = 1024 // (32 // row[2]) // row[1]
    for name, xd in [("row", []), ("nostore", ["GDN_XNOSTORE"]), ("late", ["GDN_XLATE"]), ("nobfly", ["GDN_XNOBFLY"])]:
        use(row, xd + ["GDN_XTIME"])
        e = vb.entry_call("cuda-v4", "states", ctx)
        for _ in range(20):
            ctx.ix.advance(); e.call(ctx.ix.index)
        torch.cuda.synchronize()
        busy, _, m = serving._timed(e.call, ctx.ix, 200, 5.0)
        ctx.ix.advance(); e.call(ctx.ix.index); torch.cuda.synchronize()
        (k,) = list(cb._kernels.values())
        xt = read_xt(k.module)[:nw].astype(np.int64)
        load = xt[:, 1] - xt[:, 0]
        tok = [xt[:, 2 + t] - xt[:, 1 + t] for t in range(T - 1)] + [xt[:, T + 1] - xt[:, T]]
        late = xt[:, T + 2] - xt[:, T + 1]
        tot = xt[:, T + 2] - xt[:, 0]
        med = lambda a: int(np.median(a))
        print(f"{sd} T={T} {name:8s} kernel {statistics.median(busy):.3f} us | warps {nw} cycles: load {med(load)} "
              f"tokens {[med(a) for a in tok]} late {med(late)} total {med(tot)} (max {int(tot.max())})", flush=True)

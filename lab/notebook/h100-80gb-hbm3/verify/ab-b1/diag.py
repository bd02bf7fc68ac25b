"""Diagnostic A/B at B = 1 (not a result of record), states form: the table row, the row with
chains of 2 and 4, and builds with diag_patch.py's switches: stores after the loop (XLATE,
gated like the row), no per-token state store, no butterfly, neither (wrong on purpose, not
gated); R interleaved rounds of 200 calls beside the floor.  From the checkout's root, after
diag_patch.py:  python3 .../ab-b1/diag.py fp32,bf16 8,4 3"""
import statistics
import sys
import time

import torch

from b1 import cells, use
from bench import clocks, floor
from bench import pool as serving
from bench import verify as vb

sds, ts, R = sys.argv[1].split(","), [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
t0, form = time.time(), "states"
for sd, T, ctx, row in cells(sds, ts):
    chain = lambda c: row[:5] + (c,) + row[6:]     # noqa: E731
    var = {"row": (row, []), "chain2": (chain(2), []), "chain4": (chain(4), []),
           "nostore": (row, ["GDN_XNOSTORE"]), "nobfly": (row, ["GDN_XNOBFLY"]),
           "late": (row, ["GDN_XLATE"]), "nostore+nobfly": (row, ["GDN_XNOSTORE", "GDN_XNOBFLY"]),
           "late+chain4": (chain(4), ["GDN_XLATE"])}
    gated = [name for name, (cfg, xd) in var.items() if set(xd) <= {"GDN_XLATE"}]
    for name in gated:
        use(*var[name])
        chk = vb.check_entry(vb.entry_call("cuda-v4", form, ctx), ctx, form)
        if not chk["ok"]:
            print("FAIL", sd, T, name, chk["reason"])
            del var[name]
    acc = {}
    for _ in range(R):
        f = floor.verify_floor_times(vb.floor_target(ctx, form), iters=100,
                                     reduce=clocks.busy_and_count)
        acc.setdefault("floor", []).extend(s for s, _ in f["samples"])
        for name, (cfg, xd) in var.items():
            use(cfg, xd)
            e = vb.entry_call("cuda-v4", form, ctx)
            for _ in range(5):
                ctx.ix.advance()
                e.call(ctx.ix.index)
            torch.cuda.synchronize()
            busy, _, _ = serving._timed(e.call, ctx.ix, 200, 5.0)
            acc.setdefault(name, []).extend(busy)
    med = {k: statistics.median(v) for k, v in acc.items()}
    print(f"{sd} T={T} B=1 {form} [{time.time() - t0:.0f}s] row={row} | "
          + " | ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)

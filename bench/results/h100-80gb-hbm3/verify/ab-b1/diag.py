"""Diagnostic A/B at B=1 (not a result of record): the row, the row with chain 2/4 (gated), and
the row with parts compiled out (ungated, wrong on purpose): XNOSTORE (no per-token state store),
XNOBFLY (no butterfly shuffles), XNOUPD (no state update).  usage: diag.py sds Ts rounds"""
import statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
import torch
from lab import verify_ab as va
from gdnzoo import dispatch
from gdnzoo.backends import _cuda_build as cb, cuda_v4
from bench import clocks, floor, shapes
from bench import pool as serving
from bench import verify as vb

XDEFS = []
_orig_opts = cb.nvrtc_options
cb.nvrtc_options = lambda defs, arch: _orig_opts(defs, arch) + [f"-D{d}=1" for d in XDEFS]

def use(cfg, xd):
    XDEFS[:] = xd
    va._use(cfg)
    cb._kernels.clear()

sds = sys.argv[1].split(","); ts = [int(x) for x in sys.argv[2].split(",")]; R = int(sys.argv[3])
orig = cuda_v4.table_config
gpu = torch.cuda.get_device_name(); G = va.G; l2 = clocks.l2_bytes(); t0 = time.time()
for sd in sds:
    dt = shapes.DTYPES[sd]
    P = vb.pool_slots([(1, T) for T in ts], G.HV, G.V, G.K, dt.itemsize, l2)
    sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
    for T in ts:
        ctx = vb.make_ctx(1, T, sd, sp, G, l2, "cuda", 0)
        row = cuda_v4.full_config(orig(gpu, dt, 1, G.H, G.HV, G.K, G.V, True, T, True, True))
        var = {"row": (row, []), "chain2": (row[:5] + (2,) + row[6:], []),
               "chain4": (row[:5] + (4,) + row[6:], []),
               "nostore": (row, ["GDN_XNOSTORE"]), "nobfly": (row, ["GDN_XNOBFLY"]),
               "late": (row, ["GDN_XLATE"]), "nostore+nobfly": (row, ["GDN_XNOSTORE", "GDN_XNOBFLY"]), "late+chain4": (row[:5] + (4,) + row[6:], ["GDN_XLATE"])}
        form = "states"
        calls = {}
        for name, (cfg, xd) in var.items():
            use(cfg, xd)
            e = vb.entry_call("cuda-v4", form, ctx)
            chk = vb.check_entry(e, ctx, form)
            if (not xd or xd == ['GDN_XLATE']) and not chk["ok"]:
                print("FAIL", sd, T, name, chk["reason"]); continue
            calls[name] = (e.call, cfg, xd)
        acc = {}
        for _ in range(R):
            f = floor.verify_floor_times(vb.floor_target(ctx, form), iters=100, reduce=clocks.busy_and_count)
            acc.setdefault("floor", []).extend(s for s, _ in f["samples"])
            for name, (call, cfg, xd) in calls.items():
                use(cfg, xd)
                e = vb.entry_call("cuda-v4", form, ctx)
                for _ in range(5):
                    ctx.ix.advance(); e.call(ctx.ix.index)
                torch.cuda.synchronize()
                busy, _, m = serving._timed(e.call, ctx.ix, 200, 5.0)
                acc.setdefault(name, []).extend(busy)
        med = {k: statistics.median(v) for k, v in acc.items()}
        print(f"{sd} T={T} B=1 {form} [{time.time()-t0:.0f}s] row={row} | " +
              " | ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)

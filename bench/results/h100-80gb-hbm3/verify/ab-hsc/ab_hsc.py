"""A/B of cuda-v4 with the head's per-token scalars from the block (config field head_scalars)
against the H100 verify rows, in the verify bench's three forms (its inputs, pool, indices,
gate and kernel clock): each shape is put in place of the table row, gated per form against
the float64 reference, then timed in R interleaved rounds beside the same-run floor.

    python3 ab_hsc.py fp32,bf16 8,4,2 1,4 3      # run 1 (hsc_ab.log): CANDS_RUN1, no row+hs2
    python3 ab_hsc.py fp32,bf16 8,4 1,4 3        # run 2 (hsc2_ab.log): CANDS

Run 2 also timed head_scalars 2 (the q/k rows left in shared memory for the token loop:
../experiments-notkept/head_scalars2_qk_rows.patch, not kept; the current cuda_v4.py refuses
the value 2, so run 2's candidates need that patch and its host side: q/k mode 0, ahead 3 as 1).
"""
import statistics, sys, time, types
import torch
from gdnzoo.bench import verify as vb, pool as serving, clocks, floor, shapes
from gdnzoo.backends import cuda_v4
from gdnzoo import dispatch
ORIG = cuda_v4.table_config
GPU = torch.cuda.get_device_name()
G = types.SimpleNamespace(H=4, HV=8, K=128, V=128)
SDs, Ts, Bs = sys.argv[1].split(","), [int(x) for x in sys.argv[2].split(",")], \
    [int(x) for x in sys.argv[3].split(",")]
R = int(sys.argv[4]) if len(sys.argv) > 4 else 3
def CANDS_RUN1(B, T):
    """Run 1: shapes beside the row, each with head_scalars 1."""
    shapes = [(4, 1, 16), (8, 1, 16), (2, 1, 16), (4, 1, 32), (8, 1, 32)] if B == 1 else \
        [(4, 2, 16), (8, 2, 16), (4, 1, 16), (8, 1, 16), (4, 1, 32), (8, 1, 32)]
    return [(w, rw, lpr, 3, 1, 0, 0, 2 if lpr <= 16 else 0, 0, 3, 1) for w, rw, lpr in shapes]


def CANDS(B, T):
    """Shapes beside the row: HSC 2 (q/k rows from the block too) and the HSC 1 leaders of the
    first A/B (hsc_ab.log)."""
    s2 = [(4, 1, 16), (8, 1, 16), (2, 1, 16), (4, 1, 32), (8, 1, 32)] if B == 1 else \
        [(4, 2, 16), (8, 2, 16), (4, 1, 16), (8, 1, 16), (4, 1, 32)]
    s1 = [(8, 1, 32, 0), (4, 1, 16, 2)] if B == 1 else [(8, 2, 16, 2), (8, 1, 16, 2)]
    return [(w, rw, lpr, 3, 1, 0, 0, 0, 0, 1, 2) for w, rw, lpr in s2] + \
        [(w, rw, lpr, 3, 1, 0, 0, q, 0, 3, 1) for w, rw, lpr, q in s1]
t0 = time.time()
run_log = []
for sd in SDs:
    dt = shapes.DTYPES[sd]
    cells = [(B, T) for T in Ts for B in Bs]
    l2 = clocks.l2_bytes()
    P = vb.pool_slots(cells, G.HV, G.V, G.K, dt.itemsize, l2)
    sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
    for B, T in cells:
        ctx = vb.make_ctx(B, T, sd, sp, G, l2, "cuda", 0)
        row = cuda_v4.full_config(ORIG(GPU, dt, B, 4, 8, 128, 128, True, T, True, True))
        cfgs = {"row": row}
        if not row[8]:                                   # a token-loop row: with HSC too
            cfgs["row+hs"] = row[:10] + (1,)
            cfgs["row+hs2"] = row[:7] + (0, 0, 1, 2)
        for c in CANDS(B, T):
            c = cuda_v4.full_config(c)
            if c[8] and T > cuda_v4.CHUNK_REG_MAX_T and c[8] == 2:
                continue
            if sd == "bf16" and c[2] == 32:
                continue
            if c not in cfgs.values():
                cfgs["".join(map(str, c[:3])) + (f"c{c[8]}" if c[8] else f"a{c[9]}q{c[7]}") + f"h{c[3]}"
                     + ("s" * c[10])] = c
        res = {}
        for form in vb.FORMS:
            calls = {}
            for name, cfg in cfgs.items():
                cuda_v4.table_config = lambda *a, _c=cfg, **k: _c
                cuda_v4._binds.clear(); dispatch._MEMO.clear()
                e = vb.entry_call("cuda-v4", form, ctx)
                chk = vb.check_entry(e, ctx, form)
                if not chk["ok"]:
                    print("  FAIL", sd, B, T, form, name, chk["reason"], flush=True)
                    continue
                calls[name] = e.call
            acc = {}
            for r in range(R):
                f = floor.verify_floor_times(vb.floor_target(ctx, form), iters=100,
                                             reduce=clocks.busy_and_count)
                acc.setdefault("floor", []).extend(s for s, _ in f["samples"])
                for name, call in calls.items():
                    cuda_v4.table_config = lambda *a, _c=cfgs[name], **k: _c
                    cuda_v4._binds.clear(); dispatch._MEMO.clear()
                    for _ in range(5):
                        ctx.ix.advance(); call(ctx.ix.index)
                    torch.cuda.synchronize()
                    busy, counts, method = serving._timed(call, ctx.ix, 200, 5.0)
                    acc.setdefault(name, []).extend(busy)
            med = {k: statistics.median(v) for k, v in acc.items()}
            res[form] = med
            fl = med["floor"]
            bar = fl * 1.15 + 0.032
            print(f"{sd} B={B} T={T} {form:13s} [{time.time()-t0:.0f}s] floor {fl:.3f} bar {bar:.3f} | "
                  + " | ".join(f"{k} {v:.3f}{'*' if v <= bar else ''}" for k, v in med.items() if k != "floor"),
                  method, flush=True)
        # the shapes by their worst multiple of the bar over the three forms
        worst = {k: max(res[f][k] / (res[f]["floor"] * 1.15 + 0.032) for f in res if k in res[f])
                 for k in cfgs if all(k in res[f] for f in res)}
        rank = sorted(worst.items(), key=lambda kv: kv[1])
        print(f"  {sd} B={B} T={T} worst/bar: " + " ".join(f"{k}={v:.3f}" for k, v in rank[:6])
              + f" | row={worst.get('row', float('nan')):.3f} {row}", flush=True)
        del ctx
    del sp
    torch.cuda.empty_cache()
cuda_v4.table_config = ORIG

"""A/B of cuda-v4 launch shapes in the verify bench's three forms (states, states+update,
slots), in its own convention (inputs, pool, indices, gate, kernel clock): each shape is put in
place of the table row, gated per form against the float64 reference, then timed in R
interleaved rounds of 200 calls beside the same-run verify floor.  Prints, per cell and form,
the medians (``*``: within the floor bar, 15% plus one 32 ns tick), then the shapes by their
worst multiple of the bar over the three forms.

A script names its candidates and calls :func:`main` (the saved scripts beside the logs under
``lab/notebook/<gpu>/verify/ab-*/``):

    main(lambda B, T: [...configs...], extra=lambda row: {"name": config, ...})
    # python3 script.py fp32,bf16 2,4,8 1,4 [rounds]
"""
from __future__ import annotations

import statistics
import sys
import time
import types

import torch

from gdnzoo import dispatch
from gdnzoo.backends import cuda_v4
from gdnzoo.bench import clocks, floor
from gdnzoo.bench import mode_pool as serving
from gdnzoo.bench import mode_verify as vb
from gdnzoo.inputs import DTYPES

G = types.SimpleNamespace(H=4, HV=8, K=128, V=128)     # the contest geometry


def label(c) -> str:
    """A shape's short name: W RW LPR, then chunk or ahead and q/k mode, hint, ``s`` per
    head_scalars level, ``-tc`` with the tensor-core verify."""
    c = cuda_v4.full_config(c)
    return ("".join(map(str, c[:3])) + (f"c{c[8]}" if c[8] else f"a{c[9]}q{c[7]}")
            + f"h{c[3]}" + "s" * c[10] + "-tc" * (c[11] == "tc-verify"))


def _use(cfg):
    """Every cuda-v4 launch from now on takes ``cfg`` (the table row's place)."""
    cuda_v4.table_config = lambda *a, _c=cfg, **k: _c
    cuda_v4._binds.clear()
    dispatch._MEMO.clear()


def cell_configs(row, cands, sd, T, extra=None) -> dict:
    """name -> config: the row, ``extra(row)``'s entries, then the candidates that serve (no
    register Gram above its T, no 32 lanes a row for bf16 at K=128), each once."""
    cfgs = {"row": row, **(extra(row) if extra else {})}
    for c in map(cuda_v4.full_config, cands):
        if (c[8] == 2 and T > cuda_v4.CHUNK_REG_MAX_T) or (sd == "bf16" and c[2] == 32):
            continue
        if c not in cfgs.values():
            cfgs[label(c)] = c
    return cfgs


def contexts(sd, cells):
    """(B, T, ctx) for each (B, T) of ``cells`` at state dtype ``sd``: the bench's verify
    cells (contest geometry) over one state pool sized for all of them, freed at the end."""
    l2 = clocks.l2_bytes()
    sp = serving.state_pool(serving.pool_slots(cells, G.HV, G.V, G.K, DTYPES[sd].itemsize, l2,
                                               width=vb.Verify.width),
                            G.HV, G.V, G.K, sd, "cuda")
    for B, T in cells:
        ctx = vb.verify_ctx(B, T, sd, sp, vars(G), l2, "cuda", 0)
        yield B, T, ctx
        del ctx
    del sp
    torch.cuda.empty_cache()


def run(sds, ts, bs, rounds, candidates, extra=None, use=None):
    """``use(name, config)``: what puts a shape in place before its calls (default: the
    config in the table row's place; a script may also swap a kernel source there)."""
    use = use or (lambda name, cfg: _use(cfg))
    orig = cuda_v4.table_config
    gpu = torch.cuda.get_device_name()
    t0 = time.time()
    try:
        for sd in sds:
            dt = DTYPES[sd]
            for B, T, ctx in contexts(sd, [(B, T) for T in ts for B in bs]):
                row = cuda_v4.full_config(orig(gpu, dt, B, G.H, G.HV, G.K, G.V, True, T, True,
                                               True))
                cfgs = cell_configs(row, candidates(B, T), sd, T, extra)
                res = {form: _time_form(ctx, form, cfgs, rounds, f"{sd} B={B} T={T}", t0,
                                        use) for form in vb.FORMS}
                worst = {k: max(res[f][k] / (res[f]["floor"] * 1.15 + 0.032) for f in res)
                         for k in cfgs if all(k in res[f] for f in res) and not k.startswith("x_")}
                rank = sorted(worst.items(), key=lambda kv: kv[1])
                print(f"  {sd} B={B} T={T} worst/bar: "
                      + " ".join(f"{k}={v:.3f}" for k, v in rank[:6])
                      + f" | row={worst.get('row', float('nan')):.3f} {row}", flush=True)
    finally:
        cuda_v4.table_config = orig


def _time_form(ctx, form, cfgs, rounds, what, t0, use) -> dict:
    """name -> median µs over ``rounds`` interleaved rounds (with the floor's), the gated
    shapes only (and the ungated ``x_`` probes)."""
    calls = {}
    for name, cfg in cfgs.items():
        use(name, cfg)
        e = vb.verify_call("cuda-v4", form, ctx)
        # A name starting with "x_" is a timing probe (a variant that leaves something out, to
        # bound what that costs): timed without the gate, and never a candidate to keep.
        chk = {"ok": True} if name.startswith("x_") else vb.check_form(e, ctx, form)
        if not chk["ok"]:
            print("  FAIL", what, form, name, chk["reason"], flush=True)
            continue
        calls[name] = e.call
    return time_rounds(ctx, form, calls, rounds, lambda name: use(name, cfgs[name]),
                       f"{what} {form:13s} [{time.time() - t0:.0f}s]")


def time_rounds(ctx, form, calls, rounds, prepare, what) -> dict:
    """name -> median µs of each (gated) call over ``rounds`` interleaved rounds of 200 calls
    beside the same-run verify floor of ``form``; ``prepare(name)`` runs before a call's turn
    (its launch row, say).  Prints one line: ``what``, the floor, the bar, each median (``*``
    within the bar)."""
    acc = {}
    method = ""
    for _ in range(rounds):
        f = floor.indexed_floor_times(ctx.target(form), iters=100,
                                      reduce=clocks.busy_and_count)
        acc.setdefault("floor", []).extend(s for s, _ in f["samples"])
        for name, call in calls.items():
            prepare(name)
            got, method = clocks.kernel_times(ctx.bank.kernel(call), 200, warmup=5,
                                              reduce=clocks.busy_and_count,
                                              prepare=ctx.bank.prepare)
            acc.setdefault(name, []).extend(s for s, _ in got)
    med = {k: statistics.median(v) for k, v in acc.items()}
    bar = med["floor"] * 1.15 + 0.032
    print(f"{what} floor {med['floor']:.3f} bar {bar:.3f} | "
          + " | ".join(f"{k} {v:.3f}{'*' if v <= bar else ''}" for k, v in med.items()
                       if k != "floor"), method, flush=True)
    return med


def main(candidates, extra=None, use=None):
    sds, ts, bs = (sys.argv[1].split(","), [int(x) for x in sys.argv[2].split(",")],
                   [int(x) for x in sys.argv[3].split(",")])
    run(sds, ts, bs, int(sys.argv[4]) if len(sys.argv) > 4 else 3, candidates, extra, use)

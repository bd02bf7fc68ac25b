"""cuda-v4's K-first kernel (cuda_v4_kfirst.cu) against its k-last kernel (the launch table's
row) and fla-recurrent's K-first tile, per batch size, on a GPU: CUDA events around replays of
a CUDA graph of one call on each of rotated input sets (states >= 2x L2 in all), medians of 20.
"rule": the launch shape _cuda_v4_kfirst.shape picks (the table row's hint); "W:LK[:H]": that
shape, explicitly, with cache hint H (default 3).  Every
entry's first call is checked against the float64 oracle (the gate) before it is timed; the
first entry of a batch size is timed once untimed first (a process's first timing reads high).

    python -m lab.kfirst_cuda --geom 16/32 --batches 1,4,16,64,256 --shapes 1:8,1:16,2:8
"""
from __future__ import annotations


import torch

import gdnzoo
from gdnzoo import dispatch, gate
from gdnzoo.backends import cuda_v4
from gdnzoo.inputs import make_inputs
from gdnzoo.operation import DECODE
from lab.kfirst_rows import batches, parser, time_us


def sets_for(B, H, HV, sd, n):
    out = []
    for i in range(n):
        x = make_inputs(B=B, T=1, H=H, HV=HV, state_dtype=sd, device="cuda", seed=i)
        out.append((x, x.state.transpose(-1, -2).contiguous(), torch.empty_like(x.v)))
    return out


def record(x, st, out, kfirst, dest):
    named = {arg.name: arg.default for arg in DECODE.args}
    named.update(q=x.q, k=x.k, v=x.v, state=st, A_log=x.A_log, a=x.a, dt_bias=x.dt_bias, b=x.b,
                 scale=x.scale, out=out, new_state=torch.empty_like(st) if dest else None,
                 use_qk_l2norm=True, algo=None,
                 state_layout="k-first" if kfirst else "k-last")
    return dispatch.record(DECODE, tuple(named[n] for n in DECODE.names), "cuda-v4")


def explicit(w, lk, hint, dest):
    """cuda-v4 on a K-first state at launch shape (w warps, lk lanes along K, cache hint), its
    call record built once a set, outside the timed graph."""
    cfg = dict(warps=w, row_groups=1, lanes_per_row=lk, hint=hint)
    recs = {}

    def call(x, st, out):
        key = (id(x), id(st), id(out))
        if key not in recs:
            recs[key] = record(x, st, out, True, dest)
        cuda_v4.run(recs[key], config=cfg)
        return recs[key].out, recs[key].new_state
    return call


def checked(name, x, kfirst, fn):
    """``fn`` once on a copy of the set ``x``, judged against the oracle; raises on a
    failure."""
    x = x.clone()
    ref_out, ref_state = x.reference(True)
    st = x.state.transpose(-1, -2).contiguous() if kfirst else x.state
    o, ns = fn(x, st, torch.empty_like(x.v))
    j = gate.judge(o, ns.transpose(-1, -2) if kfirst else ns, ref_out, ref_state)
    if not j.ok:
        raise AssertionError(f"{name}: {j.reason}")


def main(argv=None):
    p = parser(__doc__, "1,4,16,64,256")
    p.add_argument("--shapes", default="1:4,1:8,1:16,2:8,2:16,4:16",
                   help="explicit K-first launch shapes W:LK[:HINT]")
    p.add_argument("--dest", action="store_true", help="destination passing (else in place)")
    a = p.parse_args(argv)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    for H, HV, B, n in batches(a):
        sets = sets_for(B, H, HV, sd, n)
        kw = dict(use_qk_l2norm=True)

        def api(algo, kfirst):
            def call(x, st, out):
                new = torch.empty_like(st) if a.dest else None
                return gdnzoo.decode(x.q, x.k, x.v, x.state if not kfirst else st, x.A_log,
                                     x.a, x.dt_bias, x.b, x.scale, out=out, new_state=new,
                                     state_layout="k-first" if kfirst else "k-last",
                                     algo=algo, **kw)
            return call

        entries = [("v4 k-last", False, api("cuda-v4", False)),
                   ("v4 K-first rule", True, api("cuda-v4", True)),
                   ("fla-rec K-first", True, api("fla-recurrent", True))]
        for shp in filter(None, a.shapes.split(",")):
            w, lk, hint = (int(v) for v in (shp + ":3").split(":")[:3])
            entries.append((f"W{w}:LK{lk}:H{hint}", True, explicit(w, lk, hint, a.dest)))
        row = [f"{a.geom} B={B} {a.state_dtype}{' dest' if a.dest else ''} ({n} sets)"]
        warm = True                         # a process's first timing reads high: one untimed
        for name, kfirst, fn in entries:
            try:
                checked(name, sets[0][0], kfirst, fn)
            except (AssertionError, ValueError) as e:
                row.append(f"{name}: FAIL {str(e)[:80]}")
                continue
            for s in sets:                  # every set once (records built), untimed
                fn(*s)
            if warm:                        # (lab/notebook/h200/kfirst_lanes_2026-11-30/)
                time_us(lambda x, st, out, fn=fn: fn(x, st, out), sets)
                warm = False
            us = time_us(lambda x, st, out, fn=fn: fn(x, st, out), sets)
            row.append(f"{name}: {us:.2f}")
        print("  " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()

"""cuda-v4's K-first kernel with a 16-bit state held packed (cuda_v4_kfirst.cu's PACK, one token)
against the kernel before it (``--old``: its source file), at launch shapes and register caps
(``GDN_KF_MINB``, the blocks an SM the registers must allow), beside cuda-v4 on a k-last state,
on a GPU (lab.kfirst_sweep's clock: graph replays over rotated sets, the k-last entry timed once
untimed, then first and last; every entry gated first).

    python -m lab.kfirst_pack_ab --old lab/_old_kfirst.cu --state-dtype bf16 [--dest]
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_v4_kfirst as kf
from gdnzoo.backends import cuda_v4
from lab.kfirst_cuda import checked, record, sets_for
from lab.kfirst_rows import batches, parser, time_us
from lab.kfirst_sweep import klast

_real_get = kf.cuda_build.get_kernel
_use = {"source": None, "minb": 0}


def _get_kernel(cu_path, name, defs, dev, shared=0):
    if name == kf.KERNEL:
        if _use["source"] is not None:
            cu_path = _use["source"]
        if _use["minb"]:
            defs = tuple(sorted(tuple(defs) + (("GDN_KF_MINB", _use["minb"]),)))
    return _real_get(cu_path, name, defs, dev, shared)


kf.cuda_build.get_kernel = _get_kernel


def entry(w, lk, hint, dest, source, minb):
    cfg = dict(warps=w, row_groups=1, lanes_per_row=lk, hint=hint)
    recs = {}

    def call(x, st, out):
        key = (id(x), id(st), id(out))
        _use.update(source=source, minb=minb)
        try:
            if key not in recs:
                recs[key] = record(x, st, out, True, dest)
            cuda_v4.run(recs[key], config=cfg)
        finally:
            _use.update(source=None, minb=0)
        return recs[key].out, recs[key].new_state
    return call


def main(argv=None):
    p = parser(__doc__, "16,64,256")
    p.add_argument("--dest", action="store_true")
    p.add_argument("--old", required=True)
    p.add_argument("--shapes", default="4:4:0:0,4:4:0:4,4:4:0:5,2:4:0:6,2:4:0:8,2:8:0:0",
                   help="W:LK:HINT:MINB (HINT 0 dest / 3 in place where given as 0 here: the rule's)")
    a = p.parse_args(argv)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    old = Path(a.old).resolve()
    for H, HV, B, n in batches(a):
        sets = sets_for(B, H, HV, sd, n)
        base = klast(a.dest)
        for s in sets:
            base(*s)
        time_us(base, sets)
        k0 = time_us(base, sets)
        row = []
        for shp in a.shapes.split(","):
            w, lk, hint, minb = (int(v) for v in shp.split(":"))
            hint = hint or (0 if a.dest else 3)
            got = []
            for src in (old, None):                     # the same bits, old and new?
                x, st, out = sets[0]
                x, st = x.clone(), st.clone()
                o, ns = entry(w, lk, hint, a.dest, src, minb)(x, st, torch.empty_like(out))
                got.append((o.clone(), ns.clone()))
            same = all(torch.equal(u, v) for u, v in zip(*got))
            row.append(f"W{w}:LK{lk}:H{hint}:M{minb} old and new bit for bit: {same}")
            for tag, src in (("old", old), ("new", None)):
                fn = entry(w, lk, hint, a.dest, src, minb)
                name = f"{tag} W{w}:LK{lk}:H{hint}:M{minb}"
                try:
                    checked(name, sets[0][0], True, fn)
                except (AssertionError, ValueError) as e:
                    row.append(f"{name} FAIL {str(e)[:60]}")
                    continue
                for s in sets:
                    fn(*s)
                row.append(f"{name} {time_us(fn, sets):.2f}")
        k1 = time_us(base, sets)
        print(f"{a.geom} B={B} {a.state_dtype}{' dest' if a.dest else ''}: k-last {k0:.2f} / "
              f"{k1:.2f} (mean {statistics.mean((k0, k1)):.2f})", flush=True)
        for r in row:
            print("  " + r, flush=True)


if __name__ == "__main__":
    main()

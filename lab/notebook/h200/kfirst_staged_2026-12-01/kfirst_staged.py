"""cuda-v4 on a K-first state as the product picks it (the staged form, GDN_STAGED, at states
of 64 MB or more, bf16 or in place) beside the same call on the register tile (the launch shape
the rule would take without the staged form, given as an explicit config) and beside cuda-v4 on a
k-last state, on a GPU: each entry gated against the float64 oracle first, then CUDA events
around replays of a CUDA graph of one call on each of rotated input sets (states >= 2x L2),
medians of 20, two interleaved rounds.  From the repository root:

    PYTHONPATH=. python3 lab/notebook/h200/kfirst_staged_2026-12-01/kfirst_staged.py \
        --geom 16/32 --state-dtype bf16 --batches 16,64,256 [--dest]

Calls 1 and 4 of this folder ran an earlier form of it, with the standalone prototype of the
staged kernel as a third entry (prototype.cu, in git history at 02b68d2).
"""
from __future__ import annotations

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.backends import _cuda_v4_kfirst as kf
from gdnzoo.backends import cuda_v4
from lab.kfirst_cuda import record, sets_for
from lab.kfirst_rows import batches, parser, time_us


def api(kfirst: bool, dest: bool):
    def call(x, st, out, new=None):
        return gdnzoo.decode(x.q, x.k, x.v, st if kfirst else x.state, x.A_log, x.a, x.dt_bias,
                             x.b, x.scale, out=out, new_state=new if dest else None,
                             use_qk_l2norm=True, algo="cuda-v4",
                             state_layout="k-first" if kfirst else "k-last")
    return call


def register_tile(dest: bool):
    """The K-first call on the register tile at the rule's launch shape (an explicit config)."""
    recs = {}

    def call(x, st, out, new=None):
        key = (id(x), id(st), id(out))
        if key not in recs:                  # (with ``dest`` the record's own new_state)
            recs[key] = record(x, st, out, True, dest)
        r = recs[key]
        B, HV = x.v.shape[0], x.v.shape[2]
        w, lk, hint = kf.shape(st.element_size(), B * HV, 128, 128, not dest, True)
        cuda_v4.run(r, config=dict(warps=w, row_groups=1, lanes_per_row=lk, hint=hint))
        return r.out, r.new_state
    return call


def gated(name, x, kfirst, fn, dest):
    """``fn`` once on a copy of the set ``x``, judged against the float64 oracle."""
    x = x.clone()
    ref_out, ref_state = x.reference(True)
    st = x.state.transpose(-1, -2).contiguous() if kfirst else x.state
    new = torch.empty_like(st) if dest else None
    o, ns = fn(x, st, torch.empty_like(x.v), new)
    j = gate.judge(o, ns.transpose(-1, -2) if kfirst else ns, ref_out, ref_state)
    if not j.ok:
        raise AssertionError(f"{name}: {j.reason}")


def main(argv=None):
    p = parser(__doc__, "16,64,256")
    p.add_argument("--dest", action="store_true", help="destination passing (else in place)")
    a = p.parse_args(argv)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    for H, HV, B, n in batches(a):
        sets = [(x, st, out, torch.empty_like(st) if a.dest else None)
                for x, st, out in sets_for(B, H, HV, sd, n)]
        entries = [("k-last", False, api(False, a.dest)),
                   ("K-first (product)", True, api(True, a.dest)),
                   ("K-first (register tile)", True, register_tile(a.dest))]
        row = [f"{a.geom} B={B} {a.state_dtype}{' dest' if a.dest else ''} ({n} sets)"]
        times = {}
        for name, kfirst, fn in entries:
            try:
                gated(name, sets[0][0], kfirst, fn, a.dest)
                times[name] = []
            except (AssertionError, ValueError, RuntimeError) as e:
                row.append(f"{name}: FAIL {str(e)[:100]}")
        # a process's first timing reads high: the first entry once, untimed
        time_us(lambda x, st, o, ns, f=entries[0][2]: f(x, st, o, ns), sets)
        for _ in range(2):
            for name, kfirst, fn in entries:
                if name in times:
                    times[name].append(time_us(lambda x, st, o, ns, f=fn: f(x, st, o, ns), sets))
        base = min(times["k-last"])
        for name, ts in times.items():
            row.append(f"{name}: {min(ts):.2f} us ({min(ts) / base:.3f}x k-last; rounds "
                       f"{', '.join(f'{t:.2f}' for t in ts)})")
        print("  " + "\n    ".join(row), flush=True)


if __name__ == "__main__":
    main()

"""Where the host time of one eager gdnzoo.decode call at B=1 goes, per layer (GPU machine).

    python3 -m gdnzoo.bench.host_breakdown [--algo cuda-v4,fla-recurrent]

Each row is the median wall time per call over batches of back-to-back calls (the host clock of
``gdnzoo bench``: no synchronization), so it is dispatch cost as long as the GPU keeps up.
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch

import gdnzoo
from gdnzoo import guards, registry
from gdnzoo.bench.clocks import host_times
from gdnzoo.contract import check_aliasing, signature, validate
from gdnzoo.inputs import make_inputs


def per_call_us(fn):
    return statistics.median(host_times(lambda i: fn(), batches=9, per_batch=1000, warmup=200))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", default="cuda-v4,fla-recurrent")
    args = ap.parse_args(argv)
    x = make_inputs(B=1, device="cuda", seed=0)
    out = torch.empty(1, 1, 8, 128, dtype=x.v.dtype, device="cuda")
    a = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b)
    rows = [
        ("signature() of the inputs", lambda: signature(*a, x.scale, out, None, False)),
        ("full validate()", lambda: validate(*a, x.scale, out=out)),
        ("check_aliasing() (validate path; memoized calls compare spans)",
         lambda: check_aliasing(x.state, out, None)),
        ("os.environ.get('ALGO') (only when no algo is named)", lambda: os.environ.get("ALGO")),
        ("10 x Tensor.data_ptr()", lambda: [t.data_ptr() for t in (*a, out, x.state)]),
        ("torch raw current stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
    ]
    for name in args.algo.split(","):
        run = registry.runner(name)
        bound = registry.launcher(name, *a, x.scale, out, x.state, False)
        gdnzoo.decode(*a, x.scale, out=out, algo=name)          # memoizes (and guards) it
        rows += [
            (f"{name}: decode's memo lookup (guards in use: {guards.available()})",
             lambda name=name: gdnzoo._lookup(*a, x.scale, out, None, False, name)),
            (f"{name}: gdnzoo.decode(..., out=out)",
             lambda name=name: gdnzoo.decode(*a, x.scale, out=out, algo=name)),
            (f"{name}: backend run()", lambda run=run: run(*a, x.scale, out, x.state, False)),
            (f"{name}: bound launcher", lambda b=bound: b(*a, x.scale, out, x.state, False)),
        ]
    print(f"host time per call, B=1, {torch.cuda.get_device_name()}:")
    for what, fn in rows:
        print(f"  {what:60s} {per_call_us(fn):7.2f} us")


if __name__ == "__main__":
    main()

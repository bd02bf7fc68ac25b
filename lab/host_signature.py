"""The dispatcher's host time for a prefill call whose signature is new (a server's every new
token count) against one it has seen, the backend left out (its launcher a no-op), on CPU
tensors: what gdnzoo's own Python costs before any kernel.  Prints the per-call medians and
where a new signature's time goes (the named functions, wall time, garbage collection
included where it lands).

    python3 -m lab.host_signature [--memo N] [--no-gc]
"""
from __future__ import annotations

import argparse
import collections
import gc
import statistics
import time

import torch

import gdnzoo
from gdnzoo import dispatch, guards, registry
from gdnzoo import prefill_contract
from gdnzoo.inputs import make_prefill_inputs

TIMED = [(dispatch, "_miss"), (dispatch, "_resolve"), (prefill_contract, "verdict"),
         (dispatch, "overlap_probe"), (dispatch, "signature"), (registry, "select"),
         (dispatch, "_remember"), (guards, "make")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--memo", type=int, default=0, help="dispatch._MEMO_MAX (0: as shipped)")
    ap.add_argument("--no-gc", action="store_true", help="garbage collection off")
    a = ap.parse_args()
    if a.memo:
        dispatch._MEMO_MAX = a.memo
    if a.no_gc:
        gc.disable()
    registry.launcher = lambda name, call: (lambda rec: None)
    spent = collections.Counter()
    for mod, name in TIMED:
        def timed(*args, _f=getattr(mod, name), _key=f"{mod.__name__}.{name}", **kw):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kw)
            finally:
                spent[_key] += time.perf_counter() - t0
        setattr(mod, name, timed)
    x = make_prefill_inputs([1024] * 8, H=4, HV=8, K=128, V=128, device="cpu", seed=0)
    T = x.q.shape[0]
    cus = []
    for i in range(a.calls + 101):
        cu = x.cu_seqlens.clone()
        cu[-1] -= i
        cus.append(cu)
    out, new = torch.empty_like(x.v), torch.empty_like(x.state)

    def call(i):
        n = T - i
        t0 = time.perf_counter()
        gdnzoo.prefill(x.q[:n], x.k[:n], x.v[:n], x.state, x.A_log, x.a[:n], x.dt_bias,
                       x.b[:n], cus[i], out=out[:n], new_state=new, use_qk_l2norm=True,
                       algo="pt-reference")
        return time.perf_counter() - t0
    for i in range(1, 101):
        call(i)
    same = statistics.median(call(0) for _ in range(a.calls))
    spent.clear()
    fresh = statistics.median(call(i) for i in range(101, a.calls + 101))
    print(f"a seen signature {same * 1e6:.0f} us a call, a new one {fresh * 1e6:.0f} us "
          f"(dispatch._MEMO_MAX {dispatch._MEMO_MAX}, gc {'off' if a.no_gc else 'on'}); "
          f"a new one's time in:")
    for key, s in spent.most_common():
        print(f"  {key}: {s / a.calls * 1e6:.1f} us")


if __name__ == "__main__":
    main()

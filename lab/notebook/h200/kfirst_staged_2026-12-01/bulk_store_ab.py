"""GDN_STAGED's new tile stored by bulk copies from shared memory (GDN_STAGED = 2: each thread's
new values back into the staged tile, then cp.async.bulk shared -> global) against the committed
stores from registers (1), on a GPU.  One variant a process (``--variant``), so run it in
alternating processes; each process times cuda-v4 on a k-last state beside the product's
K-first call (the staged form at these sizes) and prints the ratio, every entry gated against
the float64 oracle first (kfirst_staged.py's gate and clock).  From the repository root:

    PYTHONPATH=. python3 lab/notebook/h200/kfirst_staged_2026-12-01/bulk_store_ab.py \
        --variant 2 --geom 16/32 --batches 64,256 --state-dtype bf16 [--dest]
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_v4_kfirst as kf
from lab.kfirst_cuda import sets_for
from lab.kfirst_rows import batches, parser, time_us

_spec = importlib.util.spec_from_file_location(
    "kfirst_staged", Path(__file__).with_name("kfirst_staged.py"))
ks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ks)


def main(argv=None):
    p = parser(__doc__, "64,256")
    p.add_argument("--dest", action="store_true")
    p.add_argument("--variant", type=int, choices=(1, 2), default=2)
    a = p.parse_args(argv)
    if a.variant == 2:                 # the same rule, the bulk-store form where it stages
        pick = kf.pick_staged
        kf.pick_staged = lambda *args: 2 if pick(*args) else False
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    for H, HV, B, n in batches(a):
        sets = [(x, st, out, torch.empty_like(st) if a.dest else None)
                for x, st, out in sets_for(B, H, HV, sd, n)]
        entries = [("k-last", False, ks.api(False, a.dest)),
                   ("K-first", True, ks.api(True, a.dest))]
        for name, kfirst, fn in entries:
            for s in sets[:2]:
                ks.gated(name, s[0], kfirst, fn, a.dest)
        time_us(entries[0][2], sets)                  # a process's first timing reads high
        t = {name: min(time_us(fn, sets) for _ in range(2)) for name, _, fn in entries}
        print(f"variant {a.variant} {a.geom} B={B} {a.state_dtype}{' dest' if a.dest else ''}: "
              f"k-last {t['k-last']:.2f} us, K-first {t['K-first']:.2f} us, "
              f"{t['K-first'] / t['k-last']:.3f}x", flush=True)


if __name__ == "__main__":
    main()

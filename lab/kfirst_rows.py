"""fla-recurrent's decode step on a K-first state against a k-last one, per launch tile
(block_v), on a GPU.  Destination passing (as FLA's entry point); CUDA events around replays
of a CUDA graph of one call on each of rotated input sets (states read and written: >= 4x L2
in all).  "table": the launch table's row (K-first: kfirst_config's launch); bv=N (or N:W):
that tile as given, 1 (or W) warps, 1 stage.  Which tile a K-first state wants
(backends/fla_recurrent.kfirst_config).

    python -m lab.kfirst_rows --geom 16/32 --batches 1,4,16 --block-v 4,8,16
"""
from __future__ import annotations

import argparse
import statistics

import torch

from gdnzoo.backends import fla_recurrent as fr
from gdnzoo.bench.clocks import rotation_count
from gdnzoo.inputs import make_inputs


def sets_for(B, H, HV, sd, n, kfirst):
    out = []
    for i in range(n):
        x = make_inputs(B=B, T=1, H=H, HV=HV, state_dtype=sd, device="cuda", seed=i)
        st = x.state.transpose(-1, -2).contiguous() if kfirst else x.state
        out.append((x, st, torch.empty_like(x.v), torch.empty_like(st)))
    return out


def time_us(fn, sets, rounds=20):
    """Per call: one CUDA graph of a call on every set, replayed (no host launch cost)."""
    for s in sets[:2]:
        fn(*s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for s in sets:
            fn(*s)
    g.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / len(sets))
    return statistics.median(per)


def parser(doc: str, batches: str) -> argparse.ArgumentParser:
    """The K-first lab scripts' common options: --geom H/HV, --batches, --state-dtype."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--geom", default="16/32")
    p.add_argument("--batches", default=batches)
    p.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16"))
    return p


def batches(a):
    """(H, HV, B, sets) per batch of the parsed options ``a``: the sets whose states fill
    twice the L2 (2 to 64 of them)."""
    H, HV = (int(v) for v in a.geom.split("/"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for B in (int(b) for b in a.batches.split(",")):
        size = B * HV * 128 * 128 * (4 if a.state_dtype == "fp32" else 2)
        yield H, HV, B, rotation_count(size, l2, 2, 2, 64)


def main(argv=None):
    p = parser(__doc__, "1,4,16")
    p.add_argument("--block-v", default="4,8,16",
                   help="tiles: BV or BV:num_warps (1 warp when not given)")
    a = p.parse_args(argv)
    sd = a.state_dtype
    for H, HV, B, n in batches(a):
        row = [f"{a.geom} B={B} {sd} ({n} sets)"]
        for kfirst in (False, True):
            sets = sets_for(B, H, HV, sd, n, kfirst)
            form = (0, 0, 1 if kfirst else 0)
            for tile in [None] + a.block_v.split(","):
                cfg = None if tile is None else (
                    tuple(int(x) for x in (tile + ":1").split(":")[:2]) + (1,))

                def call(x, st, o, ns, cfg=cfg):
                    fr.launch(x.q, x.k, x.v, st, x.A_log, x.a, x.dt_bias, x.b, x.scale, o, ns,
                              True, config=cfg, form=form)
                us = time_us(call, sets)
                row.append(f"{'kfirst' if kfirst else 'klast'} bv={tile or 'table'}: {us:.2f}")
        print("  " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()

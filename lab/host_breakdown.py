"""Where the host time of one eager gdnzoo.decode call at B=1 goes, per layer (GPU machine):

    python3 -m lab.host_breakdown [--algo cuda-v4,fla-recurrent] [--ab OLD_INIT.py]
    python3 -m lab.host_breakdown --device cpu --algo pt-reference    # the layers, no GPU

Each row is the median wall time per call over batches of back-to-back calls (the host clock of
``gdnzoo bench``: each batch synchronized at its ends, none inside), so it is dispatch cost as
long as the GPU keeps up.

``--ab`` compares the public face and hot path of another version with this one in the same
process (host speed differs between processes and machines by up to 2x, so only in-process
alternation compares code): the file is an older ``gdnzoo/__init__.py`` (``git show
REV:gdnzoo/__init__.py``), loaded as a module over this version's layers below it, and the two
``decode`` functions are timed in alternating rounds.  ``lab/host_instructions.py`` counts the
same work in instructions, without a GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics

import torch

import gdnzoo
from gdnzoo import dispatch, guards, registry
from gdnzoo.bench.clocks import host_times
from gdnzoo.checks import check_aliasing, signature
from gdnzoo.contract import validate
from gdnzoo.inputs import make_inputs
from gdnzoo.operation import DECODE
from lab import harness


def per_call_us(fn, batches=9):
    return statistics.median(host_times(lambda i: fn(), batches=batches, per_batch=1000,
                                        warmup=200))


def decode_args(x, out, algo):
    """gdnzoo.decode's positional arguments of a dense call (as dispatch.decode builds them)."""
    return (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, None, False,
            algo) + dispatch._NO_SERVE + (None,) + dispatch._RAW_K_LAST


def breakdown(lab, names, device):
    x = make_inputs(B=1, device=device, seed=0)
    out = torch.empty(1, 1, 8, 128, dtype=x.v.dtype, device=device)
    a = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b)
    named = dict(zip(("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"), a), out=out)
    args = decode_args(x, out, names[0])
    rows = [
        ("signature() of the inputs", lambda: signature(DECODE, args)),
        ("full validate()", lambda: validate(*a, x.scale, out=out)),
        ("check_aliasing() (validate path; memoized calls compare spans)",
         lambda: check_aliasing(DECODE, named, True)),
        ("registry.env_algo() (only when no algo is named)", registry.env_algo),
        ("10 x Tensor.data_ptr()", lambda: [t.data_ptr() for t in (*a, out, x.state)]),
    ]
    if device == "cuda":
        rows.append(("torch raw current stream", lambda: torch._C._cuda_getCurrentRawStream(0)))
    for name in names:
        args = decode_args(x, out, name)
        rec = dispatch.record(DECODE, args, name)
        run, bound = registry.runner(name), registry.launcher(name, rec)
        gdnzoo.decode(*a, x.scale, out=out, algo=name)          # memoizes (and guards) it
        rows += [
            (f"{name}: decode's memo lookup (guards in use: {guards.available()})",
             lambda args=args: dispatch.lookup(DECODE, args)),
            (f"{name}: gdnzoo.decode(..., out=out)",
             lambda name=name: gdnzoo.decode(*a, x.scale, out=out, algo=name)),
            (f"{name}: the call record", lambda args=args, name=name: dispatch.record(
                DECODE, args, name)),
            (f"{name}: backend run(record)", lambda run=run, rec=rec: run(rec)),
            (f"{name}: bound launcher(record)", lambda b=bound, rec=rec: b(rec)),
        ]
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    lab.log(f"host time per call, B=1, {where}:")
    for what, fn in rows:
        us = per_call_us(fn)
        lab.results.setdefault("breakdown", []).append(dict(what=what, us=us))
        lab.log(f"  {what:66s} {us:7.2f} us")


def ab(lab, names, path, rounds=41):
    """Old and new decode in alternating rounds (the order flips every round), 3 x 1000 calls
    each; the median of the per-round differences compares them."""
    spec = importlib.util.spec_from_file_location("gdnzoo_face_ab", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    x = make_inputs(B=1, device="cuda", seed=0)
    out = torch.empty(1, 1, 8, 128, dtype=x.v.dtype, device="cuda")
    a = (*x.args(),)
    lab.log(f"A/B, same process, {rounds} rounds of 3 x 1000 calls each, order flipped every "
            f"round: {path} (old) vs this tree (new); B=1, out given; named algo, and no algo "
            f"(the default table)")
    for name in [*names, None]:
        per = {"old": [], "new": []}
        for r in range(rounds):
            order = (("old", old), ("new", gdnzoo)) if r % 2 else (("new", gdnzoo), ("old", old))
            for which, mod in order:
                per[which].append(per_call_us(lambda: mod.decode(*a, out=out, algo=name), 3))
        diff = sorted(n - o for o, n in zip(per["old"], per["new"]))
        q1, med, q3 = (diff[int(len(diff) * f)] for f in (0.25, 0.5, 0.75))
        lab.results.setdefault("ab", []).append(dict(algo=name, old_us=per["old"],
                                                     new_us=per["new"]))
        lab.log(f"  algo={name}: old {statistics.median(per['old']):6.2f} us, new "
                f"{statistics.median(per['new']):6.2f} us; new - old per round: median "
                f"{med:+.2f} us (quartiles {q1:+.2f}, {q3:+.2f})")


def main(lab):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", default="cuda-v4,fla-recurrent")
    ap.add_argument("--ab", default=None, metavar="OLD_INIT_PY")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (then e.g. --algo "
                    "pt-reference: the dispatch's share alone)")
    args = ap.parse_args()
    names = [n for n in args.algo.split(",") if n]
    lab.part("breakdown", breakdown, lab, names, args.device)
    if args.ab:
        lab.part("ab", ab, lab, names, args.ab)


if __name__ == "__main__":
    harness.run("host_breakdown", main)

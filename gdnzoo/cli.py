"""The ``gdnzoo`` command line: list | run | bench | tune | check | pack.

Starting it imports no torch: a subcommand's module is imported only when that subcommand
runs (or prints its help), so ``gdnzoo --help`` and ``gdnzoo --version`` answer at once.
"""
from __future__ import annotations

import argparse
import sys
import time

from gdnzoo import __version__
from gdnzoo.bench.args import DEFAULT_BATCHES as BENCH_BATCHES, positive_int


def _table(rows, headers):
    cols = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cols]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_list(args) -> int:
    import gdnzoo
    from gdnzoo import operation, registry
    device = args.device or registry.default_device()
    if device == "cuda" and registry.default_device() != "cuda":
        print("error: --device cuda, but torch sees no CUDA device on this machine",
              file=sys.stderr)
        return 2
    ops = list(registry.load_registry().ops) if args.op == "all" else [args.op]
    for op in ops:
        features = [f for f, _, _ in operation.get(op).features]
        rows = [(b.name, "yes" if b.available else "no", b.language, ",".join(b.state_dtypes),
                 b.min_cc or "-", *("yes" if b.features[f] is True else "no" for f in features),
                 b.reason if not b.available else b.notes)
                for b in gdnzoo.list_backends(device, op=op)]
        print(f"gdnzoo {op} backends on this machine (device: {device}): "
              f"{operation.get(op).summary}\n")
        print(_table(rows, ["name", "available", "language", "state", "min cc", *features,
                            "notes / reason"]))
        print()
    print("A 'no' under a feature: registry.yaml says why that backend cannot serve it, and "
          "a call naming it (algo=) quotes that reason.")
    if "decode" in ops:
        _auto_selection(device)
    return 0


def _auto_selection(device):
    """decode's automatic choice by batch size at the contest geometry, on this machine."""
    from gdnzoo import registry
    from gdnzoo.contract import Problem
    from gdnzoo.inputs import DTYPES
    if device != "cuda":
        order = registry.load_registry().op().fallback.get("cpu", [])
        print("\nauto-selection on CPU (decode): " + " > ".join(order))
        return
    import torch
    gpu, cc = registry.gpu_name(), torch.cuda.get_device_capability()
    row = registry.default_row(gpu)
    print(f"\nauto-selection on {gpu} (decode, contest geometry; "
          f"{'table row ' + repr(row.gpu) if row else 'no default-table row: fallback order'}):")
    for sd in ("fp32", "bf16"):
        for mode, inplace, T in (("in place", True, 1), ("dest    ", False, 1),
                                 ("T=2     ", True, 2)):
            picks = []
            for B in BENCH_BATCHES:
                p = Problem(B=B, T=T, H=4, HV=8, K=128, V=128, state_dtype=DTYPES[sd],
                            io_dtype=DTYPES["bf16"], device="cuda", cc=cc, inplace=inplace)
                try:
                    picks.append(f"B={B}:{registry.select(p).name}")
                except ValueError as e:
                    picks.append(f"B={B}:none ({e})")
            print(f"  {sd} state, {mode}: " + "  ".join(picks))
    from gdnzoo import tables
    geo = [r.label() for r in tables.default_rows(registry.load_registry().op().defaults, gpu)
           if r.geometry is not None]
    if geo:
        print("  other geometries read that row by (sequence, head) pairs; rows of their own: "
              + ", ".join(geo))


def cmd_run(args) -> int:
    import torch

    import gdnzoo
    from gdnzoo import gate
    from gdnzoo.inputs import DTYPES, make_inputs
    H, HV = args.heads
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    x = make_inputs(B=args.batch, T=args.tokens, H=H, HV=HV, K=args.dim, V=args.dim,
                    state_dtype=DTYPES[args.state_dtype], device=device, seed=args.seed)
    try:                               # the choice for the form run (--dest: its own table)
        sel = gdnzoo.select(*x.args(), use_qk_l2norm=args.l2norm, algo=args.algo,
                            **({"new_state": torch.empty_like(x.state)} if args.dest else {}))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"backend: {sel.name} (chosen by {sel.source}: {sel.reason})")
    print(f"inputs: B={args.batch} T={args.tokens} H={H} HV={HV} K=V={args.dim} "
          f"state={args.state_dtype} l2norm={args.l2norm} device={device} seed={args.seed} "
          f"mode={'dest-passing' if args.dest else 'in-place'}")
    # a backend named (--algo) is called by name; else the automatic choice, which falls back
    # where a named one would refuse (GDNZOO_PDL on a backend without PDL: run without it)
    algo = sel.name if args.algo else None
    call, first = (gdnzoo.get(algo) if algo else gdnzoo.decode), []

    def timed(*a, **kw):
        t0 = time.perf_counter()
        res = call(*a, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        first.append(time.perf_counter() - t0)
        return res
    try:
        j, _, _ = gate.gated_call(timed, x, dest=args.dest, use_qk_l2norm=args.l2norm)
    except ValueError as e:            # a call the backend refuses (ALGO with GDNZOO_PDL)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:          # a backend that fails here (pt-compiled: no toolchain)
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("check vs the float64 reference (gdnzoo.gate: no element with abs>1e-2 and rel>1e-2, "
          "and a relative error bound):")
    for what, v, rel in (("output", j.out, j.rel_err_out), ("new_state", j.state, j.rel_err_state)):
        print(f"  {what:<9} max abs {v.max_abs:.3e}  max rel {v.max_rel:.3e}  bad {v.n_bad}  "
              f"relative error {rel:.3e}")
    for r in j.reasons:
        print(f"  FAIL {r}")
    # Timing: wall clock per call, synchronized, after the first (compiling) call.
    # in the form checked: --dest times destination passing (a distinct new_state), not in place
    n = args.iters
    state2 = x.state.clone()
    form = dict(new_state=torch.empty_like(state2)) if args.dest else {}
    for _ in range(3):
        gdnzoo.decode(x.q, x.k, x.v, state2, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                      use_qk_l2norm=args.l2norm, algo=algo, **form)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        gdnzoo.decode(x.q, x.k, x.v, state2, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                      use_qk_l2norm=args.l2norm, algo=algo, **form)
    if device == "cuda":
        torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / n
    print(f"time: first call {first[0] * 1e3:.1f} ms (includes compile/JIT); then {per * 1e6:.1f} us "
          f"per call (wall clock over {n} eager {'dest-passing' if args.dest else 'in-place'} "
          f"calls, state warm; `gdnzoo bench` for kernel time)")
    ok = j.ok
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _pair(s):
    try:
        h, hv = (int(t) for t in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,HV like 4,8; got {s!r}") from None
    if h < 1 or hv < 1 or hv % h:
        raise argparse.ArgumentTypeError(f"expected H,HV >= 1 with HV a multiple of H, got {s!r}")
    return h, hv


def _lazy_sub(sub, name, help_, module, add_fn, cmd_fn, build):
    """A subcommand implemented in gdnzoo.bench.<module>, imported only when ``build``."""
    p = sub.add_parser(name, help=help_, description=help_)
    if not build:
        return
    try:
        mod = __import__(f"gdnzoo.bench.{module}", fromlist=[add_fn])
        getattr(mod, add_fn)(p)
        p.set_defaults(func=getattr(mod, cmd_fn))
    except (ImportError, AttributeError) as e:
        err = f"{name}: unavailable in this install ({type(e).__name__}: {e})"
        p.set_defaults(func=lambda a: (print(f"error: {err}", file=sys.stderr), 2)[1])


def build_parser(command=None):
    """The parser; of the subcommands implemented in gdnzoo.bench, only ``command`` gets its
    arguments, so only its module is imported."""
    ap = argparse.ArgumentParser(prog="gdnzoo", description="Gated Delta Net kernel zoo: the "
                                 "decode step and the chunked prefill, every backend behind one "
                                 "signature")
    ap.add_argument("--version", action="version", version=f"gdnzoo {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND", title="commands", required=True)
    p = sub.add_parser("list", help="every backend with availability, reason and features")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--op", choices=["decode", "prefill", "commit", "all"], default="all",
                   help="the operation whose backends to list (default all)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="one decode step on generated inputs, checked against the reference")
    p.add_argument("--algo", default=None, help="backend name (default: ALGO env, else auto)")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--heads", type=_pair, default=(4, 8), help="H,HV (default 4,8)")
    p.add_argument("--dim", type=positive_int, default=128, help="K = V head size (default 128)")
    p.add_argument("--state-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--tokens", type=positive_int, default=1, help="T tokens per call (default 1)")
    p.add_argument("--l2norm", action="store_true", help="use_qk_l2norm=True")
    p.add_argument("--dest", action="store_true", help="destination-passing (new_state distinct)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iters", type=positive_int, default=20, help="timed calls (default 20)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.set_defaults(func=cmd_run)

    for name, help_, module, add_fn, cmd_fn in (
            ("bench", "side-by-side benchmark of every backend, one mode at a time (dense, dest, "
             "pool, verify, chained, prefill, engine-prefill)", "pipeline", "add_bench_args",
             "cmd_bench"),
            ("tune", "measure and write this GPU's row of the default table", "tune",
             "add_tune_args", "cmd_tune"),
            ("check", "every backend on the contest's workloads, PASS/FAIL (decode: the "
             "54-workload batch mix; --op prefill: the prefill mix)", "check",
             "add_check_args", "cmd_check"),
            ("pack", "export a backend as a flashinfer-bench Solution (--op decode or prefill)",
             "pack",
             "add_pack_args", "cmd_pack")):
        _lazy_sub(sub, name, help_, module, add_fn, cmd_fn, command == name)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    ap = build_parser(command)
    args, extra = ap.parse_known_args(argv)
    if extra:                     # the command's own usage, not the top level's
        sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

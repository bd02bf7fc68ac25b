"""``gdnzoo bench``: every backend x batch size x state dtype, correctness first, three clocks.

Per cell: inputs from :func:`gdnzoo.inputs.make_inputs`; one call through the validated public
callable ``gdnzoo.get(name)`` checked against the float64 reference (the gate, gdnzoo.gate; output
and new state; a destination-passing call must leave ``state`` untouched).  A failing cell gets FAIL
and no time.  Then the raw launcher (``gdnzoo.registry.runner``) is timed on the kernel and graph
clocks and the public callable on the host clock, rotating over enough state sets (and, for
destination passing, new-state sets) that reads and writes miss L2.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass

DEFAULT_BATCHES = (1, 4, 8, 16, 32, 48, 64, 128, 256, 512)
CLOCKS = ("kernel", "graph", "host")
MODES = ("inplace", "dest", "pool", "verify")
STATE_DTYPES = ("fp32", "bf16")
RUN_LAST = ("pt-compiled",)          # slow to compile per shape: a time budget cuts it first
CELL_SECONDS = 0.15                  # target measuring time per clock per cell
WARMUP_CALLS = 8                     # untimed calls per cell before any clock (public + raw)
HOST_WARM_S = 0.02                   # host clock: calls for this long first (CPU clock ramp)
DEFAULT_BUDGET_S = 240.0             # cells; then the floor (~30 s), files and plots

METHOD = (
    "Correctness first: one call through gdnzoo.get(name) vs the float64 reference on the same "
    "inputs; PASS needs both the contest rule (no element with |x-y|>1e-2 and |x-y|/(|y|+1e-8)>1e-2, "
    "no NaN/Inf, right shape/dtype) and relative Frobenius error ||x-y||/||y|| below 1e-2 for the "
    "output and 1e-4 (fp32 state) / 8e-3 (bf16 state) for the new state; a failing cell gets no "
    "time. Cold L2 for reads and writes: calls rotate over N distinct state "
    "sets (destination passing: N state and N new-state sets) with N*set bytes >= 4x the L2 "
    "(N >= 2), updated in place. kernel: CUPTI activity records, per call last end - first start "
    "of all kernels/memcpy/memset it launched, device drained between calls (never inside). "
    "graph: per-call time of many calls captured in one CUDA graph, CUDA events per replay. "
    "host: wall time per eager call via gdnzoo.get(name), batches of back-to-back calls with no "
    "synchronization (measures dispatch until the launch queue fills, then max(dispatch, GPU)). "
    "floor: in-place float4 streaming kernel over exactly the state bytes, best launch shape "
    "searched, same clock and rotation. Medians with p20/p80.")


@dataclass(frozen=True)
class Cell:
    backend: str
    B: int
    H: int
    HV: int
    K: int
    V: int
    T: int
    state_dtype: str
    mode: str            # "inplace" | "dest"
    l2norm: bool = False


def _ints(s):
    return [int(x) for x in str(s).split(",") if x.strip()]


def _words(s):
    return [x.strip() for x in str(s).split(",") if x.strip()]


# Argument types: a bad value is an argparse error (exit status 2) naming the option, before
# anything is measured.

def usage_error(msg):
    """An argument error of ``gdnzoo bench``'s modes: exit status 2, as argparse's own."""
    print(f"gdnzoo bench: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def positive_int(s):
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def positive_ints(s):
    """A comma list of positive integers, e.g. 1,4,16."""
    words = _words(s)
    if not words:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {s!r}")
    return [positive_int(w) for w in words]


def non_negative_float(s):
    try:
        x = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {s!r}") from None
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {s!r}")
    return x


def heads(s):
    """H,HV with HV a multiple of H (kept as the text, as the sweep's callers pass it)."""
    try:
        H, HV = (int(w) for w in str(s).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,HV like 4,8; got {s!r}") from None
    if H < 1 or HV < 1 or HV % H:
        raise argparse.ArgumentTypeError(f"expected H,HV >= 1 with HV a multiple of H, got {s!r}")
    return s


def one_of(valid, what):
    """A comma list of words, each one of ``valid``."""
    def parse(s):
        words = _words(s)
        bad = [w for w in words if w not in valid]
        if bad or not words:
            raise argparse.ArgumentTypeError(f"expected a comma list of {what} from "
                                             f"{', '.join(valid)}; got {s!r}")
        return words
    return parse


ALONE = {"pool": "the serving benchmark", "verify": "the speculative-verify benchmark"}


def modes(s):
    words = one_of(MODES, "modes")(s)
    for m, what in ALONE.items():
        if m in words and len(words) > 1:
            raise argparse.ArgumentTypeError(f"{m} ({what}) runs alone; got {s!r}")
    return words


def token_counts(s):
    """T: one positive integer, or (for --mode verify) a comma list of distinct ones, returned
    as a tuple."""
    words = _words(s)
    if not words:
        raise argparse.ArgumentTypeError(f"expected a positive integer or a comma list of them, "
                                         f"got {s!r}")
    ts = [positive_int(w) for w in words]
    if len(set(ts)) != len(ts):
        raise argparse.ArgumentTypeError(f"expected distinct token counts, got {s!r}")
    return ts[0] if len(ts) == 1 else tuple(ts)


def names(s):
    if not _words(s):
        raise argparse.ArgumentTypeError(f"expected a comma list of backend names or 'all', "
                                         f"got {s!r}")
    return s


class _Unset:
    """Marks a default value of :func:`add_bench_args`, so that a mode with defaults of its own
    (``--mode verify``) tells it from the same value given on the command line."""


class _UnsetList(_Unset, list):
    pass


class _UnsetInt(_Unset, int):
    pass


class _UnsetFloat(_Unset, float):
    pass


def given(value) -> bool:
    """Whether an option's value came from the command line (not :func:`add_bench_args`'s
    default)."""
    return not isinstance(value, _Unset)


def add_bench_args(p):
    p.add_argument("--algo", type=names, default=None,
                   help="comma list of backends or 'all' (default: ALGO env, else all)")
    p.add_argument("--batch", type=positive_ints, default=_UnsetList(DEFAULT_BATCHES),
                   help="comma list of batch sizes (default 1,4,8,16,32,48,64,128,256,512)")
    p.add_argument("--heads", type=heads, default="4,8",
                   help="H,HV (default 4,8: the contest geometry)")
    p.add_argument("--dim", type=positive_int, default=128, help="K = V (default 128)")
    p.add_argument("--tokens", type=token_counts, default=_UnsetInt(1),
                   help="T tokens per call (default 1); --mode verify: a comma list of T in "
                        "2..16 (default 2,4,8)")
    p.add_argument("--state-dtype", type=one_of(STATE_DTYPES, "state dtypes"),
                   default=_UnsetList(["fp32"]),
                   help="fp32, bf16 or fp32,bf16")
    p.add_argument("--timing", type=one_of(CLOCKS, "clocks"), default=list(CLOCKS),
                   help="comma list of kernel,graph,host (default all three)")
    p.add_argument("--mode", type=modes, default=["inplace"],
                   help="inplace, dest or inplace,dest (default inplace); pool: the serving "
                        "benchmark (bench/pool.py), alone; verify: the speculative-verify "
                        "benchmark (bench/verify.py), alone")
    p.add_argument("--l2norm", action="store_true", help="use_qk_l2norm=True")
    p.add_argument("--iters", type=positive_int, default=200,
                   help="most timed calls per clock per cell")
    p.add_argument("--nvbench", action="store_true",
                   help="cross-check kernel time with NVBench (cuda-bench), in a subprocess")
    p.add_argument("--out", default=None,
                   help="results directory (default gdnzoo-results/<gpu-slug>/ in the working "
                        "directory, e.g. gdnzoo-results/h100-80gb-hbm3/; split runs need one "
                        "directory each)")
    p.add_argument("--time-budget", type=non_negative_float, default=_UnsetFloat(DEFAULT_BUDGET_S),
                   help=f"seconds; cells not started by then are SKIPped (slow backends run last); "
                        f"0 = none (default {DEFAULT_BUDGET_S:g}: with compiles and the floor, "
                        f"a full H100 run ends in about 5 minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


# ----------------------------------------------------------------------------- cell planning

def plan(args, names, device):
    H, HV = _ints(args.heads)
    cells = []
    order = [n for n in names if n not in RUN_LAST] + [n for n in names if n in RUN_LAST]
    for mode in args.mode:            # dtype innermost: a time budget cuts whole backends last
        for name in order:
            for B in args.batch:
                for sd in args.state_dtype:
                    cells.append(Cell(name, B, H, HV, args.dim, args.dim, args.tokens, sd, mode,
                                      bool(args.l2norm)))
    return cells


def resolve_names(algo):
    from gdnzoo.registry import env_algo, load_registry
    all_names = load_registry().names
    algo = algo or env_algo() or "all"
    if algo == "all":
        return all_names
    names = _words(algo)
    bad = [n for n in names if n not in all_names]
    if bad:
        raise SystemExit(f"--algo: unknown backend(s) {', '.join(bad)}; valid: {', '.join(all_names)}, all")
    return names


def state_set_bytes(c: Cell) -> int:
    return c.B * c.HV * c.V * c.K * (4 if c.state_dtype == "fp32" else 2)


def bytes_moved(c: Cell, io_bytes: int = 2) -> int:
    """State read + written, plus q, k, v, a, b read and out written, plus A_log, dt_bias."""
    state = 2 * state_set_bytes(c)
    qk = 2 * c.B * c.T * c.H * c.K * io_bytes
    vo = 2 * c.B * c.T * c.HV * c.V * io_bytes
    gates = 2 * c.B * c.T * c.HV * io_bytes + 2 * c.HV * 4
    return state + qk + vo + gates


# ------------------------------------------------------------------------------- one cell

def _problem(c, inp, device):
    import torch

    from gdnzoo.contract import validate
    out = torch.empty(c.B, c.T, c.HV, c.V, dtype=inp.v.dtype, device=device)
    ns = None if c.mode == "inplace" else torch.empty_like(inp.state)
    p, s = validate(*inp.args(), out=out, new_state=ns, use_qk_l2norm=c.l2norm)
    return p, s


def _check(c, name, inp):
    """One call through the public API on fresh buffers, judged by the gate (both rules,
    NaN-prefilled outputs, state untouched in destination passing)."""
    import gdnzoo
    from gdnzoo import gate
    j, _, _ = gate.gated_call(gate.via_public(gdnzoo.get(name)), inp, dest=c.mode == "dest",
                              use_qk_l2norm=c.l2norm)
    return dict(ok=j.ok, reason=j.reason, max_abs_err_out=j.out.max_abs,
                max_abs_err_state=j.state.max_abs, rel_err_out=j.rel_err_out,
                rel_err_state=j.rel_err_state, n_bad=j.n_bad)


def _flags(mod):
    f = getattr(mod, "allocates_state", None)
    try:
        return "warm write target" if callable(f) and f() else ""
    except Exception:
        return ""


def measure_cell(c: Cell, timing, iters, device, seed=0):
    """Rows (one per clock) for one cell: correctness, then each requested clock."""
    import torch

    from gdnzoo import registry
    from gdnzoo.bench import clocks
    from gdnzoo.inputs import make_inputs
    import gdnzoo
    base = dict(cell=c, flags="", n_sets=0, working_set_mib=0.0)
    inp = make_inputs(B=c.B, T=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V, state_dtype=c.state_dtype,
                      device=device, seed=seed)
    p, scale = _problem(c, inp, device)
    ok, why = registry.can_serve(c.backend, p)
    if ok and device == "cpu" and registry.load_registry().backends[c.backend].language == "triton":
        if os.environ.get("TRITON_INTERPRET") != "1":
            ok, why = False, "Triton on CPU needs TRITON_INTERPRET=1 (the interpreter)"
        elif c.B > 4:
            ok, why = False, "Triton interpreter on CPU: only B <= 4 (too slow beyond)"
    if not ok:
        return [dict(base, clock=k, status="SKIP", note=why) for k in timing]
    chk = _check(c, c.backend, inp)
    base.update({k: chk[k] for k in ("max_abs_err_out", "max_abs_err_state", "rel_err_out",
                                      "rel_err_state", "n_bad")})
    if not chk["ok"]:
        return [dict(base, clock=k, status="FAIL", note=chk["reason"]) for k in timing]

    raw = registry.runner(c.backend)
    public = gdnzoo.get(c.backend)
    base["flags"] = _flags(registry.backend_module(c.backend))
    rot = clocks.Rotation(inp.state, dest=c.mode == "dest",
                          l2=clocks.l2_bytes() if device == "cuda" else 0)
    base.update(n_sets=rot.n, working_set_mib=rot.working_set_bytes / 2**20)
    out = torch.empty(c.B, c.T, c.HV, c.V, dtype=inp.v.dtype, device=device)
    q, k, v, A_log, a, dt_bias, b = inp.q, inp.k, inp.v, inp.A_log, inp.a, inp.dt_bias, inp.b

    # One rotation for every clock and warm-up of the cell (see clocks.Rotation).
    def launch(i):
        st, ns = rot.next()
        raw(q, k, v, st, A_log, a, dt_bias, b, scale, out, ns, c.l2norm)

    def call(i):
        st, ns = rot.next()
        public(q, k, v, st, A_log, a, dt_bias, b, scale, out=out,
               new_state=None if ns is st else ns, use_qk_l2norm=c.l2norm)

    for i in range(WARMUP_CALLS):      # compile-on-first-shape backends settle over a few calls
        call(i)
        launch(i)
    est = clocks.event_time_us(launch, 3)
    rows = []
    for clock in timing:
        row = dict(base, clock=clock, status="PASS", note="", samples=[])
        try:
            if clock == "host":
                t0 = time.perf_counter()
                for i in range(3):
                    call(i)
                host_est = (time.perf_counter() - t0) * 1e6 / 3
                per = 10
                nb = int(min(max(CELL_SECONDS * 1e6 / (per * max(host_est, 1.0)), 3), max(iters // per, 3)))
                row["samples"] = clocks.host_times(call, nb, per, warm_s=HOST_WARM_S)
                row["method"] = "perf_counter"
            elif device != "cuda":
                row["note"] = "n/a (no CUDA device)"
            elif clock == "kernel":
                it = int(min(iters, max(10, CELL_SECONDS * 1e6 / (est + 40))))
                row["samples"], row["method"] = clocks.kernel_times(launch, it)
            elif clock == "graph":
                calls = rot.n * max(1, math.ceil(20 / rot.n))
                reps = int(min(max(CELL_SECONDS * 1e6 / (calls * max(est, 1.0)), 3), 20))
                row["samples"] = clocks.graph_times(launch, calls, reps)
                row["method"] = f"CUDA graph of {calls} calls, {reps} replays"
        except clocks.GraphUnsupported as e:
            row["note"] = f"n/a ({e})"
        except Exception as e:
            row.update(status="ERROR", note=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            if device == "cuda":
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- the sweep

class _Progress:
    def __init__(self, total, quiet):
        self.total, self.i, self.bar = total, 0, None
        self.quiet = quiet
        if not quiet:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, unit="cell", leave=False)
            except ImportError:
                pass

    def step(self, label):
        self.i += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif not self.quiet:
            print(f"\r[{self.i}/{self.total}] {label:<40}", end="", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet:
            print(file=sys.stderr)


def floor_rows(floor_cells, timing, device, iters):
    """Floor rows per (B, state dtype) and the device reference numbers (copy bandwidth, empty kernel)."""
    from gdnzoo.bench import floor
    ref = {}
    if device != "cuda":
        return [], dict(note="floor, copy bandwidth, empty kernel: not measured (no CUDA device)")
    try:
        ref["copy"] = floor.copy_bandwidth()
    except Exception as e:
        ref["copy"] = dict(gbps=float("nan"), note=f"{type(e).__name__}: {e}")
    try:
        ref["empty_kernel"] = floor.empty_kernel_us()
    except Exception as e:
        ref["empty_kernel"] = dict(us=float("nan"), note=f"{type(e).__name__}: {e}")
    rows = []
    if "kernel" not in timing:
        return rows, ref
    for c in floor_cells:
        row = dict(cell=c, clock="kernel", status="PASS", note="", flags="", samples=[])
        try:
            f = floor.floor_times(state_set_bytes(c), iters=min(iters, 100))
            row.update(samples=f["samples"], note=f["config"], n_sets=f["n_sets"],
                       working_set_mib=f["n_sets"] * state_set_bytes(c) / 2**20, method=f["method"])
        except Exception as e:
            row.update(status="ERROR", note=f"{type(e).__name__}: {e}")
        rows.append(row)
    return rows, ref


def run_sweep(args, progress=True):
    """Measure every planned cell; returns (rows, device_reference, skipped_clock_notes)."""
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    names = resolve_names(args.algo)
    bad = [k for k in args.timing if k not in CLOCKS]
    if bad:
        raise SystemExit(f"--timing: unknown clock(s) {bad}; valid: {', '.join(CLOCKS)}")
    cells = plan(args, names, device)
    from gdnzoo import registry
    avail = {n: registry.availability(n, device) for n in names}
    notes = []
    if device != "cuda":
        notes.append("no CUDA device: kernel and graph clocks, floor, copy bandwidth and empty "
                     "kernel are skipped; host clock only")
    for n_, (ok, why) in avail.items():
        if not ok:
            notes.append(f"{n_}: skipped ({why})")
    rows = []
    t_start = time.perf_counter()
    bar = _Progress(len(cells), quiet=not progress or getattr(args, "quiet", False))
    for c in cells:
        label = f"{c.backend} B={c.B} {c.state_dtype} {c.mode}"
        bar.step(label)
        ok, why = avail[c.backend]
        if not ok:
            rows += [dict(cell=c, clock=k, status="SKIP", note=why, flags="") for k in args.timing]
            continue
        if args.time_budget and time.perf_counter() - t_start > args.time_budget:
            rows += [dict(cell=c, clock=k, status="SKIP", flags="",
                          note=f"time budget ({args.time_budget:g} s) exhausted") for k in args.timing]
            continue
        try:
            rows += measure_cell(c, args.timing, args.iters, device, args.seed)
        except Exception as e:
            msg = str(e).splitlines()[0][:200] if str(e) else ""
            rows += [dict(cell=c, clock=k, status="ERROR", note=f"{type(e).__name__}: {msg}", flags="")
                     for k in args.timing]
            if device == "cuda":
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
        if device == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    first = {}
    for c in cells:
        first.setdefault((c.B, c.state_dtype), Cell("floor", c.B, c.H, c.HV, c.K, c.V, c.T,
                                                    c.state_dtype, "inplace", c.l2norm))
    frows, ref = floor_rows(list(first.values()), args.timing, device, args.iters)
    return rows + frows, ref, notes


def cmd_bench(args) -> int:
    from gdnzoo.bench import report
    if "verify" in args.mode:                # the speculative-verify benchmark: bench/verify.py
        from gdnzoo.bench import verify
        return verify.cmd_bench_verify(args)
    if isinstance(args.tokens, tuple):
        print(f"gdnzoo bench: error: --tokens: a list of token counts is for --mode verify; "
              f"--mode {','.join(args.mode)} times one T, got {','.join(map(str, args.tokens))}",
              file=sys.stderr)
        return 2
    if "pool" in args.mode:                  # the serving benchmark: bench/pool.py
        from gdnzoo.bench import pool
        return pool.cmd_bench_pool(args)
    rows, ref, notes = run_sweep(args)
    if getattr(args, "nvbench", False):
        from gdnzoo.bench import nvbench_xcheck
        extra, note = nvbench_xcheck.cross_check(rows, args)
        rows += extra
        notes.append(note)
    table = report.build_rows(rows, ref)
    out = args.out or report.default_out_dir()
    env = report.environment(METHOD, ref, notes)
    files = report.write_all(table, env, out, plots=not args.no_plots)
    print(report.console(table, env, notes, files))
    return 1 if any(r["status"] in ("FAIL", "ERROR") for r in table) else 0

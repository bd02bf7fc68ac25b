"""``gdnzoo bench``: one pipeline for every mode.

Design.  A run is plan -> gate -> clocks -> floor -> report -> results:

* plan: the options (bench/args.py) and the mode's own (``Mode.plan``) make a :class:`Plan`:
  geometry, clocks, budget and the run's groups.  A :class:`Cell` is one row key of the
  results (mode, entry, shape, state dtype, form, the mode's own keys); a :class:`Group` is the
  cells measured together (one set of inputs, one floor), the unit a time budget cuts.
* gate: every entry is called once and judged against the float64 reference (gdnzoo.gate,
  through the check the mode's entry carries) before any clock; a failing entry is FAIL and gets
  no time (:func:`gated`).
* clocks: :func:`timed` runs the kernel, graph and host clocks (bench/clocks.py) over a cold
  source (``clocks.Sets``: rotated dense state sets, fresh pool slots, prefill input sets); a
  mode may time clocks of its own (chained).
* floor: the mode's floor rows, measured in the same run (bench/floor.py).
* report: one table (bench/report.py): long-format rows, the derived columns (``x_floor``
  through ``Mode.floor_of``, bandwidth through ``Mode.bytes_moved``, the automatic choice
  against the best entry of each cell through ``Mode.problem``), then ``Mode.derive`` (bars).
* results: one schema, writer and reader (bench/report.py), one console renderer
  (bench/console.py: a grid per ``Mode.sections`` and the mode's ``extra_lines``), plots.

A mode is one module (bench/mode_*.py), registered by name in ``args.MODES``: a :class:`Mode`
whose hooks supply its plan, a group's ``context``, each cell's ``entry`` (ours and the peers',
its inputs and check) or ``floor_rows``, bytes moved, its extra columns and cell keys
(``columns``, ``keys``), console sections and bars.  A new mode (prefill: cells keyed by a
sequence mix, TFLOP/s and error columns, a compute floor) is a new module and touches nothing
here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gdnzoo.bench import args as A, entries

add_bench_args = A.add_bench_args    # gdnzoo bench's options, where the CLI looks for them
CELL_SECONDS = 0.15                  # target measuring time per clock per cell
WARMUP_CALLS = 8                     # untimed calls per entry before any clock
HOST_WARM_S = 0.02                   # host clock: calls for this long first (CPU clock ramp)
HOST_BATCH_US = 1000.0               # host clock: a synchronized batch lasts about this long
NAN = float("nan")
ERRS = ("max_abs_err_out", "max_abs_err_state", "rel_err_out", "rel_err_state", "n_bad")


@dataclass(frozen=True)
class Cell:
    """One row key of the results, the clock aside."""
    bench: str               # the gdnzoo bench mode that measured it
    backend: str             # the entry: a backend, "floor", "auto", a peer
    B: int                   # sequences
    T: int                   # tokens per sequence
    H: int                   # q, k heads
    HV: int                  # v heads
    K: int                   # q, k head size
    V: int                   # v head size
    state_dtype: str
    mode: str                # the call's form: inplace, dest, pool, a verify form, a PDL level
    l2norm: bool = False
    keys: tuple = ()         # the mode's own key columns, (name, value) pairs


@dataclass
class Group:
    """Cells measured together: ``cells`` is [(Cell, clocks)], ``key`` the mode's handle on
    them; ``skip``: not measured, every row SKIP with this reason; ``budgeted``: cut (SKIP)
    once the time budget is spent."""
    label: str
    cells: list
    key: tuple = ()
    budgeted: bool = True
    skip: str = ""


@dataclass
class Plan:
    mode: "Mode"
    words: list              # --mode as given (dense,dest: one run)
    batches: tuple
    states: tuple
    tokens: tuple
    H: int
    HV: int
    K: int
    V: int
    l2norm: bool
    clocks: tuple
    iters: int
    seed: int
    budget: float
    device: str
    layers: int | None = None
    quiet: bool = False
    layout: str = "k-last"   # the state's layout (--state-layout; dense, dest, prefill)
    backends: tuple = ()     # ours: the gdnzoo backends timed by name
    entries: tuple = ()      # every entry of a cell, in order
    groups: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    gpu: bool = False        # the device is a CUDA device, of this L2 and compute capability
    l2: int = 0
    cc: tuple | None = None
    cache: dict = field(default_factory=dict)    # what a mode keeps across groups (its pools)

    @property
    def why_not_gpu(self) -> str:
        import torch
        return "--device cpu" if torch.cuda.is_available() else "no CUDA device"

    def sync(self):
        if self.gpu:
            import torch
            # a sticky device error is not raised here: the next entries say so too
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()

    def cell(self, backend, form, B, sd, T=None, **keys) -> Cell:
        return Cell(self.mode.bench_of(form), backend, B, self.tokens[0] if T is None else T,
                    self.H, self.HV, self.K, self.V, sd, form, self.l2norm,
                    tuple(sorted(keys.items())))


class Mode:
    """What a mode supplies; the defaults are the dense decode bench's."""
    name = ""
    op = "decode"            # the operation whose backends it times
    not_rivals = ()          # entries that auto/best never counts (an engine's own sequence)
    method = ""              # results.json's environment.method
    columns = {}             # its own result columns: name -> value when a row has none
    keys = ()                # its own cell keys (result columns too)
    clocks = A.CLOCKS        # the clocks it can time
    defaults = {}            # option -> value when not given: batch, state_dtype, tokens, ...
    cpu = "host"             # no CUDA device: "host" (CPU clocks), "check" (gate only), "skip"
    busy = False             # kernel clock: the sum of a call's records (and their number)
    subdir = ""              # its folder under the default results folder
    nvbench = False
    gpu_only = ""            # why nothing is measured without a CUDA device (cpu "skip")
    progress = None          # its progress line: (clock, name the forms) of summary_line
    # what the console says of the run's calls after their geometry (str.format of the run's
    # ``tokens``, ``l2norm``, ``layers``, ``kernel_clock``), and of a K-first state
    headline = "T={tokens}, use_qk_l2norm={l2norm}"
    k_first = ""
    floors = {"kernel": {"clock": "kernel"}}   # clock -> the floor row's columns that differ

    def bench_of(self, form) -> str:
        return self.name

    def plan(self, plan: Plan, args):
        raise NotImplementedError

    def measure(self, group: Group, plan: Plan) -> list:
        """Each cell of the group on its own over the group's ``context`` (an exception is ERROR
        rows of its entry alone): the floor's rows (``floor_rows``), or an entry's
        (:func:`gated` of ``entry``: an :class:`Entry`, or Skip where it cannot run)."""
        ctx = self.context(group.key, plan)
        return [r for c, k in group.cells for r in guarded(
            lambda: self.floor_rows(c, ctx, plan) if c.backend == "floor"
            else gated(c, k, lambda: self.entry(c, ctx, plan), plan), [(c, k)], plan)]

    def context(self, key, plan: Plan):
        """What the entries of the group of ``key`` share (None: nothing)."""

    def finish(self, rows, plan: Plan, args):
        """After the last group (flags, cross-checks)."""

    def cpu_reason(self, plan: Plan) -> str:
        return (f"{plan.why_not_gpu}: {self.gpu_only or f'--mode {self.name} times GPU kernels'}"
                f"; nothing was measured")

    def floor_of(self, row) -> dict | None:
        """Which floor row divides ``row`` (its key columns that differ), None: none."""
        return self.floors.get(row["clock"])

    def bytes_moved(self, c: Cell) -> int:
        """State read + written, plus (not the floor) :func:`io_bytes`."""
        return 2 * state_bytes(c) + (0 if c.backend == "floor" else io_bytes(c))

    def problem(self, c: Cell, plan: Plan, **kw):
        """The Problem the automatic choice sees for cell ``c`` (None: no automatic choice)."""
        from gdnzoo.inputs import DTYPES, make_problem
        return make_problem(B=c.B, T=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V,
                            state_dtype=DTYPES[c.state_dtype], device=plan.device, cc=plan.cc,
                            use_qk_l2norm=c.l2norm, **kw)

    def derive(self, table, plan: Plan):
        """Columns of its own on the built table (bars)."""

    def sections(self, plan: Plan, table) -> list:
        """Console grids: [(title line(s), keep(row) -> bool, show x floor[, the column whose
        values are the grid's rows (default B)])]."""
        return []

    def extra_lines(self, table, plan: Plan) -> list:
        return []

    def summary(self, rows) -> str | None:
        """A progress line after each group (:func:`summary_line` of the mode's ``progress``:
        (clock, name the forms); None: a progress bar only)."""
        return None if self.progress is None else summary_line(rows, *self.progress)


def host_batches(call_us: float, iters: int) -> tuple:
    """(calls per batch, batches) of the host clock for a call of about ``call_us`` (the
    larger of its dispatch and GPU estimates).  Each batch is synchronized at both ends, so a
    sample is max(dispatch, GPU) per call plus one call's other part spread over the batch:
    batches of about HOST_BATCH_US, 10 to 100 calls, keep that near 1% (why synchronized:
    clocks.host_times).  Batches: as many as ``iters`` calls and CELL_SECONDS allow, at least 5."""
    per = int(min(max(math.ceil(HOST_BATCH_US / call_us), 10), 100))
    nb = int(max(min(CELL_SECONDS * 1e6 / (per * call_us), iters // per), 5))
    return per, nb


def state_bytes(c: Cell) -> int:
    """One set of the cell's states: B x [HV, V, K] of its state dtype."""
    return c.B * c.HV * c.V * c.K * (4 if c.state_dtype == "fp32" else 2)


def io_bytes(c: Cell) -> int:
    """q, k, v, a, b read and out written (bf16), A_log and dt_bias read (fp32)."""
    return 2 * c.B * c.T * (2 * c.H * c.K + 2 * c.HV * c.V + 2 * c.HV) + 2 * c.HV * 4


def get_mode(name) -> Mode:
    return importlib.import_module(f"gdnzoo.bench.{A.MODES[name]}").MODES[name]


# ----------------------------------------------------------------------------- rows

def rows_of(cell, clocks, status, note="", **extra) -> list:
    return [dict(cell=cell, clock=k, status=status, note=note, **{"flags": "", **extra})
            for k in clocks]


def section(title, with_floor=False, by="B", **match) -> tuple:
    """A console grid of ``Mode.sections``: the rows whose columns equal ``match``."""
    return title, lambda r: all(r[k] == v for k, v in match.items()), with_floor, by


def joined(*notes) -> str:
    return "; ".join(n for n in notes if n)


def errors(chk) -> dict:
    return {k: chk[k] for k in ERRS if k in chk}


def summary_line(rows, clock="kernel", forms=False) -> str:
    """One progress line: each timed median on ``clock`` and its multiple of the floor of its
    form, then the entries checked but not timed or not passed."""
    med = {(r["cell"].backend, r["cell"].mode): statistics.median(r["samples"]) for r in rows
           if r["clock"] == clock and r["status"] == "PASS" and r.get("samples")}

    def label(name, form):
        return f"{name}[{form}]" if forms else name
    parts = [f"{label(n, f)} {us:.2f}" + (f" {us / fl:.2f}x" if (fl := med.get(("floor", f)))
                                          and n != "floor" else "") for (n, f), us in med.items()]
    other = [f"{label(r['cell'].backend, r['cell'].mode)} "
             f"{'checked' if r['status'] == 'PASS' else r['status']}" for r in rows
             if r["clock"] == clock and r["status"] != "SKIP" and not r.get("samples")]
    return " | ".join(parts + other) or "nothing ran"


def judged(j) -> dict:
    """A check's dict from a gdnzoo.gate judgement."""
    return dict(ok=j.ok, reason=j.reason, max_abs_err_out=j.out.max_abs,
                max_abs_err_state=j.state.max_abs, rel_err_out=j.rel_err_out,
                rel_err_state=j.rel_err_state, n_bad=j.n_bad)


def failure(e) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def guarded(fn, cells, plan, **extra) -> list:
    """fn()'s rows, or ERROR rows for ``cells`` ([(Cell, clocks)]) naming the exception (and
    carrying ``extra``)."""
    try:
        return fn()
    except Exception as e:
        plan.sync()
        return [r for c, k in cells for r in rows_of(c, k, "ERROR", failure(e), **extra)]


def records(counts) -> tuple:
    """(median records per call, a note when they varied)."""
    lo, hi = min(counts), max(counts)
    return statistics.median(counts), ("" if lo == hi else f"records per call {lo}-{hi}")


# ----------------------------------------------------------------------------- gate, clocks

@dataclass
class Entry:
    """One checked-then-timed entry: ``call(*args)`` launches one call on what the cold source
    ``cold`` (a clocks.Sets) hands it; ``check()``: the gate's dict; ``host(i)``: the host
    clock's call; ``base``: columns every row carries."""
    call: object
    check: object
    cold: object
    note: str = ""
    host: object = None
    base: dict = field(default_factory=dict)


def gated(cell, clocks, setup, plan) -> list:
    """Rows of one entry: SKIP (``setup()`` raised Skip), FAIL (the gate), PASS checked but not
    timed (no CUDA device, a mode that checks there), or :func:`timed`'s."""
    try:
        e = setup()
    except entries.Skip as s:
        return rows_of(cell, clocks, entries.skip_status(str(s)), str(s))
    chk = e.check()
    base = {**e.base, **errors(chk)}
    if not chk["ok"]:
        return rows_of(cell, clocks, "FAIL", chk["reason"], **base)
    if not plan.gpu and (plan.mode.cpu == "check" or "host" not in clocks):
        # a mode that checks on CPU, or only GPU clocks asked for (--timing kernel)
        return rows_of(cell, clocks, "PASS", joined(e.note, "checked, not timed (not on a CUDA "
                                                            "device)"), **base)
    return timed(cell, clocks, e, plan, plan.mode.busy, base)


def timed(cell, clock_names, e: Entry, plan, busy=False, base=None) -> list:
    """Each clock of ``clock_names`` (kernel, graph, host) of the checked entry ``e``: warm-up
    calls, a rough estimate that sizes the sessions, then one session per clock over ``e``'s
    cold source (one counter for all of them).  ``busy``: the kernel clock sums a call's
    records and counts them (``kernels_per_call``)."""
    from gdnzoo.bench import clocks
    cold = e.cold
    base = dict(base or {}, n_sets=cold.n)
    if hasattr(cold, "working_set_bytes"):
        base["working_set_mib"] = cold.working_set_bytes / 2**20
    launch, prep = cold.kernel(e.call), cold.prepare

    def once(i):
        if prep is not None:
            prep(i)
        launch(i)
    for i in range(WARMUP_CALLS):      # compile-on-first-shape backends settle over a few calls
        if e.host is not None:
            e.host(i)
        once(i)
    est = clocks.event_time_us(once, 3)
    rows = []
    for clock in clock_names:
        row = dict(base, cell=cell, clock=clock, status="PASS", note=e.note, flags="", samples=[])
        try:
            if clock == "host":
                t0 = time.perf_counter()
                for i in range(3):
                    e.host(i)
                call_us = max((time.perf_counter() - t0) * 1e6 / 3, est, 1.0)
                per, nb = host_batches(call_us, plan.iters)
                row["samples"] = clocks.host_times(e.host, nb, per, warm_s=HOST_WARM_S)
                row["method"] = "perf_counter"
            elif not plan.gpu:
                row["note"] = joined(e.note, "n/a (no CUDA device)")
            elif clock == "kernel":
                it = int(min(plan.iters, max(10, CELL_SECONDS * 1e6 / (est + 40))))
                got, row["method"] = clocks.kernel_times(
                    launch, it, reduce=clocks.busy_and_count if busy else clocks.span_us,
                    prepare=prep)
                row["samples"] = [s for s, _ in got] if busy else got
                if busy:
                    row["kernels_per_call"], varied = records([n for _, n in got])
                    row["note"] = joined(e.note, varied)
            elif clock == "graph":
                n = cold.n
                calls = n * max(1, math.ceil(20 / n))
                reps = int(min(max(CELL_SECONDS * 1e6 / (calls * max(est, 1.0)), 3), 20))
                row["samples"] = clocks.graph_times(cold.graph(e.call), calls, reps)
                row["method"] = f"CUDA graph of {calls} calls, {reps} replays"
        except clocks.GraphUnsupported as x:
            row["note"] = f"n/a ({x})"
        except Exception as x:
            row.update(status="ERROR", note=failure(x))
            plan.sync()
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- the run

class Progress:
    def __init__(self, total, quiet):
        self.total, self.i, self.bar, self.quiet = total, 0, None, quiet
        if not quiet:
            with contextlib.suppress(ImportError):
                from tqdm import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, unit="cell", leave=False)

    def step(self, label):
        self.i += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif not self.quiet:
            print(f"\r[{self.i}/{self.total}] {label:<40}", end="", file=sys.stderr, flush=True)

    def log(self, line):
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        elif not self.quiet:
            print(f"\r{line}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet:
            print(file=sys.stderr)


def make_plan(args) -> Plan:
    """The run's plan from ``gdnzoo bench``'s options; a bad one is a usage error (exit 2)."""
    import torch
    notes = A.resolve(args)
    mode = get_mode(args.mode[0])
    d = mode.defaults

    def opt(name):
        v = getattr(args, name)
        return d[name] if name in d and not A.given(v) else v
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        A.usage_error("--device cuda: no CUDA device is available")
    timing = opt("timing")
    if A.given(args.timing):
        kept = [c for c in timing if c in mode.clocks]
        if not kept:
            A.usage_error(f"--timing: --mode {mode.name} times "
                          f"{' and/or '.join(mode.clocks)}, got {','.join(timing)}")
        if len(kept) < len(timing):
            notes.append(f"--timing: --mode {mode.name} has no "
                         f"{', '.join(c for c in timing if c not in kept)} clock")
        timing = kept
    else:
        timing = [c for c in mode.clocks if c in timing] or list(mode.clocks)
    tokens = opt("tokens")
    if isinstance(tokens, tuple) and "tokens" not in d:
        A.usage_error(f"--tokens: a list of token counts is for --mode verify; --mode "
                      f"{','.join(args.mode)} times one T, got {','.join(map(str, tokens))}")
    if args.nvbench and not mode.nvbench:
        notes.append(f"--nvbench: not available in --mode {mode.name}")
    if args.state_layout != "k-last" and mode.name not in ("dense", "prefill"):
        A.usage_error(f"--state-layout: a K-first state is timed by --mode dense, dest and "
                      f"prefill, not --mode {','.join(args.mode)}")
    H, HV = args.heads
    plan = Plan(mode, list(args.mode), tuple(opt("batch")), tuple(opt("state_dtype")),
                tokens if isinstance(tokens, tuple) else (tokens,), H, HV, args.dim, args.dim,
                bool(args.l2norm), tuple(timing), args.iters, args.seed,
                float(opt("time_budget")), device, args.layers, bool(args.quiet),
                args.state_layout, notes=notes)
    if device == "cuda":
        from gdnzoo.bench import clocks
        plan.gpu, plan.l2, plan.cc = True, clocks.l2_bytes(), torch.cuda.get_device_capability()
    mode.plan(plan, args)
    return plan


def reference(plan) -> dict:
    """Copy bandwidth and an empty kernel, measured in this run (a CUDA device only)."""
    from gdnzoo.bench import floor
    if not plan.gpu:
        return dict(note="copy bandwidth, empty kernel: not measured (no CUDA device)")
    ref = {}
    for key, fn, nan in (("copy", floor.copy_bandwidth, "gbps"),
                         ("empty_kernel", floor.empty_kernel_us, "us")):
        try:
            ref[key] = fn()
        except Exception as e:
            ref[key] = {nan: NAN, "note": failure(e)}
    return ref


def measure(plan: Plan, args=None) -> tuple:
    """Every group of the plan (budget, skips, errors), the mode's finish, the automatic
    choice of each cell: (raw rows, device reference)."""
    import torch
    mode, rows = plan.mode, []
    ref = reference(plan)
    off = not plan.gpu and mode.cpu == "skip"
    if off:
        plan.notes.insert(0, mode.cpu_reason(plan))
    bar = Progress(len(plan.groups), plan.quiet)
    t0 = time.perf_counter()
    for g in plan.groups:
        bar.step(g.label)
        why = mode.cpu_reason(plan) if off else g.skip
        if not why and g.budgeted and plan.budget and time.perf_counter() - t0 > plan.budget:
            why = f"time budget ({plan.budget:g} s) exhausted"
        if why:
            rows += [r for c, k in g.cells for r in rows_of(c, k, entries.skip_status(why), why)]
            continue
        got = guarded(lambda: mode.measure(g, plan), g.cells, plan)
        rows += got
        line = mode.summary(got)
        if line is not None:
            bar.log(f"[{bar.i}/{bar.total}] {g.label} ({time.perf_counter() - t0:.0f} s): " + line)
        if plan.gpu:
            torch.cuda.empty_cache()
    bar.close()
    mode.finish(rows, plan, args)
    pick = functools.lru_cache(maxsize=None)(     # per cell, whatever its entry
        lambda cell: "" if (p := mode.problem(cell, plan)) is None else entries.choice(p))
    for r in rows:
        if r["cell"].backend != "floor":
            r["auto"] = pick(dataclasses.replace(r["cell"], backend=""))
    return rows, ref


def cmd_bench(args) -> int:
    """``gdnzoo bench``: exit 2 on a bad option (before anything is measured), 1 if an entry
    failed its check or broke, else 0 (also when nothing could be measured: the rows say why)."""
    from gdnzoo.bench.report import default_out_dir
    pdl_note = A.drop_env_pdl("gdnzoo bench")
    plan = make_plan(args)
    if pdl_note:
        plan.notes.append(pdl_note)
    out = A.check_out(args.out or Path(default_out_dir()) / plan.mode.subdir)
    rows, ref = measure(plan, args)
    table, _ = results(plan, rows, ref, out, plots=not args.no_plots)
    return 1 if any(r["status"] in ("FAIL", "ERROR") for r in table) else 0


def results(plan, rows, ref, out, plots=True) -> tuple:
    """The run's table, its files under ``out`` (and plots), printed on the console:
    (table, environment)."""
    from gdnzoo.bench import console, plots as drawing, report
    table = report.build_table(rows, ref, plan)
    env = report.environment(plan.mode.method, ref, plan.notes)
    if plan.layout != "k-last":
        env["state_layout"] = plan.layout              # what tune --from must not read as k-last
    files = report.write_results(table, env, out, report.columns(plan.mode))
    drawn = drawing.plot_all(table, env, out, plan) if plots else "not drawn (--no-plots)"
    print(console.render(table, env, plan, files, drawn))
    return table, env

"""``gdnzoo bench --mode pool``: the serving benchmark.

The call a serving engine makes, timed per (B, state dtype), fp32 and bf16 in one run:

* a state pool of at least 2 GiB (or 4x the L2, whichever is larger) whose slots are a page
  apart, page = HV*V*K*(1 + 1/32) elements (vLLM's layout: other per-sequence data shares the
  page); slot 0 is the null slot (``null_slot=0``) and is never used;
* q, k, v views of one packed ``mixed_qkv`` [B, 2*H*K + HV*V] bf16, a and b strided views of
  one [B, 2*HV] tensor, ``use_qk_l2norm=True``, T = 1, the state updated in place;
* fresh random distinct slots every call.  Before timing, a bank of index rows is generated on
  the device: ``rows`` rows of B distinct slots, no slot in two rows, rows * B * slot bytes >= 4x
  the L2 (clocks.rotation_count), each row on a 256-byte boundary.  Kernel clock: every call
  passes one persistent index tensor, as an engine passes its slot mapping, and before each call
  the next row is copied into it by a device copy outside the timed window (clocks.kernel_times'
  ``prepare``): the call's slots are cold and new, its index tensor was just written, so it is
  in L2, as an engine's freshly uploaded slot mapping is.  Graph clock: a copy between calls
  would be inside the graph's time, so the graph's N calls pass N per-call index tensors (rows
  of the bank), read cold.  Every entry (the floor included) draws its rows from one counter per
  cell, so no session starts on slots another just touched.

Entries, each a row of the results: the pool floor (:func:`gdnzoo.bench.floor.pool_floor_times`);
``auto`` (``gdnzoo.decode``'s own choice, named in the note); each pool-capable gdnzoo backend
(``gdnzoo.get(name)``, ``vllm-packed`` among them when registered); ``flashinfer-pool``
(FlashInfer's ``gated_delta_rule_decode_pretranspose`` with ``initial_state_indices``, bf16 state
only, its q, k, v, a, b made contiguous once per cell, outside the timed calls); the engine
adapters ``adapter-vllm`` and ``adapter-sglang`` (``gdnzoo.integrations.<engine>.packed_decode``),
whose CUPTI records per call must equal ``auto``'s.  Each is checked once per cell against the
float64 reference (gdnzoo.gate: out and the written slots; no other byte of the pool may change)
before it is timed; a failed check marks the cell FAIL and times nothing.  Kernel clock: CUPTI, per call the sum of every record
(kernel, memcpy, memset) the call launched, and their number.  Graph clock (``auto`` and
``vllm-packed``): wall time per call in a CUDA graph of N calls.  Without a CUDA device nothing
is timed: every cell is reported SKIP with the reason and the command exits 0.

Arguments are ``gdnzoo bench``'s.  ``--batch``, ``--state-dtype`` and ``--time-budget`` left at
the dense bench's defaults (or set to them) read as not given: B = 1, 4, 8, 16, 32, 64, 128,
256, 512, fp32 and bf16, 480 s.  ``--algo`` names the gdnzoo backends to time (default: every
registered one that takes pools natively); the floor, ``auto``, the peers and the adapters
always run.

Writes ``results.csv`` and ``results.json`` (``gdnzoo bench``'s columns plus ``kernels_per_call``;
``gdnzoo tune --from`` reads it for the default table's ``table_pool``) under ``--out`` (default:
the bench's results folder for this GPU, ``/pool``), prints a line per cell as it goes and a
table per state dtype, each entry as a multiple of the same-run pool floor.
"""
from __future__ import annotations

import importlib
import math
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from gdnzoo.bench import clocks, sweep

POOL_BATCHES = (1, 4, 8, 16, 32, 64, 128, 256, 512)
STATES = ("fp32", "bf16")
MIN_POOL_BYTES = 2 << 30
PAGE_EXTRA = 32                     # page = slot + slot / PAGE_EXTRA elements
NULL_SLOT = 0
ROW_ALIGN = 64                      # index rows start every 64 int32 (256 bytes)
FI_STATES = ("bf16",)
BUDGET_S = 480.0                    # default --time-budget: a full H100 run, compiles included
GRAPH_ENTRIES = ("auto", "vllm-packed")
ADAPTERS = {"adapter-vllm": "gdnzoo.integrations.vllm",
            "adapter-sglang": "gdnzoo.integrations.sglang"}
PEERS = ("flashinfer-pool",) + tuple(ADAPTERS)
COLUMNS_EXTRA = ("kernels_per_call",)

METHOD = (
    "Serving convention: state pool >= max(2 GiB, 4x L2), page stride HV*V*K*(1+1/32), slot 0 "
    "the null slot; q/k/v views of one packed mixed_qkv, a/b strided views of one [B, 2*HV] "
    "tensor; use_qk_l2norm=True; T=1, in place. Cold: fresh slots every call from a bank of index "
    "rows (B distinct random slots each, no slot in two rows, rows*B*slot bytes >= 4x L2) made "
    "on the device before timing; kernel clock: one persistent index tensor, the next row copied "
    "into it before each call outside the timed window (index in L2, slots cold); graph clock: "
    "N calls on N per-call rows (index read cold). Correctness first: one call per entry and "
    "cell vs the float64 reference (gdnzoo.gate on out and the written slots, nothing else of "
    "the pool changed); a failing entry gets no time. "
    "kernel: CUPTI records per call, the sum of every kernel/memcpy/memset the call launched, "
    "and their number (kernels_per_call). graph: per-call wall time of a CUDA graph of N calls. "
    "floor: streaming read-modify-write of exactly each call's slots through the same index "
    "rows, best launch shape searched. Medians with p20/p80.")


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Plan:
    batches: tuple
    states: tuple
    backends: tuple          # gdnzoo backends timed by name (besides auto)
    entries: tuple           # every entry, in order (the floor first)
    H: int
    HV: int
    K: int
    V: int
    clocks: tuple            # "kernel" and/or "graph"
    budget: float            # seconds; cells not started by then are SKIPped (0: none)
    notes: tuple             # what the arguments changed or dropped, said once


def pool_backends() -> list:
    """Registered backends that take pools natively (``pools: true``, not the torch
    gather-and-scatter forms), in registry order."""
    from gdnzoo.registry import load_registry
    return [n for n, s in load_registry().backends.items()
            if s.pools is True and s.language != "python"]


def make_plan(args) -> Plan:
    """The run's batch sizes, state dtypes and entries from ``gdnzoo bench`` arguments."""
    if args.tokens != 1:
        raise SystemExit(f"--tokens: the serving benchmark is a decode step, T=1; got "
                         f"{args.tokens}")
    notes = []
    batches = tuple(args.batch) if sweep.given(args.batch) else POOL_BATCHES
    states = tuple(args.state_dtype) if sweep.given(args.state_dtype) else STATES
    backends = named_backends(args.algo, pool_backends, SystemExit)
    H, HV = sweep._ints(args.heads)
    timing = tuple(c for c in args.timing if c in ("kernel", "graph"))
    if not timing:
        raise SystemExit(f"--timing: pool mode times kernel and/or graph, got "
                         f"{','.join(args.timing)}")
    if getattr(args, "nvbench", False):
        notes.append("--nvbench: not available in pool mode")
    entries = ("floor", "auto", *backends, *PEERS)
    budget = float(args.time_budget) if sweep.given(args.time_budget) else BUDGET_S
    return Plan(batches, states, tuple(backends), entries, H, HV, args.dim, args.dim, timing,
                budget, tuple(notes))


# ----------------------------------------------------------------------------- the inputs

def page_elems(HV, V, K) -> int:
    slot = HV * V * K
    return slot + slot // PAGE_EXTRA


def rows_for(B, slot_bytes, l2) -> int:
    """Index rows of a cell: rows * B * slot bytes >= 4x L2 (at least 2)."""
    return clocks.rotation_count(B * slot_bytes, l2)


def pool_slots(batches, HV, V, K, elem, l2, min_bytes=MIN_POOL_BYTES) -> int:
    """Slots of the pool of one state dtype: at least ``min_bytes`` and 4x L2 of pages, and
    room for every cell's rows plus its check row, slot 0 aside."""
    page = page_elems(HV, V, K) * elem
    need = max(rows_for(B, HV * V * K * elem, l2) * B + B for B in batches) + 1
    return max(math.ceil(max(min_bytes, 4 * l2) / page), need)


class StatePool:
    """A pool [P, HV, V, K] with a page stride (``buf``: its whole flat storage)."""

    def __init__(self, P, HV, V, K, dtype, device, seed=0):
        self.page, self.slot = page_elems(HV, V, K), HV * V * K
        self.buf = torch.empty(P * self.page, dtype=dtype, device=device)
        gen = torch.Generator(device=device).manual_seed(seed)
        self.buf.normal_(0.0, 0.05, generator=gen)       # the magnitudes make_inputs gives
        self.state = self.buf.as_strided((P, HV, V, K), (self.page, V * K, K, 1))
        self.P = P

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()


class Slots:
    """The index rows of one cell: ``rows`` rows of B distinct slots in [1, P), no slot in two
    rows, plus a check row of B other slots; each row an int32 [B] view starting on a 256-byte
    boundary.  :meth:`next` hands out rows round robin from one counter."""

    def __init__(self, P, B, rows, device, seed=0):
        if rows * B + B > P - 1:
            raise ValueError(f"slots: {rows} rows and a check row of B={B} need "
                             f"{rows * B + B} slots; the pool has {P - 1} besides the null slot")
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(P - 1, generator=gen)[:(rows + 1) * B] + 1
        width = -(-B // ROW_ALIGN) * ROW_ALIGN
        bank = torch.full((rows + 1, width), -1, dtype=torch.int32)
        bank[:, :B] = perm.view(rows + 1, B).to(torch.int32)
        self.bank = bank.to(device)
        self.rows = [self.bank[i, :B] for i in range(rows)]
        self.check = self.bank[rows, :B]
        self.index = self.check.clone()          # the calls' own tensor: always valid slots
        self.B, self._turn = B, 0

    def next(self) -> torch.Tensor:
        row = self.rows[self._turn % len(self.rows)]
        self._turn += 1
        return row

    def row(self, i) -> torch.Tensor:
        return self.rows[i % len(self.rows)]

    def advance(self, i=None):
        """Copy the next row into :attr:`index` (a device copy; ``i`` is unused)."""
        self.index.copy_(self.next())


class ServingInputs:
    """One cell's activations in the engines' layout: q, k, v views of ``mixed`` [B, 2*H*K +
    HV*V] and a, b views of ``ab`` [B, 2*HV] (also as the engines' [B, HV] ``a2``, ``b2``)."""

    def __init__(self, B, H, HV, K, V, state_dtype, device, seed=0):
        from gdnzoo.inputs import make_inputs
        x = make_inputs(B=B, T=1, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype,
                        device=device, seed=seed)
        HK = H * K
        self.mixed = torch.cat([x.q.reshape(B, HK), x.k.reshape(B, HK),
                                x.v.reshape(B, HV * V)], dim=1).contiguous()
        self.ab = torch.cat([x.a.reshape(B, HV), x.b.reshape(B, HV)], dim=1).contiguous()
        self.q = self.mixed[:, :HK].view(B, 1, H, K)
        self.k = self.mixed[:, HK:2 * HK].view(B, 1, H, K)
        self.v = self.mixed[:, 2 * HK:].view(B, 1, HV, V)
        self.a2, self.b2 = self.ab[:, :HV], self.ab[:, HV:]
        self.a, self.b = self.a2.unsqueeze(1), self.b2.unsqueeze(1)
        self.A_log, self.dt_bias, self.scale = x.A_log, x.dt_bias, x.scale
        self.out = torch.empty(B, 1, HV, V, dtype=x.v.dtype, device=device)

    def args(self, state):
        """gdnzoo.decode's positional arguments with ``state``."""
        return (self.q, self.k, self.v, state, self.A_log, self.a, self.dt_bias, self.b,
                self.scale)


@dataclass
class CellCtx:
    B: int
    sd: str
    pool: StatePool
    x: ServingInputs
    slots: Slots
    ref: tuple = None        # float64 (out, state of the check slots), made by the first check


# ----------------------------------------------------------------------------- the entries

class Skip(Exception):
    """An entry that cannot run in this cell (the message says why)."""


def _gdnzoo_call(ctx, algo):
    import gdnzoo
    fn = gdnzoo.decode if algo is None else gdnzoo.get(algo)
    x, pool = ctx.x, ctx.pool.state

    def call(idx):
        fn(*x.args(pool), out=x.out, use_qk_l2norm=True, state_indices=idx, null_slot=NULL_SLOT)
    return call


def problem(ctx):
    from gdnzoo.contract import validate
    return validate(*ctx.x.args(ctx.pool.state), out=ctx.x.out, use_qk_l2norm=True,
                    state_indices=ctx.slots.check, null_slot=NULL_SLOT)[0]


def entry_call(name, ctx):
    """(call(idx), note) of entry ``name`` in this cell; raises Skip with the reason."""
    from gdnzoo import registry
    if name == "auto":
        import gdnzoo
        sel = gdnzoo.select(*ctx.x.args(ctx.pool.state), out=ctx.x.out, use_qk_l2norm=True,
                            state_indices=ctx.slots.check, null_slot=NULL_SLOT)
        return _gdnzoo_call(ctx, None), f"auto -> {sel.name} ({sel.source})"
    if name == "flashinfer-pool":
        return _flashinfer_call(ctx), ("FlashInfer pool API, q/k/v/a/b made contiguous outside "
                                       "the timed calls")
    if name in ADAPTERS:
        try:
            mod = importlib.import_module(ADAPTERS[name])
        except ImportError as e:
            raise Skip(f"{ADAPTERS[name]} not importable ({type(e).__name__}: {e})") from None
        x, pool = ctx.x, ctx.pool.state

        def call(idx):
            mod.packed_decode(x.mixed, x.a2, x.b2, x.A_log, x.dt_bias, x.scale, pool, x.out, idx,
                              use_qk_l2norm_in_kernel=True)
        return call, f"{ADAPTERS[name]}.packed_decode"
    if name not in registry.load_registry().backends:
        raise Skip("not registered in registry.yaml")
    ok, why = registry.can_serve(name, problem(ctx))
    if not ok:
        raise Skip(why)
    return _gdnzoo_call(ctx, name), ""


def flashinfer_gdn(api):
    """FlashInfer's ``flashinfer.gdn_decode.<api>`` (every bench peer of FlashInfer); Skip with
    the reason where it cannot run: below SM90, not importable, or without the CuTe DSL its GDN
    kernels are written in (FlashInfer itself imports without it, and a call then fails inside
    it with "'NoneType' object is not callable")."""
    if torch.cuda.get_device_capability() < (9, 0):
        raise Skip("FlashInfer's GDN kernels need SM90+")
    try:
        fn = getattr(importlib.import_module("flashinfer.gdn_decode"), api)
    except Exception as e:
        raise Skip(f"flashinfer.gdn_decode.{api} not importable ({type(e).__name__}: "
                   f"{e})") from None
    try:
        importlib.import_module("cutlass.cute")
    except Exception as e:
        raise Skip("FlashInfer's GDN kernels need the CuTe DSL (nvidia-cutlass-dsl), which does "
                   f"not import ({type(e).__name__}: {e})") from None
    return fn


def _flashinfer_call(ctx):
    if ctx.sd not in FI_STATES:
        raise Skip("FlashInfer's pool API is timed with bf16 state only")
    fi = flashinfer_gdn("gated_delta_rule_decode_pretranspose")
    x, pool = ctx.x, ctx.pool.state
    q, k, v, a, b = (t.contiguous() for t in (x.q, x.k, x.v, x.a, x.b))

    def call(idx):
        fi(q, k, v, None, x.A_log, a, x.dt_bias, b, scale=x.scale, output=x.out,
           use_qk_l2norm=True, initial_state=pool, initial_state_indices=idx,
           backend="flashinfer")
    return call


def check_entry(call, ctx) -> dict:
    """One call on the check row, judged by the gate against the float64 reference (out and
    the written slots); then the check slots are restored, and nothing else of the pool's
    storage (other slots, page gaps) nor the packed activations may have changed."""
    from gdnzoo import gate
    from gdnzoo.inputs import Inputs
    from gdnzoo.reference import reference_outputs
    x, pool, idx = ctx.x, ctx.pool.state, ctx.slots.check
    rows = idx.long()
    before = pool.index_select(0, rows)
    if ctx.ref is None:
        ctx.ref = reference_outputs(Inputs(*x.args(before)), use_qk_l2norm=True)
    storage, mixed, ab = ctx.pool.buf.clone(), x.mixed.clone(), x.ab.clone()
    x.out.fill_(float("nan"))
    call(idx)
    j = gate.judge(x.out, pool.index_select(0, rows), *ctx.ref, out_dtype=x.out.dtype,
                   state_dtype=pool.dtype)
    pool.index_copy_(0, rows, before)
    if not torch.equal(ctx.pool.buf, storage):
        j.reasons.append("pool: changed outside the slots of the call (other slots or page gaps)")
    if not torch.equal(mixed, x.mixed) or not torch.equal(ab, x.ab):
        j.reasons.append("mixed_qkv or a/b: modified by the call")
    return dict(ok=j.ok, reason=j.reason, max_abs_err_out=j.out.max_abs,
                max_abs_err_state=j.state.max_abs, rel_err_out=j.rel_err_out,
                rel_err_state=j.rel_err_state, n_bad=j.n_bad)


# ----------------------------------------------------------------------------- measuring

def _cell(name, B, sd, plan):
    return sweep.Cell(name, B, plan.H, plan.HV, plan.K, plan.V, 1, sd, "pool", True)


def named_backends(algo, default, fail):
    """``--algo`` of a serving mode: None or "all" gives ``default()``; else the comma-separated
    names, each registered (else ``fail(message)`` is raised)."""
    from gdnzoo.registry import load_registry
    if algo in (None, "all"):
        return default()
    names = load_registry().names
    backends = [n.strip() for n in str(algo).split(",") if n.strip()]
    unknown = [n for n in backends if n not in names]
    if unknown:
        raise fail(f"--algo: unknown backend(s) {', '.join(unknown)}; valid: "
                   f"{', '.join(names)}, all")
    return backends


def _rows_of(name, B, sd, plan, status, note, **extra):
    return [dict(cell=_cell(name, B, sd, plan), clock=k, status=status, note=note, flags="",
                 **extra) for k in plan.clocks if k == "kernel" or name in GRAPH_ENTRIES]


def _estimate(call, slots):
    """Rough us per call (CUDA events over 3 calls, index refresh included): budgets only."""
    return clocks.event_time_us(lambda i: (slots.advance(), call(slots.index)), 3)


def _timed(call, slots, iters, est):
    """Kernel clock of ``call`` on the persistent index tensor, refreshed with the next row
    before each call outside the timed window: (busy samples, records per call, method)."""
    it = int(min(iters, max(10, sweep.CELL_SECONDS * 1e6 / (est + 40))))
    samples, method = clocks.kernel_times(lambda i: call(slots.index), it,
                                          reduce=clocks.busy_and_count, prepare=slots.advance)
    return [s for s, _ in samples], [n for _, n in samples], method


def _graph(call, slots, est):
    n = len(slots.rows)
    calls = n * max(1, math.ceil(20 / n))
    reps = int(min(max(sweep.CELL_SECONDS * 1e6 / (calls * max(est, 1.0)), 3), 20))
    return (clocks.graph_times(lambda i: call(slots.row(i)), calls, reps),
            f"CUDA graph of {calls} calls, {reps} replays")


def _records_note(counts):
    lo, hi = min(counts), max(counts)
    return statistics.median(counts), ("" if lo == hi else f"records per call {lo}-{hi}")


def measure_entry(name, ctx, plan, iters):
    """Rows of one entry in one cell: SKIP, FAIL, ERROR or the timed clocks."""
    base = dict(n_sets=len(ctx.slots.rows),
                working_set_mib=len(ctx.slots.rows) * ctx.B * ctx.pool.slot
                * ctx.pool.buf.element_size() / 2**20)
    try:
        call, note = entry_call(name, ctx)
        chk = check_entry(call, ctx)
    except Skip as e:
        return _rows_of(name, ctx.B, ctx.sd, plan, "SKIP", str(e))
    errs = {k: chk[k] for k in ("max_abs_err_out", "max_abs_err_state", "rel_err_out",
                                "rel_err_state", "n_bad")}
    if not chk["ok"]:
        return _rows_of(name, ctx.B, ctx.sd, plan, "FAIL", chk["reason"], **errs, **base)
    for _ in range(sweep.WARMUP_CALLS):
        ctx.slots.advance()
        call(ctx.slots.index)
    rows, est = [], _estimate(call, ctx.slots)
    if "kernel" in plan.clocks:
        busy, counts, method = _timed(call, ctx.slots, iters, est)
        n, varied = _records_note(counts)
        rows.append(dict(cell=_cell(name, ctx.B, ctx.sd, plan), clock="kernel", status="PASS",
                         note="; ".join(s for s in (note, varied) if s), flags="",
                         samples=busy, method=method, kernels_per_call=n, **errs, **base))
    if "graph" in plan.clocks and name in GRAPH_ENTRIES:
        row = dict(cell=_cell(name, ctx.B, ctx.sd, plan), clock="graph", status="PASS",
                   note=note, flags="", **errs, **base)
        try:
            row["samples"], row["method"] = _graph(call, ctx.slots, est)
        except clocks.GraphUnsupported as e:
            row["note"] = f"n/a ({e})"
        rows.append(row)
    return rows


def measure_floor(ctx, plan, iters):
    from gdnzoo.bench import floor
    if "kernel" not in plan.clocks:
        return []
    target = floor.PoolTarget(ctx.pool.buf, ctx.pool.page, ctx.pool.slot, ctx.B,
                              ctx.slots.index, ctx.slots.advance)
    f = floor.pool_floor_times(target, iters=min(iters, 100), reduce=clocks.busy_and_count)
    row = dict(cell=_cell("floor", ctx.B, ctx.sd, plan), clock="kernel", flags="",
               n_sets=len(ctx.slots.rows), note=f["config"], method=f["method"])
    if f["samples"] is None:
        return [dict(row, status="SKIP")]
    busy = [s for s, _ in f["samples"]]
    return [dict(row, status="PASS", samples=busy,
                 kernels_per_call=_records_note([n for _, n in f["samples"]])[0])]


def _flag_adapters(rows):
    """An adapter whose CUPTI records per call differ from ``auto``'s in its cell is flagged."""
    auto = {(r["cell"].B, r["cell"].state_dtype): r.get("kernels_per_call") for r in rows
            if r["cell"].backend == "auto" and r["clock"] == "kernel" and r["status"] == "PASS"}
    for r in rows:
        n = r.get("kernels_per_call")
        ref = auto.get((r["cell"].B, r["cell"].state_dtype))
        if r["cell"].backend in ADAPTERS and r["clock"] == "kernel" and n and ref and n != ref:
            r["flags"] = f"records {n:g} != decode's {ref:g}"


# ----------------------------------------------------------------------------- the run

def _log(quiet, s):
    if not quiet:
        print(s, file=sys.stderr, flush=True)


def _summary(rows):
    """One progress line: each timed entry's kernel median and its multiple of the floor."""
    med = {r["cell"].backend: statistics.median(r["samples"]) for r in rows
           if r["clock"] == "kernel" and r["status"] == "PASS" and r.get("samples")}
    fl = med.get("floor")
    parts = []
    for name, us in med.items():
        parts.append(f"{name} {us:.2f}" + (f" {us / fl:.2f}x" if fl and name != "floor" else ""))
    bad = [f"{r['cell'].backend} {r['status']}" for r in rows
           if r["status"] in ("FAIL", "ERROR") and r["clock"] == "kernel"]
    return " | ".join(parts + bad)


def run_pool(args, plan):
    """Measure every (state dtype, B) cell; returns (rows, device reference, notes)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    notes = list(plan.notes)
    if device != "cuda":
        why = (f"{'--device cpu' if torch.cuda.is_available() else 'no CUDA device'}: the "
               f"serving benchmark times GPU kernels (CUPTI kernel clock, CUDA graphs, the pool "
               f"floor); nothing was measured")
        notes.insert(0, why)
        rows = [r for sd in plan.states for B in plan.batches for name in plan.entries
                for r in _rows_of(name, B, sd, plan, "SKIP", why)]
        return rows, dict(note="not measured (no CUDA device)"), notes
    from gdnzoo.inputs import DTYPES
    _, ref = sweep.floor_rows([], ["kernel"], device, args.iters)
    l2 = clocks.l2_bytes()
    pools, rows = {}, []
    t0, n_cells, i = time.perf_counter(), len(plan.batches) * len(plan.states), 0
    for B in plan.batches:
        for sd in plan.states:
            i += 1
            if plan.budget and time.perf_counter() - t0 > plan.budget:
                rows += [r for name in plan.entries for r in _rows_of(
                    name, B, sd, plan, "SKIP", f"time budget ({plan.budget:g} s) exhausted")]
                continue
            if sd not in pools:
                elem = DTYPES[sd].itemsize
                P = pool_slots(plan.batches, plan.HV, plan.V, plan.K, elem, l2)
                pools[sd] = StatePool(P, plan.HV, plan.V, plan.K, DTYPES[sd], device, args.seed)
                notes.append(f"{sd} pool: {P} slots, {pools[sd].nbytes / 2**30:.2f} GiB, page "
                             f"{pools[sd].page} elements (slot {pools[sd].slot})")
            sp = pools[sd]
            slot_bytes = sp.slot * sp.buf.element_size()
            ctx = CellCtx(B, sd, sp, ServingInputs(B, plan.H, plan.HV, plan.K, plan.V, sd, device,
                                                   args.seed),
                          Slots(sp.P, B, rows_for(B, slot_bytes, l2), device, args.seed + B))
            cell_rows = []
            for name in plan.entries:
                try:
                    cell_rows += (measure_floor(ctx, plan, args.iters) if name == "floor"
                                  else measure_entry(name, ctx, plan, args.iters))
                except Exception as e:
                    msg = str(e).splitlines()[0][:200] if str(e) else ""
                    cell_rows += _rows_of(name, B, sd, plan, "ERROR", f"{type(e).__name__}: {msg}")
                    torch.cuda.synchronize()
            rows += cell_rows
            _log(args.quiet, f"[{i}/{n_cells}] {sd} B={B} ({time.perf_counter() - t0:.0f} s): "
                             + _summary(cell_rows))
            del ctx
            torch.cuda.empty_cache()
    _flag_adapters(rows)
    return rows, ref, notes


# ----------------------------------------------------------------------------- files, console

def build_table(raw, ref):
    """report.build_rows plus this benchmark's own column (kernels_per_call)."""
    from gdnzoo.bench import report
    table = report.build_rows(raw, ref)
    for t, r in zip(table, raw):
        t["kernels_per_call"] = r.get("kernels_per_call", "")
    return table


def columns():
    from gdnzoo.bench import report
    return list(report.COLUMNS) + list(COLUMNS_EXTRA)


def write_results(table, env, out_dir, cols=None) -> list:
    """results.csv and results.json (report.read_results reads it back) under ``out_dir``,
    with :func:`columns` or the given ``cols``."""
    import csv
    import json
    from pathlib import Path
    from gdnzoo.bench import report
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = cols or columns()
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in table:
            w.writerow({k: report._fmt_csv(r.get(k, "")) for k in cols})
    head = json.dumps(report._jsonable(dict(environment=env, columns=cols)), indent=1)
    body = ",\n".join(json.dumps(report._jsonable([r.get(k, "") for k in cols]),
                                 separators=(",", ":")) for r in table)
    (out / "results.json").write_text(head[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n")
    return [str(out / "results.csv"), str(out / "results.json")]


def console(table, env, notes, files, plan) -> str:
    from gdnzoo.bench import report
    lines = [report.run_line(env, "gdnzoo bench --mode pool"),
             f"H={plan.H} HV={plan.HV} K={plan.K} V={plan.V}, T=1, use_qk_l2norm=True, in place; "
             f"kernel clock: {env.get('kernel_clock', 'n/a')} (sum of a call's records)"]
    timed = [r for r in table if r["status"] == "PASS" and r["clock"] == "kernel"
             and isinstance(r["median_us"], float) and math.isfinite(r["median_us"])]
    for sd in plan.states:
        if not any(r["state_dtype"] == sd for r in timed):
            continue
        lines.append(f"\n{sd} state, kernel clock, us / x the same-run pool floor:")
        lines += report.pivot(table, sd, "pool", "kernel")
        if any(r["state_dtype"] == sd and r["clock"] == "graph" and r["status"] == "PASS"
               for r in table):
            lines.append(f"{sd} state, graph clock (CUDA graph of N calls), us per call:")
            lines += report.pivot(table, sd, "pool", "graph", with_floor=False)
        k = {}
        for r in timed:
            if r["state_dtype"] == sd and r["kernels_per_call"] != "":
                k.setdefault(r["backend"], set()).add(r["kernels_per_call"])
        lines.append("records per call: " + ", ".join(
            f"{n} {'/'.join(f'{c:g}' for c in sorted(v))}" for n, v in k.items()))
    for r in table:
        if r["flags"]:
            lines.append(f"flag {r['backend']} {r['state_dtype']} B={r['B']}: {r['flags']}")
    lines += _not_timed(table)
    shown = {r["note"] for r in table if r["status"] == "SKIP"}
    lines += [f"note: {n}" for n in notes if n not in shown]
    if files:
        lines.append("wrote: " + ", ".join(files))
    return "\n".join(lines)


def _not_timed(table) -> list:
    """One line per FAIL or ERROR (backend, reason), and one per SKIP reason naming its entries."""
    lines, seen, skips = [], set(), {}
    for r in table:
        if r["status"] in ("FAIL", "ERROR") and (r["backend"], r["note"]) not in seen:
            seen.add((r["backend"], r["note"]))
            lines.append(f"{r['status']} {r['backend']} ({r['state_dtype']} B={r['B']}): "
                         f"{r['note'][:200]}")
        elif r["status"] == "SKIP":
            names = skips.setdefault(r["note"], [])
            if r["backend"] not in names:
                names.append(r["backend"])
    return lines + [f"SKIP {', '.join(names)}: {note[:200]}" for note, names in skips.items()]


def default_out():
    from pathlib import Path
    from gdnzoo.bench import report
    return str(Path(report.default_out_dir()) / "pool")


def cmd_bench_pool(args) -> int:
    """``gdnzoo bench --mode pool``: exit 1 if any entry failed its check or broke, else 0."""
    from gdnzoo.bench import report
    plan = make_plan(args)
    rows, ref, notes = run_pool(args, plan)
    table = build_table(rows, ref)
    env = report.environment(METHOD, ref, notes)
    files = write_results(table, env, args.out or default_out())
    print(console(table, env, notes, files, plan))
    return 1 if any(r["status"] in ("FAIL", "ERROR") for r in table) else 0

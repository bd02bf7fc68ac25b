"""``gdnzoo bench --mode pool``: the serving benchmark, and the serving convention that
``--mode verify`` and ``--mode chained`` build on (:class:`Serving`, :class:`PoolCell`).

The call a serving engine makes, per (B, state dtype), on a page-strided pool with fresh slots
every call (how: :data:`METHOD`).  Entries: the pool floor, ``auto`` (``gdnzoo.decode``'s own
choice), each pool-capable gdnzoo backend, ``flashinfer-pool`` (bf16 state), the engine
adapters ``adapter-vllm`` and ``adapter-sglang`` (flagged when their CUPTI records per call
differ from ``auto``'s).  ``gdnzoo tune --from`` reads the rows for the default table's
``table_pool``.  Without a CUDA device every row is SKIP.
"""

from __future__ import annotations

import importlib
import itertools
import math
from dataclasses import dataclass

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.bench import clocks, entries, floor
from gdnzoo.bench.args import usage_error
from gdnzoo.bench.pipeline import Entry, Group, Mode, judged, records, rows_of, section
from gdnzoo.contract import validate
from gdnzoo.inputs import (DTYPES, Inputs, distinct_slots, make_inputs, packed, page_elems,
                           paged_pool)
from gdnzoo.pool import Pool as Slots
from gdnzoo.reference import reference_outputs

POOL_BATCHES = (1, 4, 8, 16, 32, 64, 128, 256, 512)
STATES = ("fp32", "bf16")
MIN_POOL_BYTES = 2 << 30
NULL_SLOT = 0
FI_STATES = ("bf16",)
BUDGET_S = 480.0                    # default --time-budget: a full H100 run, compiles included
GRAPH_ENTRIES = ("auto", "vllm-packed")
ADAPTERS = {"adapter-vllm": "gdnzoo.integrations.vllm",
            "adapter-sglang": "gdnzoo.integrations.sglang"}
PEERS = ("flashinfer-pool",) + tuple(ADAPTERS)

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


# ----------------------------------------------------------------------------- the convention

def rows_for(B, slot_bytes, l2, T=1) -> int:
    """Index rows of a cell: rows * B*T * slot bytes >= 4x L2 (at least 2)."""
    return clocks.rotation_count(B * T * slot_bytes, l2)


def pool_slots(cells, HV, V, K, elem, l2, min_bytes=MIN_POOL_BYTES, width=lambda B, T: B) -> int:
    """Slots of the pool of one state dtype: at least ``min_bytes`` and 4x L2 of pages, and
    room for every (B, T) cell's rows and its check row, ``width(B, T)`` slots a row, slot 0
    aside."""
    page = page_elems(HV, V, K) * elem
    need = max((rows_for(B, HV * V * K * elem, l2, T) + 1) * width(B, T) for B, T in cells) + 1
    return max(math.ceil(max(min_bytes, 4 * l2) / page), need)


def state_pool(P, HV, V, K, sd, device, seed=0):
    """The bench's pool (:class:`gdnzoo.inputs.PagedPool`): drawn in place on the device."""
    return paged_pool(P, HV, V, K, dtype=sd, device=device, fill="normal",
                      gen=torch.Generator(device=device).manual_seed(seed))


def slot_bank(P, B, rows, device, seed=0):
    """``rows`` rows of B distinct slots in [1, P), no slot in two rows, and a check row of B
    other slots (clocks.IndexBank, part ``slots``)."""
    if rows * B + B > P - 1:
        raise ValueError(f"slots: {rows} rows and a check row of B={B} need {rows * B + B} "
                         f"slots; the pool has {P - 1} besides the null slot")
    perm = distinct_slots(P, (rows + 1) * B, torch.Generator().manual_seed(seed))
    return clocks.IndexBank({"slots": (perm.view(rows + 1, B), None)}, device)


@dataclass
class PoolCtx:
    """One cell of the serving convention: the pool, the packed inputs, the index bank."""
    B: int
    sd: str
    pool: object             # gdnzoo.inputs.PagedPool
    x: object                # gdnzoo.inputs.Packed
    bank: object             # clocks.IndexBank
    out: object
    ref: tuple = None        # float64 (out, state of the check slots), made by the first check

    def kw(self, ix, form="pool") -> dict:
        """gdnzoo.decode's pool keywords of a call on index row ``ix``."""
        return dict(state_indices=ix.slots, null_slot=NULL_SLOT)

    def problem(self, form="pool"):
        """The Problem of the check row's call in ``form`` (what a backend must serve)."""
        return validate(*self.x.args(self.pool.state), out=self.out, use_qk_l2norm=True,
                        **self.kw(self.bank.check, form))[0]

    def target(self, form="pool"):
        """The pool floor's target: this cell's slots, through its persistent index tensor."""
        sp, bank = self.pool, self.bank
        return floor.PoolTarget(sp.buf, sp.page, sp.slot, self.B, bank.index.slots, bank.advance)


def cell_inputs(B, T, sd, geometry, device, seed) -> tuple:
    """(packed inputs of :func:`gdnzoo.inputs.make_inputs`, out [B, T, HV, V])."""
    x = packed(make_inputs(B=B, T=T, **geometry, state_dtype=sd, device=device, seed=seed))
    return x, torch.empty(B, T, geometry["HV"], geometry["V"], dtype=x.v.dtype, device=device)


def make_ctx(B, sd, sp, H, HV, K, V, device, seed, l2) -> PoolCtx:
    x, out = cell_inputs(B, 1, sd, dict(H=H, HV=HV, K=K, V=V), device, seed)
    bank = slot_bank(sp.P, B, rows_for(B, sp.slot * sp.buf.element_size(), l2), device, seed + B)
    bank.working_set_bytes = bank.n * B * sp.slot * sp.buf.element_size()
    return PoolCtx(B, sd, sp, x, bank, out)


def snapshot(ctx) -> tuple:
    inter = getattr(ctx, "inter", None)
    return (ctx.pool.buf.clone(), ctx.x.rows.clone(), ctx.x.ab.clone(),
            None if inter is None else inter.clone())


def restore(ctx, snap, pool_reason, slots=None, rows=None) -> list:
    """Put back what a call was allowed to write (the pool's ``slots``, the intermediate store's
    ``rows``) from ``snap``, then the reasons it changed what it must not: the pool's storage
    (``pool_reason``), the intermediate store, the packed activations; each restored."""
    st, (buf, xrows, ab, inter) = ctx.pool.state, snap
    if slots is not None:
        st.index_copy_(0, slots, buf.as_strided(st.size(), st.stride()).index_select(0, slots))
    if rows is not None:
        ctx.inter.index_copy_(0, rows, inter.index_select(0, rows))
    reasons = []
    if not ctx.pool.buf.equal(buf):
        reasons.append(pool_reason)
        ctx.pool.buf.copy_(buf)
    if inter is not None and not ctx.inter.equal(inter):
        reasons.append("intermediate_states: changed outside the call's rows")
        ctx.inter.copy_(inter)
    if not ctx.x.rows.equal(xrows) or not ctx.x.ab.equal(ab):
        reasons.append("mixed_qkv or a/b: modified by the call")
    return reasons


def check_slots(call, ctx) -> dict:
    """One call on the check row, judged by the gate against the float64 reference (out and
    the written slots); then the check slots are restored, and nothing else of the pool's
    storage (other slots, page gaps) nor the packed activations may have changed."""
    st, ix = ctx.pool.state, ctx.bank.check
    slots = ix.slots.long()
    if ctx.ref is None:
        ctx.ref = reference_outputs(Inputs(*ctx.x.args(st.index_select(0, slots))),
                                    use_qk_l2norm=True)
    snap = snapshot(ctx)
    ctx.out.fill_(float("nan"))
    call(ix)
    j = gate.judge(ctx.out, st.index_select(0, slots), *ctx.ref, out_dtype=ctx.out.dtype,
                   state_dtype=st.dtype)
    j.reasons += restore(ctx, snap, "pool: changed outside the slots of the call (other slots "
                                    "or page gaps)", slots)
    return judged(j)


# ----------------------------------------------------------------------------- the entries

def gdnzoo_call(name, ctx, form="pool") -> tuple:
    """(call(ix), note) of ``auto`` (gdnzoo.decode's own choice) or gdnzoo backend ``name``
    through its public callable in ``form``, use_qk_l2norm=True; raises Skip with the reason."""
    x, st, out = ctx.x, ctx.pool.state, ctx.out
    if name == "auto":
        try:
            sel = gdnzoo.select(*x.args(st), out=out, use_qk_l2norm=True,
                                **ctx.kw(ctx.bank.check, form))
        except ValueError as e:
            raise entries.Skip(str(e)) from None
        fn, note = gdnzoo.decode, f"auto -> {sel.name} ({sel.source})"
    else:
        entries.serve(name, ctx.problem(form))
        fn, note = gdnzoo.get(name), ""

    def call(ix):
        fn(*x.args(st), out=out, use_qk_l2norm=True, **ctx.kw(ix, form))
        return out
    return call, note


def pool_call(name, ctx) -> tuple:
    """(call(ix), note) of entry ``name`` in this cell; raises Skip with the reason."""
    x, st = ctx.x, ctx.pool.state
    if name == "flashinfer-pool":
        if ctx.sd not in FI_STATES:
            raise entries.Skip("FlashInfer's pool API is timed with bf16 state only")
        fi = entries.flashinfer_gdn("gated_delta_rule_decode_pretranspose")
        q, k, v, a, b = x.dense()

        def call(ix):
            fi(q, k, v, None, x.A_log, a, x.dt_bias, b, scale=x.scale, output=ctx.out,
               use_qk_l2norm=True, initial_state=st, initial_state_indices=ix.slots,
               backend="flashinfer")
        return call, "FlashInfer pool API, q/k/v/a/b made contiguous outside the timed calls"
    if name in ADAPTERS:
        try:
            mod = importlib.import_module(ADAPTERS[name])
        except ImportError as e:
            raise entries.Skip(f"{ADAPTERS[name]} not importable ({type(e).__name__}: {e})") \
                from None

        def call(ix):
            mod.packed_decode(x.mixed, x.a2, x.b2, x.A_log, x.dt_bias, x.scale, st, ctx.out,
                              ix.slots, use_qk_l2norm_in_kernel=True)
        return call, f"{ADAPTERS[name]}.packed_decode"
    return gdnzoo_call(name, ctx)


def indexed_floor(c, target, bank, plan, clock="kernel", **extra) -> tuple:
    """([row], launch shape) of the pool floor or a verify floor (``target``) timed over the
    index bank ``bank`` (floor.indexed_floor_times, busy samples); SKIP (and shape None) where
    it was not measured."""
    f = floor.indexed_floor_times(target, iters=min(plan.iters, 100), reduce=clocks.busy_and_count)
    row = dict(extra, cell=c, clock=clock, flags="", n_sets=bank.n, note=f["config"],
               method=f["method"])
    if f["samples"] is None:
        return [dict(row, status="SKIP")], None
    return [dict(row, status="PASS", samples=[s for s, _ in f["samples"]],
                 kernels_per_call=records([n for _, n in f["samples"]])[0])], f["shape"]


def flag_adapters(rows):
    """An adapter whose CUPTI records per call differ from ``auto``'s in its cell is flagged."""
    auto = {(r["cell"].B, r["cell"].state_dtype): r.get("kernels_per_call") for r in rows
            if r["cell"].backend == "auto" and r["clock"] == "kernel" and r["status"] == "PASS"}
    for r in rows:
        n = r.get("kernels_per_call")
        ref = auto.get((r["cell"].B, r["cell"].state_dtype))
        if r["cell"].backend in ADAPTERS and r["clock"] == "kernel" and n and ref and n != ref:
            r["flags"] = f"records {n:g} != decode's {ref:g}"


# ----------------------------------------------------------------------------- the mode

class Serving(Mode):
    """What the modes in the serving convention share: the kernel clock (the sum of a call's
    records, and their number) and the graph clock (``graph_entries`` only), a pool per state
    dtype sized for the run's cells (``cells``, ``width`` slots a row), a context per cell
    (``context``), each entry gated then timed over the cell's index bank, its floor."""
    columns = {"kernels_per_call": ""}
    clocks = ("kernel", "graph")
    busy = True
    graph_entries = ()
    keep_pools = True        # False: one state dtype's pool at a time

    def clocks_of(self, name, plan) -> tuple:
        return tuple(k for k in plan.clocks if k == "kernel" or name in self.graph_entries)

    def cells(self, plan) -> list:
        return [(B, 1) for B in plan.batches]

    @staticmethod
    def width(B, T) -> int:
        return B

    def pool(self, sd, plan):
        """The run's pool of state dtype ``sd`` (made once, sized for every cell)."""
        if sd not in plan.cache:
            if not self.keep_pools:
                plan.cache.clear()
            P = pool_slots(self.cells(plan), plan.HV, plan.V, plan.K, DTYPES[sd].itemsize,
                           plan.l2, MIN_POOL_BYTES if plan.gpu else 0, width=self.width)
            sp = plan.cache[sd] = state_pool(P, plan.HV, plan.V, plan.K, sd, plan.device, plan.seed)
            plan.notes.append(f"{sd} pool: {sp.P} slots, {sp.nbytes / 2**30:.2f} GiB, page "
                              f"{sp.page} elements (slot {sp.slot})")
        return plan.cache[sd]

    def floor_rows(self, c, ctx, plan):
        if not plan.gpu:
            return rows_of(c, ("kernel",), "SKIP", "not on a CUDA device")
        return indexed_floor(c, ctx.target(c.mode), ctx.bank, plan)[0]

    def problem(self, c, plan, **kw):
        """The automatic choice's Problem: its calls read and write a pool."""
        return super().problem(c, plan, pool=True, **kw)


class Pool(Serving):
    name = "pool"
    headline = ("T=1, use_qk_l2norm=True, in place; kernel clock: {kernel_clock} (sum of a call's "
                "records)")
    method = METHOD
    defaults = dict(batch=POOL_BATCHES, state_dtype=STATES, time_budget=BUDGET_S)
    cpu = "skip"
    graph_entries = GRAPH_ENTRIES
    subdir = "pool"
    progress = ("kernel", False)
    gpu_only = ("the serving benchmark times GPU kernels (CUPTI kernel clock, CUDA graphs, the "
                "pool floor)")

    def plan(self, plan, args):
        if plan.tokens != (1,):
            usage_error(f"--tokens: the serving benchmark is a decode step, T=1; got "
                        f"{plan.tokens[0]}")
        plan.l2norm = True
        plan.backends = tuple(entries.named(args.algo, lambda: entries.backends(
            pools=True, native=True)))
        plan.entries = ("floor", "auto", *plan.backends, *PEERS)
        for B, sd in itertools.product(plan.batches, plan.states):
            plan.groups.append(Group(f"{sd} B={B}", [
                (plan.cell(n, "pool", B, sd), self.clocks_of(n, plan)) for n in plan.entries],
                key=(B, sd)))

    def context(self, key, plan):
        B, sd = key
        return make_ctx(B, sd, self.pool(sd, plan), plan.H, plan.HV, plan.K, plan.V,
                        plan.device, plan.seed, plan.l2)

    def entry(self, c, ctx, plan):
        call, note = pool_call(c.backend, ctx)
        return Entry(call, lambda: check_slots(call, ctx), ctx.bank, note)

    def finish(self, rows, plan, args):
        flag_adapters(rows)

    def sections(self, plan, table):
        return [s for sd in plan.states for s in (
            section(f"\n{sd} state, kernel clock, us / x the same-run pool floor:", True,
                    state_dtype=sd, clock="kernel"),
            section(f"{sd} state, graph clock (CUDA graph of N calls), us per call:",
                    state_dtype=sd, clock="graph"))]

    def extra_lines(self, table, plan):
        lines = []
        for sd in plan.states:
            k = {}
            for r in table:
                if (r["state_dtype"] == sd and r["clock"] == "kernel" and r["status"] == "PASS"
                        and r.get("kernels_per_call") not in ("", None)):
                    k.setdefault(r["backend"], set()).add(r["kernels_per_call"])
            if k:
                lines.append(f"{sd} records per call: " + ", ".join(
                    f"{n} {'/'.join(f'{c:g}' for c in sorted(v))}" for n, v in k.items()))
        return lines + [f"flag {r['backend']} {r['state_dtype']} B={r['B']}: {r['flags']}"
                        for r in table if r["flags"]]


class PoolCell:
    """One (state dtype, B) of a pool shape search (``gdnzoo tune --shapes --mode pool``): a
    cell of this mode over a shared pool ``sp`` in ``FORM``, each candidate checked as the
    bench checks it (subclassed by the verify search's)."""
    FORM = "pool"
    SLOTS = "slots"         # the index row's field of the call's slots (verify's slots form: grid)

    def __init__(self, sd, sp, B, geometry, seed=3):
        self.sd, self.B, self.sp = sd, B, sp
        self.ctx = self.context(geometry, seed)
        self.problem = self.ctx.problem(self.FORM)
        self.prepare = self.ctx.bank.advance    # the next row into the index, before each call

    def context(self, geometry, seed):
        return make_ctx(self.B, self.sd, self.sp, **geometry, device="cuda", seed=seed,
                        l2=clocks.l2_bytes())

    def floor_launcher(self):
        return floor.best_indexed_launcher(self.ctx.target(self.FORM))

    def call(self, run, config, **kw):
        """call(ix): ``run`` with ``config`` on index row ``ix``, the pool keywords
        gdnzoo.decode passes a backend (and ``kw``, e.g. verify's)."""
        ctx, st, field_ = self.ctx, self.ctx.pool.state, self.SLOTS

        def call(ix):
            slots = getattr(ix, field_)
            entries.launch(run, ctx.x, st, ctx.out, st, True, config=config,
                           pool=Slots(slots, slots, NULL_SLOT),
                           **{k: f(ix) for k, f in kw.items()})
            return ctx.out
        return call

    def check(self, call) -> dict:
        return check_slots(call, self.ctx)

    def checked(self, run, config):
        """launch(i) of one candidate after the check passed it; raises if it is wrong or
        cannot run."""
        call = self.call(run, config)
        chk = self.check(call)
        if not chk["ok"]:
            raise AssertionError(chk["reason"])
        return self.ctx.bank.kernel(call)


MODES = {"pool": Pool()}

"""``gdnzoo bench --mode chained``: the decode's added latency per layer inside a model's graph.

A CUDA graph of L layers (``--layers``, default 64), each a producer (a Triton kernel writing
the layer's packed ``mixed_qkv``) then the decode on the layer's own pool, in the serving
convention of ``--mode pool``; how it measures and its bars (ours, printed, never asserted):
:data:`METHOD`.  Entries at the PDL levels off, wait and early: the chained floor
(:func:`gdnzoo.bench.floor.chained_launcher`), ours (the backends with ``pdl: true``, through
``gdnzoo.decode(..., pdl=level)``), and without PDL the peers ``vllm-packed`` and
``flashinfer-pool``; each also timed standalone.  Without a CUDA device every row is SKIP.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.bench import clocks, entries, floor
from gdnzoo.bench import mode_pool as serving
from gdnzoo.bench.args import given, usage_error
from gdnzoo.bench.console import us
from gdnzoo.bench.pipeline import (ERRS, Entry, Group, Mode, Progress, errors, failure, guarded,
                                   judged, rows_of, section, timed)
from gdnzoo.bench.report import finite
from gdnzoo.contract import PDL_LEVELS, validate
from gdnzoo.inputs import DTYPES, Inputs, distinct_slots, page_elems
from gdnzoo.reference import reference_outputs

try:                                 # the producer kernel; without Triton nothing can be chained
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents
    NO_TRITON = ""
except ImportError as _e:
    triton = tl = None
    NO_TRITON = f"triton not importable ({_e})"

BATCHES = (1, 4, 16, 64, 256)
STATES = ("fp32", "bf16")
LAYERS = 64
LEVELS = ("off", "wait", "early")
PEERS = ("vllm-packed", "flashinfer-pool")
BUDGET_S = 480.0
PRODUCER_BLOCK = 1024
CHAIN_SECONDS = 0.3                 # replays of one chain and its producers' graph
MIN_REPLAYS, MAX_REPLAYS = 10, 200
FLOOR_BAR = 1.10                    # bars: ours <= 1.10 x the chained floor + one tick
TICK_US = 0.032                     # one CUPTI tick
STANDALONE_BAR = 1.05               # at B >= STANDALONE_MIN_B: chained <= 1.05 x standalone
STANDALONE_MIN_B = 64
CLOCKS = ("chained", "standalone")
NAN = float("nan")
COLUMNS = {"layers": "", "producer_us": NAN, "kernels_per_call": "", "bar_floor": "",
           "bar_off": "", "bar_standalone": ""}

METHOD = (
    "Chained: a CUDA graph of L layers, each a producer (Triton SiLU over [B, 2*H*K+HV*V] bf16, "
    "launched without PDL, writing the layer's packed mixed_qkv) then the decode (q/k/v views "
    "of it; the layer's own pool in place, page stride HV*V*K*(1+1/32), slot 0 the null slot; "
    "a/b strided views of one [B, 2*HV] tensor; use_qk_l2norm=True). Added latency per layer = "
    "(chain graph time - producers-only graph time) / L, per pair of replays (CUDA events around "
    "each replay), median over pairs. Cold: each layer's pool is its part of one storage >= "
    "max(2 GiB, 4x L2), random distinct slots per layer in rows with rows*L*B*slot bytes >= 4x "
    "L2, the next row copied into the persistent index tensor before each replay, outside the "
    "events. PDL levels: off; wait (griddepcontrol.wait before any load); early (state loaded "
    "before the wait). Chained floor: the pool floor kernel (launch shape from this cell's pool "
    "floor search) reading one value of mixed_qkv, at each level. Standalone: the pool bench's "
    "kernel clock (CUPTI, sum of a call's records) on the whole storage, fresh slots per call. "
    "Correctness first: one replay on known slots with mixed_qkv and out NaN-filled first; the "
    "first and last layers judged by the gate vs the float64 reference (the floor: slots "
    "unchanged); a failing entry gets no time. x_floor: chained / the chained floor at the same "
    "level (standalone: / the pool floor). Bars (ours): chained <= 1.10 x floor + 0.032 us; "
    "<= the same backend's PDL off + 0.032 us; B >= 64: <= 1.05 x standalone.")


def clocks_of(name) -> tuple:
    """The clocks an entry has rows for: the floor's standalone row is the pool floor's, one per
    cell (its own cell of the group)."""
    return ("chained",) if name == "floor" else CLOCKS


# ----------------------------------------------------------------------------- the producer

def _silu_rows(x, y, n, BLOCK: tl.constexpr, TRIGGER: tl.constexpr):
    """y = x * sigmoid(x) over n elements (fp32 math, y's dtype stored).  TRIGGER (sm_90+):
    let the kernel after this one start at once (griddepcontrol.launch_dependents), as engines'
    conv kernels do: a decode launched with PDL may then issue its launch and, at "early", its
    state loads while this kernel runs; it still waits for this kernel before reading y."""
    if TRIGGER:
        gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m).to(tl.float32)
    tl.store(y + offs, (v / (1.0 + tl.exp(-v))).to(y.dtype.element_ty), mask=m)


@functools.lru_cache(maxsize=None)
def _producer_kernel():
    if triton is None:
        raise RuntimeError(f"the chained clock's producer is a Triton kernel: {NO_TRITON}")
    return triton.jit(_silu_rows)


def produce(x, y):
    """The producer: ``y = silu(x)`` elementwise (flat contiguous tensors of one size), one
    Triton launch on the current stream, itself launched without PDL (so it starts after
    everything before it completed: what makes "early" correct) but triggering its dependent
    at once on sm_90+."""
    n = x.numel()
    if not (x.is_contiguous() and y.is_contiguous() and y.numel() == n):
        raise ValueError("producer: x and y must be contiguous tensors of one size")
    trigger = x.is_cuda and torch.cuda.get_device_capability(x.device) >= (9, 0)
    _producer_kernel()[(triton.cdiv(n, PRODUCER_BLOCK),)](x, y, n, BLOCK=PRODUCER_BLOCK,
                                                          TRIGGER=trigger)


# ----------------------------------------------------------------------------- the layers

def chain_bank(P, L, B, rows, device, seed=0):
    """Every layer's slots: ``rows`` rows of B distinct slots in [1, P) per layer (no slot in
    two rows of a layer), one clocks.IndexBank (part ``slots`` [L, B], each layer's row on a
    256-byte boundary, no check row: row 0 is the check's)."""
    if rows * B > P - 1:
        raise ValueError(f"chain slots: {rows} rows of B={B} need {rows * B} slots per "
                         f"layer; a layer's pool has {P - 1} besides the null slot")
    gen = torch.Generator().manual_seed(seed)
    slots = torch.stack([distinct_slots(P, rows * B, gen).view(rows, B) for _ in range(L)], 1)
    return clocks.IndexBank({"slots": (slots, None)}, device, check=False)


class Chain:
    """One cell's model of L layers.  Layer l: producer input ``xs[l]`` and output ``ys[l]``
    (flat B*D bf16, D = 2*H*K + HV*V: its mixed_qkv, ``mixed[l]`` as [B, D]), q, k, v as the
    packed views of it (``packed[l]``) or as three contiguous blocks of it (``flat[l]``), its
    pool ``pools[l]`` (slots [l*P, (l+1)*P) of ``storage``, flat in ``bufs[l]``), its index
    ``index[l]`` (row ``slots``'s persistent tensors), its output ``outs[l]``.  The gates and
    head constants (``x``, :class:`gdnzoo.inputs.Packed`) are shared; ``alone`` is the
    standalone clock's bank of rows over the whole storage."""

    def __init__(self, B, sd, L, H, HV, K, V, device, l2, seed=0,
                 min_bytes=serving.MIN_POOL_BYTES):
        elem = DTYPES[sd].itemsize
        self.B, self.sd, self.L = B, sd, L
        P, rows = self.P, self.rows = layer_slots(B, L, HV, V, K, elem, l2, min_bytes)
        s = self.storage = serving.state_pool(L * P, HV, V, K, sd, device, seed)
        self.pools = [s.state[i * P:(i + 1) * P] for i in range(L)]
        self.bufs = [s.buf[i * P * s.page:(i + 1) * P * s.page] for i in range(L)]
        self.slots = chain_bank(P, L, B, rows, device, seed)
        self.index = self.slots.index.slots
        self.alone = serving.slot_bank(L * P, B, serving.rows_for(B, s.slot * elem, l2), device,
                                       seed + B)
        D, HK = 2 * H * K + HV * V, H * K
        gen = torch.Generator(device=device).manual_seed(seed)
        self.xs = (torch.randn(L, B * D, generator=gen, device=device) * 0.5).to(torch.bfloat16)
        self.ys = torch.empty_like(self.xs)
        self.outs = torch.empty(L, B, 1, HV, V, dtype=torch.bfloat16, device=device)
        self.x = serving.cell_inputs(B, 1, sd, dict(H=H, HV=HV, K=K, V=V), device, seed)[0]
        self.mixed = [y.view(B, D) for y in self.ys]
        self.packed = [(m[:, :HK].view(B, 1, H, K), m[:, HK:2 * HK].view(B, 1, H, K),
                        m[:, 2 * HK:].view(B, 1, HV, V)) for m in self.mixed]
        self.flat = [(y[:B * HK].view(B, 1, H, K), y[B * HK:2 * B * HK].view(B, 1, H, K),
                      y[2 * B * HK:].view(B, 1, HV, V)) for y in self.ys]
        self.working_set = rows * L * B * s.slot * elem    # bytes the replays cycle through

    def produce(self, layer):
        produce(self.xs[layer], self.ys[layer])

    def check_rows(self, layer):
        """Layer ``layer``'s slots in row 0, the check's."""
        return self.slots.rows[0].slots[layer]


def layer_slots(B, L, HV, V, K, elem, l2, min_bytes=serving.MIN_POOL_BYTES) -> tuple:
    """(P, rows): slots of each layer's pool and index rows per layer.  rows * L * B * slot
    bytes >= 4x L2 (at least one row); the L pools together hold at least ``min_bytes`` and 4x
    L2 of pages, and room for the standalone clock's rows over the whole storage (its check
    row and one null slot included)."""
    slot = HV * V * K * elem
    page = page_elems(HV, V, K) * elem
    rows = clocks.rotation_count(L * B * slot, l2, min_sets=1)
    alone = serving.rows_for(B, slot, l2) * B + B + 1
    total = max(math.ceil(max(min_bytes, 4 * l2) / page), alone)
    return max(math.ceil(total / L), rows * B + 1), rows


# ----------------------------------------------------------------------------- the entries

@dataclass
class Runner:
    """One entry in one cell: ``layer[l]()`` runs layer l's decode in the chain; ``alone(idx)``
    the same decode on the whole storage at slots ``idx`` (None: the floor, timed alone by
    :func:`gdnzoo.bench.floor.indexed_floor_times`); ``views(l)``: the q, k, v it reads (None:
    the floor)."""
    layer: list
    alone: object
    views: object
    note: str


def runner(name, level, ch, shape) -> Runner:
    """Entry (name, level) in cell ``ch``: the chained floor, FlashInfer's pool API or a gdnzoo
    backend through ``gdnzoo.decode(..., pdl=level)``; ``shape``: the pool floor's launch shape
    (None when not measured).  Raises Skip with the reason."""
    if name == "floor":
        if shape is None:
            raise entries.Skip("the pool floor was not measured in this cell (see its standalone "
                               "row)")
        if level != "off" and torch.cuda.get_device_capability() < (9, 0):
            raise entries.Skip("PDL (griddepcontrol) needs compute capability >= 9.0")
        s = ch.storage
        launches = [floor.chained_launcher(
            floor.PoolTarget(ch.bufs[i], s.page, s.slot, ch.B, ch.index[i], None), shape,
            PDL_LEVELS[level], ch.mixed[i]) for i in range(ch.L)]
        vpt, blk, per = shape
        return Runner(launches, None, None,
                      f"pool floor kernel float4 x{vpt}/thread, {blk} threads, {per} blocks per "
                      f"slot, reading mixed_qkv[n, 0]")
    x = ch.x
    if name == "flashinfer-pool":
        if ch.sd not in serving.FI_STATES:
            raise entries.Skip("FlashInfer's pool API is timed with bf16 state only")
        fi = entries.flashinfer_gdn("gated_delta_rule_decode_pretranspose")
        a, b = x.a.contiguous(), x.b.contiguous()
        views = ch.flat
        note = "FlashInfer pool API; q, k, v contiguous blocks of the producer's output"

        def call(layer, state, idx):
            q, k, v = ch.flat[layer]
            fi(q, k, v, None, x.A_log, a, x.dt_bias, b, scale=x.scale, output=ch.outs[layer],
               use_qk_l2norm=True, initial_state=state, initial_state_indices=idx,
               backend="flashinfer")
    else:
        q, k, v = ch.packed[0]
        p, _ = validate(q, k, v, ch.pools[0], x.A_log, x.a, x.dt_bias, x.b, x.scale,
                        out=ch.outs[0], use_qk_l2norm=True, state_indices=ch.index[0],
                        null_slot=serving.NULL_SLOT, pdl=level)
        entries.serve(name, p)
        views, note = ch.packed, f"gdnzoo.decode(algo={name!r}, pdl={level!r})"

        def call(layer, state, idx):
            q, k, v = ch.packed[layer]
            gdnzoo.decode(q, k, v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                          out=ch.outs[layer], use_qk_l2norm=True, algo=name, state_indices=idx,
                          null_slot=serving.NULL_SLOT, pdl=level)
    return Runner([functools.partial(call, i, ch.pools[i], ch.index[i]) for i in range(ch.L)],
                  lambda idx: call(0, ch.storage.state, idx), views.__getitem__, note)


# ----------------------------------------------------------------------------- checking

def chain_call(ch, run):
    """issue(): the chain of every layer, [producer, decode] each, on the current stream."""
    def issue():
        for i in range(ch.L):
            ch.produce(i)
            run.layer[i]()
    return issue


def check_chain(ch, run, issue) -> dict:
    """``issue()`` (the chain, eager or a graph's replay) once on the check slots, every layer's
    mixed_qkv and out filled with NaN first; the first and last layers judged: out and their
    slots by the gate against the float64 reference of what their producers wrote (the floor:
    its slots bit-identical, as alpha=1, beta=0, gamma=0 store what they read).  Their slots
    are then restored, so a failing entry leaves the next check its starting states.  Returns
    a check's dict (pipeline.judged's keys)."""
    ch.slots.first()
    layers = sorted({0, ch.L - 1})
    rows = {i: ch.check_rows(i).long() for i in layers}
    before = {i: ch.pools[i].index_select(0, rows[i]) for i in layers}
    ch.ys.fill_(NAN)
    ch.outs.fill_(NAN)
    issue()
    if ch.ys.is_cuda:
        torch.cuda.synchronize()
    reasons, res, x = [], dict(dict.fromkeys(ERRS, 0.0), n_bad=0), ch.x
    for i in layers:
        after = ch.pools[i].index_select(0, rows[i])
        ch.pools[i].index_copy_(0, rows[i], before[i])
        if run.views is None:
            if not torch.equal(after, before[i]):
                reasons.append(f"layer {i}: the floor changed the slots it streams")
            continue
        q, k, v = run.views(i)
        ref = reference_outputs(Inputs(q, k, v, before[i], x.A_log, x.a, x.dt_bias, x.b,
                                       x.scale), use_qk_l2norm=True)
        j = gate.judge(ch.outs[i], after, *ref, out_dtype=torch.bfloat16, state_dtype=after.dtype)
        reasons += [f"layer {i}: {r}" for r in j.reasons]
        for key, val in errors(judged(j)).items():
            res[key] = (res[key] + val if key == "n_bad" else max(res[key], val)
                        if math.isfinite(val) else val)
    return dict(res, ok=not reasons, reason="; ".join(reasons))


# ----------------------------------------------------------------------------- timing

def replay_times(graphs, prepare, reps, warmup=2) -> list:
    """Per-replay times (us) of each graph of ``graphs``, replayed in turn ``reps`` times,
    ``prepare()`` before each replay outside its CUDA events: [[us per replay] per graph]."""
    for _ in range(warmup):
        for g in graphs:
            prepare()
            g.replay()
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
           for _ in graphs] for _ in range(reps)]
    for r in range(reps):
        for g, (a, b) in zip(graphs, ev[r]):
            prepare()
            a.record()
            g.replay()
            b.record()
    torch.cuda.synchronize()
    return [[ev[r][j][0].elapsed_time(ev[r][j][1]) * 1e3 for r in range(reps)]
            for j in range(len(graphs))]


# ----------------------------------------------------------------------------- measuring

def measure_entry(c, clocks_, ch, plan, shape, producers) -> list:
    """Rows of one entry in one cell: SKIP, FAIL, or its chained (and standalone) times."""
    try:
        r = runner(c.backend, c.mode, ch, shape)
    except entries.Skip as e:
        return rows_of(c, clocks_, "SKIP", str(e), layers=plan.layers)
    issue = chain_call(ch, r)
    ch.slots.first()
    issue()                              # every kernel compiled, loaded, memoized: then capture
    graph = clocks.capture(issue)
    chk = check_chain(ch, r, graph.replay)
    errs = errors(chk) if r.views is not None else {}
    if not chk["ok"]:
        return rows_of(c, clocks_, "FAIL", chk["reason"], layers=plan.layers, **errs)
    # added latency per layer per replay pair: the producers' graph and the chain's replayed in
    # turn, the next slot row before each
    pair = (producers, graph)
    est = [statistics.median(t) for t in replay_times(pair, ch.slots.advance, 1)]
    reps = int(min(max(CHAIN_SECONDS * 1e6 / max(sum(est), 1.0), MIN_REPLAYS), MAX_REPLAYS))
    prod, chain = replay_times(pair, ch.slots.advance, reps)
    del graph, pair
    rows = [dict(cell=c, clock="chained", status="PASS", note=r.note, flags="",
                 samples=[(t - p) / ch.L for p, t in zip(prod, chain)],
                 producer_us=statistics.median(prod) / ch.L, n_sets=ch.rows, layers=plan.layers,
                 method=f"{reps} replay pairs of CUDA graphs of {ch.L} layers (chain - producers)"
                        f" / L", working_set_mib=ch.working_set / 2**20, **errs)]
    if r.alone is not None:
        e = Entry(lambda ix: r.alone(ix.slots), None, ch.alone, r.note)
        alone = timed(c, ("kernel",), e, plan, busy=True, base=dict(errs, layers=plan.layers))
        rows += [dict(x, clock="standalone") for x in alone]
    return rows


# ----------------------------------------------------------------------------- the table

VERDICT = {True: "PASS", False: "MISS"}


def bars(table, ours):
    """For the chained rows of ``ours``: ``bar_floor`` (<= FLOOR_BAR x the chained floor +
    TICK_US), ``bar_off`` (a PDL level: <= the same backend's PDL off + TICK_US),
    ``bar_standalone`` (B >= STANDALONE_MIN_B: <= STANDALONE_BAR x its standalone time); each
    "PASS", "MISS" or "" (not applicable or not measured)."""
    med = {(r["backend"], r["mode"], r["clock"], r["B"], r["state_dtype"]): r["median_us"]
           for r in table if r["status"] == "PASS" and finite(r["median_us"])}
    for r in table:
        r["bar_floor"] = r["bar_off"] = r["bar_standalone"] = ""
        m = med.get((r["backend"], r["mode"], r["clock"], r["B"], r["state_dtype"]))
        if m is None or r["backend"] not in ours or r["clock"] != "chained":
            continue
        B, sd = r["B"], r["state_dtype"]
        fl = med.get(("floor", r["mode"], "chained", B, sd))
        if fl:
            r["bar_floor"] = VERDICT[m <= FLOOR_BAR * fl + TICK_US]
        off = med.get((r["backend"], "off", "chained", B, sd))
        if r["mode"] != "off" and off is not None:
            r["bar_off"] = VERDICT[m <= off + TICK_US]
        alone = med.get((r["backend"], r["mode"], "standalone", B, sd))
        if B >= STANDALONE_MIN_B and alone is not None:
            r["bar_standalone"] = VERDICT[m <= STANDALONE_BAR * alone]
    return table


def bar_lines(table, sd, ours, batches) -> list:
    """One line per (B, ours at a level) with a chained time: the numbers behind each bar."""
    med = {(r["backend"], r["mode"], r["clock"], r["B"]): r["median_us"] for r in table
           if r["state_dtype"] == sd and r["status"] == "PASS" and finite(r["median_us"])}
    sel = [r for r in table if r["state_dtype"] == sd and r["clock"] == "chained"
           and r["backend"] in ours and (r["backend"], r["mode"], "chained", r["B"]) in med]
    if not sel:
        return []
    w = max(len(f"{r['backend']}[{r['mode']}]") for r in sel)
    lines = [f"{'B':>5}  {'entry':<{w}}  {'chained':>8}  {'floor':>8}  {'PDL off':>8}  "
             f"{'alone':>8}  floor-bar  off-bar  standalone-bar"]
    for B in batches:
        for r in sel:
            if r["B"] != B:
                continue
            n, lv = r["backend"], r["mode"]
            lines.append(
                f"{B:>5}  {f'{n}[{lv}]':<{w}}  {us(r['median_us']):>8}  "
                f"{us(med.get(('floor', lv, 'chained', B), NAN)):>8}  "
                f"{us(med.get((n, 'off', 'chained', B), NAN)) if lv != 'off' else '':>8}  "
                f"{us(med.get((n, lv, 'standalone', B), NAN)):>8}  "
                f"{r['bar_floor'] or '-':>9}  {r['bar_off'] or '-':>7}  "
                f"{r['bar_standalone'] or '-':>14}")
    return lines


# ----------------------------------------------------------------------------- the mode

class Chained(Mode):
    name = "chained"
    floors = {"chained": {}, "standalone": {"mode": "off"}}
    progress = ("chained", True)
    headline = ("T=1, use_qk_l2norm=True, pools in place; a CUDA graph of {layers} layers "
                "[producer (Triton, no PDL), decode]; added latency per layer = (chain - "
                "producers) / {layers}; standalone: kernel clock (sum of a call's records)")
    method = METHOD
    columns = COLUMNS
    clocks = CLOCKS
    defaults = dict(batch=BATCHES, state_dtype=STATES, time_budget=BUDGET_S)
    cpu = "skip"
    subdir = "chained"
    gpu_only = ("the chained clock replays CUDA graphs of producer and decode kernels on a GPU "
                "(and times the pool floor and each decode alone with CUPTI)")

    def plan(self, plan, args):
        if given(args.timing):
            usage_error(f"--timing: --mode chained times its own clocks (chained, standalone), "
                        f"got {','.join(args.timing)}")
        if plan.tokens != (1,):
            usage_error(f"--tokens: the chained clock times a decode step, T=1; got "
                        f"{plan.tokens[0]}")
        plan.l2norm, plan.clocks = True, CLOCKS
        plan.layers = plan.layers or LAYERS
        plan.backends = tuple(n for n in entries.named(args.algo, lambda: entries.backends(
            pdl=True)) if n not in PEERS)
        plan.entries = (*itertools.product(("floor", *plan.backends), LEVELS),
                        *((p, "off") for p in PEERS))
        for sd, B in itertools.product(plan.states, plan.batches):
            plan.groups.append(Group(f"{sd} B={B}", [
                (plan.cell("floor", "off", B, sd), ("standalone",))] + [
                (plan.cell(n, lv, B, sd), clocks_of(n)) for n, lv in plan.entries],
                key=(B, sd), skip=f"the producer kernel needs Triton: {NO_TRITON}; nothing "
                                  f"was measured" if NO_TRITON else ""))

    def measure(self, group, plan):
        """Every entry of one cell: the pool floor first (its launch shape serves the chained
        floor), the producers' graph, then each entry's chain, a progress line after each."""
        B, sd = group.key
        ch = Chain(B, sd, plan.layers, plan.H, plan.HV, plan.K, plan.V, plan.device, plan.l2,
                   plan.seed)
        plan.notes.append(f"{sd} B={B}: {ch.L} pools of {ch.P} slots "
                          f"({ch.storage.nbytes / 2**30:.2f} GiB in all), {ch.rows} index row(s) "
                          f"per layer")
        log = Progress(0, plan.quiet).log
        (fc, _), *cells = group.cells
        s, shape = ch.storage, None
        try:
            target = floor.PoolTarget(s.buf, s.page, s.slot, ch.B, ch.alone.index.slots,
                                      ch.alone.advance)
            rows, shape = serving.indexed_floor(fc, target, ch.alone, plan, "standalone",
                                                layers=plan.layers)
        except Exception as e:
            plan.sync()
            rows = rows_of(fc, ("standalone",), "ERROR", failure(e), layers=plan.layers)
        try:
            for i in range(ch.L):                     # compiled before the capture
                ch.produce(i)
            producers = clocks.capture(lambda: [ch.produce(i) for i in range(ch.L)])
        except Exception as e:
            plan.sync()
            why = f"the producers' graph: {failure(e)}"
            return rows + [x for c, k in cells for x in rows_of(c, k, "ERROR", why,
                                                               layers=plan.layers)]
        for c, k in cells:
            got = guarded(lambda: measure_entry(c, k, ch, plan, shape, producers), [(c, k)], plan,
                          layers=plan.layers)
            rows += got
            r = got[0]
            log(f"  {ch.sd} B={ch.B} {c.backend}[{c.mode}]: " + (
                f"{statistics.median(r['samples']):.2f} us per layer" if r["status"] == "PASS"
                else f"{r['status']} {r['note'][:120]}"))
        return rows

    def problem(self, c, plan, **kw):
        return super().problem(c, plan, pool=True, pdl="" if c.mode == "off" else c.mode)

    def derive(self, table, plan):
        bars(table, plan.backends)

    def sections(self, plan, table):
        what = {"chained": "us per layer / x the chained floor at this level",
                "standalone": "us per call (kernel clock) / x the pool floor"}
        return [section(f"{sd} state, PDL {level}, {clock}: {what[clock]}", True, state_dtype=sd,
                        mode=level, clock=clock)
                for sd in plan.states for level in LEVELS for clock in CLOCKS]

    def extra_lines(self, table, plan):
        lines = []
        for sd in plan.states:
            b = bar_lines(table, sd, plan.backends, plan.batches)
            if b:
                lines.append(f"{sd} state, bars (ours): chained <= {FLOOR_BAR:g} x the chained "
                             f"floor + {TICK_US * 1e3:g} ns; a PDL level <= PDL off + "
                             f"{TICK_US * 1e3:g} ns; B >= {STANDALONE_MIN_B}: chained <= "
                             f"{STANDALONE_BAR:g} x standalone")
                lines += b
        return lines


MODES = {"chained": Chained()}

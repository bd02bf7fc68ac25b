"""``gdnzoo bench --timing chained``: the decode's added latency per layer inside a model's graph.

In a model, a decode step follows the kernel that produces its ``mixed_qkv`` (the conv1d), once
per layer, all captured in one CUDA graph.  What a layer pays for the decode is then the decode
kernel's time plus the gap between the producer's end and the decode's start, which
programmatic dependent launch (PDL, ``gdnzoo.decode(..., pdl=...)``) can hide.  Per (state
dtype, B), timed in the serving convention of ``--mode pool`` (:mod:`gdnzoo.bench.pool`):

* a graph of L layers (``--layers``, default 64), each [producer, decode]: the producer is a
  small Triton kernel launched without PDL, SiLU over the layer's input [B, 2*H*K + HV*V] bf16,
  writing that layer's packed ``mixed_qkv``; the decode reads q, k, v as views of it, updates
  the layer's own state pool in place (page stride HV*V*K*(1 + 1/32), slot 0 the null slot,
  ``null_slot=0``), a, b strided views of one [B, 2*HV] tensor shared by the layers,
  ``use_qk_l2norm=True``;
* added latency per layer = (graph time of the chain - graph time of the producers alone) / L,
  one sample per pair of replays (the producers' graph, then the chain's), CUDA events around
  each replay; the median over the pairs;
* cold slots: every layer's pool is its own part of one storage of at least 2 GiB (or 4x the
  L2); each layer's slots are random, B distinct ones per row, in ``rows`` rows per layer with
  rows * L * B * slot bytes >= 4x the L2; every decode reads one persistent index tensor, the
  next row copied into it before each replay, outside the timed events.

Entries, each at the PDL levels "off", "wait" (the kernel waits for the producer before any
load) and "early" (the state is loaded before the wait): the chained floor (the pool floor
kernel of :mod:`gdnzoo.bench.floor` reading one value of ``mixed_qkv``, its launch shape the
one the pool floor's search picks for this cell, :func:`gdnzoo.bench.floor.chained_launcher`);
ours, the gdnzoo backends that launch with PDL (registry ``pdl: true``; ``--algo`` names
others), called through ``gdnzoo.decode(..., algo=name, pdl=level)`` (a level a backend
refuses is SKIP with its reason); and, without PDL, the peers ``vllm-packed`` (the gdnzoo
backend) and ``flashinfer-pool`` (FlashInfer's pool API, bf16 state, reading q, k, v as
contiguous blocks of the producer's output: same bytes, its layout).  Each entry is also timed
alone: the kernel clock of ``--mode pool`` (CUPTI, per call) on the whole storage with fresh
slots every call, the pool floor itself for the floor.

Correctness first: every chain is replayed once on known slots with every layer's
``mixed_qkv`` and ``out`` filled with NaN before (a decode reading before its producer wrote
fails); the first and last layers' outputs and slots are judged by the gate against the float64
reference of what their producers wrote (the floor must leave its slots as they were).  A
failing entry is FAIL and gets no time.

Bars (computed for ours, printed, never asserted): within 10% plus one CUPTI tick (32 ns) of the
chained floor at the same level; at a PDL level, never worse than the same backend without PDL
(one tick of slack); at B >= 64, chained within 5% of standalone.

Arguments are ``gdnzoo bench``'s; ``--batch`` and ``--state-dtype`` not given default to B = 1,
4, 16, 64, 256 and fp32, bf16; ``--time-budget`` to 480 s.  Writes ``results.csv`` and
``results.json`` under ``--out`` (default: the bench's results folder for this GPU,
``/chained``).  Without a CUDA device nothing is timed: every row is SKIP with the reason, and
the command exits 0.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass

import torch

from gdnzoo.bench import clocks, floor, sweep
from gdnzoo.bench import pool as serving

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
NULL_SLOT = 0
ROW_ALIGN = 64                      # each layer's index row starts every 64 int32 (256 bytes)
BUDGET_S = 480.0
PRODUCER_BLOCK = 1024
CHAIN_SECONDS = 0.3                 # replays of one chain and its producers' graph
MIN_REPLAYS, MAX_REPLAYS = 10, 200
FLOOR_BAR = 1.10                    # bars: ours <= 1.10 x the chained floor + one tick
TICK_US = 0.032                     # one CUPTI tick
STANDALONE_BAR = 1.05               # at B >= STANDALONE_MIN_B: chained <= 1.05 x standalone
STANDALONE_MIN_B = 64
CLOCKS = ("chained", "standalone")
COLUMNS_EXTRA = ("layers", "producer_us", "kernels_per_call", "bar_floor", "bar_off",
                 "bar_standalone")
NAN = float("nan")

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


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Plan:
    batches: tuple
    states: tuple
    layers: int
    backends: tuple          # ours: gdnzoo backends timed at every PDL level
    entries: tuple           # (name, level) of every entry, the floor's first
    H: int
    HV: int
    K: int
    V: int
    budget: float            # seconds; cells not started by then are SKIPped (0: none)
    notes: tuple


def pdl_backends() -> list:
    """Registered backends that launch with PDL (``pdl: true``), in registry order."""
    from gdnzoo.registry import load_registry
    return [n for n, s in load_registry().backends.items() if s.pdl is True]


def make_plan(args) -> Plan:
    """The run's cells and entries from ``gdnzoo bench --timing chained`` arguments; a bad one
    exits with status 2, naming it."""
    if list(args.timing) != ["chained"]:
        sweep.usage_error(f"--timing: chained runs alone, got {','.join(args.timing)}")
    if isinstance(args.tokens, tuple) or args.tokens != 1:
        sweep.usage_error(f"--tokens: the chained clock times a decode step, T=1; got {args.tokens}")
    if list(args.mode) not in (["inplace"], ["pool"]):
        sweep.usage_error(f"--mode: the chained clock times pool decode calls in place; got "
               f"{','.join(args.mode)}")
    batches = tuple(args.batch) if sweep.given(args.batch) else BATCHES
    states = tuple(args.state_dtype) if sweep.given(args.state_dtype) else STATES
    ours = [n for n in serving.named_backends(args.algo, pdl_backends, sweep.usage_error) if n not in PEERS]
    layers = LAYERS if getattr(args, "layers", None) is None else args.layers
    H, HV = sweep._ints(args.heads)
    nvbench = getattr(args, "nvbench", False)
    notes = ["--nvbench: not available with --timing chained"] if nvbench else []
    budget = float(args.time_budget) if sweep.given(args.time_budget) else BUDGET_S
    entries = ([("floor", lv) for lv in LEVELS] + [(n, lv) for n in ours for lv in LEVELS]
               + [(p, "off") for p in PEERS])
    return Plan(batches, states, layers, tuple(ours), tuple(entries), H, HV, args.dim, args.dim,
                budget, tuple(notes))


def clocks_of(name) -> tuple:
    """The clocks an entry has rows for: the floor's standalone row is the pool floor's, one per
    cell (:func:`floor_alone_rows`)."""
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

def layer_slots(B, L, HV, V, K, elem, l2, min_bytes=serving.MIN_POOL_BYTES) -> tuple:
    """(P, rows): slots of each layer's pool and index rows per layer.  rows * L * B * slot
    bytes >= 4x L2 (at least one row); the L pools together hold at least ``min_bytes`` and 4x
    L2 of pages, and room for the standalone clock's rows over the whole storage (its check
    row and one null slot included)."""
    slot = HV * V * K * elem
    page = serving.page_elems(HV, V, K) * elem
    rows = clocks.rotation_count(L * B * slot, l2, min_sets=1)
    alone = serving.rows_for(B, slot, l2) * B + B + 1
    total = max(math.ceil(max(min_bytes, 4 * l2) / page), alone)
    return max(math.ceil(total / L), rows * B + 1), rows


class ChainSlots:
    """Every layer's slots: ``rows`` rows of B distinct slots in [1, P) per layer (no slot in
    two rows of a layer), one bank [rows, L, width] int32 on the device, each layer's row on a
    256-byte boundary; the persistent index [L, width] the layers' decodes read
    (:meth:`of`); :meth:`advance` copies the next row into it (one device copy, one counter),
    :meth:`first` row 0 (the check's slots, :meth:`check_rows`)."""

    def __init__(self, P, L, B, rows, device, seed=0):
        if rows * B > P - 1:
            raise ValueError(f"chain slots: {rows} rows of B={B} need {rows * B} slots per "
                             f"layer; a layer's pool has {P - 1} besides the null slot")
        gen = torch.Generator().manual_seed(seed)
        width = -(-B // ROW_ALIGN) * ROW_ALIGN
        bank = torch.full((rows, L, width), -1, dtype=torch.int32)
        for layer in range(L):
            perm = torch.randperm(P - 1, generator=gen)[:rows * B] + 1
            bank[:, layer, :B] = perm.view(rows, B).to(torch.int32)
        self.bank = bank.to(device)
        self.index = self.bank[0].clone()
        self.B, self.rows, self._turn = B, rows, 0

    def of(self, layer) -> torch.Tensor:
        """Layer ``layer``'s index tensor: int32 [B], contiguous, its address fixed."""
        return self.index[layer, :self.B]

    def check_rows(self, layer) -> torch.Tensor:
        return self.bank[0, layer, :self.B]

    def advance(self, i=None):
        """Copy the next row into :attr:`index` (``i`` is unused)."""
        self.index.copy_(self.bank[self._turn % self.rows])
        self._turn += 1

    def first(self):
        self.index.copy_(self.bank[0])


class Chain:
    """One cell's model of L layers.  Layer l: producer input ``xs[l]`` and output ``ys[l]``
    (flat B*D bf16, D = 2*H*K + HV*V: its mixed_qkv, ``mixed[l]`` as [B, D]), q, k, v as the
    packed views of it (``packed[l]``) or as three contiguous blocks of it (``flat[l]``), its
    pool ``pools[l]`` (slots [l*P, (l+1)*P) of ``storage``, flat in ``bufs[l]``), its index
    ``slots.of(l)``, its output ``outs[l]``.  The gates and head constants (``x``, a
    :class:`gdnzoo.bench.pool.ServingInputs`) are shared; ``alone`` is the standalone clock's
    rotation over the whole storage."""

    def __init__(self, B, sd, L, H, HV, K, V, device, l2, seed=0,
                 min_bytes=serving.MIN_POOL_BYTES):
        from gdnzoo.inputs import DTYPES
        dtype = DTYPES[sd]
        elem = dtype.itemsize
        self.B, self.sd, self.L = B, sd, L
        self.P, rows = layer_slots(B, L, HV, V, K, elem, l2, min_bytes)
        P = self.P
        s = self.storage = serving.StatePool(L * P, HV, V, K, dtype, device, seed)
        self.pools = [s.state[i * P:(i + 1) * P] for i in range(L)]
        self.bufs = [s.buf[i * P * s.page:(i + 1) * P * s.page] for i in range(L)]
        self.slots = ChainSlots(P, L, B, rows, device, seed)
        self.alone = serving.Slots(L * P, B, serving.rows_for(B, s.slot * elem, l2), device,
                                   seed + B)
        D, HK = 2 * H * K + HV * V, H * K
        gen = torch.Generator(device=device).manual_seed(seed)
        self.xs = (torch.randn(L, B * D, generator=gen, device=device) * 0.5).to(torch.bfloat16)
        self.ys = torch.empty_like(self.xs)
        self.outs = torch.empty(L, B, 1, HV, V, dtype=torch.bfloat16, device=device)
        self.x = serving.ServingInputs(B, H, HV, K, V, sd, device, seed)
        self.mixed = [y.view(B, D) for y in self.ys]
        self.packed = [(m[:, :HK].view(B, 1, H, K), m[:, HK:2 * HK].view(B, 1, H, K),
                        m[:, 2 * HK:].view(B, 1, HV, V)) for m in self.mixed]
        self.flat = [(y[:B * HK].view(B, 1, H, K), y[B * HK:2 * B * HK].view(B, 1, H, K),
                      y[2 * B * HK:].view(B, 1, HV, V)) for y in self.ys]
        self.rows = rows

    def produce(self, layer):
        produce(self.xs[layer], self.ys[layer])

    @property
    def working_set_bytes(self) -> int:
        """State bytes the chain's replays cycle through: rows x L x B slots."""
        s = self.storage
        return self.rows * self.L * self.B * s.slot * s.buf.element_size()

    def notes(self) -> str:
        s = self.storage
        return (f"{self.sd} B={self.B}: {self.L} pools of {self.P} slots "
                f"({s.nbytes / 2**30:.2f} GiB in all), {self.rows} index row(s) per layer")


# ----------------------------------------------------------------------------- the entries

Skip = serving.Skip                 # an entry that cannot run in this cell (the message says why)


@dataclass
class Runner:
    """One entry in one cell: ``layer[l]()`` runs layer l's decode in the chain; ``alone(idx)``
    the same decode on the whole storage at slots ``idx`` (None: the floor, timed alone by
    :func:`gdnzoo.bench.floor.pool_floor_times`); ``views(l)``: the q, k, v it reads (None:
    the floor)."""
    layer: list
    alone: object
    views: object
    note: str


def _gdnzoo_runner(name, level, ch) -> Runner:
    import gdnzoo
    from gdnzoo import registry
    from gdnzoo.contract import validate
    if name not in registry.load_registry().backends:
        raise Skip("not registered in registry.yaml")
    x = ch.x
    q, k, v = ch.packed[0]
    p, _ = validate(q, k, v, ch.pools[0], x.A_log, x.a, x.dt_bias, x.b, x.scale, out=ch.outs[0],
                    use_qk_l2norm=True, state_indices=ch.slots.of(0), null_slot=NULL_SLOT,
                    pdl=level)
    ok, why = registry.can_serve(name, p)
    if not ok:
        raise Skip(why)

    def call(layer, state, idx):
        q, k, v = ch.packed[layer]
        gdnzoo.decode(q, k, v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out=ch.outs[layer],
                      use_qk_l2norm=True, algo=name, state_indices=idx, null_slot=NULL_SLOT,
                      pdl=level)
    return Runner([functools.partial(call, i, ch.pools[i], ch.slots.of(i)) for i in range(ch.L)],
                  lambda idx: call(0, ch.storage.state, idx), lambda i: ch.packed[i],
                  f"gdnzoo.decode(algo={name!r}, pdl={level!r})")


def _flashinfer_runner(ch) -> Runner:
    if ch.sd not in serving.FI_STATES:
        raise Skip("FlashInfer's pool API is timed with bf16 state only")
    fi = serving.flashinfer_gdn("gated_delta_rule_decode_pretranspose")
    x = ch.x
    a, b = x.a.contiguous(), x.b.contiguous()

    def call(layer, state, idx):
        q, k, v = ch.flat[layer]
        fi(q, k, v, None, x.A_log, a, x.dt_bias, b, scale=x.scale, output=ch.outs[layer],
           use_qk_l2norm=True, initial_state=state, initial_state_indices=idx,
           backend="flashinfer")
    return Runner([functools.partial(call, i, ch.pools[i], ch.slots.of(i)) for i in range(ch.L)],
                  lambda idx: call(0, ch.storage.state, idx), lambda i: ch.flat[i],
                  "FlashInfer pool API; q, k, v contiguous blocks of the producer's output")


def _floor_runner(level, ch, shape) -> Runner:
    from gdnzoo.contract import PDL_LEVELS
    if shape is None:
        raise Skip("the pool floor was not measured in this cell (see its standalone row)")
    if level != "off" and torch.cuda.get_device_capability() < (9, 0):
        raise Skip("PDL (griddepcontrol) needs compute capability >= 9.0")
    s = ch.storage
    launches = [floor.chained_launcher(
        floor.PoolTarget(ch.bufs[i], s.page, s.slot, ch.B, ch.slots.of(i), None), shape,
        PDL_LEVELS[level], ch.mixed[i]) for i in range(ch.L)]
    vpt, blk, per = shape
    return Runner(launches, None, None,
                  f"pool floor kernel float4 x{vpt}/thread, {blk} threads, {per} blocks per "
                  f"slot, reading mixed_qkv[n, 0]")


def runner(name, level, ch, shape) -> Runner:
    """Entry (name, level) in cell ``ch``; ``shape``: the pool floor's launch shape (None when
    not measured).  Raises Skip with the reason."""
    if name == "floor":
        return _floor_runner(level, ch, shape)
    if name == "flashinfer-pool":
        return _flashinfer_runner(ch)
    return _gdnzoo_runner(name, level, ch)


# ----------------------------------------------------------------------------- checking

def chain_call(ch, run):
    """issue(): the chain of every layer, [producer, decode] each, on the current stream."""
    def issue():
        for i in range(ch.L):
            ch.produce(i)
            run.layer[i]()
    return issue


def check(ch, run, issue) -> dict:
    """``issue()`` (the chain, eager or a graph's replay) once on the check slots, every layer's
    mixed_qkv and out filled with NaN first; the first and last layers judged: out and their
    slots by the gate against the float64 reference of what their producers wrote (the floor:
    its slots bit-identical, as alpha=1, beta=0, gamma=0 store what they read).  Their slots
    are then restored, so a failing entry leaves the next check its starting states.  Returns
    dict(ok, reason, max_abs_err_out, max_abs_err_state, rel_err_out, rel_err_state, n_bad)."""
    from gdnzoo import gate
    from gdnzoo.inputs import Inputs
    from gdnzoo.reference import reference_outputs
    ch.slots.first()
    layers = sorted({0, ch.L - 1})
    rows = {i: ch.slots.check_rows(i).long() for i in layers}
    before = {i: ch.pools[i].index_select(0, rows[i]) for i in layers}
    ch.ys.fill_(NAN)
    ch.outs.fill_(NAN)
    issue()
    if ch.ys.is_cuda:
        torch.cuda.synchronize()
    res = dict(reasons=[], max_abs_err_out=0.0, max_abs_err_state=0.0, rel_err_out=0.0,
               rel_err_state=0.0, n_bad=0)
    x = ch.x
    for i in layers:
        after = ch.pools[i].index_select(0, rows[i])
        ch.pools[i].index_copy_(0, rows[i], before[i])
        if run.views is None:
            if not torch.equal(after, before[i]):
                res["reasons"].append(f"layer {i}: the floor changed the slots it streams")
            continue
        q, k, v = run.views(i)
        ref = reference_outputs(Inputs(q, k, v, before[i], x.A_log, x.a, x.dt_bias, x.b,
                                       x.scale), use_qk_l2norm=True)
        j = gate.judge(ch.outs[i], after, *ref, out_dtype=torch.bfloat16,
                       state_dtype=after.dtype)
        res["reasons"] += [f"layer {i}: {r}" for r in j.reasons]
        for key, val in (("max_abs_err_out", j.out.max_abs), ("max_abs_err_state", j.state.max_abs),
                         ("rel_err_out", j.rel_err_out), ("rel_err_state", j.rel_err_state)):
            res[key] = max(res[key], val) if math.isfinite(val) else val
        res["n_bad"] += j.n_bad
    res["ok"] = not res["reasons"]
    res["reason"] = "; ".join(res.pop("reasons"))
    return res


# ----------------------------------------------------------------------------- timing

def capture(issue):
    """A CUDA graph of what ``issue()`` launches (each kernel of it run before: compiled,
    loaded, memoized; every tensor allocated)."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            issue()
    except Exception as e:
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        raise clocks.GraphUnsupported(f"capture failed: {type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:160] if str(e) else ''}") from None
    return g


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


def chain_times(graph, producers, ch) -> tuple:
    """(added latency per layer per replay pair (us), producers' time per layer (us), method):
    the producers' graph and the chain's replayed in turn, the next slot row before each."""
    est = [statistics.median(t) for t in replay_times((producers, graph), ch.slots.advance, 1)]
    reps = int(min(max(CHAIN_SECONDS * 1e6 / max(sum(est), 1.0), MIN_REPLAYS), MAX_REPLAYS))
    prod, chain = replay_times((producers, graph), ch.slots.advance, reps)
    added = [(c - p) / ch.L for p, c in zip(prod, chain)]
    return (added, statistics.median(prod) / ch.L,
            f"{reps} replay pairs of CUDA graphs of {ch.L} layers (chain - producers) / L")


# ----------------------------------------------------------------------------- measuring

def _cell(name, level, B, sd, plan):
    return sweep.Cell(name, B, plan.H, plan.HV, plan.K, plan.V, 1, sd, level, True)


def _rows_of(name, level, B, sd, plan, status, note, which=None, **extra):
    return [dict(cell=_cell(name, level, B, sd, plan), clock=c, status=status, note=note,
                 flags="", layers=plan.layers, **extra) for c in which or clocks_of(name)]


def _row(name, level, ch, plan, clock, status, note, **extra):
    return dict(cell=_cell(name, level, ch.B, ch.sd, plan), clock=clock, status=status,
                note=note, flags="", layers=plan.layers, **extra)


def floor_alone_rows(B, sd, plan, status, note) -> list:
    """The pool floor's standalone row of a cell that was not measured."""
    return _rows_of("floor", "off", B, sd, plan, status, note, which=("standalone",))


def measure_pool_floor(ch, plan, iters) -> tuple:
    """(the floor's standalone row: the pool floor on the whole storage, its launch shape or
    None when not measured)."""
    s = ch.storage
    target = floor.PoolTarget(s.buf, s.page, s.slot, ch.B, ch.alone.index, ch.alone.advance)
    f = floor.pool_floor_times(target, iters=min(iters, 100), reduce=clocks.busy_and_count)
    if f["samples"] is None:
        return _row("floor", "off", ch, plan, "standalone", "SKIP", f["config"]), None
    row = _row("floor", "off", ch, plan, "standalone", "PASS", f["config"], method=f["method"],
               samples=[t for t, _ in f["samples"]], n_sets=len(ch.alone.rows),
               kernels_per_call=serving._records_note([n for _, n in f["samples"]])[0])
    return row, f["shape"]


def standalone(run, ch, iters) -> tuple:
    """The pool bench's kernel clock of ``run.alone``: (busy samples, records per call, method)."""
    slots = ch.alone
    for _ in range(sweep.WARMUP_CALLS):
        slots.advance()
        run.alone(slots.index)
    return serving._timed(run.alone, slots, iters, serving._estimate(run.alone, slots))


def measure_entry(name, level, ch, plan, shape, producers, iters) -> list:
    """Rows of one entry in one cell: SKIP, FAIL, or its chained (and standalone) times."""
    try:
        run = runner(name, level, ch, shape)
    except Skip as e:
        return _rows_of(name, level, ch.B, ch.sd, plan, "SKIP", str(e))
    issue = chain_call(ch, run)
    ch.slots.first()
    issue()                              # every kernel compiled, loaded, memoized: then capture
    graph = capture(issue)
    chk = check(ch, run, graph.replay)
    errs = {k: chk[k] for k in ("max_abs_err_out", "max_abs_err_state", "rel_err_out",
                                "rel_err_state", "n_bad")} if run.views is not None else {}
    if not chk["ok"]:
        return [dict(r, **errs) for r in _rows_of(name, level, ch.B, ch.sd, plan, "FAIL",
                                                  chk["reason"])]
    added, prod, method = chain_times(graph, producers, ch)
    del graph
    rows = [_row(name, level, ch, plan, "chained", "PASS", run.note, samples=added,
                 producer_us=prod, method=method, n_sets=ch.rows,
                 working_set_mib=ch.working_set_bytes / 2**20, **errs)]
    if run.alone is not None:
        busy, counts, m = standalone(run, ch, iters)
        n, varied = serving._records_note(counts)
        rows.append(_row(name, level, ch, plan, "standalone", "PASS",
                         "; ".join(s for s in (run.note, varied) if s), samples=busy, method=m,
                         kernels_per_call=n, n_sets=len(ch.alone.rows), **errs))
    return rows


def _error(e) -> str:
    """ERROR rows' note; the device drained (a sticky device error: the next entries say so
    too)."""
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def measure_cell(ch, plan, iters, log=lambda s: None) -> list:
    """Every entry of one cell: the pool floor first (its launch shape serves the chained
    floor), the producers' graph, then each entry's chain; ``log(line)`` after each entry."""
    shape = None
    try:
        row, shape = measure_pool_floor(ch, plan, iters)
        rows = [row]
    except Exception as e:
        rows = floor_alone_rows(ch.B, ch.sd, plan, "ERROR", _error(e))
    try:
        for i in range(ch.L):                     # compiled before the capture
            ch.produce(i)
        producers = capture(lambda: [ch.produce(i) for i in range(ch.L)])
    except Exception as e:
        why = f"the producers' graph: {_error(e)}"
        return rows + [r for name, level in plan.entries
                       for r in _rows_of(name, level, ch.B, ch.sd, plan, "ERROR", why)]
    for name, level in plan.entries:
        try:
            got = measure_entry(name, level, ch, plan, shape, producers, iters)
        except Exception as e:
            got = _rows_of(name, level, ch.B, ch.sd, plan, "ERROR", _error(e))
        rows += got
        r = got[0]
        log(f"  {ch.sd} B={ch.B} {name}[{level}]: " + (
            f"{statistics.median(r['samples']):.2f} us per layer" if r["status"] == "PASS"
            else f"{r['status']} {r['note'][:120]}"))
    return rows


def _summary(rows) -> str:
    """One progress line: each chained median and its multiple of the floor at its level."""
    med = {(r["cell"].backend, r["cell"].mode): statistics.median(r["samples"]) for r in rows
           if r["clock"] == "chained" and r["status"] == "PASS" and r.get("samples")}
    parts = []
    for (name, level), us in med.items():
        fl = med.get(("floor", level))
        parts.append(f"{name}[{level}] {us:.2f}"
                     + (f" {us / fl:.2f}x" if fl and name != "floor" else ""))
    bad = [f"{r['cell'].backend}[{r['cell'].mode}] {r['status']}" for r in rows
           if r["status"] in ("FAIL", "ERROR") and r["clock"] == "chained"]
    return " | ".join(parts + bad) or "nothing ran"


def _skipped(plan, B, sd, why) -> list:
    return floor_alone_rows(B, sd, plan, "SKIP", why) + [
        r for name, level in plan.entries for r in _rows_of(name, level, B, sd, plan, "SKIP", why)]


def run_chained(args, plan):
    """Measure every (state dtype, B) cell; returns (rows, device reference, notes)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    notes = list(plan.notes)
    why = ""
    if device != "cuda":
        why = (f"{'--device cpu' if torch.cuda.is_available() else 'no CUDA device'}: the "
               f"chained clock replays CUDA graphs of producer and decode kernels on a GPU "
               f"(and times the pool floor and each decode alone with CUPTI); nothing was "
               f"measured")
    elif NO_TRITON:
        why = f"the producer kernel needs Triton: {NO_TRITON}; nothing was measured"
    if why:
        notes.insert(0, why)
        rows = [r for sd in plan.states for B in plan.batches for r in _skipped(plan, B, sd, why)]
        return rows, dict(note="not measured"), notes
    ref = sweep.floor_rows([], ["kernel"], device, args.iters)[1]
    l2 = clocks.l2_bytes()
    rows, t0 = [], time.perf_counter()
    n_cells, i = len(plan.states) * len(plan.batches), 0
    for sd in plan.states:
        for B in plan.batches:
            i += 1
            if plan.budget and time.perf_counter() - t0 > plan.budget:
                rows += _skipped(plan, B, sd, f"time budget ({plan.budget:g} s) exhausted")
                continue
            ch = Chain(B, sd, plan.layers, plan.H, plan.HV, plan.K, plan.V, device, l2,
                       args.seed)
            notes.append(ch.notes())
            cell_rows = measure_cell(ch, plan, args.iters,
                                     lambda line: serving._log(args.quiet, line))
            rows += cell_rows
            serving._log(args.quiet, f"[{i}/{n_cells}] {sd} B={B} "
                                     f"({time.perf_counter() - t0:.0f} s): " + _summary(cell_rows))
            del ch
            torch.cuda.empty_cache()
    return rows, ref, notes


# ----------------------------------------------------------------------------- the table

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _verdict(ok) -> str:
    return "PASS" if ok else "MISS"


def bars(table, ours):
    """Fill x_floor (chained: / the chained floor at the same level; standalone: / the pool
    floor) and, for the chained rows of ``ours``, the bars: ``bar_floor`` (<= FLOOR_BAR x the
    chained floor + TICK_US), ``bar_off`` (a PDL level: <= the same backend's PDL off +
    TICK_US), ``bar_standalone`` (B >= STANDALONE_MIN_B: <= STANDALONE_BAR x its standalone
    time); each "PASS", "MISS" or "" (not applicable or not measured)."""
    med = {(r["backend"], r["mode"], r["clock"], r["B"], r["state_dtype"]): r["median_us"]
           for r in table if r["status"] == "PASS" and _finite(r["median_us"])}
    for r in table:
        r["x_floor"] = NAN
        r["bar_floor"] = r["bar_off"] = r["bar_standalone"] = ""
        m = med.get((r["backend"], r["mode"], r["clock"], r["B"], r["state_dtype"]))
        if m is None:
            continue
        B, sd = r["B"], r["state_dtype"]
        fl = med.get(("floor", r["mode"] if r["clock"] == "chained" else "off", r["clock"], B, sd))
        if r["backend"] != "floor" and fl:
            r["x_floor"] = m / fl
        if r["backend"] not in ours or r["clock"] != "chained":
            continue
        if fl:
            r["bar_floor"] = _verdict(m <= FLOOR_BAR * fl + TICK_US)
        off = med.get((r["backend"], "off", "chained", B, sd))
        if r["mode"] != "off" and off is not None:
            r["bar_off"] = _verdict(m <= off + TICK_US)
        alone = med.get((r["backend"], r["mode"], "standalone", B, sd))
        if B >= STANDALONE_MIN_B and alone is not None:
            r["bar_standalone"] = _verdict(m <= STANDALONE_BAR * alone)
    return table


def build_table(raw, ref, ours):
    """report.build_rows plus this clock's columns (:data:`COLUMNS_EXTRA`), x_floor and bars."""
    from gdnzoo.bench import report
    table = report.build_rows(raw, ref)
    for t, r in zip(table, raw):
        t.update({k: r.get(k, NAN if k == "producer_us" else "") for k in COLUMNS_EXTRA})
    return bars(table, ours)


def _us(x) -> str:
    return "-" if not _finite(x) else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def _fmt(r) -> str:
    if r is None:
        return ""
    if r["status"] != "PASS":
        return r["status"]
    if not _finite(r["median_us"]):
        return "n/a"
    return _us(r["median_us"]) + (f"/{r['x_floor']:.2f}x" if _finite(r["x_floor"]) else "")


def grid(table, sd, level, clock, names, batches) -> list:
    """B rows x ``names`` (entries at ``level``): us, and / x the floor when measured."""
    cell = {(r["backend"], r["B"]): r for r in table if r["state_dtype"] == sd
            and r["mode"] == level and r["clock"] == clock}
    names = [n for n in names if any((n, B) in cell for B in batches)]
    if not names:
        return []
    w = [max(len(n), 11) for n in names]
    lines = [f"{'B':>5}" + "".join(f"  {n:>{x}}" for n, x in zip(names, w))]
    for B in batches:
        lines.append(f"{B:>5}" + "".join(f"  {_fmt(cell.get((n, B))):>{x}}"
                                         for n, x in zip(names, w)))
    return lines


def bar_lines(table, sd, ours, batches) -> list:
    """One line per (B, ours at a level) with a chained time: the numbers behind each bar."""
    med = {(r["backend"], r["mode"], r["clock"], r["B"]): r["median_us"] for r in table
           if r["state_dtype"] == sd and r["status"] == "PASS" and _finite(r["median_us"])}
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
                f"{B:>5}  {f'{n}[{lv}]':<{w}}  {_us(r['median_us']):>8}  "
                f"{_us(med.get(('floor', lv, 'chained', B), NAN)):>8}  "
                f"{_us(med.get((n, 'off', 'chained', B), NAN)) if lv != 'off' else '':>8}  "
                f"{_us(med.get((n, lv, 'standalone', B), NAN)):>8}  "
                f"{r['bar_floor'] or '-':>9}  {r['bar_off'] or '-':>7}  "
                f"{r['bar_standalone'] or '-':>14}")
    return lines


def console(table, env, notes, files, plan) -> str:
    from gdnzoo.bench import report
    lines = [report.run_line(env, "gdnzoo bench --timing chained"),
             f"H={plan.H} HV={plan.HV} K={plan.K} V={plan.V}, T=1, use_qk_l2norm=True, pools in "
             f"place; a CUDA graph of {plan.layers} layers [producer (Triton, no PDL), decode]; "
             f"added latency per layer = (chain - producers) / {plan.layers}"]
    for sd in plan.states:
        if not any(r["state_dtype"] == sd and r["status"] == "PASS" and _finite(r["median_us"])
                   for r in table):
            continue
        lines.append(f"\n{sd} state, chained: us per layer / x the chained floor at the same "
                     f"PDL level; standalone: us per call (kernel clock) / x the pool floor")
        for level in LEVELS:
            names = [n for n, lv in plan.entries if lv == level]
            for clock in CLOCKS:
                g = grid(table, sd, level, clock, names, plan.batches)
                if g:
                    lines.append(f"PDL {level}, {clock}:")
                    lines += g
        b = bar_lines(table, sd, plan.backends, plan.batches)
        if b:
            lines.append(f"{sd} state, bars (ours): chained <= {FLOOR_BAR:g} x the chained floor "
                         f"+ {TICK_US * 1e3:g} ns; a PDL level <= PDL off + {TICK_US * 1e3:g} "
                         f"ns; B >= {STANDALONE_MIN_B}: chained <= {STANDALONE_BAR:g} x "
                         f"standalone")
            lines += b
    lines += serving._not_timed(table)
    shown = {r["note"] for r in table if r["status"] == "SKIP"}
    lines += [f"note: {n}" for n in notes if n not in shown]
    if files:
        lines.append("wrote: " + ", ".join(files))
    return "\n".join(lines)


def write_results(table, env, out_dir) -> list:
    """results.csv and results.json (report.read_results reads it back) under ``out_dir``:
    report's columns plus :data:`COLUMNS_EXTRA` (the pool bench's writer)."""
    from gdnzoo.bench import report
    return serving.write_results(table, env, out_dir,
                                 list(report.COLUMNS) + list(COLUMNS_EXTRA))


def default_out():
    from pathlib import Path
    from gdnzoo.bench import report
    return str(Path(report.default_out_dir()) / "chained")


def cmd_bench_chained(args) -> int:
    """``gdnzoo bench --timing chained``: exit 2 on a bad argument, 1 if any entry failed its
    check or broke, else 0 (also when nothing could be measured: the rows say why)."""
    from gdnzoo.bench import report
    plan = make_plan(args)
    rows, ref, notes = run_chained(args, plan)
    table = build_table(rows, ref, plan.backends)
    env = report.environment(METHOD, ref, notes)
    files = write_results(table, env, args.out or default_out())
    print(console(table, env, notes, files, plan))
    return 1 if any(r["status"] in ("FAIL", "ERROR") for r in table) else 0

"""``gdnzoo bench --mode verify``: the speculative-verify benchmark.

A verify call decodes T draft tokens of each of B sequences and keeps the state after every
token (:mod:`gdnzoo.verify`).  Timed per (state dtype, T, B), in the serving convention of
``--mode pool`` (:mod:`gdnzoo.bench.pool`): a page-strided state pool of at least 2 GiB (or 4x
the L2), slot 0 the null slot (``null_slot=0``), q, k, v views of one packed ``mixed_qkv``
[B*T, 2*H*K + HV*V] (token rows, sequence-major), a and b views of one [B*T, 2*HV] tensor,
``use_qk_l2norm=True``, and fresh random distinct slots every call.

Three forms, each a row ``mode`` of the results:

* ``states``: ``intermediate_states`` [S, T, HV, V, K] addressed by ``intermediate_indices``
  [B] and ``update_state=False`` (SGLang's verify; FlashInfer's with a batch-scoped buffer);
* ``states+update``: the same and the final state written back to the read slot;
* ``slots``: ``state_indices`` [B, T] and ``num_accepted_tokens`` [B] (vLLM's verify): token t's
  state to slot ``state_indices[n, t]``, the initial state read from column
  ``num_accepted_tokens[n] - 1`` (random counts in 1..T, fixed per cell).

Fresh slots and rows: before timing, a bank of index rows is made on the device (``Indices``):
each row has B pool slots, B intermediate rows (a permutation of one block of B rows of the
intermediate store), B*T per-token slots and their read column, no slot in two rows, rows *
B*T * slot bytes >= 4x L2.  Kernel clock: every call passes one persistent set of index tensors,
refreshed from the next row by device copies before each call, outside the timed window (as
``--mode pool`` does); graph clock: the graph's N calls pass N rows.  One counter per cell.

Entries per cell and form: the verify floor of the form (:func:`gdnzoo.bench.floor.
verify_floor_times`: each sequence's state block read once and stored where the form stores
states, through the same index tensors, best launch shape); ``auto`` (``gdnzoo.decode``'s own
choice, named in the note); each gdnzoo backend whose registry entry has ``verify: true`` (not
the torch ones unless named by ``--algo``); the peers ``vllm-spec`` (vLLM's
``fused_sigmoid_gating_delta_rule_update`` as its engine calls it: q, k, v flattened to
[1, B*T] with ``cu_seqlens``, the per-token form, in place on the pool), ``flashinfer-mtp``
(FlashInfer's ``gated_delta_rule_mtp``, fp32 pool: its batch-scoped intermediate buffer with
``disable_state_update``, or ``ssm_state_indices`` [B, T]) and ``flashinfer-pretranspose``
(``gated_delta_rule_decode_pretranspose`` with ``intermediate_states_buffer``, bf16 pool).  The
peers get q, k, v, a, b made contiguous once per cell, outside the timed calls (their best
case).  Per (state dtype, B), in the cell of the largest T: ``commit`` (:func:`gdnzoo.commit`
of a step of each row into its slot, cold rows as after a whole model's verify) beside its copy
floor (the same bytes through the same indices).

Correctness first: every entry is called once on a check row and judged by the gate
(gdnzoo.gate) against the float64 reference (:func:`gdnzoo.reference.reference_verify_outputs`
on the bench's own inputs): the output and every state it stored; then what it stored is
restored and nothing else of the pool (other slots, page gaps; with ``update_state=False`` the
pool must be bit-identical), of the intermediate store or of the packed activations may have
changed.  ``commit`` must copy exactly (``gdnzoo.reference.reference_commit``).  A failing entry
is FAIL and gets no time; one that raises is ERROR; one that cannot run is SKIP with the reason.

Without a CUDA device nothing is timed: cells with B <= 4 are checked (Triton backends only under
``TRITON_INTERPRET=1``), the others and the floors are SKIP with the reason.

Arguments are ``gdnzoo bench``'s; ``--batch``, ``--state-dtype``, ``--tokens`` and
``--time-budget`` not given default to B = 1, 4, 16, 64, 256, fp32 and bf16, T = 2, 4, 8, and
480 s.  Each T must be in 2..16.  Writes ``results.csv`` and
``results.json`` under ``--out`` (default: the bench's results folder for this GPU,
``/verify``) and prints a table per state dtype and T, each entry as a multiple of the
same-run floor of its form.
"""
from __future__ import annotations

import importlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from gdnzoo.bench import clocks, floor, sweep
from gdnzoo.bench import pool as serving

BATCHES = (1, 4, 16, 64, 256)
TOKENS = (2, 4, 8)
STATES = ("fp32", "bf16")
FORMS = ("states", "states+update", "slots")
COMMIT = "commit"
NULL_SLOT = 0
ROW_ALIGN = 64                      # index rows start every 64 int32 (256 bytes)
BUDGET_S = 480.0
CPU_MAX_B = 4                       # without a GPU, cells up to this B are checked
VLLM_MODULE = "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating"
PEER_FORMS = {"vllm-spec": ("slots",), "flashinfer-mtp": FORMS,
              "flashinfer-pretranspose": ("states", "states+update")}
PEERS = tuple(PEER_FORMS)
GRAPH_ENTRIES = ("auto", "vllm-spec")

METHOD = (
    "Speculative verify in the serving convention: state pool >= max(2 GiB, 4x L2), page "
    "stride HV*V*K*(1+1/32), slot 0 the null slot; q/k/v views of one packed mixed_qkv "
    "[B*T, 2*H*K+HV*V], a/b strided views of one [B*T, 2*HV] tensor; use_qk_l2norm=True. Forms: "
    "states = intermediate_states [S, T, HV, V, K] by intermediate_indices + update_state=False; "
    "states+update = the same and the final state; slots = state_indices [B, T] + "
    "num_accepted_tokens (random in 1..T); commit = gdnzoo.commit of one step per sequence. "
    "Cold: a bank of index rows made on the device before timing (B slots, B intermediate rows, "
    "B*T per-token slots each, no slot in two rows, rows*B*T*slot bytes >= 4x L2); kernel "
    "clock: persistent index tensors refreshed from the next row before each call outside the "
    "timed window; graph clock: N calls on N rows. Correctness first: one call per entry and "
    "cell vs the float64 reference (gdnzoo.gate on out and every stored state; nothing else of "
    "the pool, the intermediate store or the activations changed; commit exact); a failing "
    "entry gets no time. kernel: CUPTI records per call, the sum of every kernel/memcpy/memset "
    "the call launched, and their number. graph: per-call wall time of a CUDA graph of N calls. "
    "floor (per form): each sequence's indices loaded, its state block read once and stored "
    "where the form stores states, through the same index tensors, best launch shape searched; "
    "x_floor = median / the same-run floor of the same form. bytes_moved: state bytes (+ q, k, "
    "v, gates, out for the entries). Medians with p20/p80.")


# ----------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Plan:
    batches: tuple
    tokens: tuple
    states: tuple
    backends: tuple          # gdnzoo backends timed by name (besides auto)
    entries: tuple           # auto, the backends, the peers (floors and commit apart)
    H: int
    HV: int
    K: int
    V: int
    clocks: tuple            # "kernel" and/or "graph"
    budget: float            # seconds; cells not started by then are SKIPped (0: none)
    notes: tuple


def forms_of(name) -> tuple:
    """The forms an entry is timed in."""
    return PEER_FORMS.get(name, FORMS)


def verify_backends() -> list:
    """Registered backends that serve verify (``verify: true``), torch ones aside, in registry
    order."""
    from gdnzoo.registry import load_registry
    return [n for n, s in load_registry().backends.items()
            if s.verify is True and s.language != "python"]


def make_plan(args) -> Plan:
    """The run's cells and entries from ``gdnzoo bench`` arguments; a bad one exits with
    status 2, naming it."""
    tokens = (TOKENS if not sweep.given(args.tokens) else
              args.tokens if isinstance(args.tokens, tuple) else (args.tokens,))
    bad = [t for t in tokens if not 2 <= t <= floor.MAX_TOKENS]
    if bad:
        sweep.usage_error(f"--tokens: a verify call checks 2..{floor.MAX_TOKENS} draft tokens, got "
               f"{','.join(map(str, bad))}")
    batches = tuple(args.batch) if sweep.given(args.batch) else BATCHES
    states = tuple(args.state_dtype) if sweep.given(args.state_dtype) else STATES
    backends = serving.named_backends(args.algo, verify_backends, sweep.usage_error)
    timing = tuple(c for c in args.timing if c in ("kernel", "graph"))
    if not timing:
        sweep.usage_error(f"--timing: verify mode times kernel and/or graph, got {','.join(args.timing)}")
    H, HV = sweep._ints(args.heads)
    notes = ["--nvbench: not available in verify mode"] if getattr(args, "nvbench", False) else []
    budget = float(args.time_budget) if sweep.given(args.time_budget) else BUDGET_S
    return Plan(batches, tuple(tokens), states, tuple(backends),
                ("auto", *backends, *PEERS), H, HV, args.dim, args.dim, timing, budget,
                tuple(notes))


# ----------------------------------------------------------------------------- the inputs

def rows_for(B, T, slot_bytes, l2) -> int:
    """Index rows of a cell: rows * B*T * slot bytes >= 4x L2 (at least 2)."""
    return clocks.rotation_count(B * T * slot_bytes, l2)


def pool_slots(cells, HV, V, K, elem, l2, min_bytes=serving.MIN_POOL_BYTES) -> int:
    """Slots of the pool of one state dtype: at least ``min_bytes`` and 4x L2 of pages, and
    room for every (B, T) cell's rows and check row, slot 0 aside."""
    page = serving.page_elems(HV, V, K) * elem
    slot = HV * V * K * elem
    need = max((rows_for(B, T, slot, l2) + 1) * B * (T + 1) for B, T in cells) + 1
    return max(math.ceil(max(min_bytes, 4 * l2) / page), need)


class Ix(NamedTuple):
    """One call's indices."""
    slots: torch.Tensor      # [B] int32: pool slots (read; the final state's write)
    rows: torch.Tensor       # [B] int32: intermediate rows, all in one block of B rows
    block: int               # that block: rows block*B .. block*B + B - 1
    grid: torch.Tensor       # [B, T] int32: per-token slots
    read: torch.Tensor       # [B] int32: grid[n, accepted[n] - 1], the per-token read slot


def _aligned(n) -> int:
    return -(-n // ROW_ALIGN) * ROW_ALIGN


class Indices:
    """The index rows of one cell: ``n`` rows and a check row (:class:`Ix` each, every index
    tensor starting on a 256-byte boundary), pool slots in [1, P) with no slot in two rows or
    two places; ``accepted`` [B] (counts in 1..T) picks each row's per-token read column.
    :meth:`advance` copies the next row (one counter) into :attr:`index`'s persistent
    tensors."""

    def __init__(self, P, B, T, n, accepted, device, seed=0):
        R = n + 1
        if R * B * (T + 1) > P - 1:
            raise ValueError(f"indices: {n} rows and a check row of B={B}, T={T} need "
                             f"{R * B * (T + 1)} slots; the pool has {P - 1} besides the null "
                             f"slot")
        gen = torch.Generator().manual_seed(seed)
        perm = (torch.randperm(P - 1, generator=gen)[:R * B * (T + 1)] + 1).to(torch.int32)
        slots = torch.full((R, _aligned(B)), -1, dtype=torch.int32)
        slots[:, :B] = perm[:R * B].view(R, B)
        grid = torch.full((R, _aligned(B * T)), -1, dtype=torch.int32)
        grid[:, :B * T] = perm[R * B:].view(R, B * T)
        rows = torch.full((R, _aligned(B)), -1, dtype=torch.int32)
        rows[:, :B] = torch.stack([i * B + torch.randperm(B, generator=gen) for i in range(R)])
        col = (accepted.cpu().long() - 1).view(1, B, 1).expand(R, B, 1)
        read = torch.full((R, _aligned(B)), -1, dtype=torch.int32)
        read[:, :B] = grid[:, :B * T].view(R, B, T).gather(2, col)[..., 0]
        self.bank = [t.to(device) for t in (slots, rows, grid, read)]
        s, r, g, d = self.bank
        ixs = [Ix(s[i, :B], r[i, :B], i, g[i, :B * T].view(B, T), d[i, :B]) for i in range(R)]
        self.rows, self.check = ixs[:n], ixs[n]
        c = self.check
        self._tensors = (c.slots.clone(), c.rows.clone(), c.grid.clone(), c.read.clone())
        self.block, self._turn = n, 0

    @property
    def index(self) -> Ix:
        """The persistent index tensors the kernel clock's calls pass (valid slots always)."""
        s, r, g, d = self._tensors
        return Ix(s, r, self.block, g, d)

    def next(self) -> Ix:
        row = self.rows[self._turn % len(self.rows)]
        self._turn += 1
        return row

    def row(self, i) -> Ix:
        return self.rows[i % len(self.rows)]

    def advance(self, i=None):
        """Copy the next row into :attr:`index` (device copies; ``i`` is unused)."""
        row = self.next()
        for dst, src in zip(self._tensors, (row.slots, row.rows, row.grid, row.read)):
            dst.copy_(src)
        self.block = row.block


class VerifyInputs:
    """One cell's activations in the engines' layout: q, k, v views of ``mixed`` [B*T, 2*H*K +
    HV*V] and a, b views of ``ab`` [B*T, 2*HV], each [B, T, ...]; ``out`` [B, T, HV, V]."""

    def __init__(self, B, T, H, HV, K, V, state_dtype, device, seed=0):
        from gdnzoo.inputs import make_inputs
        x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, device=device,
                        seed=seed)
        HK, N = H * K, B * T
        self.mixed = torch.cat([x.q.reshape(N, HK), x.k.reshape(N, HK),
                                x.v.reshape(N, HV * V)], dim=1).contiguous()
        m = self.mixed.view(B, T, -1)
        self.q = m[:, :, :HK].unflatten(2, (H, K))
        self.k = m[:, :, HK:2 * HK].unflatten(2, (H, K))
        self.v = m[:, :, 2 * HK:].unflatten(2, (HV, V))
        self.ab = torch.cat([x.a.reshape(N, HV), x.b.reshape(N, HV)], dim=1).contiguous()
        g = self.ab.view(B, T, 2 * HV)
        self.a, self.b = g[:, :, :HV], g[:, :, HV:]
        self.A_log, self.dt_bias, self.scale = x.A_log, x.dt_bias, x.scale
        self.out = torch.empty(B, T, HV, V, dtype=x.v.dtype, device=device)
        self._dense = None

    def args(self, state):
        """gdnzoo.decode's positional arguments with ``state``."""
        return (self.q, self.k, self.v, state, self.A_log, self.a, self.dt_bias, self.b,
                self.scale)

    def dense(self):
        """(q, k, v, a, b) made contiguous, once (the peers' inputs)."""
        if self._dense is None:
            self._dense = tuple(t.contiguous() for t in (self.q, self.k, self.v, self.a, self.b))
        return self._dense


@dataclass
class CellCtx:
    B: int
    T: int
    sd: str
    pool: serving.StatePool
    x: VerifyInputs
    ix: Indices
    inter: torch.Tensor                   # the intermediate store [(rows+1)*B, T, HV, V, K]
    accepted: torch.Tensor                # [B] int32 in 1..T (num_accepted_tokens)
    steps: torch.Tensor                   # [B] int32: accepted - 1, commit's accepted steps
    refs: dict = field(default_factory=dict)

    def reference(self, form):
        """float64 (out [B, T, HV, V], states [B, T, HV, V, K]) of the check row's call in
        ``form``, from the initial states it reads (made once per read kind)."""
        from gdnzoo.inputs import Inputs
        from gdnzoo.reference import reference_verify_outputs
        from gdnzoo.verify import Verify
        key = "slots" if form == "slots" else "states"
        if key not in self.refs:
            c = self.ix.check
            init = self.pool.state.index_select(0, (c.read if key == "slots" else c.slots).long())
            buf = torch.empty((self.B, self.T) + tuple(init.shape[1:]), dtype=init.dtype,
                              device=init.device)
            x = self.x
            out, _, states = reference_verify_outputs(
                Inputs(x.q, x.k, x.v, init, x.A_log, x.a, x.dt_bias, x.b, x.scale),
                Verify(buf, None, True, False, None), use_qk_l2norm=True)
            self.refs[key] = (out, states)
        return self.refs[key]


def make_ctx(B, T, sd, sp, plan, l2, device, seed) -> CellCtx:
    """One cell's inputs, indices and intermediate store on the pool ``sp``."""
    slot_bytes = sp.slot * sp.buf.element_size()
    n = rows_for(B, T, slot_bytes, l2)
    gen = torch.Generator().manual_seed(seed + 7919 * B + T)
    accepted = torch.randint(1, T + 1, (B,), generator=gen, dtype=torch.int32)
    inter = torch.empty((n + 1) * B, T, plan.HV, plan.V, plan.K, dtype=sp.buf.dtype,
                        device=device)
    inter.normal_(0.0, 0.05, generator=torch.Generator(device=device).manual_seed(seed))
    return CellCtx(B, T, sd, sp, VerifyInputs(B, T, plan.H, plan.HV, plan.K, plan.V, sd, device,
                                              seed),
                   Indices(sp.P, B, T, n, accepted, device, seed + B + 1000 * T), inter,
                   accepted.to(device), (accepted - 1).to(device))


# ----------------------------------------------------------------------------- the entries

Skip = serving.Skip


class Entry(NamedTuple):
    call: Callable           # call(ix) -> out [B, T, HV, V]
    note: str
    batch_rows: bool = False  # stores intermediate states by batch row in block ix.block


def form_kwargs(ctx, form, ix) -> dict:
    """gdnzoo.decode's pool and verify keywords of a call in ``form`` on indices ``ix``."""
    if form == "slots":
        return dict(state_indices=ix.grid, null_slot=NULL_SLOT,
                    num_accepted_tokens=ctx.accepted)
    return dict(state_indices=ix.slots, null_slot=NULL_SLOT, intermediate_states=ctx.inter,
                intermediate_indices=ix.rows, update_state=form == "states+update")


def problem(ctx, form):
    from gdnzoo.contract import validate
    return validate(*ctx.x.args(ctx.pool.state), out=ctx.x.out, use_qk_l2norm=True,
                    **form_kwargs(ctx, form, ctx.ix.check))[0]


def _gdnzoo_call(ctx, form, algo):
    import gdnzoo
    fn = gdnzoo.decode if algo is None else gdnzoo.get(algo)
    x, st = ctx.x, ctx.pool.state

    def call(ix):
        fn(*x.args(st), out=x.out, use_qk_l2norm=True, **form_kwargs(ctx, form, ix))
        return x.out
    return call


def entry_call(name, form, ctx) -> Entry:
    """Entry ``name`` in ``form`` in this cell; raises Skip with the reason."""
    from gdnzoo import registry
    if form not in forms_of(name):
        raise Skip(f"{name} is timed in the {', '.join(forms_of(name))} form only")
    if name == "auto":
        import gdnzoo
        try:
            sel = gdnzoo.select(*ctx.x.args(ctx.pool.state), out=ctx.x.out, use_qk_l2norm=True,
                                **form_kwargs(ctx, form, ctx.ix.check))
        except ValueError as e:
            raise Skip(str(e)) from None
        return Entry(_gdnzoo_call(ctx, form, None), f"auto -> {sel.name} ({sel.source})")
    if name == "vllm-spec":
        return _vllm_call(ctx)
    if name.startswith("flashinfer-"):
        return _flashinfer_call(ctx, name, form)
    if name not in registry.load_registry().backends:
        raise Skip("not registered in registry.yaml")
    ok, why = registry.can_serve(name, problem(ctx, form))
    if not ok:
        raise Skip(why)
    return Entry(_gdnzoo_call(ctx, form, name), "")


def _on_gpu(ctx, who):
    if ctx.pool.buf.device.type != "cuda":
        raise Skip(f"{who}: CUDA devices only")


def _vllm_call(ctx) -> Entry:
    _on_gpu(ctx, "vLLM's Triton verify kernel")
    try:
        fn = importlib.import_module(VLLM_MODULE).fused_sigmoid_gating_delta_rule_update
    except Exception as e:
        raise Skip(f"{VLLM_MODULE} not importable ({type(e).__name__}: {e})") from None
    x, st, B, T = ctx.x, ctx.pool.state, ctx.B, ctx.T
    q, k, v, a, b = x.dense()
    q1, k1, v1 = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v))
    a1, b1 = a.reshape(B * T, -1), b.reshape(B * T, -1)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=q.device)
    shape = x.out.shape

    def call(ix):
        o, _ = fn(A_log=x.A_log, a=a1, b=b1, dt_bias=x.dt_bias, q=q1, k=k1, v=v1,
                  scale=x.scale, initial_state=st, inplace_final_state=True, cu_seqlens=cu,
                  ssm_state_indices=ix.grid, num_accepted_tokens=ctx.accepted,
                  use_qk_l2norm_in_kernel=True)
        return o.view(shape)
    return Entry(call, "vLLM fused_sigmoid_gating_delta_rule_update, [1, B*T] with cu_seqlens, "
                       "q/k/v/a/b contiguous outside the timed calls")


def _flashinfer_call(ctx, name, form) -> Entry:
    mtp = name == "flashinfer-mtp"
    if mtp and ctx.sd != "fp32":
        raise Skip("gated_delta_rule_mtp takes an fp32 pool only (bf16: "
                   "flashinfer-pretranspose)")
    if not mtp and ctx.sd != "bf16":
        raise Skip("gated_delta_rule_decode_pretranspose takes a pool with T > 1 for bf16 "
                   "state only (fp32: flashinfer-mtp)")
    _on_gpu(ctx, "FlashInfer's GDN kernels")
    api = "gated_delta_rule_mtp" if mtp else "gated_delta_rule_decode_pretranspose"
    fi = serving.flashinfer_gdn(api)
    x, st, B = ctx.x, ctx.pool.state, ctx.B
    q, k, v, a, b = x.dense()

    def kwargs(ix):
        if form == "slots":
            return dict(initial_state_indices=ix.read, ssm_state_indices=ix.grid,
                        disable_state_update=False)
        return dict(initial_state_indices=ix.slots, disable_state_update=form == "states",
                    intermediate_states_buffer=ctx.inter[ix.block * B:(ix.block + 1) * B])

    if mtp:
        def call(ix):
            fi(q, k, v, initial_state=st, A_log=x.A_log, a=a, dt_bias=x.dt_bias, b=b,
               scale=x.scale, output=x.out, use_qk_l2norm=True, **kwargs(ix))
            return x.out
    else:
        def call(ix):
            fi(q, k, v, None, x.A_log, a, x.dt_bias, b, scale=x.scale, output=x.out,
               use_qk_l2norm=True, initial_state=st, backend="flashinfer", **kwargs(ix))
            return x.out
    where = "ssm_state_indices [B, T]" if form == "slots" else "batch-scoped intermediate buffer"
    return Entry(call, f"FlashInfer {api}, {where}, q/k/v/a/b contiguous outside the timed "
                       f"calls", batch_rows=form != "slots")


def _restore_and_compare(ctx, storage, inter_before, slots, rows, form, reasons):
    """Put back what the call was allowed to write, then require every other byte of the pool
    storage and the intermediate store unchanged (restoring them if not)."""
    st = ctx.pool.state
    if slots is not None:
        st.index_copy_(0, slots, storage.as_strided(st.size(), st.stride()).index_select(0, slots))
    if rows is not None:
        ctx.inter.index_copy_(0, rows, inter_before.index_select(0, rows))
    if not torch.equal(ctx.pool.buf, storage):
        reasons.append("pool: changed although update_state=False" if form == "states" else
                       "pool: changed outside the call's slots (other slots or page gaps)")
        ctx.pool.buf.copy_(storage)
    if not torch.equal(ctx.inter, inter_before):
        reasons.append("intermediate_states: changed outside the call's rows")
        ctx.inter.copy_(inter_before)


def check_entry(entry: Entry, ctx, form) -> dict:
    """One call on the check row, judged by the gate against the float64 reference: out and
    every state the form stores (intermediate rows, final slots, per-token slots); then those
    are restored and nothing else of the pool, the intermediate store or the packed
    activations may have changed."""
    from gdnzoo import gate
    x, st, ix, B = ctx.x, ctx.pool.state, ctx.ix.check, ctx.B
    ref_out, ref_states = ctx.reference(form)
    storage, inter_before = ctx.pool.buf.clone(), ctx.inter.clone()
    mixed, ab = x.mixed.clone(), x.ab.clone()
    x.out.fill_(float("nan"))
    out = entry.call(ix)
    want = ref_states.flatten(0, 1)
    slots = rows = None
    if form == "slots":
        slots = ix.grid.reshape(-1).long()
        got = st.index_select(0, slots)
    else:
        rows = (ix.block * B + torch.arange(B, device=st.device) if entry.batch_rows
                else ix.rows.long())
        got = ctx.inter.index_select(0, rows).flatten(0, 1)
        if form == "states+update":
            slots = ix.slots.long()
            got = torch.cat([got, st.index_select(0, slots)])
            want = torch.cat([want, ref_states[:, -1]])
    j = gate.judge(out, got, ref_out, want, out_dtype=x.out.dtype, state_dtype=st.dtype)
    _restore_and_compare(ctx, storage, inter_before, slots, rows, form, j.reasons)
    if not torch.equal(mixed, x.mixed) or not torch.equal(ab, x.ab):
        j.reasons.append("mixed_qkv or a/b: modified by the call")
    return dict(ok=j.ok, reason=j.reason, max_abs_err_out=j.out.max_abs,
                max_abs_err_state=j.state.max_abs, rel_err_out=j.rel_err_out,
                rel_err_state=j.rel_err_state, n_bad=j.n_bad)


def commit_call(ctx):
    """call(ix): gdnzoo.commit of step accepted[n] - 1 of row ix.rows[n] into slot
    ix.slots[n]."""
    import gdnzoo
    steps = ctx.steps

    def call(ix):
        gdnzoo.commit(ctx.inter, ix.rows, steps, ctx.pool.state, ix.slots, null_slot=NULL_SLOT)
    return call


def check_commit(call, ctx) -> dict:
    """One commit on the check row: every committed slot must equal
    ``gdnzoo.reference.reference_commit``'s copy exactly; nothing else may change."""
    from gdnzoo.reference import reference_commit
    st, ix = ctx.pool.state, ctx.ix.check
    want = torch.empty((ctx.B,) + tuple(st.shape[1:]), dtype=st.dtype, device=st.device)
    reference_commit(ctx.inter, ix.rows, ctx.steps, want, None)
    storage, inter_before = ctx.pool.buf.clone(), ctx.inter.clone()
    call(ix)
    slots = ix.slots.long()
    wrong = int((st.index_select(0, slots) != want).flatten(1).any(1).sum())
    reasons = [f"state: {wrong} of B={ctx.B} committed slots differ from "
               f"intermediate_states[row, step]"] if wrong else []
    _restore_and_compare(ctx, storage, inter_before, slots, None, COMMIT, reasons)
    return dict(ok=not reasons, reason="; ".join(reasons))


# ----------------------------------------------------------------------------- measuring

def _cell(name, form, key, plan):
    B, T, sd = key
    return sweep.Cell(name, B, plan.H, plan.HV, plan.K, plan.V, T, sd, form, True)


def _rows_of(name, form, key, plan, status, note, **extra):
    return [dict(cell=_cell(name, form, key, plan), clock=k, status=status, note=note, flags="",
                 **extra) for k in plan.clocks if k == "kernel" or name in GRAPH_ENTRIES]


def _key(ctx):
    return ctx.B, ctx.T, ctx.sd


def measure(name, form, call, note, chk, ctx, plan, iters):
    """Rows of one checked entry: FAIL, or (on a CUDA device) its timed clocks."""
    errs = {k: chk[k] for k in ("max_abs_err_out", "max_abs_err_state", "rel_err_out",
                                "rel_err_state", "n_bad") if k in chk}
    base = dict(n_sets=len(ctx.ix.rows), **errs)
    if not chk["ok"]:
        return _rows_of(name, form, _key(ctx), plan, "FAIL", chk["reason"], **base)
    if ctx.pool.buf.device.type != "cuda":
        return _rows_of(name, form, _key(ctx), plan, "PASS",
                        "; ".join(s for s in (note, "checked, not timed (not on a CUDA device)")
                                  if s), **base)
    ix = ctx.ix
    for _ in range(sweep.WARMUP_CALLS):
        ix.advance()
        call(ix.index)
    rows = []
    est = serving._estimate(call, ix)
    if "kernel" in plan.clocks:
        busy, counts, method = serving._timed(call, ix, iters, est)
        n, varied = serving._records_note(counts)
        rows.append(dict(cell=_cell(name, form, _key(ctx), plan), clock="kernel", status="PASS",
                         note="; ".join(s for s in (note, varied) if s), flags="", samples=busy,
                         method=method, kernels_per_call=n, **base))
    if "graph" in plan.clocks and name in GRAPH_ENTRIES:
        row = dict(cell=_cell(name, form, _key(ctx), plan), clock="graph", status="PASS",
                   note=note, flags="", **base)
        try:
            row["samples"], row["method"] = serving._graph(call, ix, est)
        except clocks.GraphUnsupported as e:
            row["note"] = f"n/a ({e})"
        rows.append(row)
    return rows


def measure_entry(name, form, ctx, plan, iters):
    """Rows of one entry in one form: SKIP, FAIL, or checked (and timed)."""
    try:
        e = entry_call(name, form, ctx)
    except Skip as s:
        return _rows_of(name, form, _key(ctx), plan, "SKIP", str(s))
    return measure(name, form, e.call, e.note, check_entry(e, ctx, form), ctx, plan, iters)


def measure_commit(ctx, plan, iters):
    call = commit_call(ctx)
    return measure(COMMIT, COMMIT, call, f"gdnzoo.commit, intermediate_states T_max={ctx.T}",
                   check_commit(call, ctx), ctx, plan, iters)


def floor_target(ctx, form):
    """The verify floor's target of ``form`` over this cell's persistent index tensors."""
    sp, c = ctx.pool, ctx.ix.index
    index = c.grid if form == "slots" else c.slots
    counts = ctx.accepted if form == "slots" else (ctx.steps if form == COMMIT else None)
    return floor.VerifyTarget(form, sp.buf, sp.page, sp.slot, ctx.B, ctx.T, index, ctx.ix.advance,
                              inter=None if form == "slots" else ctx.inter,
                              rows=None if form == "slots" else c.rows, counts=counts)


def measure_floor(ctx, plan, form, iters):
    if ctx.pool.buf.device.type != "cuda":
        return _rows_of("floor", form, _key(ctx), plan, "SKIP", "not on a CUDA device")
    f = floor.verify_floor_times(floor_target(ctx, form), iters=min(iters, 100),
                                 reduce=clocks.busy_and_count)
    row = dict(cell=_cell("floor", form, _key(ctx), plan), clock="kernel", flags="",
               n_sets=len(ctx.ix.rows), note=f["config"], method=f["method"])
    if f["samples"] is None:
        return [dict(row, status="SKIP")]
    return [dict(row, status="PASS", samples=[s for s, _ in f["samples"]],
                 kernels_per_call=serving._records_note([n for _, n in f["samples"]])[0])]


# ----------------------------------------------------------------------------- the run

def _summary(rows):
    """One progress line: each timed kernel median and its multiple of its form's floor."""
    med = {(r["cell"].backend, r["cell"].mode): statistics.median(r["samples"]) for r in rows
           if r["clock"] == "kernel" and r["status"] == "PASS" and r.get("samples")}
    parts = []
    for (name, form), us in med.items():
        fl = med.get(("floor", form))
        parts.append(f"{name}[{form}] {us:.2f}"
                     + (f" {us / fl:.2f}x" if fl and name != "floor" else ""))
    other = [f"{r['cell'].backend}[{r['cell'].mode}] "
             f"{'checked' if r['status'] == 'PASS' else r['status']}" for r in rows
             if r["clock"] == "kernel" and r["status"] != "SKIP" and not r.get("samples")]
    return " | ".join(parts + other) or "nothing ran"


def _guarded(fn, name, form, key, plan, device):
    """fn()'s rows, or ERROR rows naming the exception."""
    try:
        return fn()
    except Exception as e:
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        if device == "cuda":
            try:
                torch.cuda.synchronize()
            except Exception:            # a sticky device error: the next entries say so too
                pass
        return _rows_of(name, form, key, plan, "ERROR", f"{type(e).__name__}: {msg}")


def measure_cell(ctx, plan, iters, with_commit, device):
    rows = []
    for form in FORMS:
        rows += _guarded(lambda: measure_floor(ctx, plan, form, iters), "floor", form,
                         _key(ctx), plan, device)
        for name in plan.entries:
            if form in forms_of(name):
                rows += _guarded(lambda: measure_entry(name, form, ctx, plan, iters), name, form,
                                 _key(ctx), plan, device)
    if with_commit:
        rows += _guarded(lambda: measure_floor(ctx, plan, COMMIT, iters), "floor", COMMIT,
                         _key(ctx), plan, device)
        rows += _guarded(lambda: measure_commit(ctx, plan, iters), COMMIT, COMMIT, _key(ctx),
                         plan, device)
    return rows


def _cell_names(plan, with_commit):
    """(name, form) of every row a cell has, in order."""
    out = []
    for form in FORMS:
        out += [("floor", form)] + [(n, form) for n in plan.entries if form in forms_of(n)]
    return out + ([("floor", COMMIT), (COMMIT, COMMIT)] if with_commit else [])


def _skipped(plan, key, with_commit, why):
    return [r for name, form in _cell_names(plan, with_commit)
            for r in _rows_of(name, form, key, plan, "SKIP", why)]


def run_verify(args, plan):
    """Measure every (state dtype, T, B) cell; returns (rows, device reference, notes)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    notes = list(plan.notes)
    gpu = device == "cuda"
    why = "--device cpu" if torch.cuda.is_available() else "no CUDA device"
    if not gpu:
        notes.insert(0, f"{why}: nothing is timed (CUPTI kernel clock, CUDA graphs, floors); "
                        f"cells with B <= {CPU_MAX_B} are checked against the reference")
    from gdnzoo.inputs import DTYPES
    ref = sweep.floor_rows([], ["kernel"], device, args.iters)[1]
    l2 = clocks.l2_bytes() if gpu else 0
    runnable = [B for B in plan.batches if gpu or B <= CPU_MAX_B]
    rows, t0 = [], time.perf_counter()
    n_cells, i = len(plan.states) * len(plan.tokens) * len(plan.batches), 0
    for sd in plan.states:
        sp = None
        if runnable:
            elem = DTYPES[sd].itemsize
            P = pool_slots([(B, T) for B in runnable for T in plan.tokens], plan.HV, plan.V,
                           plan.K, elem, l2, serving.MIN_POOL_BYTES if gpu else 0)
            sp = serving.StatePool(P, plan.HV, plan.V, plan.K, DTYPES[sd], device, args.seed)
            notes.append(f"{sd} pool: {P} slots, {sp.nbytes / 2**30:.2f} GiB, page {sp.page} "
                         f"elements (slot {sp.slot})")
        for T in plan.tokens:
            for B in plan.batches:
                i += 1
                key, with_commit = (B, T, sd), T == max(plan.tokens)
                if B not in runnable:
                    rows += _skipped(plan, key, with_commit,
                                     f"{why}: only B <= {CPU_MAX_B} is checked on the CPU, "
                                     f"nothing is timed")
                    continue
                if plan.budget and time.perf_counter() - t0 > plan.budget:
                    rows += _skipped(plan, key, with_commit,
                                     f"time budget ({plan.budget:g} s) exhausted")
                    continue
                ctx = make_ctx(B, T, sd, sp, plan, l2, device, args.seed)
                cell_rows = measure_cell(ctx, plan, args.iters, with_commit, device)
                rows += cell_rows
                serving._log(args.quiet, f"[{i}/{n_cells}] {sd} T={T} B={B} "
                                         f"({time.perf_counter() - t0:.0f} s): "
                                         + _summary(cell_rows))
                del ctx
                if gpu:
                    torch.cuda.empty_cache()
        del sp
        if gpu:
            torch.cuda.empty_cache()
    return rows, ref, notes


# ----------------------------------------------------------------------------- files, console

def stores(form, T) -> int:
    """[HV, V, K] blocks a verify (or commit) stores per sequence."""
    return floor.verify_stores(form, T)


def bytes_moved(name, form, B, T, H, HV, K, V, state_bytes) -> int:
    """State bytes read (one block per sequence) and stored (:func:`stores`), plus, for an
    entry that decodes (not a floor, not commit), q, k, v, a, b read and out written (bf16)
    and A_log, dt_bias (fp32)."""
    s = (1 + stores(form, T)) * B * HV * V * K * state_bytes
    if name == "floor" or form == COMMIT:
        return s
    return s + 2 * B * T * (2 * H * K + 2 * HV * V + 2 * HV) + 2 * HV * 4


def build_table(raw, ref):
    """pool.build_table, with this benchmark's bytes and each row's multiple of the floor of
    its own form (same B, T, state dtype)."""
    from gdnzoo.inputs import DTYPES
    table = serving.build_table(raw, ref)
    copy = ((ref or {}).get("copy") or {}).get("gbps", float("nan"))
    fl = {(r["B"], r["T"], r["state_dtype"], r["mode"]): r["median_us"] for r in table
          if r["backend"] == "floor" and r["status"] == "PASS" and r["clock"] == "kernel"}
    for r in table:
        r["bytes_moved"] = bytes_moved(r["backend"], r["mode"], r["B"], r["T"], r["H"], r["HV"],
                                       r["K"], r["V"], DTYPES[r["state_dtype"]].itemsize)
        m = r["median_us"]
        ok = isinstance(m, float) and math.isfinite(m) and m > 0
        r["achieved_gbps"] = r["bytes_moved"] / m / 1e3 if ok else float("nan")
        r["pct_copy_bw"] = (100 * r["achieved_gbps"] / copy if ok and math.isfinite(copy)
                            else float("nan"))
        f = fl.get((r["B"], r["T"], r["state_dtype"], r["mode"]))
        r["x_floor"] = (m / f if ok and f and math.isfinite(f) and r["clock"] == "kernel"
                        and r["backend"] != "floor" else float("nan"))
    return table


def _fmt(r):
    if r["status"] != "PASS":
        return r["status"]
    m = r["median_us"]
    if not (isinstance(m, float) and math.isfinite(m)):
        return "n/a"
    us = f"{m:.2f}" if m < 100 else f"{m:.0f}"
    return f"{us}/{r['x_floor']:.2f}x" if math.isfinite(r["x_floor"]) else us


def pivot(table, sd, T, modes, clock) -> list:
    """Rows ``name [form]`` (each form's floor first) x batch sizes: us, and / x its floor."""
    sel = [r for r in table if r["state_dtype"] == sd and r["T"] == T and r["clock"] == clock
           and r["mode"] in modes]
    Bs = sorted({r["B"] for r in sel})
    cell = {(r["backend"], r["mode"], r["B"]): r for r in sel}
    names = []
    for form in modes:
        names += [("floor", form)] * any(n == "floor" and f == form for n, f, _ in cell)
        names += list(dict.fromkeys((n, f) for n, f, _ in cell if f == form and n != "floor"))
    w = max([len(f"{n} [{f}]") for n, f in names] + [7])
    lines = [f"{'entry':<{w}} " + "".join(f"{'B=' + str(B):>14}" for B in Bs)]
    for n, f in names:
        lines.append(f"{f'{n} [{f}]':<{w}} " + "".join(
            f"{_fmt(cell[(n, f, B)]) if (n, f, B) in cell else '':>14}" for B in Bs))
    return lines


def console(table, env, notes, files, plan) -> str:
    from gdnzoo.bench import report
    lines = [report.run_line(env, "gdnzoo bench --mode verify"),
             f"H={plan.H} HV={plan.HV} K={plan.K} V={plan.V}, use_qk_l2norm=True; forms: states "
             f"(intermediate_states, update_state=False), states+update, slots (state_indices "
             f"[B, T] + num_accepted_tokens); kernel clock: "
             f"{env.get('kernel_clock', 'n/a')} (sum of a call's records)"]
    timed = {(r["state_dtype"], r["T"], r["clock"], r["mode"] == COMMIT) for r in table
             if r["status"] == "PASS" and isinstance(r["median_us"], float)
             and math.isfinite(r["median_us"])}
    for sd in plan.states:
        for T in plan.tokens:
            if (sd, T, "kernel", False) in timed:
                lines.append(f"\n{sd} state, T={T}, kernel clock, us / x the same-run floor of "
                             f"the form:")
                lines += pivot(table, sd, T, FORMS, "kernel")
            if (sd, T, "graph", False) in timed:
                lines.append(f"{sd} state, T={T}, graph clock (CUDA graph of N calls), us per "
                             f"call:")
                lines += pivot(table, sd, T, FORMS, "graph")
            if (sd, T, "kernel", True) in timed:
                lines.append(f"{sd} state, commit (intermediate_states T_max={T}), kernel clock, "
                             f"us / x the same-run copy floor:")
                lines += pivot(table, sd, T, (COMMIT,), "kernel")
    checked = sorted({f"{r['backend']} [{r['mode']}]" for r in table
                      if r["status"] == "PASS" and "not timed" in r["note"]})
    if checked:
        lines.append("checked against the reference, not timed (not on a CUDA device): "
                     + ", ".join(checked))
    lines += serving._not_timed(table)
    shown = {r["note"] for r in table if r["status"] == "SKIP"}
    lines += [f"note: {n}" for n in notes if n not in shown]
    if files:
        lines.append("wrote: " + ", ".join(files))
    return "\n".join(lines)


def default_out():
    from pathlib import Path
    from gdnzoo.bench import report
    return str(Path(report.default_out_dir()) / "verify")


def cmd_bench_verify(args) -> int:
    """``gdnzoo bench --mode verify``: exit 2 on a bad argument, 1 if any entry failed its check
    or broke, else 0."""
    from gdnzoo.bench import report
    plan = make_plan(args)
    rows, ref, notes = run_verify(args, plan)
    table = build_table(rows, ref)
    env = report.environment(METHOD, ref, notes)
    files = serving.write_results(table, env, args.out or default_out())
    print(console(table, env, notes, files, plan))
    return 1 if any(r["status"] in ("FAIL", "ERROR") for r in table) else 0

"""``gdnzoo bench --mode verify``: the speculative-verify benchmark, per (state dtype, T, B), in
the serving convention of ``--mode pool``, T draft tokens of B sequences, three forms (the
rows' ``mode``):

* ``states``: ``intermediate_states`` [S, T, HV, V, K] by ``intermediate_indices`` [B],
  ``update_state=False`` (SGLang's verify; FlashInfer's with a batch-scoped buffer);
* ``states+update``: the same and the final state written back to the read slot;
* ``slots``: ``state_indices`` [B, T] and ``num_accepted_tokens`` [B] (vLLM's verify).

Entries per form: its verify floor, ``auto``, each gdnzoo backend with ``verify: true``, the
peers ``vllm-spec`` (vLLM's Triton kernel as its engine calls it), ``flashinfer-mtp`` (fp32
pool) and ``flashinfer-pretranspose`` (bf16 pool); at the largest T, ``commit`` beside its copy
floor.  How: :data:`METHOD`.  Without a CUDA device cells with B <= 4 are checked, not timed.
"""

from __future__ import annotations

import copy
import importlib
import itertools
from dataclasses import dataclass, field

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.bench import clocks, entries, floor
from gdnzoo.bench import mode_pool as serving
from gdnzoo.bench.args import usage_error
from gdnzoo.bench.pipeline import Entry, Group, io_bytes, judged, section, state_bytes
from gdnzoo.inputs import Inputs, accepted_counts, distinct_slots, intermediate_buffer
from gdnzoo.reference import reference_commit, reference_verify_outputs
from gdnzoo.verify import Verify as Keep

BATCHES = (1, 4, 16, 64, 256)
TOKENS = (2, 4, 8)
STATES = ("fp32", "bf16")
FORMS = ("states", "states+update", "slots")
COMMIT = "commit"
NULL_SLOT = serving.NULL_SLOT
BUDGET_S = 480.0
CPU_MAX_B = 4                       # without a GPU, cells up to this B are checked
VLLM_MODULE = "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating"
# the forms a peer is timed in (the other entries: every form)
PEER_FORMS = {"vllm-spec": ("slots",), "flashinfer-mtp": FORMS,
              "flashinfer-pretranspose": ("states", "states+update")}
PEERS = tuple(PEER_FORMS)
GRAPH_ENTRIES = ("auto", "vllm-spec")
OUTSIDE = "pool: changed outside the call's slots (other slots or page gaps)"

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


# ----------------------------------------------------------------------------- the inputs

def verify_bank(P, B, T, n, accepted, device, seed=0):
    """``n`` index rows and a check row (clocks.IndexBank, parts ``slots`` [B], ``rows`` [B],
    ``grid`` [B, T], ``read`` [B]): pool slots in [1, P), no slot in two rows or two places;
    row i's intermediate rows a permutation of block i (rows iB .. iB + B - 1); ``accepted``
    [B] (counts in 1..T) picks each row's per-token read column."""
    R = n + 1
    if R * B * (T + 1) > P - 1:
        raise ValueError(f"indices: {n} rows and a check row of B={B}, T={T} need "
                         f"{R * B * (T + 1)} slots; the pool has {P - 1} besides the null slot")
    gen = torch.Generator().manual_seed(seed)
    perm = distinct_slots(P, R * B * (T + 1), gen)
    grid = perm[R * B:].view(R, B * T)
    rows = torch.stack([i * B + torch.randperm(B, generator=gen) for i in range(R)])
    col = (accepted.cpu().long() - 1).view(1, B, 1).expand(R, B, 1)
    read = grid.view(R, B, T).gather(2, col)[..., 0]
    return clocks.IndexBank({"slots": (perm[:R * B].view(R, B), None), "rows": (rows, None),
                             "grid": (grid, (B, T)), "read": (read, None)}, device)


@dataclass
class VerifyCtx(serving.PoolCtx):
    T: int = 1
    inter: object = None      # the intermediate store [(rows+1)*B, T, HV, V, K]
    accepted: object = None   # [B] int32 in 1..T (num_accepted_tokens)
    steps: object = None      # [B] int32: accepted - 1, commit's accepted steps
    refs: dict = field(default_factory=dict)

    def kw(self, ix, form="states") -> dict:
        """gdnzoo.decode's pool and verify keywords of a call in ``form`` on index row ``ix``."""
        if form == "slots":
            return dict(state_indices=ix.grid, null_slot=NULL_SLOT,
                        num_accepted_tokens=self.accepted)
        return dict(state_indices=ix.slots, null_slot=NULL_SLOT, intermediate_states=self.inter,
                    intermediate_indices=ix.rows, update_state=form == "states+update")

    def target(self, form="states"):
        """The verify floor's target of ``form`` over this cell's persistent index tensors."""
        sp, c = self.pool, self.bank.index
        counts = self.accepted if form == "slots" else (self.steps if form == COMMIT else None)
        return floor.VerifyTarget(form, sp.buf, sp.page, sp.slot, self.B, self.T,
                                  c.grid if form == "slots" else c.slots, self.bank.advance,
                                  inter=None if form == "slots" else self.inter,
                                  rows=None if form == "slots" else c.rows, counts=counts)

    def reference(self, form):
        """float64 (out [B, T, HV, V], states [B, T, HV, V, K]) of the check row's call in
        ``form``, from the initial states it reads (made once per read kind)."""
        key = "slots" if form == "slots" else "states"
        if key not in self.refs:
            c = self.bank.check
            init = self.pool.state.index_select(0, (c.read if key == "slots" else c.slots).long())
            buf = torch.empty((self.B, self.T) + tuple(init.shape[1:]), dtype=init.dtype,
                              device=init.device)
            out, _, states = reference_verify_outputs(
                Inputs(*self.x.args(init)), Keep(buf, None, True, False, None),
                use_qk_l2norm=True)
            self.refs[key] = (out, states)
        return self.refs[key]


def verify_ctx(B, T, sd, sp, g, l2, device, seed) -> VerifyCtx:
    """One cell's inputs, index bank and intermediate store on the pool ``sp`` (geometry ``g``:
    H, HV, K, V)."""
    n = serving.rows_for(B, sp.slot * sp.buf.element_size(), l2, T)
    accepted = accepted_counts(B, T, torch.Generator().manual_seed(seed + 7919 * B + T),
                               torch.int32)
    _, inter = intermediate_buffer((n + 1) * B, T, g["HV"], g["V"], g["K"], dtype=sp.buf.dtype,
                                   device=device, fill="normal",
                                   gen=torch.Generator(device=device).manual_seed(seed))
    x, out = serving.cell_inputs(B, T, sd, g, device, seed)
    bank = verify_bank(sp.P, B, T, n, accepted, device, seed + B + 1000 * T)
    return VerifyCtx(B, sd, sp, x, bank, out, T=T, inter=inter,
               accepted=accepted.to(device), steps=(accepted - 1).to(device))


# ----------------------------------------------------------------------------- the entries

@dataclass
class Call:
    call: object             # call(ix) -> out [B, T, HV, V]
    note: str
    batch_rows: bool = False  # stores intermediate states by batch row in block ix.block


def verify_call(name, form, ctx) -> Call:
    """Entry ``name`` in ``form`` in this cell; raises Skip with the reason."""
    forms = PEER_FORMS.get(name, FORMS)
    if form not in forms:
        raise entries.Skip(f"{name} is timed in the {', '.join(forms)} form only")
    if name == "vllm-spec":
        return vllm_call(ctx)
    if name.startswith("flashinfer-"):
        return flashinfer_call(ctx, name, form)
    return Call(*serving.gdnzoo_call(name, ctx, form))


def vllm_call(ctx) -> Call:
    entries.on_gpu(ctx.pool.buf.device, "vLLM's Triton verify kernel")
    try:
        fn = importlib.import_module(VLLM_MODULE).fused_sigmoid_gating_delta_rule_update
    except Exception as e:
        raise entries.Skip(f"{VLLM_MODULE} not importable ({type(e).__name__}: {e})") from None
    x, st, B, T = ctx.x, ctx.pool.state, ctx.B, ctx.T
    q, k, v, a, b = x.dense()
    q1, k1, v1 = (t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v))
    a1, b1 = a.reshape(B * T, -1), b.reshape(B * T, -1)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=q.device)

    def call(ix):
        o, _ = fn(A_log=x.A_log, a=a1, b=b1, dt_bias=x.dt_bias, q=q1, k=k1, v=v1,
                  scale=x.scale, initial_state=st, inplace_final_state=True, cu_seqlens=cu,
                  ssm_state_indices=ix.grid, num_accepted_tokens=ctx.accepted,
                  use_qk_l2norm_in_kernel=True)
        return o.view(ctx.out.shape)
    return Call(call, "vLLM fused_sigmoid_gating_delta_rule_update, [1, B*T] with cu_seqlens, "
                      "q/k/v/a/b contiguous outside the timed calls")


def flashinfer_call(ctx, name, form) -> Call:
    mtp = name == "flashinfer-mtp"
    if mtp and ctx.sd != "fp32":
        raise entries.Skip("gated_delta_rule_mtp takes an fp32 pool only (bf16: "
                           "flashinfer-pretranspose)")
    if not mtp and ctx.sd != "bf16":
        raise entries.Skip("gated_delta_rule_decode_pretranspose takes a pool with T > 1 for "
                           "bf16 state only (fp32: flashinfer-mtp)")
    entries.on_gpu(ctx.pool.buf.device, "FlashInfer's GDN kernels")
    api = "gated_delta_rule_mtp" if mtp else "gated_delta_rule_decode_pretranspose"
    fi = entries.flashinfer_gdn(api)
    x, st, B, out = ctx.x, ctx.pool.state, ctx.B, ctx.out
    q, k, v, a, b = x.dense()

    def kwargs(ix):
        if form == "slots":
            return dict(initial_state_indices=ix.read, ssm_state_indices=ix.grid,
                        disable_state_update=False)
        return dict(initial_state_indices=ix.slots, disable_state_update=form == "states",
                    intermediate_states_buffer=ctx.inter[ix.block * B:(ix.block + 1) * B])

    head = (q, k, v) if mtp else (q, k, v, None, x.A_log, a, x.dt_bias, b)
    own = (dict(initial_state=st, A_log=x.A_log, a=a, dt_bias=x.dt_bias, b=b) if mtp else
           dict(initial_state=st, backend="flashinfer"))

    def call(ix):
        fi(*head, scale=x.scale, output=out, use_qk_l2norm=True, **own, **kwargs(ix))
        return out
    where = "ssm_state_indices [B, T]" if form == "slots" else "batch-scoped intermediate buffer"
    return Call(call, f"FlashInfer {api}, {where}, q/k/v/a/b contiguous outside the timed "
                      f"calls", batch_rows=form != "slots")


def check_form(e: Call, ctx, form) -> dict:
    """One call on the check row, judged by the gate against the float64 reference: out and
    every state the form stores (intermediate rows, final slots, per-token slots); then those
    are restored and nothing else may have changed (mode_pool.restore)."""
    st, ix, B = ctx.pool.state, ctx.bank.check, ctx.B
    ref_out, ref_states = ctx.reference(form)
    snap = serving.snapshot(ctx)
    ctx.out.fill_(float("nan"))
    out = e.call(ix)
    want = ref_states.flatten(0, 1)
    slots = rows = None
    if form == "slots":
        slots = ix.grid.reshape(-1).long()
        got = st.index_select(0, slots)
    else:
        rows = (ix.block * B + torch.arange(B, device=st.device) if e.batch_rows
                else ix.rows.long())
        got = ctx.inter.index_select(0, rows).flatten(0, 1)
        if form == "states+update":
            slots = ix.slots.long()
            got = torch.cat([got, st.index_select(0, slots)])
            want = torch.cat([want, ref_states[:, -1]])
    j = gate.judge(out, got, ref_out, want, out_dtype=ctx.out.dtype, state_dtype=st.dtype)
    j.reasons += serving.restore(ctx, snap, "pool: changed although update_state=False"
                                 if form == "states" else OUTSIDE, slots, rows)
    return judged(j)


def commit_call(ctx):
    """call(ix): gdnzoo.commit of step accepted[n] - 1 of row ix.rows[n] into slot ix.slots[n]."""
    return lambda ix: gdnzoo.commit(ctx.inter, ix.rows, ctx.steps, ctx.pool.state, ix.slots,
                                    null_slot=NULL_SLOT)


def check_commit(call, ctx) -> dict:
    """One commit on the check row: every committed slot must equal
    ``gdnzoo.reference.reference_commit``'s copy exactly; nothing else may change."""
    st, ix = ctx.pool.state, ctx.bank.check
    want = torch.empty((ctx.B,) + tuple(st.shape[1:]), dtype=st.dtype, device=st.device)
    reference_commit(ctx.inter, ix.rows, ctx.steps, want, None)
    snap = serving.snapshot(ctx)
    call(ix)
    slots = ix.slots.long()
    wrong = int((st.index_select(0, slots) != want).flatten(1).any(1).sum())
    reasons = [f"state: {wrong} of B={ctx.B} committed slots differ from "
               f"intermediate_states[row, step]"] if wrong else []
    reasons += serving.restore(ctx, snap, OUTSIDE, slots)
    return dict(ok=not reasons, reason="; ".join(reasons))


# ----------------------------------------------------------------------------- the mode

class Verify(serving.Serving):
    name = "verify"
    floors = {"kernel": {}}
    progress = ("kernel", True)
    headline = ("use_qk_l2norm=True; forms: states (intermediate_states, update_state=False), "
                "states+update, slots (state_indices [B, T] + num_accepted_tokens); kernel clock: "
                "{kernel_clock} (sum of a call's records)")
    method = METHOD
    defaults = dict(batch=BATCHES, state_dtype=STATES, tokens=TOKENS, time_budget=BUDGET_S)
    cpu = "check"
    graph_entries = GRAPH_ENTRIES
    keep_pools = False
    subdir = "verify"

    def plan(self, plan, args):
        bad = [t for t in plan.tokens if not 2 <= t <= floor.MAX_TOKENS]
        if bad:
            usage_error(f"--tokens: a verify call checks 2..{floor.MAX_TOKENS} draft tokens, got "
                        f"{','.join(map(str, bad))}")
        plan.l2norm = True
        plan.backends = tuple(entries.named(args.algo, lambda: entries.backends(
            verify=True, native=True)))
        plan.entries = ("auto", *plan.backends, *PEERS)
        why = plan.why_not_gpu
        for sd, T, B in itertools.product(plan.states, plan.tokens, plan.batches):
            names = [(n, f) for f in FORMS for n in ("floor",) + plan.entries
                     if f in PEER_FORMS.get(n, FORMS)]
            if T == max(plan.tokens):
                names += [("floor", COMMIT), (COMMIT, COMMIT)]
            skip = (f"{why}: only B <= {CPU_MAX_B} is checked on the CPU, nothing is timed"
                    if plan.device != "cuda" and B > CPU_MAX_B else "")
            plan.groups.append(Group(f"{sd} T={T} B={B}", [
                (plan.cell(n, f, B, sd, T=T), self.clocks_of(n, plan)) for n, f in names],
                key=(B, T, sd), skip=skip))
        if plan.device != "cuda":
            plan.notes.insert(0, f"{why}: nothing is timed (CUPTI kernel "
                                 f"clock, CUDA graphs, floors); cells with B <= {CPU_MAX_B} are "
                                 f"checked against the reference")

    def cells(self, plan) -> list:
        return [(B, T) for B in plan.batches for T in plan.tokens if plan.gpu or B <= CPU_MAX_B]

    @staticmethod
    def width(B, T) -> int:
        return B * (T + 1)

    def context(self, key, plan):
        B, T, sd = key
        g = dict(H=plan.H, HV=plan.HV, K=plan.K, V=plan.V)
        return verify_ctx(B, T, sd, self.pool(sd, plan), g, plan.l2, plan.device, plan.seed)

    def entry(self, c, ctx, plan):
        if c.backend == COMMIT:
            call = commit_call(ctx)
            return Entry(call, lambda: check_commit(call, ctx), ctx.bank,
                         f"gdnzoo.commit, intermediate_states T_max={ctx.T}")
        e = verify_call(c.backend, c.mode, ctx)
        return Entry(e.call, lambda: check_form(e, ctx, c.mode), ctx.bank, e.note)

    def bytes_moved(self, c) -> int:
        """State bytes read (one block per sequence) and stored (floor.verify_stores), plus,
        for an entry that decodes (not a floor, not commit), its activations (io_bytes)."""
        s = (1 + floor.verify_stores(c.mode, c.T)) * state_bytes(c)
        return s + (0 if c.backend == "floor" or c.mode == COMMIT else io_bytes(c))

    def problem(self, c, plan, **kw):
        if c.mode == COMMIT:
            return None
        return super().problem(c, plan, verify=c.mode,
                               intermediate="" if c.mode == "slots" else "indexed")

    def sections(self, plan, table):
        out = []
        for sd, T in itertools.product(plan.states, plan.tokens):
            out += [section(f"\n{sd} state, T={T}, {form}, kernel clock, us / x the same-run "
                            f"floor of the form:", True, state_dtype=sd, T=T, mode=form,
                            clock="kernel") for form in FORMS]
            out += [section(f"{sd} state, T={T}, {form}, graph clock (CUDA graph of N calls), "
                            f"us per call:", state_dtype=sd, T=T, mode=form, clock="graph")
                    for form in FORMS]
            out.append(section(f"{sd} state, commit (intermediate_states T_max={T}), kernel "
                               f"clock, us / x the same-run copy floor:", True, state_dtype=sd,
                               T=T, mode=COMMIT, clock="kernel"))
        return out

    def extra_lines(self, table, plan):
        checked = sorted({f"{r['backend']} [{r['mode']}]" for r in table
                          if r["status"] == "PASS" and "not timed" in r["note"]})
        return ["checked against the reference, not timed (not on a CUDA device): "
                + ", ".join(checked)] if checked else []


class VerifyCell(serving.PoolCell):
    """One (state dtype, B) of a verify shape search at T tokens (``gdnzoo tune --shapes --mode
    verify``): a cell of this mode over a shared pool ``sp`` in the ``states`` form (update_state
    False, where the search's stages run), each candidate checked by :func:`check_form`.  A
    verify row serves every form, so the search confirms its pick in each of
    :attr:`CONFIRM_FORMS` (:meth:`in_form`: the same inputs, bank and pool in another form)."""
    FORM = "states"
    CONFIRM_FORMS = FORMS

    def __init__(self, sd, sp, B, T, geometry, seed=3):
        self.T = T
        super().__init__(sd, sp, B, geometry, seed)

    def context(self, geometry, seed):
        device = self.sp.buf.device
        l2 = clocks.l2_bytes(device) if device.type == "cuda" else 0
        return verify_ctx(self.B, self.T, self.sd, self.sp, geometry, l2, device, seed)

    def in_form(self, form) -> "VerifyCell":
        """This cell in ``form``: its context shared (inputs, index bank, pool, intermediate
        store), its Problem, calls, check and floor those of ``form``."""
        if form not in FORMS:
            raise ValueError(f"form: one of {', '.join(FORMS)}, got {form!r}")
        other = copy.copy(self)
        other.FORM, other.problem = form, self.ctx.problem(form)
        other.SLOTS = "grid" if form == "slots" else "slots"
        return other

    def call(self, run, config):
        ctx = self.ctx
        if self.FORM == "slots":                  # per-token slots [B, T], no intermediate store
            keep = Keep(None, None, False, True, ctx.accepted)
            return super().call(run, config, verify=lambda ix: keep)
        update = self.FORM == "states+update"
        return super().call(run, config,
                            verify=lambda ix: Keep(ctx.inter, ix.rows, update, False, None))

    def check(self, call) -> dict:
        return check_form(Call(call, ""), self.ctx, self.FORM)


MODES = {"verify": Verify()}

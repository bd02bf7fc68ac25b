"""``gdnzoo bench --mode prefill``: the prefill of every registered prefill backend, the
automatic choice and the peers (FLA's and FlashInfer's chunked prefill, registered as
``fla-upstream`` and ``fi-baseline``) over geometries x sequence mixes x state dtypes x forms.

A cell is (geometry H/HV, a sequence mix such as ``1x8192`` or ``ragged``, state dtype, form):
``dense`` is one state per sequence updated in place, ``pool`` the serving form (the states in
a pool of slots, every sequence reading and writing its slot in place).  q/k/v bf16, K = V =
128, use_qk_l2norm=True.  Every entry is gated through its public callable against the float64
oracle (its relative RMS errors of output and final state are the rows' ``rel_err_out`` /
``rel_err_state``), then timed on three clocks over rotated input sets.  How: :data:`METHOD`.
"""
from __future__ import annotations

import itertools
import math
import statistics

import torch

import gdnzoo
from gdnzoo import gate, prefill_contract, registry
from gdnzoo.bench import args as A, entries, floor
from gdnzoo.bench.clocks import GraphUnsupported, Sets
from gdnzoo.bench.pipeline import Cell, Entry, Group, Mode, judged, state_bytes
from gdnzoo.bench.report import finite
from gdnzoo.inputs import DTYPES, make_prefill_inputs
from gdnzoo.prefill_contract import Problem

GEOMETRIES = ((4, 8), (16, 32), (16, 48), (16, 64), (2, 8))
MIXES = ("1x8192", "1x32768", "8x1024", "16x256", "64x64", "ragged")
# a serving-like mix: one long prompt, medium ones, a single token, a zero-length sequence, the
# chunk edges
RAGGED = (2048, 1, 700, 0, 63, 65, 1500, 3000, 128, 4096)
FORMS = A.PREFILL_FORMS
PEERS = ("fi-baseline", "fla-upstream")
# Timed only when --algo names them: the PyTorch forms take tens of ms a call, fla-recurrent
# (token by token) 7.8 ms at 4/8 1x8192 on an H200, about as long as triton-chunk's whole
# matrix cell by cell; its prefill has its own run (bench/results/h200/prefill_recurrent/).
SLOW = ("pt-reference", "pt-compiled", "fla-recurrent")
# Entries that read cu_seqlens on the host inside a call: no CUDA graph can hold them, and a
# capture that fails part-way leaves torch's CUDA generator in capture mode (every later
# random draw on the GPU raises), so their graph clock is n/a without trying.
HOST_SYNC = {"fla-upstream": "FLA's chunk reads cu_seqlens on the host in every call"}
BUDGET_S = 420.0
DIM = 128
# Without a CUDA device nothing is timed; cells of at most this many tokens are checked against
# float64 (the default mixes there: CPU_MIXES).
CPU_MAX_TOKENS = 2048
CPU_MIXES = ("1x130", "3x64")


def mixes_here(plan, args, gpu_mixes, cpu_mixes) -> list:
    """The mixes a run measures: ``--mix``, else the mode's (on CPU its small ones, with a note
    saying that nothing is timed there)."""
    if not plan.gpu:
        plan.notes.insert(0, f"{plan.why_not_gpu}: nothing is timed; cells of at most "
                             f"{CPU_MAX_TOKENS} tokens are checked against float64"
                             + ("" if args.mix else f" (mixes {','.join(cpu_mixes)})"))
    return list(args.mix or (gpu_mixes if plan.gpu else cpu_mixes))


def too_long_here(plan, tokens: int) -> str:
    """A cell's SKIP reason on CPU when it has more than :data:`CPU_MAX_TOKENS` tokens."""
    return "" if plan.gpu or tokens <= CPU_MAX_TOKENS else (
        f"{plan.why_not_gpu}: only cells of at most {CPU_MAX_TOKENS} tokens are checked on the "
        f"CPU, nothing is timed")


METHOD = (
    "Prefill: N sequences packed on one token axis (cu_seqlens int32), q/k/v bf16, K = V = 128, "
    "use_qk_l2norm=True, raw gates; dense: one fp32/bf16 state per sequence updated in place; "
    "pool: the states in a pool of slots (random distinct slots, in place). Correctness first: "
    "one call through gdnzoo.get(name, op='prefill') vs the float64 per-token oracle "
    "(gdnzoo.gate: the contest rule and relative Frobenius error < 1e-2 output, 1e-4 fp32 / "
    "8e-3 bf16 state; the peers, which round their states to bf16, 8e-3 for either state); "
    "rel_err_out / rel_err_state are those relative RMS errors; a failing "
    "entry gets no time. Clocks over n rotated input sets (q, k, v, a, b, state; n*set >= 2x L2, "
    "at most 8): kernel: the time a call's CUPTI records cover (their union: summed where "
    "none overlaps; kernels_per_call counts them; a peer's gate-prep kernels included); "
    "graph: per-call time in a CUDA graph of N calls (n/a for an entry that syncs the host); "
    "host: wall time per eager call. floor: the larger of the "
    "memory floor (q, k, v, a, b read, out written, the state read and written once, at this "
    "run's measured copy bandwidth) and the compute floor (4*T*HV*K*V flops, FlashInfer's "
    "count, at this run's measured bf16 matmul rate). TFLOP/s: 4*T*HV*K*V per call over the "
    "median. host: each batch of calls synchronized at its end (the wait timed). Medians with "
    "p20/p80.")


def parse_mix(mix: str) -> tuple:
    """(lengths, padded entries) of ``NxL`` (N sequences of L tokens), ``NxL+Kpad`` (and K
    padded entries: ``--mode engine-prefill`` only) or ``ragged``."""
    if mix == "ragged":
        return list(RAGGED), 0
    m = A.MIX.fullmatch(mix)
    return [int(m[2])] * int(m[1]), int(m[3] or 0)


def prefill_bytes(c: Cell) -> int:
    """q, k, v, a, b read and out written (bf16), the state read and written once."""
    return 2 * c.T * (2 * c.H * c.K + 2 * c.HV * c.V + 2 * c.HV) + 2 * state_bytes(c)


def input_sets(x, form, l2, device, seed, layout="k-last"):
    """The cold source of a cell (clocks.Sets): copies of its inputs (and states, and pools),
    at least 2 and 2x the L2 of bytes, at most 8; ``call(x, state, kw)`` takes one set."""
    one = sum(t.numel() * t.element_size() for t in (x.q, x.k, x.v, x.a, x.b, x.state))
    n, sets = max(2, min(8, math.ceil(2 * l2 / max(one, 1)))), []
    for i in range(n):
        y = x.clone()
        if form == "pool":
            N = y.cu_seqlens.shape[0] - 1
            P = 2 * N + 3
            g = torch.Generator().manual_seed(seed + i)
            pool = torch.randn((P, *y.state.shape[1:]), generator=g).mul(0.05).to(
                y.state.dtype).to(device)
            slots = torch.randperm(P, generator=g)[:N].to(torch.int32).to(device)
            pool[slots.long()] = y.state
            sets.append((y, entries.in_layout(pool, layout), dict(state_indices=slots)))
        else:
            sets.append((y, entries.in_layout(y.state, layout), {}))
    cold = Sets(sets)
    y, st, _ = sets[0]
    cold.working_set_bytes = n * (sum(t.numel() * t.element_size() for t in (
        y.q, y.k, y.v, y.a, y.b)) + st.numel() * st.element_size())
    return cold


def prefill_entry(c: Cell, plan) -> Entry:
    """Entry ``c.backend`` (a prefill backend, or ``auto``) in cell ``c``; Skip with the reason
    where it cannot serve it."""
    mix, form, layout = dict(c.keys)["mix"], c.mode, plan.layout
    x = make_prefill_inputs(parse_mix(mix)[0], H=c.H, HV=c.HV, K=c.K, V=c.V,
                            state_dtype=c.state_dtype, device=plan.device, seed=plan.seed)
    key = ("ref", c.H, c.HV, mix, c.state_dtype)
    ref = plan.cache.get(key) or plan.cache.setdefault(key, x.reference(True))
    fn = gdnzoo.prefill if c.backend == "auto" else gdnzoo.get(c.backend, op="prefill")
    sets = input_sets(x, form, plan.l2 or 0, plan.device, plan.seed, layout)
    y0, st0, kw0 = sets.sets[0]
    args0, kw0 = (*y0.args()[:3], st0, *y0.args()[4:]), dict(kw0, state_layout=layout)
    problem, _ = prefill_contract.validate(*args0, use_qk_l2norm=True, **kw0)
    note = ""
    if c.backend == "auto":
        sel = gdnzoo.select(*args0, op="prefill", use_qk_l2norm=True, **kw0)
        note = f"auto -> {sel.name} ({sel.source})"
    else:
        entries.serve(c.backend, problem)
    out = torch.empty_like(x.v)
    tol = gate.state_tol_of(c.backend, "prefill")

    def check():
        if form == "dense":
            j, _, _ = gate.gated_call(fn if layout == "k-last" else entries.k_first_call(fn), x,
                                      dest=False, use_qk_l2norm=True, ref=ref, state_tol=tol)
            return judged(j)
        y, pool, kw = sets.sets[0]
        before = pool.clone()
        out.fill_(float("nan"))
        call(y, pool, kw)
        slots = kw["state_indices"].long()
        got = pool.index_select(0, slots)
        j = gate.judge(out, got if layout == "k-last" else got.transpose(-1, -2), *ref,
                       state_dtype=pool.dtype, state_tol=tol)
        others = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
        others[slots] = False
        if not torch.equal(pool[others], before[others]):
            j.reasons.append("pool: slots not named were written")
        pool.copy_(before)
        return judged(j)

    def call(y, st, kw):
        fn(*y.args()[:3], st, *y.args()[4:], out=out, use_qk_l2norm=True, **kw, state_layout=layout)

    if c.backend in HOST_SYNC:
        sets.graph = no_graph(HOST_SYNC[c.backend])
    return Entry(call, check, sets, note=note, host=lambda i: call(*sets.next()))


def no_graph(why):
    """A cold source's ``graph`` for an entry no CUDA graph can hold."""

    def graph(call):
        raise GraphUnsupported(why)
    return graph


def measured_rates() -> dict:
    """This GPU's device-to-device copy bandwidth (read + write) and bf16 matmul rate on random
    data (8192^3, median of 10 after warm-up), measured now."""
    copy = floor.copy_bandwidth()
    g = torch.Generator().manual_seed(0)           # on the host (see HOST_SYNC)
    a, b = (torch.randn(8192, 8192, generator=g).to("cuda", torch.bfloat16) for _ in "ab")
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return dict(copy_gbps=copy["gbps"], tflops=2 * 8192**3 / statistics.median(times) / 1e6)


class PrefillMode(Mode):
    """What the prefill modes share: cells keyed by a sequence mix, checked (not timed) without
    a CUDA device, a call's CUPTI records summed on the kernel clock."""
    op, keys, cpu, busy = "prefill", ("mix",), "check", True


class Prefill(PrefillMode):
    name = "prefill"
    headline = "q/k/v bf16, K=V=128, use_qk_l2norm=True, cu_seqlens int32"
    k_first = ", K-first states [N, HV, K, V]"
    floors = {"kernel": {"mode": "dense", "clock": "kernel"}}
    bytes_moved = staticmethod(prefill_bytes)
    method = METHOD
    columns = {"tflops": float("nan"), "kernels_per_call": ""}
    defaults = {"state_dtype": ("fp32", "bf16"), "time_budget": BUDGET_S}
    subdir = "prefill"

    def plan(self, plan, args):
        mixes = mixes_here(plan, args, MIXES, CPU_MIXES)
        padded = [m for m in mixes if parse_mix(m)[1]]
        if padded:
            A.usage_error(f"--mix {','.join(padded)}: padded entries are for --mode "
                          f"engine-prefill (--mode prefill pads through pools in its tests)")
        geoms = [(plan.H, plan.HV)] if A.given(args.heads) or args.model else list(GEOMETRIES)
        if A.given(args.dim) and args.dim != DIM:
            plan.notes.append(f"--dim {args.dim}: prefill cells are K = V = {DIM} (the peers')")
        plan.K = plan.V = DIM                          # the header says what the cells are
        names = entries.named(args.algo or registry.env_algo(),
                              lambda: [n for n in entries.backends("prefill") if n not in SLOW],
                              "prefill")
        names = ["auto"] + [n for n in names if n != "auto"]
        avail = {n: registry.availability(n, plan.device, "prefill") for n in names if n != "auto"}
        plan.notes += [f"{n}: skipped ({why})" for n, (ok, why) in avail.items() if not ok]
        plan.l2norm = True
        if plan.layout == "k-first":
            plan.notes.append("--state-layout k-first: every state (and pool) is K-first "
                              "[.., HV, K, V] (V contiguous), gated against the k-last "
                              "reference")
        forms = args.form or FORMS
        for form, (H, HV), mix, sd in itertools.product(forms, geoms, mixes, plan.states):
            L = parse_mix(mix)[0]
            timed_floor = plan.gpu and "kernel" in plan.clocks and form == "dense"
            cells = [(Cell("prefill", n, len(L), sum(L), H, HV, DIM, DIM, sd, form, True,
                           (("mix", mix),)), ("kernel",) if n == "floor" else plan.clocks)
                     for n in names + ["floor"] * timed_floor]
            plan.groups.append(Group(f"{H}/{HV} {mix} {sd} {form}", cells,
                                     skip=too_long_here(plan, sum(L))))
        plan.backends = plan.entries = tuple(names)

    def entry(self, c, ctx, plan):
        return prefill_entry(c, plan)

    def floor_rows(self, c, ctx, plan):
        """The cell's floor: max(memory floor, compute floor) from this run's measured copy
        bandwidth and bf16 matmul rate."""
        rates = plan.cache.get("rates") or plan.cache.setdefault("rates", measured_rates())
        mem = prefill_bytes(c) / (rates["copy_gbps"] * 1e3)      # us
        comp = 4.0 * c.T * c.HV * c.K * c.V / (rates["tflops"] * 1e6)    # us, FlashInfer's flops
        which = "memory" if mem >= comp else "compute"
        return [dict(cell=c, clock="kernel", status="PASS", flags="", samples=[max(mem, comp)],
                     note=f"{which} floor (memory {mem:.1f} us at {rates['copy_gbps']:.0f} GB/s, "
                          f"compute {comp:.1f} us at {rates['tflops']:.0f} TFLOP/s)",
                     method="computed from this run's copy bandwidth and bf16 matmul rate")]

    def problem(self, c, plan, **kw):
        """The prefill Problem of cell ``c`` (the automatic choice's, shown beside the timed
        ``auto`` entry)."""
        return Problem(N=c.B, T=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V,
                       state_dtype=DTYPES[c.state_dtype], io_dtype=torch.bfloat16,
                       device=plan.device, use_qk_l2norm=True, cc=plan.cc,
                       pool=c.mode == "pool", k_first=plan.layout == "k-first")

    def derive(self, table, plan):
        for r in table:
            m = r["median_us"]
            if r["backend"] != "floor" and finite(m) and m > 0:
                r["tflops"] = 4.0 * r["T"] * r["HV"] * r["K"] * r["V"] / m / 1e6

    def sections(self, plan, table):
        out = []
        geoms = dict.fromkeys((r["H"], r["HV"]) for r in table)
        for form, (H, HV), sd, clock in itertools.product(FORMS, geoms, plan.states, plan.clocks):
            def keep(r, H=H, HV=HV, sd=sd, clock=clock, form=form):
                return (r["H"], r["HV"], r["state_dtype"], r["clock"]) == (H, HV, sd, clock) \
                    and (r["mode"] == form or r["backend"] == "floor")
            if any(keep(r) and r["mode"] == form for r in table):
                out.append((f"\n{H}/{HV}, {sd} state, {form}, {clock} clock, us"
                            + (" / x the floor" if clock == "kernel" else "") + ":", keep,
                            clock == "kernel", "mix"))
        return out

    def extra_lines(self, table, plan):
        """The prefill bars: our best entry against FLA and FlashInfer per cell and clock, and
        the errors against float64."""
        cells = {}
        for r in table:
            if r["status"] == "PASS" and finite(r["median_us"]) and r["backend"] != "floor":
                key = (r["H"], r["HV"], r["mix"], r["state_dtype"], r["mode"], r["clock"])
                cells.setdefault(key, {})[r["backend"]] = r["median_us"]
        ours = [n for n in plan.entries if n not in PEERS and n != "auto"]
        lines = []
        for peer in PEERS:
            xs = [min(t[n] for n in ours if n in t) / t[peer] for t in cells.values()
                  if peer in t and any(n in t for n in ours)]
            if xs:
                lines.append(f"  vs {peer}: {len(xs)} cells, ours/peer worst {max(xs):.2f}x, "
                             f"best {min(xs):.2f}x, faster in {sum(x < 1 for x in xs)}")
        if lines:
            lines.insert(0, "bars (per cell and clock: our best entry's time over each peer's):")
        errs = [((r["backend"], r["state_dtype"]), r["rel_err_out"], r["rel_err_state"])
                for r in table if r["clock"] == plan.clocks[0] and finite(r["rel_err_state"])]
        for name, sd in dict.fromkeys(k for k, _, _ in errs):
            eo = max(e for k, e, _ in errs if k == (name, sd))
            es = max(e for k, _, e in errs if k == (name, sd))
            lines.append(f"error vs float64, {name}, {sd} state: worst relative RMS out "
                         f"{eo:.2e}, state {es:.2e}")
        return lines


MODES = {"prefill": Prefill()}

"""``gdnzoo bench --mode engine-prefill``: the engines' whole prefill call around FlashInfer's
chunk kernel (gather the pool's slots, zero the rows without an initial state, cast to fp32,
the kernel, scatter back: ``engine``) beside gdnzoo's adapter, which runs one prefill on the
pool in place (``gdnzoo.integrations.vllm.chunked_prefill``, ``.sglang.extend``), for each
prefill backend named (default: the automatic choice and our Triton kernels).

A cell is (engine, a sequence mix, state dtype); the geometry is 4/8 heads, K = V = 128 unless
``--heads`` says otherwise.  The engines' sequences and cases are :mod:`gdnzoo.bench.
engine_prefill`'s.  How: :data:`METHOD`.
"""
from __future__ import annotations

import itertools

import torch

from gdnzoo import gate, registry
from gdnzoo.bench import engine_prefill as ep
from gdnzoo.bench import entries
from gdnzoo.bench.args import given, words
from gdnzoo.bench.clocks import Sets
from gdnzoo.bench.mode_prefill import PrefillMode, mixes_here, no_graph, parse_mix, too_long_here
from gdnzoo.bench.pipeline import Cell, Entry, Group, judged, section
from gdnzoo.bench.report import finite

ENGINES = ("vllm", "sglang")
# a zero-length sequence is left out: the engines never schedule one, and FlashInfer 0.7.2
# writes no final state for it (the engines' scatter would store garbage)
MIXES = {"1x8192": ([8192], 0), "8x1024": ([1024] * 8, 0), "16x256": ([256] * 16, 0),
         "64x64": ([64] * 64, 0), "ragged": ([2048, 1, 700, 2, 63, 65, 1500], 0),
         "8x256+2pad": ([256] * 8, 2)}
OURS = ("auto", "cuda-chunk", "triton-chunk", "triton-chunk-bf16")
CPU_MIXES = ("1x130", "4x64+2pad")
DIM = 128
BUDGET_S = 300.0
# the engine's sequence reads the device on the host (a boolean-mask zeroing in vLLM's, an
# any() in SGLang's): no CUDA graph can hold it
NO_GRAPH = "the engine's sequence syncs the host (boolean-mask indexing / any())"

METHOD = (
    "Engine prefill: the engine's tensors (g log decay and beta fp32 [1, T, HV], q and k "
    "L2-normalized outside the kernel, a page-strided pool of states, one sequence in four "
    "without an initial state, padded entries where the mix says +Npad). engine: the engine's "
    "whole sequence around FlashInfer's chunk_gated_delta_rule (vLLM: gather, zero, fp32 cast, "
    "kernel, scatter; SGLang: l2norm, index remap, gather, kernel, index_copy_); the other "
    "entries: gdnzoo's adapter on that backend (auto: the automatic choice), one prefill on the "
    "pool in place. Correctness first: the output and the named slots against a float64 "
    "per-token oracle (the engine's side and entries that round their states judged with the "
    "bf16 state's bound), the adapter's pool storage outside the named slots bit-identical, "
    "padded rows zero. Clocks on one input set, the pool updated in place by every call as in "
    "serving: kernel (the time a call's CUPTI records cover, the engine's gather/scatter/cast "
    "kernels included), graph (n/a for the engine: its sequence syncs the host), host (wall "
    "per eager call, each batch synchronized). Medians with p20/p80.")


def mix_lengths(mix: str) -> tuple:
    """(lengths, padded entries) of a mix name: one of :data:`MIXES`, else --mode prefill's
    forms (NxL, NxL+Kpad)."""
    return MIXES[mix] if mix in MIXES else parse_mix(mix)


def engine_kernel(device):
    """FlashInfer's chunk kernel (Skip where it cannot run here)."""
    ok, why = registry.availability("fi-baseline", device, "prefill")
    if not ok:
        raise entries.Skip(f"the engines call FlashInfer's chunk kernel: {why}")
    return ep.flashinfer_chunk()


def case_of(c: Cell, plan):
    """The cell's engine case and its float64 oracle, made once per (engine, mix, dtype)."""
    keys = dict(c.keys)
    key = ("case", c.mode, keys["mix"], c.state_dtype, c.H, c.HV)
    if key not in plan.cache:
        lengths, pads = mix_lengths(keys["mix"])
        sd = torch.float32 if c.state_dtype == "fp32" else torch.bfloat16
        case = ep.make_case(c.mode, lengths, pads, c.K, sd, plan.seed, plan.device,
                            heads=(c.H, c.HV))
        plan.cache[key] = (case, ep.oracle(c.mode, case))
    return plan.cache[key]


def engine_entry(c: Cell, plan) -> Entry:
    """Entry ``c.backend`` (``engine``, or a prefill backend / ``auto`` under the adapter) of
    cell ``c``; Skip with the reason where it cannot run."""
    engine = c.mode
    case, (ref_out, ref_pool) = case_of(c, plan)
    buf, pool = ep.pool_copy(case)
    named, cold = case["named"], Sets([()])
    tol = gate.state_tol_of("fi-baseline" if c.backend == "engine" else c.backend, "prefill")
    if c.backend == "engine":
        fn = ep.engine_call(engine, engine_kernel(plan.device), case, pool)
        cold.graph = no_graph(NO_GRAPH)
    else:
        if c.backend != "auto":
            ok, why = registry.availability(c.backend, plan.device, "prefill")
            if not ok:
                raise entries.Skip(why)
            entries.serve(c.backend, ep.adapter_problem(engine, case))
        fn = ep.adapter_call(engine, case, pool, None if c.backend == "auto" else c.backend)

    def check():
        before = buf.clone()
        o = fn()
        j = gate.judge(o[0], pool[named], ref_out, ref_pool[named], out_dtype=o.dtype,
                       state_dtype=pool.dtype, state_tol=tol)
        if c.backend != "engine":
            if not ep.rest_untouched(case, buf, before, pool):
                j.reasons.append("pool: storage outside the named slots was written")
            if not ep.pad_rows_zero(case, o):
                j.reasons.append("out: a padded entry's rows are not zero")
        buf.copy_(before)
        return judged(j)

    return Entry(fn, check, cold, host=lambda i: fn(),
                 note="" if c.backend != "auto" else "auto: the adapter's automatic choice")


class EnginePrefill(PrefillMode):
    name = "engine-prefill"
    not_rivals = ("engine",)
    floors = {}
    headline = "the engines' g/beta, q/k normalized outside, page-strided pools in place"
    method = METHOD
    columns = {"kernels_per_call": "", "engine_over": float("nan")}
    defaults = {"state_dtype": ("fp32",), "time_budget": BUDGET_S}
    subdir = "engine-prefill"

    def plan(self, plan, args):
        algo = args.algo or registry.env_algo()
        picked = [w for w in words(algo) if w not in ("auto", "engine")] if algo else []
        def default():
            return [n for n in OURS if n != "auto" and n in entries.backends("prefill")]
        ours = entries.named(",".join(picked), default, "prefill") if picked else default()
        names = ["engine", "auto", *ours]
        if args.l2norm:
            plan.notes.append("--l2norm: no effect here; q and k are normalized outside the "
                              "kernel, as the engines' calls take them")
        if not given(args.heads) and not args.model:
            plan.H, plan.HV = ep.H, ep.HV
        if not given(args.dim):
            plan.K = plan.V = DIM
        elif args.dim != DIM:
            plan.notes.append(f"--dim {args.dim}: FlashInfer's chunk kernel (the engine's call) "
                              f"serves K = V = {DIM} only")
        mixes = mixes_here(plan, args, list(MIXES), CPU_MIXES)
        for engine, mix, sd in itertools.product(ENGINES, mixes, plan.states):
            L, pads = mix_lengths(mix)
            cells = [(Cell("engine-prefill", n, len(L) + pads, sum(L), plan.H, plan.HV, plan.K,
                           plan.V, sd, engine, False, (("mix", mix),)), plan.clocks) for n in names]
            plan.groups.append(Group(f"{engine} {mix} {sd}", cells,
                                     skip=too_long_here(plan, sum(L))))
        plan.backends = plan.entries = tuple(names)

    def entry(self, c, ctx, plan):
        return engine_entry(c, plan)

    def problem(self, c, plan, **kw):
        """The Problem the cell's adapter call poses (the automatic choice's, shown beside the
        timed ``auto`` entry)."""
        return ep.adapter_problem(c.mode, case_of(c, plan)[0])

    def derive(self, table, plan):
        """engine_over: the engine's median over this entry's, per cell and clock (> 1: the
        adapter is faster)."""
        eng = {(r["mode"], r["mix"], r["state_dtype"], r["clock"]): r["median_us"]
               for r in table if r["backend"] == "engine" and r["status"] == "PASS"}
        for r in table:
            e = eng.get((r["mode"], r["mix"], r["state_dtype"], r["clock"]))
            if r["backend"] != "engine" and e and finite(r["median_us"]) and r["median_us"] > 0:
                r["engine_over"] = e / r["median_us"]

    def sections(self, plan, table):
        return [section(f"\n{engine}, {sd} state, {clock} clock, us:", by="mix", mode=engine,
                        state_dtype=sd, clock=clock)
                for engine in ENGINES for sd in plan.states for clock in plan.clocks]

    def extra_lines(self, table, plan):
        """The bar: our best adapter entry at least 1.3x faster than the engine's call, per
        cell and clock."""
        best = {}
        for r in table:
            if r["backend"] != "engine" and finite(r.get("engine_over", float("nan"))):
                k = (r["mode"], r["mix"], r["state_dtype"], r["clock"])
                best[k] = max(best.get(k, 0.0), r["engine_over"])
        if not best:
            return []
        lines = ["bar (engine time / our best adapter's, per cell and clock; >= 1.3 wanted):"]
        for engine in ENGINES:
            xs = [v for k, v in best.items() if k[0] == engine]
            if xs:
                lines.append(f"  {engine}: {len(xs)} cells, worst {min(xs):.2f}x, best "
                             f"{max(xs):.2f}x, >= 1.3x in {sum(x >= 1.3 for x in xs)}")
        return lines


MODES = {"engine-prefill": EnginePrefill()}

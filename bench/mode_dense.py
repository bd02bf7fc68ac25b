"""``gdnzoo bench --mode dense`` (and ``dest``; ``--mode dense,dest``: both in one run): every
backend x batch size x state dtype on a dense state, each cell gated through ``gdnzoo.get(name)``
on inputs of :func:`gdnzoo.inputs.make_inputs`, its raw launcher timed on the kernel and graph
clocks and the public callable on the host clock over one cold rotation, beside the floor
(per (B, state dtype), after the cells: the time budget does not cut it).  How: :data:`METHOD`.
Without a CUDA device: the host clock only.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import torch

import gdnzoo
from gdnzoo import gate, registry
from gdnzoo.bench import clocks, entries, floor
from gdnzoo.bench.console import ratio, text
from gdnzoo.bench.pipeline import Entry, Group, Mode, judged, state_bytes
from gdnzoo.bench.report import finite
from gdnzoo.contract import validate
from gdnzoo.inputs import make_inputs
from gdnzoo.reference import reference_outputs

RUN_LAST = ("pt-compiled",)          # slow to compile per shape: a time budget cuts it first

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
    "host: wall time per eager call via gdnzoo.get(name), batches of back-to-back calls, each "
    "batch synchronized at its start and end (the wait inside its time), none inside it: per "
    "call max(dispatch, GPU) plus one call's other part spread over the batch. "
    "floor: in-place float4 streaming kernel over exactly the state bytes, best launch shape "
    "searched, same clock and rotation. Medians with p20/p80.")


def dense_entry(c, plan) -> Entry:
    """Backend ``c.backend`` in cell ``c``: its inputs, the gate, the raw and public calls over
    one cold rotation; Skip where it cannot serve the cell."""
    dest = c.mode == "dest"
    layout = plan.layout
    x = make_inputs(B=c.B, T=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V, state_dtype=c.state_dtype,
                    device=plan.device, seed=plan.seed)
    out = torch.empty(c.B, c.T, c.HV, c.V, dtype=x.v.dtype, device=plan.device)
    state = entries.in_layout(x.state, layout)
    args = (*x.args()[:3], state, *x.args()[4:])
    p, _ = validate(*args, out=out, new_state=torch.empty_like(state) if dest else None,
                    use_qk_l2norm=c.l2norm, state_layout=layout)
    entries.serve(c.backend, p)
    if not plan.gpu and c.backend in entries.backends(language="triton"):
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise entries.Skip("Triton on CPU needs TRITON_INTERPRET=1 (the interpreter)")
        if c.B > 4:
            raise entries.Skip("Triton interpreter on CPU: only B <= 4 (too slow beyond)")
    public = gdnzoo.get(c.backend)
    raw = entries.raw(c.backend)
    rot = clocks.Rotation(state, dest=dest, l2=plan.l2)

    def check():
        fn = public if layout == "k-last" else entries.k_first_call(public)
        j, _, _ = gate.gated_call(fn, x, dest=dest, use_qk_l2norm=c.l2norm)
        return judged(j)

    def call(st, ns):
        entries.launch(raw, x, st, out, ns, c.l2norm, state_layout=layout)

    def host(i):
        st, ns = rot.next()
        public(*args[:3], st, *args[4:], out=out, new_state=None if ns is st else ns,
               use_qk_l2norm=c.l2norm, state_layout=layout)
    warm = getattr(registry.backend_module(c.backend), "allocates_state", None)
    try:
        warm = callable(warm) and warm()
    except Exception:
        warm = False
    return Entry(call, check, rot, host=host, base=dict(flags="warm write target" * bool(warm)))


def published(rows, B, sd, form, clock) -> list:
    """Algorithm | Median (us) | Speedup | vs FlashInfer at one batch size, fastest first."""
    sel = [r for r in rows if r["B"] == B and r["state_dtype"] == sd and r["mode"] == form
           and r["clock"] == clock and r["backend"] != "floor"]
    sel.sort(key=lambda r: (r["status"] != "PASS", not finite(r["median_us"]),
                            r["median_us"] if finite(r["median_us"]) else 0, r["backend"]))
    w = max([len(r["backend"]) + (1 if r["flags"] else 0) for r in sel] + [9])
    lines = [f"| {'Algorithm':<{w}} | Median (us) | Speedup | vs FlashInfer |",
             f"|{'-' * (w + 2)}|-------------|---------|---------------|"]
    for r in sel:
        lines.append(f"| {r['backend'] + '*' * bool(r['flags']):<{w}} | {text(r, False):>11} | "
                     f"{ratio(r['speedup_vs_ref']):>7} | {ratio(r['speedup_vs_fi']):>13} |")
    return lines


class Dense(Mode):
    name = "dense"
    method = METHOD
    nvbench = True
    k_first = ", K-first state [B, HV, K, V]"
    floors = dict.fromkeys(("kernel", "nvbench"), {"bench": "dense", "mode": "inplace",
                                                   "clock": "kernel"})

    def bench_of(self, form) -> str:
        return "dest" if form == "dest" else "dense"

    def plan(self, plan, args):
        names = entries.named(args.algo or registry.env_algo(), entries.backends)
        order = [n for n in names if n not in RUN_LAST] + [n for n in names if n in RUN_LAST]
        avail = {n: registry.availability(n, plan.device) for n in names}
        if plan.device != "cuda":
            plan.notes.append("no CUDA device: kernel and graph clocks, floor, copy bandwidth and "
                              "empty kernel are skipped; " + (
                                  "host clock only" if "host" in plan.clocks else
                                  "--timing asked for none of the others: each entry is "
                                  "checked against the reference, not timed"))
        if plan.layout == "k-first":
            plan.notes.append("--state-layout k-first: every state is K-first [B, HV, K, V] (V "
                              "contiguous), gated against the k-last reference; the floor moves "
                              "the same bytes")
        plan.notes += [f"{n}: skipped ({why})" for n, (ok, why) in avail.items() if not ok]
        forms = ["dest" if w == "dest" else "inplace" for w in plan.words]
        # dtype innermost: a time budget cuts whole backends last
        for form, n, B, sd in itertools.product(forms, order, plan.batches, plan.states):
            plan.groups.append(Group(f"{n} B={B} {sd} {form}", [(plan.cell(n, form, B, sd),
                                                                 plan.clocks)],
                                     skip="" if avail[n][0] else avail[n][1]))
        if plan.device == "cuda" and "kernel" in plan.clocks:
            for B, sd in itertools.product(plan.batches, plan.states):
                plan.groups.append(Group(f"floor B={B} {sd}", [(plan.cell(
                    "floor", "inplace", B, sd), ("kernel",))], budgeted=False))
        plan.backends = plan.entries = tuple(names)

    def entry(self, c, ctx, plan):
        return dense_entry(c, plan)

    def floor_rows(self, c, ctx, plan):
        f = floor.floor_times(state_bytes(c), iters=min(plan.iters, 100))
        return [dict(cell=c, clock="kernel", status="PASS", note=f["config"], flags="",
                     samples=f["samples"], n_sets=f["n_sets"], method=f["method"],
                     working_set_mib=f["n_sets"] * state_bytes(c) / 2**20)]

    def finish(self, rows, plan, args):
        if args is not None and args.nvbench and plan.layout != "k-last":
            plan.notes.append("--nvbench: not with --state-layout k-first (its subprocess times "
                              "a k-last state)")
        elif args is not None and args.nvbench:
            from gdnzoo.bench import nvbench_xcheck
            extra, note = nvbench_xcheck.cross_check(rows, args)
            rows += extra
            plan.notes.append(note)

    def problem(self, c, plan, **kw):
        return super().problem(c, plan, inplace=c.mode == "inplace",
                               k_first=plan.layout == "k-first")

    def sections(self, plan, table) -> list:
        clock = next((k for k in ("kernel", "host") if any(
            r["clock"] == k and finite(r["median_us"]) and r["backend"] != "floor"
            for r in table)), "kernel")
        out, forms = [], dict.fromkeys(r["mode"] for r in table if r["backend"] != "floor")
        for form, sd in itertools.product(forms, plan.states):
            Bs = sorted({r["B"] for r in table if r["state_dtype"] == sd})
            if not Bs:
                continue
            B0 = 1 if 1 in Bs else Bs[0]
            head = ([f"\n{sd} state, {form}, B={B0}, {clock} clock (Speedup vs pt-reference; "
                     f"* = warm write target):"] + published(table, B0, sd, form, clock)
                    + [f"{clock} clock, us" + ("/x floor" if clock == "kernel" else "") + ":"])
            out.append((head, lambda r, sd=sd, form=form: (
                r["state_dtype"] == sd and r["clock"] == clock
                and (r["mode"] == form or r["backend"] == "floor")), clock == "kernel"))
        return out


class DenseCell:
    """One (state dtype, B) of the shape search (``gdnzoo tune --shapes``) on a dense state:
    inputs, their reference, a cold rotation; ``dest``: destination passing."""

    def __init__(self, sd, B, dest, T, geometry, seed=3):
        self.sd, self.B, self.dest, self.T = sd, B, dest, T
        self.x = make_inputs(B=B, T=T, **geometry, state_dtype=sd, device="cuda", seed=seed)
        self.problem = dataclasses.replace(validate(*self.x.args())[0], inplace=not dest)
        self.rot = clocks.Rotation(self.x.state, dest=dest)
        self.out = torch.empty(B, T, geometry["HV"], geometry["V"], dtype=self.x.v.dtype,
                               device="cuda")
        self.ref = reference_outputs(self.x)
        self.prepare = None

    def floor_launcher(self):
        return floor.best_launcher(self.rot.set_bytes)

    def checked(self, run, config):
        """launch(i) of one candidate, after the gate passed it; raises if it cannot be built,
        launched, or is wrong."""
        x = self.x

        def fn(q, k, v, state, A_log, a, dt_bias, b, scale, *, out, new_state, use_qk_l2norm):
            ns = state if new_state is None else new_state
            entries.launch(run, x, state, out, ns, use_qk_l2norm, config=config)
            return out, ns
        j, _, _ = gate.gated_call(fn, x, dest=self.dest, ref=self.ref)
        if not j.ok:
            raise AssertionError(j.reason)
        return self.rot.kernel(lambda st, ns: entries.launch(run, x, st, self.out, ns, False,
                                                             config=config))


_DENSE = Dense()
MODES = {"dense": _DENSE, "dest": _DENSE}

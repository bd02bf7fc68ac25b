"""triton-chunk (backends/triton_chunk.py) on a GPU: correctness, a launch-config sweep, and
FLA and FlashInfer beside it.  From the repository root:

    python -m lab.prefill_gpu                      # everything (under 6 min on an H100)
    python -m lab.prefill_gpu --configs 12 --sweep-geoms 4/8 --skip-correctness --peers none
    python -m lab.prefill_gpu --geoms 4/8 --seqs 1x8192 --configs 3 --peers none

(a) Correctness: triton-chunk against a float64 per-token oracle (run on the GPU) under the
project gate (gdnzoo.gate), K = V = 128: packed lengths around the chunk size, GVA 2, 3, 4,
fp32 and bf16 state, l2 norm on and off, destination passing and in place, a pool with padding
in place and into a separate K-first write pool, precomputed gates, fp16 inputs, each product
precision, and a CUDA graph captured once and replayed with new data and new cu_seqlens values
of the same shapes.
(b) Timing: per geometry (H/HV) and sequence mix (N x L): triton-chunk's candidate launch
configs (at --sweep-geoms; the default config elsewhere), FLA's and FlashInfer's
chunk_gated_delta_rule when importable.  fp32 k-last initial state per sequence, qk l2 norm in
the kernel, final state written; triton-chunk and FlashInfer write into given buffers, FLA
allocates its own.  triton-chunk takes the raw gates (computed in its prep kernel); FLA takes
log-space g and fp32 beta, FlashInfer the linear gate exp(g) and fp32 beta, both made outside
every timed region.  Clocks: CUDA events around one
eager call (median of --reps, --sets input sets rotated: cold-ish), and for triton-chunk's
default and best config and the peers the bench's kernel (CUPTI: first start to last end of a
call), graph (per call in a CUDA graph of --sets calls) and host (wall per eager call) clocks.
Errors: relative RMS (||x - ref|| / ||ref||) against float64, output and final state; a
result that fails the project gate gets no speed figure.

No new cell or config starts after --budget-s seconds (compiles included: a first run on a
cold Triton cache may leave cells out; a second run finds the kernels compiled).  The table
comes last; everything goes to $OUT/prefill_gpu.json and .log (default /tmp/out).
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():          # a smoke run of this script's logic on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gdnzoo                                              # noqa: E402
from gdnzoo import gate                                    # noqa: E402
from gdnzoo.backends import triton_chunk as tc             # noqa: E402
from gdnzoo.bench import clocks                            # noqa: E402
from lab import harness                                    # noqa: E402

F64 = torch.float64
DEV = "cuda" if torch.cuda.is_available() else "cpu"
K = V = 128                                # --head-dim (smaller only for a CPU smoke run)
SMOKE = False                              # --smoke: lengths <= 66, one q/k head (CPU)
# The sweep's candidates, in the order --configs takes them: the default first (block_v 0:
# picked from the grid), then the tile sizes around it and the other knobs.
CANDIDATES = [
    dict(),
    dict(block_v=16, warps=4), dict(block_v=32, warps=4), dict(block_v=16, v_ahead=0),
    dict(precision="bf16"), dict(precision="bf16", block_v=16, warps=4),
    dict(block_v=16, warps=4, v_ahead=0), dict(block_v=64, warps=4), dict(block_v=32),
    dict(block_v=32, v_ahead=1), dict(precision="tf32x3"),
]


# ------------------------------------------------------------------ inputs and oracle

def make(lens, H, HV, seed, io=torch.bfloat16, state_dtype=torch.float32):
    """Packed inputs on the GPU with the decode tests' magnitudes, and empty outputs."""
    if SMOKE:
        lens, H, HV = [min(n, 66) for n in lens], 1, HV // H
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    dt = torch.exp(math.log(1e-3) + math.log(100.0) * torch.rand(HV, generator=gen))
    x = dict(q=randn(T, H, K, std=K ** -0.5).to(io), k=randn(T, H, K, std=K ** -0.5).to(io),
             v=randn(T, HV, V, std=0.5).to(io), a=randn(T, HV).to(io),
             b=randn(T, HV, std=1.5).to(io),
             A_log=torch.log(1.0 + 15.0 * torch.rand(HV, generator=gen)),
             dt_bias=dt + torch.log(-torch.expm1(-dt)),
             cu=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64),
             state=randn(len(lens), HV, V, K, std=0.05).to(state_dtype))
    x = {n: t.to(DEV) for n, t in x.items()}
    x["out"] = torch.empty(T, HV, V, dtype=io, device=DEV)
    x["new_state"] = torch.empty_like(x["state"])
    return x


def lens_of(mix: str) -> list:
    """The sequence lengths of a mix: "ragged" (the bench's ragged mix), "NxL" or
    "len+len+..."."""
    if mix == "ragged":
        from bench.mode_prefill import RAGGED
        return list(RAGGED)
    if "x" in mix:
        n, L = map(int, mix.split("x"))
        return [L] * n
    return [int(s) for s in mix.split("+")]


def ab_cells(doc: str, variants, cells="4,8:1x8192", more_args=None):
    """The main of a whole-call A/B script (``doc``: its docstring): --cells "H,HV:mix;..."
    (mixes as :func:`lens_of`), --reps, --rounds, --algo, and what ``more_args(parser)`` adds;
    per cell one call of --algo (default cuda-chunk-bf16) (:func:`make`, seed 0) under each of ``variants(args)`` (name -> a
    setup returning its undo, as :func:`lab.harness.side_by_side` takes them) side by side,
    then each variant's median span over the first's."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--cells", default=cells)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algo", default="cuda-chunk-bf16")
    if more_args:
        more_args(ap)
    a = ap.parse_args()
    setups = variants(a)
    for cell in a.cells.split(";"):
        heads, mix = cell.split(":")
        H, HV = map(int, heads.split(","))
        x = make(lens_of(mix), H, HV, seed=0)
        o64, s64 = oracle(x, True)
        med = harness.side_by_side(cell, prefill_call(x, a.algo), setups, a.rounds, a.reps, o64, s64)
        first, *rest = med
        print(f"{cell}: " + ", ".join(f"{n} / {first} {med[n] / med[first]:.3f}x"
                                      for n in rest), flush=True)


def prefill_call(x, algo="cuda-chunk-bf16"):
    """A ``gdnzoo.prefill`` call of ``algo`` on :func:`make`'s inputs (the l2 norm on, from one
    copy of the state, into the inputs' out and new_state), as a closure."""
    state = x["state"].clone()

    def call():
        return gdnzoo.prefill(x["q"], x["k"], x["v"], state, x["A_log"], x["a"], x["dt_bias"],
                              x["b"], x["cu"], out=x["out"], new_state=x["new_state"],
                              use_qk_l2norm=True, algo=algo)
    return call


def gates64(x):
    """(decay g, beta) in float64."""
    sp = F.softplus(x["a"].to(F64) + x["dt_bias"].to(F64), beta=1.0, threshold=20.0)
    return torch.exp(-torch.exp(x["A_log"].to(F64)) * sp), torch.sigmoid(x["b"].to(F64))


def oracle(x, l2, init=None, gates=None, scale=None):
    """float64 token by token: outputs [T, HV, V] and final states [N, HV, V, K] (k-last);
    ``init`` [N, HV, V, K] (default x["state"]), ``gates`` (decay, beta) [T, HV]."""
    q, k, v = x["q"], x["k"], x["v"]
    H, HV = q.shape[1], v.shape[1]
    scale = q.shape[2] ** -0.5 if scale is None else scale
    qx = q.to(F64).repeat_interleave(HV // H, dim=1)
    kx = k.to(F64).repeat_interleave(HV // H, dim=1)
    if l2:
        qx = qx * torch.rsqrt((qx * qx).sum(-1, keepdim=True) + 1e-6)
        kx = kx * torch.rsqrt((kx * kx).sum(-1, keepdim=True) + 1e-6)
    g, beta = gates if gates is not None else gates64(x)
    init = x["state"] if init is None else init
    cu = x["cu"].tolist()
    out = torch.zeros(q.shape[0], HV, V, dtype=F64, device=DEV)
    final = torch.zeros(len(cu) - 1, HV, V, K, dtype=F64, device=DEV)
    for n in range(len(cu) - 1):
        S = init[n].to(F64).clone()
        for t in range(cu[n], cu[n + 1]):
            S = S * g[t, :, None, None]
            u = beta[t, :, None] * (v[t].to(F64) - torch.einsum("hvk,hk->hv", S, kx[t]))
            S = S + u[:, :, None] * kx[t, :, None, :]
            out[t] = scale * torch.einsum("hvk,hk->hv", S, qx[t])
        final[n] = S
    return out, final


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def ours(x, l2, config=None, state=None, new_state=None, **kw):
    """A call of triton-chunk on the set ``x``: destination passing into x["new_state"] unless
    ``state`` / ``new_state`` say otherwise; ``kw`` goes to :func:`tc.launch`."""
    st = x["state"] if state is None else state
    ns = x["new_state"] if new_state is None else new_state

    def call():
        tc.launch(x["q"], x["k"], x["v"], st, x["A_log"], x["a"], x["dt_bias"], x["b"], x["cu"],
                  None, x["out"], ns, l2, config=config, **kw)
    return call


def judged(lab, what, out, state, ref_out, ref_state, gated=True):
    """Gate and relative errors of one result, logged and returned (``gated`` False: a
    measurement only, its verdict not counted)."""
    j = gate.judge(out, state, ref_out, ref_state, out_dtype=out.dtype, state_dtype=state.dtype)
    row = dict(case=what, ok=j.ok, gated=gated, rel_out=j.rel_err_out,
               rel_state=j.rel_err_state, reason=j.reason)
    verdict = ("ok  " if j.ok else "FAIL") if gated else "info"
    lab.log(f"  {verdict} {what}: out {j.rel_err_out:.2e} state {j.rel_err_state:.2e} "
            f"{j.reason}")
    return row


# ------------------------------------------------------------------ (a) correctness

def dense_cases(lab):
    rows = []
    for lens, H, HV, sd, l2, inplace, io in (
            ([1, 63, 64, 65, 1000, 3000], 4, 8, torch.float32, True, False, torch.bfloat16),
            ([777, 64, 0], 4, 8, torch.bfloat16, False, True, torch.bfloat16),
            ([2048, 100], 16, 64, torch.float32, True, False, torch.bfloat16),
            ([500, 129], 2, 6, torch.float32, True, False, torch.bfloat16),
            ([300, 70], 4, 8, torch.float32, True, False, torch.float16)):
        x = make(lens, H, HV, seed=len(rows), io=io, state_dtype=sd)
        ref = oracle(x, l2)
        x["out"].fill_(float("nan"))
        dst = x["state"] if inplace else x["new_state"].fill_(float("nan"))
        ours(x, l2, new_state=dst)()
        sync()
        rows.append(judged(lab, f"{H}/{HV} lens={lens} {sd} l2={l2} "
                                f"{'in place' if inplace else 'dest'} io={io}",
                           x["out"], dst, *ref))
    x = make([1, 63, 64, 65, 1000, 3000], 4, 8, seed=10)
    ref = oracle(x, True)
    for prec in tc.PRECISIONS:
        x["out"].fill_(float("nan"))
        ours(x, True, config=dict(precision=prec))()
        sync()
        # plain tf32 products are expected over the fp32 state bound: measured, not gated
        rows.append(judged(lab, f"4/8 precision {prec}", x["out"], x["new_state"], *ref,
                           gated=prec != "tf32"))
    decay, beta = gates64(x)
    g, beta16 = torch.log(decay).float(), beta.to(torch.bfloat16)
    ref = oracle(x, True, gates=(torch.exp(g.to(F64)), beta16.to(F64)))
    ours(x, True, g=g, beta=beta16)()
    sync()
    rows.append(judged(lab, "4/8 precomputed gates", x["out"], x["new_state"], *ref))
    return rows


def pool_cases(lab):
    """A pool of 10 slots (stride(0) past a slot) read at [3, -1, 7 (= null_slot), 12 (>= P),
    0], has_initial_state [T, T, F, T, F]; in place (k-last), or into a K-first pool of 11
    slots at [5, 1, -1, 2, 9]."""
    rows = []
    lens, H, HV, P, null = [100, 5, 64, 70, 300], 4, 8, 10, 7
    read = torch.tensor([3, -1, null, 12, 0], device=DEV)
    has = torch.tensor([True, True, False, True, False], device=DEV)
    for separate in (False, True):
        x = make(lens, H, HV, seed=20 + separate)
        hv = x["v"].shape[1]
        k_first = separate
        slots = torch.randn(P, hv, V, K, device=DEV) * 0.05
        base = torch.zeros(P, hv * V * K + 64, device=DEV)
        pool = base[:, :hv * V * K].view(P, hv, V, K)
        pool.copy_(slots)
        write = torch.tensor([5, 1, -1, 2, 9], dtype=torch.int32, device=DEV) if separate \
            else read
        PN = 11 if separate else P
        if separate:
            new_kf = torch.randn(PN, hv, K, V, device=DEV) * 0.05
            pool_kf = pool.transpose(-1, -2).contiguous()
            state_arg, new_arg = pool_kf, new_kf
        else:
            state_arg = new_arg = pool
        before = new_arg.clone()
        real = [(0 <= r < P) and r != null for r in read.tolist()]
        init = torch.stack([slots[r] if ok and h else torch.zeros(hv, V, K, device=DEV)
                            for r, ok, h in zip(read.tolist(), real, has.tolist())])
        ref_out, ref_state = oracle(x, True, init=init)
        cu = x["cu"].tolist()
        for n, ok in enumerate(real):
            if not ok:
                ref_out[cu[n]:cu[n + 1]] = 0
        written = {w: n for n, (w, ok) in enumerate(zip(write.tolist(), real))
                   if ok and 0 <= w < PN and w != null}
        x["out"].fill_(float("nan"))
        ours(x, True, state=state_arg, new_state=new_arg, state_indices=read,
             new_state_indices=write if separate else None, null_slot=null,
             has_initial_state=has, k_first=k_first)()
        sync()
        kl = new_arg.transpose(-1, -2) if k_first else new_arg
        got = torch.stack([kl[w] for w in written])
        row = judged(lab, f"pool {'separate K-first' if separate else 'in place'}", x["out"],
                     got, ref_out, ref_state[list(written.values())])
        untouched = all(torch.equal(new_arg[s], before[s]) for s in range(PN) if s not in written)
        row["untouched_slots_identical"] = untouched
        if not untouched:
            row["ok"] = False
            lab.log("  FAIL a slot not written changed")
        rows.append(row)
    return rows


def graph_case(lab):
    """Capture once with cu_seqlens [0, 100, 1100, 1300]; replay with new data and cu_seqlens
    [0, 700, 710, 1300], out filled with NaN: no host sync, every element written."""
    lens_a, lens_b = [100, 1000, 200], [700, 10, 590]
    x = make(lens_a, 4, 8, seed=30)
    ws = tc.workspace_for(sum(lens_a), 8, device=DEV)
    call = ours(x, True, workspace=ws)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()                                     # compiles off the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    y = make(lens_b, 4, 8, seed=31)
    for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "cu", "state"):
        x[n].copy_(y[n])
    x["out"].fill_(float("nan"))
    x["new_state"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return [judged(lab, "CUDA graph replayed with new cu_seqlens", x["out"], x["new_state"],
                   *oracle(x, True))]


def correctness(lab):
    rows = dense_cases(lab) + pool_cases(lab) + (graph_case(lab) if DEV == "cuda" else [])
    lab.results["correctness"] = rows
    bad = [r["case"] for r in rows if not r["ok"] and r["gated"]]
    if bad:
        lab.failed.append(f"correctness: {bad}")


# ------------------------------------------------------------------ peers

def fla_call(lab, x, l2):
    """FLA's chunk_gated_delta_rule on ``x`` with its precomputed gates (log-space fp32 g, fp32
    beta, made here outside any timing): (call, result -> (out, k-last state)), or (None,
    reason)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    except Exception as e:
        return None, f"FLA not importable: {type(e).__name__}: {e}"
    v_first = "state_v_first" in inspect.signature(fn).parameters
    decay, beta = gates64(x)
    g, beta = torch.log(decay).float()[None], beta.float()[None]
    kw = dict(scale=K ** -0.5, output_final_state=True, cu_seqlens=x["cu"],
              use_qk_l2norm_in_kernel=l2)
    if v_first:
        kw.update(state_v_first=True, initial_state=x["state"])
    else:
        kw["initial_state"] = x["state"].transpose(-1, -2).contiguous()
    q, k, v = x["q"][None], x["k"][None], x["v"][None]

    def call():
        return fn(q, k, v, g, beta, **kw)

    def result(res):
        o, ht = res
        return o[0], ht if v_first else ht.transpose(-1, -2)
    return (call, result), f"g, beta precomputed; state_v_first={v_first}"


def fi_call(lab, x, l2):
    """FlashInfer's prefill chunk_gated_delta_rule on ``x`` (linear gate alpha = exp(g), fp32
    beta, made here outside any timing), writing x["out"] and x["new_state"]."""
    try:
        from flashinfer.gdn_prefill import chunk_gated_delta_rule as fn
    except Exception:
        try:
            from flashinfer import chunk_gated_delta_rule as fn
        except Exception as e:
            return None, f"FlashInfer not importable: {type(e).__name__}: {e}"
    p = inspect.signature(fn).parameters
    decay, beta = gates64(x)
    alpha, beta = decay.float(), beta.float()
    kw = dict(g=alpha, beta=beta, scale=K ** -0.5, initial_state=x["state"],
              output_final_state=True, cu_seqlens=x["cu"], use_qk_l2norm_in_kernel=l2)
    if "output" in p and "output_state" in p:
        kw.update(output=x["out"], output_state=x["new_state"])

    def call():
        return fn(x["q"], x["k"], x["v"], **kw)

    def result(res):
        return res if isinstance(res, tuple) else (x["out"], x["new_state"])
    return (call, result), "alpha = exp(g), fp32 beta precomputed"


# ------------------------------------------------------------------ (b) timing

def event_ms(calls, reps):
    """Median ms of one eager call between CUDA events, input sets rotated; the device is
    drained between calls, outside the events."""
    for c in calls:
        c()
    sync()
    ts = []
    for r in range(reps):
        if DEV != "cuda":                          # a CPU smoke run: wall clock
            t0 = time.perf_counter()
            calls[r % len(calls)]()
            ts.append((time.perf_counter() - t0) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        calls[r % len(calls)]()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def three_clocks(calls, reps, graph=True):
    """Kernel (CUPTI span), graph and host clocks in ms (None where a clock cannot run;
    ``graph`` False or a reason: not tried)."""
    def launch(i):
        calls[i % len(calls)]()
    res = {}
    if DEV != "cuda":
        return res
    try:
        s, method = clocks.kernel_times(launch, reps, warmup=2)
        res["kernel_ms"], res["kernel_method"] = statistics.median(s) / 1e3, method
        # Each launch's own duration (records in start order): where a call's time goes.
        parts, _ = clocks.kernel_times(
            launch, reps, warmup=0,
            reduce=lambda recs: tuple((e - b) / 1e3 for b, e in sorted(recs)))
        res["kernels_us"] = [round(statistics.median(p), 2) for p in zip(*parts)]
    except Exception as e:
        res["kernel_ms"], res["kernel_error"] = None, f"{type(e).__name__}: {e}"
    if graph is not True:
        res["graph_ms"], res["graph_error"] = None, f"not tried: {graph}"
    else:
        try:
            res["graph_ms"] = statistics.median(clocks.graph_times(launch, len(calls),
                                                                   reps)) / 1e3
        except Exception as e:
            res["graph_ms"], res["graph_error"] = None, f"{type(e).__name__}: {str(e)[:200]}"
    res["host_ms"] = statistics.median(clocks.host_times(launch, 5, 10, warmup=3)) / 1e3
    return res


def cell(lab, args, H, HV, N, L, deadline):
    name = f"{H}/{HV} {N}x{L}"
    sets = [make([L] * N, H, HV, seed=100 + i) for i in range(args.sets)]
    ref_out, ref_state = oracle(sets[0], True)
    rows = []

    def measure(backend, calls, result, full, graph=True):
        res = result(calls[0]())
        sync()
        # The peers round their intermediate states to bf16: the bench's bound for them.
        peer = backend in ("FLA", "FlashInfer") or "precision=bf16 " in backend
        j = gate.judge(res[0], res[1], ref_out, ref_state, out_dtype=res[0].dtype,
                       state_dtype=res[1].dtype,
                       state_tol=gate.PEER_STATE_TOL if peer else None)
        row = dict(cell=name, backend=backend, rel_out=j.rel_err_out, rel_state=j.rel_err_state)
        rows.append(row)
        if not j.ok:                               # the gate comes before any speed figure
            row["gate"] = j.reason
            lab.log(f"  {name} {backend}: FAILS THE GATE, not timed: {j.reason}")
            return row
        row["ms"] = event_ms(calls, args.reps)
        if full:
            row.update(three_clocks(calls, args.reps, graph))
        lab.log(f"  {name} {backend}: {row['ms']:.3f} ms, out {row['rel_out']:.2e}, state "
                f"{row['rel_state']:.2e}" + "".join(
                    f", {c} {row[c + '_ms']:.3f}" for c in ("kernel", "graph", "host")
                    if row.get(c + "_ms") is not None)
                + (f", launches {row['kernels_us']} us" if row.get("kernels_us") else ""))
        return row

    sweep = f"{H}/{HV}" in args.sweep_geoms.split(",")
    cands = json.loads(args.config_list) if args.config_list else CANDIDATES
    cands = cands[:args.configs] if sweep else cands[:1]
    mine = []
    for cfg in cands:
        if time.time() > deadline:
            lab.log(f"  {name}: time budget spent, configs left out")
            break
        resolved = tc.resolve(cfg, N, HV, V, torch.device(DEV))
        calls = [ours(x, True, config=resolved) for x in sets]
        label = "triton-chunk " + ("default " if not cfg else "") + " ".join(
            f"{k}={v}" for k, v in resolved._asdict().items())
        try:
            row = measure(label, calls, lambda _r, x=sets[0]: (x["out"], x["new_state"]),
                          full=not cfg)
            row["config"] = resolved._asdict()
            if "ms" in row:
                mine.append(row)
        except Exception as e:
            lab.log(f"  {name} {label}: ERROR {type(e).__name__}: {e}")
    if len(mine) > 1:
        best = min(mine, key=lambda r: r["ms"])
        if "host_ms" not in best and time.time() < deadline:      # the default has its clocks
            calls = [ours(x, True, config=best["config"]) for x in sets]
            best.update(three_clocks(calls, args.reps))
        best["best"] = True
    for peer, make_call in (("FLA", fla_call), ("FlashInfer", fi_call)):
        if peer.lower() not in args.peers.lower().split(",") or time.time() > deadline:
            continue
        made = [make_call(lab, x, True) for x in sets]
        if made[0][0] is None:
            lab.log(f"  {name} {peer}: {made[0][1]}")
            rows.append(dict(cell=name, backend=peer, skipped=made[0][1]))
            continue
        # FLA reads cu_seqlens on the host inside its call: no capture (a failed one can leave
        # the context unusable for the cells after it).
        graph = True if peer == "FlashInfer" else "FLA syncs the host on cu_seqlens"
        try:
            measure(peer, [m[0][0] for m in made], made[0][0][1], full=True,
                    graph=graph)["gates"] = made[0][1]
        except Exception as e:
            lab.log(f"  {name} {peer}: ERROR {type(e).__name__}: {str(e)[:300]}")
            rows.append(dict(cell=name, backend=peer, error=f"{type(e).__name__}: {e}"))
    del sets
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return rows


def timing(lab, args, t0):
    deadline = t0 + args.budget_s
    rows = []
    for geom in args.geoms.split(","):
        H, HV = map(int, geom.split("/"))
        for spec in args.seqs.split(","):
            N, L = map(int, spec.split("x"))
            if time.time() > deadline:
                lab.log(f"{geom} {spec}: time budget spent, left out")
                continue
            rows += lab.part(f"cell {geom} {spec}", cell, lab, args, H, HV, N, L, deadline) or []
    lab.results["timing"] = rows
    return rows


def table(lab, rows):
    lab.log("\ncell              backend                     ms    x FI   kernel  graph   host"
            "    out err   state err")
    fi = {r["cell"]: r["ms"] for r in rows if r["backend"] == "FlashInfer" and "ms" in r}
    for r in rows:
        if "ms" not in r:
            why = r.get("skipped") or r.get("error") or f"FAILS THE GATE: {r.get('gate')}"
            lab.log(f"{r['cell']:<17} {r['backend'][:40]:<24} {why}")
            continue
        if "config" in r and not (r["backend"].startswith("triton-chunk default") or r.get("best")):
            continue
        name = r["backend"] if "config" not in r else (
            "triton-chunk " + ("default" if "default" in r["backend"] else "best") + " "
            + "/".join(str(r["config"][k]) for k in ("block_v", "warps", "stages")))
        rel = f"{r['ms'] / fi[r['cell']]:.2f}" if r["cell"] in fi else "  -"
        clk = "".join(f" {r[c]:6.3f}" if r.get(c) is not None else "      -"
                      for c in ("kernel_ms", "graph_ms", "host_ms"))
        lab.log(f"{r['cell']:<17} {name:<24} {r['ms']:7.3f} {rel:>6} {clk}  "
                f"{r['rel_out']:.2e}  {r['rel_state']:.2e}")


def main(lab, args):
    global K, V, SMOKE
    K = V = args.head_dim
    SMOKE = args.smoke
    t0 = time.time()
    where = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (Triton interpreter)"
    lab.log(f"triton-chunk on {where}, torch {torch.__version__}")
    if not args.skip_correctness:
        lab.part("correctness", correctness, lab)
    rows = timing(lab, args, t0)
    table(lab, rows)
    lab.log(f"total {time.time() - t0:.0f} s")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--geoms", default="4/8,16/32,16/64,2/8", help="H/HV list")
    p.add_argument("--seqs", default="1x8192,8x1024,16x256", help="N x L list")
    p.add_argument("--sweep-geoms", default="4/8,16/64",
                   help="geometries whose cells time --configs candidates (else the default)")
    p.add_argument("--configs", type=int, default=5, help=f"candidates (of {len(CANDIDATES)})")
    p.add_argument("--config-list", default="",
                   help="JSON list of configs to sweep instead of the built-in candidates")
    p.add_argument("--peers", default="fla,flashinfer", help="fla, flashinfer, or none")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sets", type=int, default=3, help="input sets rotated")
    p.add_argument("--budget-s", type=float, default=320.0,
                   help="no new cell or config after this many seconds")
    p.add_argument("--skip-correctness", action="store_true")
    p.add_argument("--head-dim", type=int, default=128, help="K = V (smaller: CPU smoke runs)")
    p.add_argument("--smoke", action="store_true",
                   help="lengths cut to 66 and one q/k head: the script's logic on CPU")
    return p.parse_args(argv)


if __name__ == "__main__":
    _args = parse()
    harness.run("prefill_gpu", lambda lab: main(lab, _args))

"""What a prefill call's forms cost: gdnzoo.prefill on one cell with the state k-last or K-first
and the gates raw (A_log, a, dt_bias, b) or precomputed (FLA's g = log decay in fp32 and beta
after the sigmoid in the io dtype), each against its own float64 oracle (relative RMS of the
outputs and the final states) and then timed on the kernel clock (CUPTI: a call's records,
first start to last end, the sum of their durations -- the bench's kernel clock -- and their
count), the four forms of one entry in turn over rounds, medians and each form's busy time
over k-last raw's.  Dense, one fp32 state a sequence, destination passing (the state read
cold is not the point here: one input set).

    python -m lab.prefill_forms --algo cuda-chunk-bf16,cuda-chunk \\
        --cells 4/8:1x8192,4/8:8x1024,16/32:8x1024
    python -m lab.prefill_forms --smoke          # the logic on CPU (triton-chunk, tiny, no clock)
"""
from __future__ import annotations

import argparse
import statistics

import torch

import gdnzoo
from lab import prefill_gpu as pg
from lab.wgmma_chain import parse

FORMS = ("k-last raw", "k-first raw", "k-last g/beta", "k-first g/beta")


def form_call(x, form: str, algo: str, refs: dict):
    """(call, (reference outputs, final states k-last), k_first) of one form on the set x;
    ``refs`` keeps the oracle's results by gate form."""
    k_first = form.startswith("k-first")
    decay, beta64 = pg.gates64(x)
    if form.endswith("g/beta"):
        g = torch.log(decay).float()
        beta = beta64.to(x["q"].dtype)
        gates = dict(g=g, beta=beta)
        ref = refs.get("g/beta") or refs.setdefault("g/beta", pg.oracle(
            x, True, gates=(torch.exp(g.double()), beta.double())))
    else:
        gates = dict(A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"])
        ref = refs.get("raw") or refs.setdefault("raw", pg.oracle(x, True))
    state = x["state"].transpose(-1, -2).contiguous() if k_first else x["state"]
    new_state = torch.empty_like(state)
    layout = "k-first" if k_first else "k-last"

    def call(i=0):
        return gdnzoo.prefill(x["q"], x["k"], x["v"], state, cu_seqlens=x["cu"], **gates,
                              out=x["out"], new_state=new_state, use_qk_l2norm=True,
                              state_layout=layout, algo=algo)
    return call, ref, k_first


def errors(call, ref, k_first):
    out, new = call()
    new = new.transpose(-1, -2) if k_first else new
    rel = lambda a, b: float((a.double() - b).norm() / b.norm().clamp_min(1e-30))
    return rel(out, ref[0]), rel(new, ref[1]), bool(torch.isnan(out).any() or torch.isnan(new).any())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", default="cuda-chunk-bf16,cuda-chunk")
    ap.add_argument("--cells", default="4/8:1x8192,4/8:8x1024,16/32:8x1024",
                    help="H/HV:NxL (N sequences of L tokens) or H/HV:L+L+..., comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10, help="calls a form a round")
    ap.add_argument("--smoke", action="store_true", help="CPU: triton-chunk, tiny cells, no clock")
    a = ap.parse_args(argv)
    if a.smoke:
        pg.SMOKE, pg.K, pg.V = True, 64, 64
        a.algo, a.cells = "triton-chunk", "1/2:20+0+70"
    from gdnzoo.bench.clocks import busy_and_count, kernel_times
    for cell in a.cells.split(","):
        H, HV, lens = parse(cell)
        x, refs = pg.make(lens, H, HV, seed=0), {}
        for algo in a.algo.split(","):
            calls, line = {}, []
            for form in FORMS:
                call, ref, kf = form_call(x, form, algo, refs)
                eo, es, nan = errors(call, ref, kf)
                line.append(f"{form}: out {eo:.3e} state {es:.3e}{' NAN' if nan else ''}")
                calls[form] = call
            print(f"{cell} {algo} errors | " + " | ".join(line), flush=True)
            if a.smoke:
                continue
            span = {f: [] for f in FORMS}
            busy = {f: [] for f in FORMS}
            count = {}
            for _ in range(a.rounds):
                for f in FORMS:
                    s, _ = kernel_times(calls[f], a.reps)
                    b, _ = kernel_times(calls[f], a.reps, reduce=busy_and_count)
                    span[f] += s
                    busy[f] += [t for t, _ in b]
                    count[f] = {n for _, n in b}
            base = statistics.median(busy[FORMS[0]])
            print(f"{cell} {algo} kernel clock (span / busy us, launches, busy vs k-last raw): "
                  + " | ".join(f"{f} {statistics.median(span[f]):.1f} / "
                               f"{statistics.median(busy[f]):.1f}, "
                               f"{'/'.join(map(str, sorted(count[f])))}, "
                               f"{statistics.median(busy[f]) / base:.3f}x" for f in FORMS),
                  flush=True)


if __name__ == "__main__":
    main()

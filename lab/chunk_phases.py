"""A prototype: triton-chunk's prep kernel beside its sequential kernel, for one long sequence.

Why: at 4/8 heads one sequence's sequential kernel runs 64 programs on an H200's 132 SMs, and
the prep kernel (68 us of 409 at 1 x 8192; about 266 of 768 at 16/32) runs before it on all of
them (lab/notebook/h200/chunk_ablate_2026-11-29.log).

How, with the product's two kernels unchanged: cut the sequence into P phases at chunk
boundaries; phase p's prep runs on a side stream while phase p - 1's sequential kernel runs,
and phase p's sequential kernel waits (an event) for its prep and carries the state on from
phase p - 1 (in place in ``new_state``).  A phase is a one-sequence call whose cu_seqlens is
[start, end) of the phase: both kernels address the workspace by token, so each phase writes
and reads its own rows.  Results are bit-identical to one triton-chunk call (same chunks,
same arithmetic); what may change is only when the kernels run.

Not in the product.  From the repository root:

    TRITON_INTERPRET=1 python -m lab.chunk_phases --check     # CPU: bit-identical to one call
    python -m lab.chunk_phases --check --time                 # GPU: also CUDA events and graphs
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdnzoo.backends import _triton_launch as tlaunch          # noqa: E402
from gdnzoo.backends import triton_chunk as tc                 # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def phase_bounds(L: int, P: int, C: int) -> list:
    """[(start, end)] of P phases of a sequence of L tokens, cut at chunk boundaries (fewer
    when there are fewer chunks)."""
    nc = -(-L // C)
    per = -(-nc // P) if nc else 0
    return [(j * C, min((j + per) * C, L)) for j in range(0, nc, per)] if nc else []


class Phased:
    """Launches of one sequence in phases: cu_seqlens tensors made once (a CUDA graph may
    capture a call), two streams on the GPU."""

    def __init__(self, x, P: int, config=None, l2: bool = True):
        cu = x["cu"].tolist()
        assert len(cu) == 2 and cu[0] == 0, "one sequence only"
        self.x, self.l2 = x, l2
        q, v = x["q"], x["v"]
        self.c = tc.resolve(config, 1, v.shape[1], v.shape[2], q.device)
        self.bounds = phase_bounds(cu[1], P, self.c.chunk)
        self.cus = [torch.tensor([a, b], dtype=x["cu"].dtype, device=q.device)
                    for a, b in self.bounds]
        gpu = q.device.type == "cuda"
        self.side = torch.cuda.Stream() if gpu else None
        self.ready = [torch.cuda.Event() for _ in self.bounds] if gpu else []

    def __call__(self):
        x, c = self.x, self.c
        q, k, v = x["q"], x["k"], x["v"]
        T, H, K = q.shape
        HV = v.shape[1]
        scale = 1.0 / math.sqrt(K)
        _, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                          x["b"], None, None)
        mats, vecs = tc._workspace(None, max(T, 1), HV, c, q.device)
        main = torch.cuda.current_stream() if self.side is not None else None
        if main is not None:
            self.side.wait_stream(main)              # the inputs are ready before any prep
        for i, cu in enumerate(self.cus):
            # the prep of phase i on the side stream, the state carried on in new_state
            if main is not None:
                torch.cuda.set_stream(self.side)
            tc.launch_prep(q, k, ga, gb, A_log, dt_bias, cu, mats, vecs, scale, self.l2, 0, c)
            if main is not None:
                self.ready[i].record(self.side)
                torch.cuda.set_stream(main)
                main.wait_event(self.ready[i])
            tc.launch_state(q, k, v, cu, mats, vecs, x["out"],
                            x["state"] if i == 0 else x["new_state"], x["new_state"], c)


def one_call(x, l2=True):
    tc.launch(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"], x["b"],
              x["cu"], None, x["out"], x["new_state"], l2)


def check():
    from lab.prefill_gpu import make
    import lab.prefill_gpu as pg
    if DEV == "cpu":
        pg.K = pg.V = 64
    cases = [([200], 1, 2), ([64], 2, 4), ([1], 1, 1), ([130], 1, 3)]
    if DEV == "cuda":
        cases += [([8192], 4, 8), ([8192], 16, 32)]
    for lens, H, HV in cases:
        x = make(lens, H, HV, seed=len(lens) + lens[0])
        one_call(x)
        want = x["out"].clone(), x["new_state"].clone()
        for P in (1, 2, 3, 4):
            x["out"].fill_(float("nan"))
            x["new_state"].fill_(float("nan"))
            Phased(x, P)()
            if DEV == "cuda":
                torch.cuda.synchronize()
            same = torch.equal(x["out"], want[0]) and torch.equal(x["new_state"], want[1])
            print(f"lens {lens} H/HV {H}/{HV} P={P}: "
                  f"{'bit-identical' if same else 'DIFFERS'} to one call", flush=True)
            assert same


def time_cells(cells, phases, reps):
    """Median of one eager call between CUDA events (both streams joined;
    ``lab.prefill_gpu.event_ms``) and per call in a CUDA graph of 10 calls (the bench's graph
    clock, ``clocks.graph_times``); triton-chunk's own call first."""
    from gdnzoo.bench import clocks
    from lab.prefill_gpu import event_ms, make
    for cell in cells:
        geom, L = cell.split(":")
        H, HV = map(int, geom.split("/"))
        x = make([int(L)], H, HV, seed=0)
        runs = [("triton-chunk", lambda: one_call(x))]
        runs += [(f"phases P={P}", Phased(x, P)) for P in phases]
        for name, fn in runs:
            eager = event_ms([fn], reps) * 1e3
            graph = statistics.median(clocks.graph_times(lambda i: fn(), 10, 5))
            print(f"{cell:12s} {name:14s} eager (events) {eager:8.1f} us   graph "
                  f"{graph:8.1f} us", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--cells", default="4/8:8192,4/8:32768,16/32:8192,2/8:8192")
    ap.add_argument("--phases", default="2,4,8")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if a.check or not a.time:
        check()
    if a.time:
        time_cells(a.cells.split(","), [int(p) for p in a.phases.split(",")], a.reps)


if __name__ == "__main__":
    main()

"""An experiment, not in the product: can triton-chunk's prep kernel hide under its sequential
kernel on the SMs a long sequence leaves idle?

At 4/8 heads and one long sequence the sequential kernel runs 64 programs (one an SM) for
~266 us on an H200 while 68 SMs idle; the prep kernel, 68 us alone on all SMs, runs before it.
Here the two run side by side on two streams, each on its own valid workspace (the sequential
kernel on workspace A, filled once; the prep kernel of the same inputs into workspace B), so
the pair's wall time says what a kernel that overlaps them (prep workers beside the chains,
flags per chunk) could reach, before anyone writes one.  Timed with CUDA events around each
rep on the calling stream (medians of 20): the two one after another, then side by side with
the sequential kernel launched first and last.

    python -m lab.chunk_overlap --cells 4/8:1x8192,4/8:1x32768,2/8:1x8192    # a GPU
"""
from __future__ import annotations

import argparse

import torch

from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from lab import prefill_gpu as pg
from lab.harness import event_median_us


def cell(H, HV, N, L):
    x = pg.make([L] * N, H, HV, seed=0)
    T, V = x["q"].shape[0], x["v"].shape[2]
    c = tc.resolve(None, N, HV, V, x["q"].device, tokens=T)
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                          x["b"], None, None)
    scale = x["q"].shape[2] ** -0.5
    ws = [tc.workspace_for(T, HV, c) for _ in range(2)]
    (ma, va), (mb, vb) = (tc._workspace(w, T, HV, c, x["q"].device) for w in ws)

    def prep(m, v):
        tc.launch_prep(x["q"], x["k"], ga, gb, A_log, dt_bias, x["cu"], m, v, scale, True,
                       gates, c)

    def state():
        tc.launch_state(x["q"], x["k"], x["v"], x["cu"], ma, va, x["out"], x["state"],
                        x["new_state"], c)
    prep(ma, va)
    main = torch.cuda.current_stream()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def side_by_side(state_first):
        s1.wait_stream(main)
        s2.wait_stream(main)
        order = [(s1, state), (s2, lambda: prep(mb, vb))]
        for s, fn in (order if state_first else order[::-1]):
            with torch.cuda.stream(s):
                fn()
        main.wait_stream(s1)
        main.wait_stream(s2)
    runs = {"prep alone": lambda: prep(mb, vb), "state alone": state,
            "one after another": lambda: (prep(mb, vb), state()),
            "side by side, state first": lambda: side_by_side(True),
            "side by side, prep first": lambda: side_by_side(False)}
    t = {name: event_median_us(fn, 20) for name, fn in runs.items()}
    programs = N * HV * (V // c.block_v)
    return t, c, programs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default="4/8:1x8192,4/8:1x32768,2/8:1x8192")
    a = p.parse_args(argv)
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    for spec in a.cells.split(","):
        geom, mix = spec.split(":")
        H, HV = map(int, geom.split("/"))
        N, L = map(int, mix.split("x"))
        t, c, programs = cell(H, HV, N, L)
        print(f"{spec}: sequential programs {programs} on {n_sm} SMs (block_v {c.block_v}, "
              f"{c.warps} warps, segments {c.segments})", flush=True)
        for name, us in t.items():
            print(f"  {name:28s} {us:8.1f} us", flush=True)


if __name__ == "__main__":
    main()

"""Whether torch.profiler's kernel clock still links its GPU records to their iterations after
a cupti-python session in the same process (tests/test_clocks_gpu.py's torch.profiler
reference failed so on an H200: "iteration 0 launched no GPU activity (200 GPU records: 11
launched outside every iteration, ...)").  Runs the sessions in the order given, each on a
1-element add, and prints per session: iterations without a record, records outside every
window, records whose link to a launch is missing, and where the GPU records' starts lie
against the iteration windows (the two clocks' bases).

    python -m lab.clock_interplay torch,cupti,torch     # one process, sessions in this order
"""
from __future__ import annotations

import argparse

import torch

from gdnzoo.bench import clocks


def torch_session(launch, iters):
    from torch.profiler import ProfilerActivity, profile, record_function
    tag = "gdnzoo_iter_"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            torch.cuda.synchronize()
            with record_function(f"{tag}{i}"):
                launch(i)
        torch.cuda.synchronize()
    windows, launch_of, gpu = clocks._profiler_records(prof.profiler.kineto_results.events(), tag)
    w = [windows[i] for i in sorted(windows)]
    per, dropped = clocks._group(w, launch_of, gpu)
    unlinked = sum(1 for *_, c in gpu if launch_of.get(c) is None)
    starts = sorted(s for s, _, _ in gpu)
    inside = sum(1 for s in starts if w[0][0] <= s <= w[-1][1] + 1_000_000)
    print(f"  torch.profiler: {len(w)} windows {w[0][0]}..{w[-1][1]}, {len(gpu)} GPU records "
          f"{starts[0] if starts else '-'}..{starts[-1] if starts else '-'} ({inside} starting "
          f"inside the windows' span), unlinked {unlinked}, outside every window {dropped}, "
          f"empty iterations {sum(not r for r in per)}, with more than one "
          f"{sum(len(r) > 1 for r in per)}")


def cupti_session(launch, iters):
    samples, method = clocks.kernel_times(launch, iters)
    print(f"  {method}: {len(samples)} samples, median {sorted(samples)[len(samples) // 2]:.2f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("order", help="comma-separated sessions: torch, cupti")
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    x = torch.zeros(1, device="cuda")
    launch = lambda i: x.add_(1.0)      # noqa: E731
    for _ in range(5):
        launch(0)
    torch.cuda.synchronize()
    for s in a.order.split(","):
        print(f"session {s}:")
        try:
            (torch_session if s == "torch" else cupti_session)(launch, a.iters)
        except Exception as e:
            print(f"  raised {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()

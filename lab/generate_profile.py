"""Where one prefill of lab.models_gpu's generate() goes (a random-init Qwen3.5-shaped model,
gdnzoo.integrations.transformers enabled): generate() of one new token after --prompt tokens at
batch --batch, its wall time over --reps calls, each gdnzoo.prefill call's wall time (synced
around it), then torch.profiler over one call: the CPU ops and the GPU kernels with the most
time.  On a GPU, from the repository root (no FLA needed):

    python -m lab.generate_profile --batch 1 --prompt 2048
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import gdnzoo
from gdnzoo.integrations import transformers as hook
from lab.models_gpu import qwen35_shaped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--head-dim", dest="head_dim", type=int, default=128)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--algos", default="auto,cuda-chunk,triton-chunk,cuda-chunk-bf16",
                    help="the prefill's backend in the synced runs (auto: the hook's choice)")
    a = ap.parse_args()
    a.new = 2
    model = qwen35_shaped(a)
    ids = torch.randint(0, a.vocab, (a.batch, a.prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0))
    real, spent = gdnzoo.prefill, []

    def timed(algo):
        def prefill(*args, **kw):
            if algo != "auto":
                kw["algo"] = algo
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = real(*args, **kw)
            torch.cuda.synchronize()
            spent.append((time.perf_counter() - t0) * 1e3)
            return out
        return prefill

    def gen():
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        torch.cuda.synchronize()

    for mode in ["gdnzoo"] + [f"{x}, prefill synced" for x in a.algos.split(",")]:
        hook.enable()
        if mode.endswith("synced"):
            gdnzoo.prefill = timed(mode.split(",")[0])
        try:
            gen()
            gen()
            walls = []
            for _ in range(a.reps):
                spent.clear()
                t0 = time.perf_counter()
                gen()
                walls.append((time.perf_counter() - t0) * 1e3)
            print(f"{mode}: generate(1) {statistics.median(walls):.2f} ms (min {min(walls):.2f})"
                  + (f"; gdnzoo.prefill calls {', '.join(f'{t:.2f}' for t in spent)} ms"
                     if spent else ""), flush=True)
        finally:
            gdnzoo.prefill = real
            hook.disable()
    hook.enable()
    try:
        gen()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            gen()
    finally:
        hook.disable()
    avg = prof.key_averages()
    print(avg.table(sort_by="cpu_time_total", row_limit=a.top, max_name_column_width=60))
    print(avg.table(sort_by="self_cuda_time_total", row_limit=a.top, max_name_column_width=60))


if __name__ == "__main__":
    main()

"""The kernel clock's two CUPTI readers beside CUDA events, on one prefill call.

``python3 -m lab.clock_probe``: triton-chunk's prefill (4/8, 1x8192 and 64x64, fp32 state)
timed by CUDA events around each call, by bench.clocks' torch.profiler reader (before and after a
cupti-python session) and by its cupti-python reader when that imports; then one profiled call's
GPU records as torch.profiler reports them inside a marker, as the reader makes them (name,
duration, correlation).  It asks whether the torch.profiler fallback reads the same times as the
others (an H200 without cupti-python read triton-chunk's prefill about 2.1x slower than the
committed cupti-python run: the marker's GPU annotation was summed with the kernels).
"""
from __future__ import annotations

import statistics

import torch

import gdnzoo
from gdnzoo.bench import clocks
from gdnzoo.inputs import make_prefill_inputs


def events_us(call, iters=30):
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        call()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def dump_records(call):
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("gdnzoo_iter_0"):
            call()
        torch.cuda.synchronize()
    for ev in prof.profiler.kineto_results.events():
        if ev.device_type() == torch.autograd.DeviceType.CUDA:
            print(f"    gpu  {ev.name()[:60]:60s} {(ev.end_ns() - ev.start_ns()) / 1e3:9.2f} us "
                  f"corr {ev.linked_correlation_id()}")
    for row in prof.key_averages():
        if row.device_time_total:
            print(f"    avg  {row.key[:60]:60s} device {row.device_time_total:9.2f} us "
                  f"x{row.count}")


def main():
    ok, why = clocks.cupti_python_available()
    print("cupti-python:", ok, why)
    for lens in ([8192], [64] * 64):
        x = make_prefill_inputs(lens, H=4, HV=8, device="cuda", seed=0)
        fn = gdnzoo.get("triton-chunk", op="prefill")

        def call():
            fn(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
               use_qk_l2norm=True)
        for _ in range(5):
            call()
        def show(label, samples):
            print(f"  {label}: busy {statistics.median(s[0] for s in samples):.1f} us, "
                  f"records {statistics.median(s[1] for s in samples)}")
        print(f"{len(lens)}x{lens[0]}: events {events_us(call):.1f} us")
        show("torch.profiler (first)", clocks._kernel_times_torch_profiler(
            lambda i: call(), 30, 0, clocks.busy_and_count)[0])
        if ok:
            t, m = clocks.kernel_times(lambda i: call(), 30, reduce=clocks.busy_and_count)
            show(m, t)
            show("torch.profiler (after)", clocks._kernel_times_torch_profiler(
                lambda i: call(), 30, 0, clocks.busy_and_count)[0])
        dump_records(call)


if __name__ == "__main__":
    main()

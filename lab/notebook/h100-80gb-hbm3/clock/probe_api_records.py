"""Options against the callback's host cost: builtin callback; no API records (attribution by time)."""
import statistics, time, torch
from cupti import cupti
from gdnzoo.bench import clocks
x = torch.zeros(1, device="cuda")
def one(i): x.add_(1.0)
def two(i): x.add_(1.0); x.add_(1.0)
def builtin(c):
    c.activity_register_timestamp_callback(time.perf_counter_ns)
    return time.perf_counter_ns, ""
def coarse(c): return c.get_timestamp, ""

def noapi(launch, iters, start):
    K = cupti.ActivityKind
    gpu = []
    def req(): return 8 * 1024 * 1024, 0
    def done(acts):
        for a in acts:
            if a.kind == K.CONCURRENT_KERNEL: gpu.append((a.start, a.end, None))
    base = time.perf_counter_ns()
    now = lambda: time.perf_counter_ns() - base
    clocks._detach_cupti(cupti)
    cupti.activity_register_timestamp_callback(now)
    cupti.activity_register_callbacks(req, done)
    cupti.activity_enable(K.CONCURRENT_KERNEL)
    wins = []
    for i in range(iters):
        torch.cuda.synchronize(); t0 = now(); launch(start + i); wins.append((t0, now()))
    torch.cuda.synchronize(); cupti.activity_flush_all(1)
    cupti.activity_disable(K.CONCURRENT_KERNEL); cupti.finalize()
    # by time: each record to the last window starting before it
    per = [[] for _ in wins]; import bisect
    st = [w[0] for w in wins]
    for s, e, _ in gpu: per[bisect.bisect_right(st, s) - 1].append((s, e))
    bad = sum(1 for p in per if not p)
    lat = statistics.median(min(s for s, _ in p) - w[0] for p, w in zip(per, wins) if p)
    return [clocks.span_us(p) for p in per if p], bad, lat

for name, fn in (("one", one), ("two", two)):
    for meth, patch in (("fine", None), ("builtin", builtin), ("coarse", coarse)):
        orig = clocks._fine_timestamps
        if patch: clocks._fine_timestamps = patch
        try: t, m = clocks.kernel_times(fn, 300)
        finally: clocks._fine_timestamps = orig
        print(f"{name} {meth:8s} span {statistics.median(t):.3f} us {m}", flush=True)
    fn(0); torch.cuda.synchronize()
    t, bad, lat = noapi(fn, 300, 0)
    print(f"{name} noapi    span {statistics.median(t):.3f} us  empty windows {bad}  launch->start median {lat} ns", flush=True)
    t = clocks._kernel_times_torch_profiler(fn, 300, 0)
    print(f"{name} torchprf span {statistics.median(t):.3f} us", flush=True)

"""The three clocks against work of known cost, on a GPU.

Reference times come from a separate method: CUDA events around many back-to-back launches,
synchronized once at the end (the per-launch overhead vanishes in the average).

Run this file alone on its GPU, never beside other test processes (pytest -n): contexts of
several processes time-slice the GPU, and a 50 us spin kernel's wall time read 159 us a call
under `pytest -n 8` on an H200 (2026-11-30), against 53 alone.
"""
import pytest
import torch

from gdnzoo.bench import clocks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _events_us(fn, n):
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / n


@pytest.fixture(scope="module")
def sleep50():
    """(cycles, us) of a torch.cuda._sleep kernel calibrated to about 50 us."""
    c = 100_000
    for _ in range(3):
        t = _events_us(lambda: torch.cuda._sleep(c), 50)
        c = int(c * 50.0 / t)
    return c, _events_us(lambda: torch.cuda._sleep(c), 200)


def _med(xs):
    return clocks.summarize(xs)["median"]


def test_kernel_clock_spin_kernel(sleep50):
    c, ref = sleep50
    t, method = clocks.kernel_times(lambda i: torch.cuda._sleep(c), 50)
    assert _med(t) == pytest.approx(ref, rel=0.10), method


def test_kernel_clock_torch_profiler_path(sleep50):
    c, ref = sleep50
    torch.cuda._sleep(c)
    torch.cuda.synchronize()
    t, _ = clocks._kernel_times_torch_profiler(lambda i: torch.cuda._sleep(c), 30, 0)
    assert _med(t) == pytest.approx(ref, rel=0.10)


def test_torch_profiler_path_sums_only_the_kernels(sleep50):
    """Its iteration marker's GPU annotation is not counted as a record of the call."""
    c, ref = sleep50

    def two(i):
        torch.cuda._sleep(c)
        torch.cuda._sleep(c)
    got, _ = clocks._kernel_times_torch_profiler(two, 30, 0, clocks.busy_and_count)
    assert {n for _, n in got} == {2}
    assert _med([t for t, _ in got]) == pytest.approx(2 * ref, rel=0.10)


def test_kernel_clock_counts_every_kernel_of_a_call(sleep50):
    c, ref = sleep50

    def two(i):
        torch.cuda._sleep(c)
        torch.cuda._sleep(c)
    t, _ = clocks.kernel_times(two, 30)
    assert _med(t) == pytest.approx(2 * ref, rel=0.10)


def test_kernel_clock_after_torch_profiler(sleep50):
    """A torch.profiler session leaves a TSC timestamp callback in CUPTI: ours must not read it."""
    c, ref = sleep50
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        torch.cuda._sleep(c)
        torch.cuda.synchronize()

    def two(i):
        torch.cuda._sleep(c)
        torch.cuda._sleep(c)
    t, method = clocks.kernel_times(two, 30)
    assert _med(t) == pytest.approx(2 * ref, rel=0.10), method
    t, method = clocks.kernel_times(lambda i: torch.cuda._sleep(c), 30)
    assert _med(t) == pytest.approx(ref, rel=0.10), method


def _gcd_ns(samples_us):
    import math
    g = 0
    for x in samples_us:
        g = math.gcd(g, round(x * 1000))
    return g


def test_kernel_clock_resolves_as_finely_as_torch_profiler():
    """A 1 us kernel's samples are not all on a coarse grid (CUPTI's own REALTIME-sized stamps
    came in 256 ns steps on an H100 host): the kernel clock resolves at least as finely as
    torch.profiler's, whose timestamp callback keeps small numbers too."""
    ok, why = clocks.cupti_python_available()
    if not ok:
        pytest.skip(f"the kernel clock is torch.profiler's own here (cupti-python: {why})")
    x = torch.zeros(1, device="cuda")
    ours, method = clocks.kernel_times(lambda i: x.add_(1.0), 200)
    theirs, _ = clocks._kernel_times_torch_profiler(lambda i: x.add_(1.0), 200, 0)
    assert _gcd_ns(ours) <= max(_gcd_ns(theirs), 32), (method, sorted(set(ours))[:8])


def test_graph_clock_spin_kernel(sleep50):
    c, ref = sleep50
    t = clocks.graph_times(lambda i: torch.cuda._sleep(c), 40, 5)
    assert _med(t) == pytest.approx(ref, rel=0.10)


def test_host_clock_long_batches_are_gpu_bound(sleep50):
    """Batches of 100 calls of a 50 us kernel: wall time per call is the kernel's time."""
    c, ref = sleep50
    t = clocks.host_times(lambda i: torch.cuda._sleep(c), batches=10, per_batch=100, warmup=4000)
    assert _med(t) == pytest.approx(ref, rel=0.10)


def test_host_clock_synchronized_batches_read_the_gpu(sleep50):
    """The bench's host clock (synchronized batches of 10, no warm-up to fill the queue): a
    50 us kernel reads its GPU time, plus at most one dispatch spread over the batch."""
    c, ref = sleep50
    t = clocks.host_times(lambda i: torch.cuda._sleep(c), batches=5, per_batch=10, warmup=2)
    assert _med(t) == pytest.approx(ref, rel=0.15)


def test_kernel_clock_tiny_kernel_has_no_sync_inside():
    """A tiny kernel's CUPTI time is GPU time (near its in-graph time), not launch + sync time."""
    x = torch.zeros(1, device="cuda")
    t, _ = clocks.kernel_times(lambda i: x.add_(1.0), 50)
    g = clocks.graph_times(lambda i: x.add_(1.0), 200, 5)
    assert _med(t) < 10.0
    assert _med(t) < _med(g) + 3.0


def test_copy_bandwidth_two_methods():
    """CUPTI time of a copy of known bytes vs CUDA events over many copies (bandwidth within 10%)."""
    from gdnzoo.bench import floor
    n = 256 << 20
    cb = floor.copy_bandwidth(n, iters=20)
    src = torch.empty(n // 4, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ev = 2 * n / (_events_us(lambda: dst.copy_(src), 30) * 1e-6) / 1e9
    assert cb["gbps"] == pytest.approx(ev, rel=0.10)


def test_floor_between_half_and_full_copy_bandwidth():
    from gdnzoo.bench import floor
    cb = floor.copy_bandwidth()
    set_bytes = 64 << 20
    f = floor.floor_times(set_bytes, iters=30)
    gbps = 2 * set_bytes / (_med(f["samples"]) * 1e-6) / 1e9
    assert 0.5 * cb["gbps"] < gbps < 1.15 * cb["gbps"], f["config"]
    assert f["n_sets"] * set_bytes >= 4 * clocks.l2_bytes()


def test_floor_kernel_reads_and_writes():
    """Every launch shape the search tries really rewrites every element (x -> 2x + 1)."""
    from gdnzoo.bench import floor
    if not floor.cupy_available()[0]:
        pytest.skip("cupy not installed")
    n = (1 << 20) + 4                      # not a multiple of any block: tails are covered
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe = clocks.Rotation(torch.zeros(n, device="cuda"), count=1)
    cfgs, dropped = floor.search_configs(n // 4, sms, probe=probe)
    # __launch_bounds__(block) per instantiation: every (vpt, block) pair fits the register file.
    assert not dropped, dropped
    assert {(v, b) for v, b, _ in cfgs} == {(v, b) for v in floor.VPTS for b in floor.BLOCKS}
    for cfg in cfgs:
        rot = clocks.Rotation(torch.randint(-8, 8, (n,), device="cuda").float(), count=1)
        x = rot.states[0]
        y = 2 * x + 1
        floor._launcher(rot, cfg, alpha=2.0, beta=1.0)(0)
        torch.cuda.synchronize()
        assert torch.equal(x, y), cfg

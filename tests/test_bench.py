"""The benchmark on CPU: the dense mode's files, the one table and console, tune's table logic,
rotation counts, the options every mode shares (refused before anything is measured)."""
import argparse
import csv
import dataclasses
import difflib
import json
import math
import shutil
from pathlib import Path
import time

import pytest
import torch
import yaml

from gdnzoo.bench import clocks, console, mode_dense, pipeline, plots, report, tune
from gdnzoo.bench.report import read_results
from helpers import bench_args, bench_plan, bench_run, run_cli

MIB = 1 << 20


def _args(tmp_path, *extra):
    return bench_args("--algo", "pt-reference", "--batch", "1,2", "--heads", "1,2", "--dim", "16",
                      "--iters", "10", "--device", "cpu", "--no-plots", "--quiet",
                      "--out", str(tmp_path / "out"), *extra)


def _rows(args):
    return bench_run(args)[1]


# ------------------------------------------------------------------------------ rotation

@pytest.mark.parametrize("set_bytes", [1, 4096, 512 * 1024, 3 * MIB, 50 * MIB, 256 * MIB, 1 << 33])
def test_rotation_covers_four_l2(set_bytes):
    l2 = 50 * MIB
    n = clocks.rotation_count(set_bytes, l2, max_sets=1 << 40)
    assert n >= 2
    assert n * set_bytes >= 4 * l2
    assert n == 2 or (n - 1) * set_bytes < 4 * l2          # no more sets than needed


def test_rotation_examples():
    l2 = 50 * MIB
    assert clocks.rotation_count(512 * 1024, l2) == 400      # B=1 fp32 contest state
    assert clocks.rotation_count(256 * MIB, l2) == 2         # B=512 fp32: two sets suffice
    assert clocks.rotation_count(4096, 0) == 2               # CPU: still alternate
    assert clocks.rotation_count(1, l2, max_sets=64) == 64
    with pytest.raises(ValueError):
        clocks.rotation_count(0, l2)


def test_summarize():
    s = clocks.summarize([5, 1, 4, 2, 3, 6, 7, 8, 9, 10])
    assert s["median"] == 5.5 and s["n"] == 10
    assert s["p20"] == pytest.approx(2.8) and s["p80"] == pytest.approx(8.2)
    assert math.isnan(clocks.summarize([])["median"])


def test_host_clock_cpu_counts_calls():
    calls = []
    t = clocks.host_times(lambda i: calls.append(i), batches=4, per_batch=5, warmup=2)
    assert len(t) == 4 and all(x >= 0 for x in t)
    assert calls == list(range(22))                          # call ids keep rotating


def test_host_clock_warms_up_for_the_given_time():
    """The batches start once ``warm_s`` has passed, whatever a call takes (a loaded machine
    may make one sleep of 0.2 ms last the whole 10 ms: a count of calls would not say it)."""
    stamps = []
    t0 = time.perf_counter()
    t = clocks.host_times(lambda i: (stamps.append((i, time.perf_counter())), time.sleep(2e-4)),
                          batches=2, per_batch=3, warmup=1, warm_s=0.01)
    ids = [i for i, _ in stamps]
    assert len(t) == 2 and len(ids) >= 1 + 6 and ids == list(range(len(ids)))
    assert stamps[-6][1] - t0 >= 0.01            # the first timed call, after the warm-up


@pytest.mark.parametrize("call_us, per, nb", [
    (3.0, 100, 5),        # dispatch-bound B=1: the GPU part spread over 100 calls
    (21.0, 48, 5),        # about 1 ms a batch
    (194.0, 10, 20),      # GPU-bound: iters (200) / 10 calls a batch
    (3000.0, 10, 5),      # a prefill call: CELL_SECONDS allow 5 batches of 10
])
def test_host_clock_batches(call_us, per, nb):
    from gdnzoo.bench.pipeline import host_batches
    assert host_batches(call_us, 200) == (per, nb)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_kernel_clock_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        clocks.kernel_times(lambda i: None, 3)


def test_spans_group_by_launch_window():
    windows = [(0, 10), (100, 110)]
    launch_of = {1: 5, 2: 6, 3: 105}
    gpu = [(20, 30, 1), (31, 50, 2), (120, 125, 3)]          # ns
    assert clocks._spans(windows, launch_of, gpu)[0] == [pytest.approx(0.030),
                                                         pytest.approx(0.005)]
    with pytest.raises(RuntimeError, match="no GPU activity"):
        clocks._spans(windows, launch_of, gpu[:2])[0]


def test_profiler_spans_drop_a_rare_lost_record_and_say_so():
    """torch.profiler now and then links no record to one call of hundreds; an unlinked record
    then lands in the window before its start.  Up to 2% of the iterations may come back empty:
    they and the iterations holding extra records are dropped, and the note counts both."""
    n = 100
    windows = [(1000 * i, 1000 * i + 100) for i in range(n)]
    launch_of = {i: 1000 * i + 5 for i in range(n)}
    gpu = [(1000 * i + 10, 1000 * i + 10 + 7 + i % 3, i) for i in range(n)]
    want = clocks._spans(windows, launch_of, gpu)[0]
    got, note = clocks._spans(windows, launch_of, gpu, lose=clocks.LOST_SHARE)
    assert got == want and note == ""
    lost = list(gpu)
    lost[40] = (39_990, 39_997, -1)            # unlinked, started inside window 39
    got, note = clocks._spans(windows, launch_of, lost, lose=clocks.LOST_SHARE)
    assert got == [w for i, w in enumerate(want) if i not in (39, 40)]
    assert note == " (1 of 100 iterations without a record and 1 with more than 1 dropped)"
    with pytest.raises(RuntimeError, match="iteration 40 launched no GPU activity"):
        clocks._spans(windows, launch_of, lost)[0]
    three = [r for i, r in enumerate(gpu) if i not in (10, 20, 30)]        # 3% lost: an error
    with pytest.raises(RuntimeError, match="iteration 10 launched no GPU activity"):
        clocks._spans(windows, launch_of, three, lose=clocks.LOST_SHARE)
    with pytest.raises(RuntimeError, match="no GPU activity"):            # a CPU backend
        clocks._spans(windows, launch_of, [], lose=clocks.LOST_SHARE)


def test_profiler_spans_mislinked_records_go_by_their_start():
    """Links that point at other launches (a torch.profiler session after a cupti-python one in
    the same process) leave iterations empty and others doubled; each iteration drains before
    the next, so the records' starts assign them, and the note says so.  Where the starts do
    not give every iteration its share either, the links' grouping stands (and its error)."""
    n = 50
    windows = [(1000 * i, 1000 * i + 100) for i in range(n)]
    launch_of = {i: 1000 * i + 5 for i in range(n)}
    gpu = [(1000 * i + 300, 1000 * i + 310 + i % 3, i) for i in range(n)]
    want = clocks._spans(windows, launch_of, gpu)[0]
    # records 10..20 linked to the launch of the iteration after theirs (20's to 21's)
    mislinked = [(s, e, c + 1 if 10 <= c <= 20 else c) for s, e, c in gpu]
    got, note = clocks._spans(windows, launch_of, mislinked)
    assert got == want
    assert note == " (1 of 50 iterations linked to no record: every record assigned by its start)"
    twice = mislinked + [(30_400, 30_450, -1)]           # unlinked, a second in iteration 30
    with pytest.raises(RuntimeError, match="iteration 10 launched no GPU activity"):
        clocks._spans(windows, launch_of, twice)


class _Ev:
    """A torch.profiler (Kineto) event stand-in."""

    def __init__(self, name, cuda, start, end, corr=0, linked=0):
        self._v = (name, cuda, start, end, corr, linked)

    def name(self):
        return self._v[0]

    def device_type(self):
        return torch.autograd.DeviceType.CUDA if self._v[1] else torch.autograd.DeviceType.CPU

    def start_ns(self):
        return self._v[2]

    def end_ns(self):
        return self._v[3]

    def correlation_id(self):
        return self._v[4]

    def linked_correlation_id(self):
        return self._v[5]


def test_profiler_records_leave_out_the_markers_gpu_copy():
    """torch.profiler reports an iteration marker on the GPU too (a user annotation spanning the
    call's kernels); summed with them it doubled a call's kernel time."""
    tag = "gdnzoo_iter_"
    events = [_Ev(tag + "0", False, 0, 10), _Ev("launch", False, 2, 3, corr=7),
              _Ev("launch", False, 4, 5, corr=8),
              _Ev(tag + "0", True, 20, 60),                            # the GPU annotation
              _Ev("prep", True, 20, 30, linked=7), _Ev("state", True, 31, 60, linked=8)]
    windows, launch_of, gpu = clocks._profiler_records(events, tag)
    assert windows == {0: (0, 10)} and launch_of == {7: 2, 8: 4}
    assert gpu == [(20, 30, 7), (31, 60, 8)]
    got = clocks._spans([windows[0]], launch_of, gpu, clocks.busy_and_count)[0]
    assert got == [(pytest.approx(0.039), 2)]


class _FakeCupti:
    """CUPTI stand-in whose timestamps run ``ticks_per_ns`` times faster than ns (a TSC callback)."""

    class ActivityKind:
        CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME, DRIVER = range(5)

    class _Rec:
        def __init__(self, kind, start, end, corr):
            self.kind, self.start, self.end, self.correlation_id = kind, start, end, corr

    def __init__(self, ticks_per_ns, kernel_ns, finalize_resets=False):
        import time
        self.time, self.rate, self.kernel_ns = time, ticks_per_ns, kernel_ns
        self.finalize_resets, self.recs, self.corr, self.finalized = finalize_resets, [], 0, 0

    def get_timestamp(self):
        return int(self.time.perf_counter_ns() * self.rate)

    def finalize(self):
        self.finalized += 1
        if self.finalize_resets:
            self.rate = 1.0

    def activity_register_callbacks(self, req, done):
        self.done = done

    def activity_enable(self, k):
        pass

    def activity_disable(self, k):
        pass

    def _host_ns(self, stamp):                # a timestamp back to host nanoseconds
        return stamp / self.rate

    def _stamp(self, ns):                      # host nanoseconds as a timestamp
        return int(ns * self.rate)

    def launch(self, i):                       # an API call, then one kernel of kernel_ns
        K = self.ActivityKind
        self.corr += 1
        t = self.get_timestamp()
        self.recs.append(self._Rec(K.RUNTIME, t, t + 10, self.corr))
        g = self._host_ns(t) + 2000 + 7        # the kernel starts 2 us after its launch call
        self.recs.append(self._Rec(K.CONCURRENT_KERNEL, self._stamp(g),
                                   self._stamp(g + self.kernel_ns), self.corr))

    def activity_flush_all(self, flag):
        self.done(self.recs)


@pytest.mark.parametrize("rate,resets", [(1.0, False), (2.07, False), (2.07, True)])
def test_kernel_clock_timestamp_unit(rate, resets):
    """CUPTI records in TSC ticks (left behind by torch.profiler) still give microseconds."""
    import time
    fake = _FakeCupti(rate, kernel_ns=100_000, finalize_resets=resets)

    def sync():
        time.sleep(2e-4)                       # a drain long enough to make the session >= ms
    t, note = clocks._kernel_times_cupti(fake.launch, 20, 0, cupti=fake, sync=sync)
    assert len(t) == 20 and all(x == pytest.approx(100.0, rel=0.01) for x in t)
    assert fake.finalized >= 2                 # detached before (foreign callbacks) and after
    assert ("rescaled" in note) == (rate != 1.0 and not resets)


def test_kernel_clock_keeps_the_untimed_step_out():
    """What ``prepare`` launches between two calls (after one call's drain, before the next
    call's launch) belongs to no call: a 1 ms copy there must not reach the samples."""
    import time
    fake = _FakeCupti(1.0, kernel_ns=100_000)

    def prepare(i):
        t = fake.get_timestamp()
        fake.recs.append(fake._Rec(fake.ActivityKind.MEMCPY, t + 100, t + 1_000_100, 0))

    def sync():
        time.sleep(2e-4)
    t, _ = clocks._kernel_times_cupti(fake.launch, 10, 0, cupti=fake, sync=sync,
                                      prepare=prepare)
    assert len(t) == 10 and all(x == pytest.approx(100.0, rel=0.01) for x in t)


class _FakeCuptiRealtime(_FakeCupti):
    """CUPTI stand-in whose own timestamps are CLOCK_REALTIME-sized nanoseconds passed through a
    double (256 ns steps), unless a timestamp callback is registered: then every timestamp is
    the callback's, as CUPTI does.  ``accept=False``: the registration fails."""

    def __init__(self, kernel_ns, accept=True):
        super().__init__(1.0, kernel_ns)
        self.cb, self.accept, self.realtime0 = None, accept, 1_800_000_000_000_000_000

    def activity_register_timestamp_callback(self, f):
        if not self.accept:
            raise RuntimeError("CUPTI_ERROR_NOT_COMPATIBLE")
        self.cb = f

    def finalize(self):
        super().finalize()
        self.cb = None                         # cuptiFinalize forgets the callback

    def _host_ns(self, stamp):
        return stamp - self.realtime0 if self.cb is None else stamp

    def _stamp(self, ns):
        return int(float(self.realtime0 + ns)) if self.cb is None else ns

    def get_timestamp(self):
        return self.cb() if self.cb else self._stamp(self.time.perf_counter_ns())


@pytest.mark.parametrize("accept", [True, False])
def test_kernel_clock_registers_a_small_timestamp_clock(accept):
    """The session's own ns clock keeps a 1000 ns kernel at 1000 ns; CUPTI's REALTIME-sized
    timestamps (a double's 256 ns steps) would read it as 768 or 1024, and the note says so."""
    import time
    fake = _FakeCuptiRealtime(kernel_ns=1000, accept=accept)

    def sync():
        time.sleep(2e-4)
    t, note = clocks._kernel_times_cupti(fake.launch, 30, 0, cupti=fake, sync=sync)
    assert len(t) == 30
    if accept:
        assert all(x == pytest.approx(1.0, abs=1e-9) for x in t) and note == ""
        assert fake.cb is None                 # finalized after the session
    else:
        assert all(round(x * 1000) % 256 == 0 for x in t) and "256 ns" in note


def test_floor_search_skips_unlaunchable_shapes(monkeypatch):
    """Shapes the kernel's attributes rule out, or whose probe launch fails, are dropped with a note."""
    from gdnzoo.bench import floor
    monkeypatch.setattr(floor, "launchable", lambda v, b: (False, f"x{v}/{b}: too many registers")
                        if (v, b) == (8, 1024) else (True, ""))
    cfgs, notes = floor.search_configs(1 << 20, 132)
    assert cfgs and all((v, b) != (8, 1024) for v, b, _ in cfgs)
    assert notes == ["x8/1024: too many registers"]

    def launcher(rot, cfg):
        def launch(i):
            if cfg[:2] == (4, 512):
                raise RuntimeError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
        return launch
    monkeypatch.setattr(floor, "_launcher", launcher)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    kept, notes = floor.search_configs(1 << 20, 132, probe=object())
    assert kept and all(c[:2] != (4, 512) for c in kept)
    assert len(kept) == len(cfgs) - sum(c[:2] == (4, 512) for c in cfgs)
    assert any("OUT_OF_RESOURCES" in n for n in notes)


def test_interleaved_times_follow_the_launches_not_positions(monkeypatch):
    """Warm-up launches precede the timed ones; samples must still go to who ran them."""
    ran = []

    def fake_kernel_times(launch, iters, warmup=3, start=0):
        for i in range(warmup):
            launch(start + i)
        ran.clear()
        for i in range(iters):
            launch(start + warmup + i)
        return [10.0 * who for who in ran], "fake"

    def make(j):
        def launch(i):
            ran.append(j)
        return launch
    monkeypatch.setattr(clocks, "kernel_times", fake_kernel_times)
    per, method = clocks.interleaved_kernel_times([make(j) for j in range(5)], reps=4)
    assert method == "fake" and [len(s) for s in per] == [4] * 5
    assert all(set(s) == {10.0 * j} for j, s in enumerate(per))


def test_ns_per_tick():
    assert clocks.ns_per_tick((0, 0), (1_000_000, 1_000_000)) == 1.0
    assert clocks.ns_per_tick((0, 0), (1_000_000, 1_005_000)) == 1.0      # within tolerance
    assert clocks.ns_per_tick((0, 5), (1_000_000, 2_070_005)) == pytest.approx(1 / 2.07)
    assert clocks.ns_per_tick((0, 0), (0, 0)) == 1.0


# ------------------------------------------------------------------------------ the sweep

def test_sweep_cpu_writes_files(tmp_path, capsys):
    args = _args(tmp_path, "--state-dtype", "fp32,bf16", "--mode", "inplace,dest")
    assert pipeline.cmd_bench(args) == 0
    out = tmp_path / "out"
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == report.COLUMNS
    assert len(rows) == 2 * 2 * 2 * 3                       # B x dtype x mode x clock
    host = [r for r in rows if r["clock"] == "host"]
    assert all(r["status"] == "PASS" and float(r["median_us"]) > 0 for r in host)
    assert all(float(r["max_abs_err_out"]) < 1e-2 for r in host)
    assert all(float(r["speedup_vs_ref"]) == 1.0 for r in host)
    other = [r for r in rows if r["clock"] != "host"]
    assert all(r["median_us"] == "" and "no CUDA" in r["note"] for r in other)
    doc = json.loads((out / "results.json").read_text())
    assert doc["columns"] == report.COLUMNS and len(doc["rows"]) == len(rows)
    env = doc["environment"]
    assert {"gpu", "driver", "cuda", "date", "commit", "method", "versions"} <= set(env)
    assert "torch" in env["versions"] and "cold" in env["method"].lower()
    text = capsys.readouterr().out
    assert "| Algorithm" in text and "host clock" in text and "skipped" in text
    assert {r["bench"] for r in rows} == {"dense", "dest"}
    assert all(r["auto"] == "pt-reference" and float(r["auto_vs_best"]) == 1.0 for r in host)


def test_sweep_fails_a_wrong_backend_and_times_nothing(tmp_path, monkeypatch):
    from gdnzoo import dispatch, registry
    from gdnzoo.backends import pt_reference as ref

    def broken(call, *, config=None):
        call.out.fill_(1.0)                                   # garbage, far beyond the tolerance
        call.new_state.copy_(call.state)

    registry.runner.cache_clear()
    monkeypatch.setattr(dispatch, "_MEMO", {})                # decode's memo of resolved runners
    monkeypatch.setattr(ref, "run", broken)
    try:
        rows = _rows(_args(tmp_path))
    finally:
        registry.runner.cache_clear()
    assert rows and all(r["status"] == "FAIL" for r in rows)
    assert all(not r.get("samples") for r in rows)
    assert "elements off" in rows[0]["note"]


def test_k_first_state_runs_gated_and_says_so(tmp_path):
    """--state-layout k-first: every cell's state K-first, gated against the k-last reference;
    the run says so, and a backend that reads it as k-last fails the gate."""
    plan, rows, _ = bench_run(_args(tmp_path, "--mode", "dense,dest", "--state-layout",
                                    "k-first"))
    host = [r for r in rows if r["clock"] == "host"]
    assert len(host) == 4 and all(r["status"] == "PASS" for r in host)
    assert any("K-first" in n for n in plan.notes) and plan.layout == "k-first"
    assert plan.mode.problem(rows[0]["cell"], plan).k_first


def test_k_first_gate_catches_a_layout_ignored():
    import gdnzoo
    from gdnzoo import gate
    from gdnzoo.bench.entries import k_first_call
    from gdnzoo.inputs import make_inputs
    x = make_inputs(B=2, H=1, HV=2, K=16, V=16, seed=3)

    def ignores_layout(*a, state_layout, **kw):          # a K-first state read as k-last
        return gdnzoo.decode(*a, **kw, algo="pt-reference")

    def writes_its_input(q, k, v, state, *rest, new_state, **kw):
        o, n = gdnzoo.decode(q, k, v, state, *rest, new_state=new_state, **kw)
        state.add_(1.0)                                      # destination passing, input changed
        return o, n
    for dest in (False, True):
        ok, _, _ = gate.gated_call(k_first_call(gdnzoo.get("pt-reference")), x, dest=dest)
        bad, _, _ = gate.gated_call(k_first_call(ignores_layout), x, dest=dest)
        assert ok.ok and not bad.ok
    bad, _, _ = gate.gated_call(k_first_call(writes_its_input), x, dest=True)
    assert not bad.ok and "state: modified" in bad.reason


def test_k_first_state_is_for_dense_and_dest_only(capsys):
    with pytest.raises(SystemExit) as e:
        bench_plan("--mode", "pool", "--state-layout", "k-first")
    assert e.value.code == 2 and "--state-layout" in capsys.readouterr().err


def _corrupt(kind):
    """A pt-reference run that computes the right thing, then breaks one part of it."""
    from gdnzoo.backends import pt_reference as ref
    orig = ref.run

    def run(call, *, config=None):
        out, new_state = call.out, call.new_state
        old = call.state.clone()
        orig(call, config=config)
        if kind == "zero-out":
            out.zero_()
        elif kind == "skip-state":
            new_state.copy_(old)
        elif kind == "out-5pct":                 # every element within the contest rule's atol
            out.mul_(0.95)
        elif kind == "state-rounded":            # fp32 state kept at bf16 precision only
            new_state.copy_(new_state.to(torch.bfloat16).to(new_state.dtype))
    return run


@pytest.mark.parametrize("kind,mode", [("zero-out", "inplace"), ("skip-state", "inplace"),
                                       ("skip-state", "dest"), ("out-5pct", "inplace"),
                                       ("state-rounded", "inplace")])
def test_sweep_gate_needs_relative_error_too(tmp_path, monkeypatch, kind, mode):
    from gdnzoo import dispatch, registry
    from gdnzoo.backends import pt_reference as ref
    registry.runner.cache_clear()
    monkeypatch.setattr(dispatch, "_MEMO", {})
    monkeypatch.setattr(ref, "run", _corrupt(kind))
    try:
        rows = _rows(_args(tmp_path, "--mode", mode))
    finally:
        registry.runner.cache_clear()
    assert rows and all(r["status"] == "FAIL" for r in rows)
    assert all(not r.get("samples") for r in rows)
    what = "out" if kind in ("zero-out", "out-5pct") else "new_state"
    assert all(f"{what}: " in r["note"] for r in rows)
    assert all(r["rel_err_out" if what == "out" else "rel_err_state"] > 1e-4 for r in rows)
    if kind in ("out-5pct", "state-rounded"):
        # The contest rule alone passes these: only the relative error catches them.
        assert all("relative error" in r["note"] for r in rows)
        assert all(r["n_bad"] == 0 for r in rows)


def test_sweep_reports_relative_errors(tmp_path):
    plan, rows, _ = bench_run(_args(tmp_path, "--state-dtype", "fp32,bf16"))
    for r in rows:
        assert r["status"] == "PASS", r["note"]
        assert 0 <= r["rel_err_out"] < 1e-2
        assert 0 <= r["rel_err_state"] < (1e-4 if r["cell"].state_dtype == "fp32" else 8e-3)
    table = report.build_table(rows, None, plan)
    assert all(math.isfinite(t["rel_err_out"]) and math.isfinite(t["rel_err_state"]) for t in table)


def test_relative_error_and_strict_tol():
    from gdnzoo.gate import STRICT_TOL, relative_error, strict_tol
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert relative_error(y, y) == 0.0
    assert relative_error(torch.zeros(2), y) == 1.0
    assert relative_error(torch.tensor([3.0, 4.5]), y) == pytest.approx(0.1)
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.ones(2), torch.zeros(2)) == math.inf
    assert not relative_error(torch.tensor([float("nan"), 4.0]), y) < 1.0
    assert strict_tol("out") == STRICT_TOL["out"] == 1e-2
    assert strict_tol("state", torch.float32) == 1e-4 and strict_tol("state", torch.bfloat16) == 8e-3
    with pytest.raises(ValueError):
        strict_tol("state", torch.float16)


@pytest.mark.parametrize("algo", ["nope", "all,nope", "pt-reference,nope"])
def test_unknown_algo_lists_names(tmp_path, capsys, algo):
    with pytest.raises(SystemExit) as e:
        bench_run(_args(tmp_path, "--algo", algo))
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "--algo: unknown backend(s) nope; valid: " in err and "pt-reference" in err


def test_bytes_moved_contest_b1():
    c = bench_plan("--algo", "pt-reference").cell("x", "inplace", 1, "fp32")
    assert pipeline.get_mode("dense").bytes_moved(c) == (
        2 * 8 * 128 * 128 * 4 + 2 * 4 * 128 * 2 + 2 * 8 * 128 * 2 + 2 * 8 * 2 + 2 * 8 * 4)


# ------------------------------------------------------------------------------ report

PLAN = None


def _plan():
    global PLAN
    PLAN = PLAN or bench_plan("--algo", "pt-reference", "--state-dtype", "fp32,bf16")
    return PLAN


def _raw(backend, B, us, clock="kernel", status="PASS", sd="fp32", flags="", mode="inplace", T=1,
         auto=""):
    return dict(cell=_plan().cell(backend, mode, B, sd, T=T), clock=clock, status=status, note="",
                flags=flags, samples=[us] * 5 if us else [], auto=auto)


def _table(raw, ref=None):
    return report.build_table(raw, ref, _plan())


def _synthetic():
    raw = [_raw("floor", 1, 2.0), _raw("floor", 64, 20.0),
           _raw("pt-reference", 1, 100.0), _raw("pt-reference", 64, 400.0),
           _raw("fi-baseline", 1, 4.0), _raw("fi-baseline", 64, 26.0),
           _raw("fla-recurrent", 1, 2.5), _raw("fla-recurrent", 64, 24.0),
           _raw("cuda-v1", 1, None, status="FAIL"), _raw("cuda-v1", 64, None, status="FAIL")]
    return _table(raw, {"copy": {"gbps": 3000.0}})


def test_derived_columns():
    rows = {(r["backend"], r["B"]): r for r in _synthetic()}
    r = rows[("fla-recurrent", 1)]
    assert r["speedup_vs_ref"] == pytest.approx(40.0)
    assert r["speedup_vs_fi"] == pytest.approx(1.6)
    assert r["x_floor"] == pytest.approx(1.25)
    assert r["pct_copy_bw"] == pytest.approx(100 * r["bytes_moved"] / 2.5 / 1e3 / 3000.0)
    assert math.isnan(rows[("cuda-v1", 1)]["median_us"])
    assert rows[("floor", 1)]["bytes_moved"] == 2 * 8 * 128 * 128 * 4


def test_published_table_and_grid():
    rows = _synthetic()
    t = mode_dense.published(rows, 1, "fp32", "inplace", "kernel")
    assert t[0].split("|")[1:5] == [" Algorithm     ", " Median (us) ", " Speedup ", " vs FlashInfer "]
    body = [ln.split("|")[1].strip() for ln in t[2:]]
    assert body == ["fla-recurrent", "fi-baseline", "pt-reference", "cuda-v1"]   # fastest first
    assert "40.00x" in t[2] and "1.60x" in t[2] and "FAIL" in t[5]
    g = console.grid([r for r in rows if r["state_dtype"] == "fp32"])
    assert g[0].split() == ["B", "floor", "pt-reference", "fi-baseline", "fla-recurrent",
                            "cuda-v1", "auto", "auto/best"]
    assert g[1].split()[:5] == ["1", "2.00", "100/50.00x", "4.00/2.00x", "2.50/1.25x"]
    assert g[1].split()[5] == "FAIL" and g[2].split()[0] == "64"
    env = dict(gpu="G", driver="d", cuda="c", versions={"torch": "t"}, commit=None,
               device_reference={"copy": {"gbps": 3000.0}, "empty_kernel": {"us": 0.9}},
               kernel_clock="cupti")
    text = console.render(rows, env, _plan())
    assert len(text.splitlines()) < 60 and "3.00 TB/s" in text and "FAIL cuda-v1" in text


def test_auto_against_the_best_entry_of_each_cell():
    """Per cell (B, state dtype, form, clock): the automatic choice's time over the fastest
    entry's of the same run; the choice is the ``auto`` entry where a mode has one, else the
    backend it names; the floor is no entry."""
    raw = [_raw("floor", 1, 1.0, auto=""), _raw("cuda-v4", 1, 3.0, auto="cuda-v4"),
           _raw("fla-recurrent", 1, 2.4, auto="cuda-v4"),
           _raw("cuda-v4", 4, 3.0, auto="cuda-v4"), _raw("fla-recurrent", 4, 3.3, auto="cuda-v4"),
           _raw("cuda-v4", 16, None, status="FAIL", auto="cuda-v4"),
           _raw("fla-recurrent", 16, 5.0, auto="cuda-v4")]
    t = {(r["backend"], r["B"]): r for r in _table(raw)}
    assert t[("cuda-v4", 1)]["auto_vs_best"] == pytest.approx(1.25)
    assert t[("fla-recurrent", 1)]["auto_vs_best"] == pytest.approx(1.25)     # one per cell
    assert t[("cuda-v4", 4)]["auto_vs_best"] == pytest.approx(1.0)
    assert math.isnan(t[("fla-recurrent", 16)]["auto_vs_best"])               # choice failed
    assert math.isnan(t[("floor", 1)]["auto_vs_best"])
    g = console.grid(list(t.values()))
    assert g[1].split()[-2:] == ["cuda-v4", "1.25x"] and g[3].split()[-2:] == ["cuda-v4", "-"]
    pool = pipeline.get_mode("pool")
    plan = bench_plan("--mode", "pool", "--algo", "cuda-v4")
    cells = [plan.cell(n, "pool", 1, "fp32") for n in ("floor", "auto", "cuda-v4", "adapter-vllm")]
    raw = [dict(cell=c, clock="kernel", status="PASS", samples=[us], auto="cuda-v4")
           for c, us in zip(cells, (1.0, 2.2, 2.0, 2.1))]
    t = report.build_table(raw, None, plan)
    assert pool.name == "pool" and {round(r["auto_vs_best"], 3) for r in t[1:]} == {1.1}


def test_auto_against_the_best_entry_held_to_its_bound():
    """A prefill cell: entries judged with the peers' state bound (``rounds_state``: FlashInfer,
    FLA, triton-chunk-bf16) and an engine's own sequence (``not_rivals``) are no rivals of the
    automatic choice, however fast; the entries held to its bound are."""
    mode = pipeline.get_mode("engine-prefill")
    assert mode.op == "prefill" and "engine" in mode.not_rivals

    def row(name, us):
        return dict(backend=name, B=1, T=64, H=4, HV=8, K=128, V=128, state_dtype="fp32",
                    mode="vllm", l2norm=False, clock="kernel", status="PASS", median_us=us,
                    mix="1x64", auto="triton-chunk")
    rows = [row(n, us) for n, us in (("engine", 1.0), ("fi-baseline", 1.5), ("fla-upstream", 1.8),
                                     ("triton-chunk-bf16", 2.0), ("auto", 3.3),
                                     ("triton-chunk", 3.0), ("pt-reference", 90.0))]
    report.derive(rows, mode)
    assert {round(r["auto_vs_best"], 3) for r in rows} == {1.1}
    # the console says which entries its best left out, and why
    out = console.left_out(rows, mode)
    assert len(out) == 2 and out[0].startswith("auto/best leaves out engine: the engine's own")
    assert out[1].startswith("auto/best leaves out fi-baseline, fla-upstream, "
                             "triton-chunk-bf16: rounds") and "triton-chunk," not in out[1]
    assert console.left_out(rows, pipeline.get_mode("prefill"))[0].startswith(
        "auto/best leaves out fi-baseline")                # decode-style modes: no engine


def test_gpu_slug():
    assert report.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert report.gpu_slug("cpu") == "cpu"


# ------------------------------------------------------------------------------ tune

def test_merge_ranges():
    assert tune.merge_ranges({1: "a", 4: "a", 8: "b", 16: "b", 32: "a"}) == [
        (1, 7, "a"), (8, 31, "b"), (32, None, "a")]
    assert tune.merge_ranges({4: "a"}) == [(1, None, "a")]
    assert tune.merge_ranges({}) == []


def test_fastest_skips_failed_and_flattered():
    rows = _synthetic()
    rows += _table([_raw("fla-upstream", 1, 1.0, flags="warm write target")])
    f = tune.fastest(rows, "fp32")
    assert f[1][0] == ("fla-recurrent", 2.5)
    assert all(n not in ("floor", "cuda-v1", "fla-upstream") for v in f.values() for n, _ in v)
    row = tune.make_row("NVIDIA H100 80GB HBM3", rows, commit="abc", versions={"torch": "x"})
    assert row["table"] == {"fp32": [(1, None, "fla-recurrent")]}
    assert row["provenance"]["values_us"]["fp32"][1]["fla-recurrent"] == 2.5
    at = {(r["H"], r["HV"], r["K"], r["V"]) for r in rows}
    assert len(at) == 1 and tuple(row["measured_at"].values()) == at.pop()
    assert "geometry H={H} HV={HV} K={K} V={V}, T=1".format(**row["measured_at"]) \
        in row["provenance"]["how"]
    other = [dict(r, HV=2 * r["HV"]) if r["B"] == 64 else r for r in rows]
    with pytest.raises(ValueError, match="one geometry"):
        tune.make_row("G", other)


def test_registry_row_written_text_preserving(tmp_path):
    from gdnzoo.registry import parse_registry, registry_path
    src = registry_path()
    reg = tmp_path / "registry.yaml"
    shutil.copy(src, reg)
    before = reg.read_text()
    row = dict(gpu="NVIDIA TEST-GPU 1GB", provenance=dict(how="test", measured="today"),
               measured_at=dict(H=16, HV=32, K=128, V=128),
               table={"fp32": [(1, 7, "cuda-v4"), (8, None, "fla-recurrent")],
                      "bf16": [(1, None, "fi-baseline")]})
    tune.write_registry(reg, row)
    once = reg.read_text()
    r = parse_registry(yaml.safe_load(once))
    h100 = [d for d in r.op("decode").defaults if d.gpu == "NVIDIA TEST-GPU 1GB"]
    assert len(h100) == 1 and h100[0].table["fp32"] == [(1, 7, "cuda-v4"), (8, None, "fla-recurrent")]
    assert h100[0].measured_at == row["measured_at"]
    assert tune.existing_row(reg, row["gpu"])["measured_at"] == row["measured_at"]
    ops = difflib.SequenceMatcher(a=before.splitlines(), b=once.splitlines()).get_opcodes()
    assert {op[0] for op in ops} == {"equal", "insert"}                      # only added lines
    row["table"] = {"fp32": [(1, None, "cuda-v1")]}
    tune.write_registry(reg, row)                                            # replace, not append
    twice = reg.read_text()
    r = parse_registry(yaml.safe_load(twice))
    assert [d.table for d in r.op("decode").defaults if d.gpu == row["gpu"]] == [{"fp32": [(1, None, "cuda-v1")]}]
    assert twice == tune.replace_row(before, row)                            # replaced in place
    assert len(r.op("decode").defaults) == len(parse_registry(yaml.safe_load(before)).op("decode").defaults) + 1
    bad = dict(row, table={"fp32": [(1, None, "no-such-backend")]})
    with pytest.raises(ValueError):
        tune.write_registry(reg, bad)
    assert reg.read_text() == twice                                          # untouched on error


def _write_run(d, raw, commit, date="2026-01-02T03:04:05+00:00", torch_v="2.11"):
    rows = _table(raw, {"copy": {"gbps": 3000.0}})
    env = dict(gpu="NVIDIA H100 80GB HBM3", driver="d", cuda="13.0", date=date, commit=commit,
               method="m", notes=[], versions={"torch": torch_v, "triton": None})
    report.write_results(rows, env, d)
    return d / "results.json"


def test_results_json_round_trip(tmp_path):
    rows = _synthetic()
    env = dict(gpu="G", date="2026-01-01", commit="c", versions={})
    report.write_results(rows, env, tmp_path)
    back, env2 = report.read_results(tmp_path / "results.json")
    assert env2["gpu"] == "G" and len(back) == len(rows)
    for a, b in zip(rows, back):
        assert set(b) == set(report.COLUMNS)
        for k in report.COLUMNS:
            if isinstance(a[k], float) and math.isnan(a[k]):
                assert b[k] is None or math.isnan(b[k])
            else:
                assert b[k] == a[k], k


def test_tune_from_results_files_writes_registry(tmp_path, capsys):
    from gdnzoo.registry import parse_registry, registry_path
    f32 = _write_run(tmp_path / "fp32", [_raw("floor", 1, 2.0), _raw("cuda-v4", 1, 3.0),
                                          _raw("fla-recurrent", 1, 3.5), _raw("cuda-v4", 64, 30.0),
                                          _raw("fla-recurrent", 64, 25.0)], "abc123")
    b16 = _write_run(tmp_path / "bf16", [_raw("fi-baseline", 1, 2.0, sd="bf16"),
                                          _raw("cuda-v1", 1, None, status="FAIL", sd="bf16")],
                     "abc123", date="2026-01-03T00:00:00+00:00")
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry_path(), reg)
    p = tune.add_tune_args(argparse.ArgumentParser())
    args = p.parse_args(["--from", str(f32), "--from", str(b16), "--write-registry",
                         "--registry", str(reg)])
    assert tune.cmd_tune(args) == 0
    r = parse_registry(yaml.safe_load(reg.read_text()))
    row = [d for d in r.op("decode").defaults if d.gpu == "NVIDIA H100 80GB HBM3"][0]
    assert row.table["fp32"] == [(1, 63, "cuda-v4"), (64, None, "fla-recurrent")]
    assert row.table["bf16"] == [(1, None, "fi-baseline")]
    prov = row.provenance
    assert prov["results"] == ["fp32/results.json", "bf16/results.json"]   # relative to registry
    assert prov["commit"] == "abc123" and prov["measured"] == "2026-01-03"
    assert prov["versions"] == {"torch": "2.11"}
    assert prov["values_us"]["fp32"][64] == {"fla-recurrent": 25.0, "cuda-v4": 30.0}
    # the same, as one comma-separated --from, prints the row instead of writing it
    args = p.parse_args(["--from", f"{f32},{b16}"])
    assert tune.cmd_tune(args) == 0
    assert "- gpu: NVIDIA H100 80GB HBM3" in capsys.readouterr().out


def test_tune_geometry_row_is_written_beside_the_general_row(tmp_path, capsys):
    """``--geometry-row`` writes a row serving only the runs' (H, HV) beside the GPU's general
    row, and a second such tune replaces that row alone."""
    from gdnzoo.registry import parse_registry, registry_path
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry_path(), reg)
    before = parse_registry(yaml.safe_load(reg.read_text())).op("decode").defaults
    gpu = "NVIDIA H100 80GB HBM3"
    general = next(d for d in before if d.gpu == gpu)
    p = tune.add_tune_args(argparse.ArgumentParser())
    for us, winner in ((2.0, "fla-recurrent"), (4.0, "cuda-v4")):
        f = _write_run(tmp_path / winner, [_raw("cuda-v4", 1, 3.0), _raw("fla-recurrent", 1, us)],
                       "abc123")
        assert tune.cmd_tune(p.parse_args(["--from", str(f), "--geometry-row", "--write",
                                           "--registry", str(reg)])) == 0
        rows = [d for d in parse_registry(yaml.safe_load(reg.read_text())).op("decode").defaults
                if d.gpu == gpu]
        assert len(rows) == 2 and rows[0] == general                 # the general row untouched
        geo = rows[1]
        assert geo.geometry == {"H": geo.measured_at["H"], "HV": geo.measured_at["HV"]}
        assert geo.table == {"fp32": [(1, None, winner)]}
        assert tune.existing_row(reg, gpu, geo.geometry)["table"] == {"fp32": [(1, None, winner)]}
    assert len(parse_registry(yaml.safe_load(reg.read_text())).op("decode").defaults) == \
        len(before) + 1


def test_tune_from_dest_results_writes_table_dest(tmp_path, capsys):
    from gdnzoo.registry import parse_registry, registry_path
    from gdnzoo.inputs import make_problem
    from gdnzoo.tables import table_choice
    inp = _write_run(tmp_path / "inplace", [_raw("cuda-v4", 1, 3.0), _raw("fla-recurrent", 1, 2.5)],
                     "abc123")
    dst = _write_run(tmp_path / "dest", [_raw("cuda-v4", 1, 3.0, mode="dest"),
                                          _raw("fla-recurrent", 1, 3.2, mode="dest"),
                                          _raw("cuda-v4", 64, 30.0, mode="dest"),
                                          _raw("fla-recurrent", 64, 25.0, mode="dest")], "def456")
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry_path(), reg)
    p = tune.add_tune_args(argparse.ArgumentParser())
    assert tune.cmd_tune(p.parse_args(["--from", f"{inp},{dst}", "--write-registry",
                                       "--registry", str(reg)])) == 0
    assert "fp32 destination passing: B 1..63 cuda-v4, B 64.. fla-recurrent" in capsys.readouterr().out
    row = [d for d in parse_registry(yaml.safe_load(reg.read_text())).op("decode").defaults
           if d.gpu == "NVIDIA H100 80GB HBM3"][0]
    assert row.table == {"fp32": [(1, None, "fla-recurrent")]}
    assert row.table_dest == {"fp32": [(1, 63, "cuda-v4"), (64, None, "fla-recurrent")]}
    assert table_choice(row, make_problem(inplace=False)) == "cuda-v4"
    assert table_choice(row, make_problem()) == "fla-recurrent"
    assert row.provenance["values_us_dest"]["fp32"][1] == {"cuda-v4": 3.0, "fla-recurrent": 3.2}
    assert "table_dest" in row.provenance["how"]
    # rows at one T > 1: table_tokens (the T=1 tables ignore them); at two: refused
    t2 = report.read_results(_write_run(tmp_path / "t2", [_raw("cuda-v4", 1, 4.0, T=2),
                                                          _raw("fla-recurrent", 1, 4.5, T=2)],
                                        "t2"))[0]
    row2 = tune.make_row("G", report.read_results(inp)[0] + t2)
    assert row2["table"] == {"fp32": [(1, None, "fla-recurrent")]}
    assert row2["table_tokens"] == {"fp32": [(1, None, "cuda-v4")]}
    assert "T=2 tokens" in row2["provenance"]["how"] and "table_tokens" in tune.render_row(row2)
    t4 = report.read_results(_write_run(tmp_path / "t4", [_raw("cuda-v4", 1, 5.0, T=4)], "t4"))[0]
    with pytest.raises(ValueError, match="several T"):
        tune.make_row("G", report.read_results(inp)[0] + t2 + t4)
    # only destination-passing rows: no in-place table to write
    with pytest.raises(ValueError, match="in-place"):
        tune.make_row("G", report.read_results(dst)[0])


def test_tune_from_refuses_overlapping_or_mixed_runs(tmp_path, capsys):
    a = _write_run(tmp_path / "a", [_raw("cuda-v4", 1, 3.0)], "c1")
    b = _write_run(tmp_path / "b", [_raw("cuda-v4", 1, 2.0)], "c2")
    with pytest.raises(SystemExit, match="in both"):
        tune.load_runs([a, b])
    with pytest.raises(SystemExit) as e:                    # a bad option: exit 2
        tune.load_runs([tmp_path / "nope.json"])
    assert e.value.code == 2 and "--from" in capsys.readouterr().err
    c = _write_run(tmp_path / "c", [_raw("cuda-v4", 4, 3.0)], "c3", torch_v="2.12")
    gpu, rows, prov = tune.load_runs([a, c])
    assert prov["commit"] == ["c1", "c3"] and prov["versions"]["torch"] == "2.11 / 2.12"


def test_bench_defaults_fit_the_final_run():
    args = bench_args()
    assert 0 < args.time_budget <= 300
    assert args.out is None and report.default_out_dir().endswith(report.gpu_slug())


def test_plot_series_of_a_dest_run_keeps_the_backends():
    # A destination-passing run has in-place floor rows and dest backend rows: the plot must
    # show the backends (it once picked the floor's mode and drew the floor alone).
    from gdnzoo.bench import plots
    row = dict(state_dtype="fp32", clock="kernel", status="PASS", median_us=2.0, pct_copy_bw=50.0,
               bytes_moved=1, T=1)
    rows = [dict(row, backend="floor", mode="inplace", B=1), dict(row, backend="cuda-v4", mode="dest", B=1),
            dict(row, backend="cuda-v4", mode="dest", B=4)]
    series = plots._series(rows, "fp32")
    assert set(series) == {"floor", "cuda-v4"} and len(series["cuda-v4"]) == 2


# ------------------------------------------------------------------------------ every mode's options

MODES = ["dense", "dest", "pool", "verify", "chained"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_out_that_cannot_take_results_fails_before_measuring(tmp_path, capsys, monkeypatch, mode,
                                                             where):
    """--out an existing file, or a folder that cannot be made: exit 2 at once, naming --out,
    before any cell is measured (it once measured every cell, then crashed writing)."""
    f = tmp_path / "taken"
    f.write_text("not a folder")
    out = f if where == "a file" else f / "results"
    monkeypatch.setattr(pipeline, "measure", lambda *a, **k: pytest.fail("measured"))
    code, _, err = run_cli(["bench", "--mode", mode, "--algo", "pt-reference", "--device", "cpu",
                            "--out", str(out), "--quiet"], capsys)
    assert code == 2 and "--out" in err and str(f) in err and "Traceback" not in err
    assert f.read_text() == "not a folder"


def test_a_time_budget_skip_says_why_on_the_console(tmp_path, capsys):
    code, out, _ = run_cli(["bench", "--algo", "pt-reference", "--batch", "1,2", "--heads", "1,2",
                            "--dim", "16", "--device", "cpu", "--time-budget", "1e-9",
                            "--no-plots", "--quiet", "--out", str(tmp_path)], capsys)
    assert code == 0
    assert "SKIP pt-reference: time budget (1e-09 s) exhausted" in out
    rows, _ = report.read_results(tmp_path / "results.json")
    assert {r["status"] for r in rows if r["B"] == 2} == {"SKIP"}


def test_duplicate_values_count_once(tmp_path):
    plan = bench_plan("--algo", "pt-reference,pt-reference", "--batch", "1,1,4,1",
                      "--state-dtype", "fp32,fp32", "--timing", "host,host")
    assert plan.batches == (1, 4) and plan.states == ("fp32",) and plan.clocks == ("host",)
    assert [g.label for g in plan.groups] == ["pt-reference B=1 fp32 inplace",
                                              "pt-reference B=4 fp32 inplace"]


def test_modes_and_aliases():
    assert bench_plan("--mode", "inplace").words == ["dense"]
    assert bench_plan("--mode", "inplace,dest", "--algo", "pt-reference").words == ["dense", "dest"]
    plan = bench_plan("--timing", "chained")
    assert plan.mode.name == "chained" and "--timing chained: read as --mode chained" in plan.notes


@pytest.mark.parametrize("argv,heads", [
    (("--model", "qwen3-next"), (16, 32)), (("--model", "qwen3-next", "--tp", "4"), (4, 8)),
    (("--model", "Qwen3.5-35B-A3B", "--tp", "8"), (2, 4)), (("--model", "qwen3.5-397b", "--tp", "2"),
                                                           (8, 32)),
    (("--model", "qwen3.5-122b-a10b", "--tp", "8"), (2, 8)),
    (("--model", "qwen3.5-27b", "--tp", "8"), (2, 6)), (("--model", "qwen3.5-2b", "--tp", "2"),
                                                        (8, 8))])
def test_model_presets(argv, heads):
    plan = bench_plan("--algo", "pt-reference", *argv)
    assert (plan.H, plan.HV) == heads and plan.K == plan.V == 128
    assert any(n.startswith(f"--model {argv[1].lower()}") or "--model" in n for n in plan.notes)


@pytest.mark.parametrize("argv,frag", [
    (("--model", "qwen3-next", "--heads", "4,8"), "--model and --heads"),
    (("--model", "qwen3-next", "--tp", "3"), "--tp"), (("--model", "qwen3-next", "--tp", "16"),
                                                       "--tp"),
    (("--tp", "2",), "--tp: only with --model"), (("--model", "llama",), "--model"),
    (("--model", "qwen3-next", "--dim", "64"), "--dim"),
    (("--layers", "4",), "--layers: only with --mode chained"),
    (("--mode", "chained", "--timing", "kernel"), "--timing"),
    (("--device", "cuda",), "--device cuda") if not torch.cuda.is_available() else
    (("--mode", "dense,pool"), "runs alone")])
def test_bad_presets_and_options_exit_2(argv, frag, capsys, tmp_path):
    code, _, err = run_cli(["bench", "--algo", "pt-reference", *argv, "--out", str(tmp_path)],
                           capsys)
    assert code == 2 and frag in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_plots_say_they_need_matplotlib(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    said = plots.plot_all(_synthetic(), {"gpu": "G"}, tmp_path)
    assert said == plots.NEEDS and "matplotlib" in said and "gdnzoo[bench]" in said
    assert not list(tmp_path.iterdir())


def test_the_documented_run_draws_its_plots(tmp_path, capsys):
    """``gdnzoo bench`` without --no-plots draws latency.png where matplotlib is present (here
    from the host clock: no GPU), and the console names the files."""
    pytest.importorskip("matplotlib")
    code, out, _ = run_cli(["bench", "--algo", "pt-reference", "--batch", "1,2", "--heads", "1,2",
                            "--dim", "16", "--iters", "10", "--device", "cpu", "--quiet",
                            "--out", str(tmp_path)], capsys)
    assert code == 0 and f"plots: {tmp_path / 'latency.png'}" in out
    assert (tmp_path / "latency.png").stat().st_size > 1000


def test_the_reader_takes_every_committed_results_file():
    """The one reader loads every results.json committed under bench/results/ as it is: those
    written before the ``bench`` and automatic-choice columns existed (the mode follows from
    ``mode``) and those written by the one pipeline (prefill)."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "bench" / "results"
    files = [p for p in root.rglob("*.json") if '"columns"' in p.read_text()[:200000]]
    assert len(files) >= 15
    seen = set()
    for p in files:
        rows, env = report.read_results(p)
        assert rows and env.get("gpu"), p
        legacy = "bench" not in json.loads(p.read_text())["columns"]
        for r in rows:
            assert set(report.COLUMNS) <= set(r), p
            if legacy:
                assert r["bench"] == report.LEGACY_BENCH[r["mode"]], (p, r["mode"])
                assert r["auto"] is None
            seen.add(r["bench"])
    assert seen == {"dense", "dest", "pool", "verify", "chained", "prefill", "engine-prefill"}


def test_a_new_mode_plugs_in_with_its_own_keys_columns_floor_and_bars(tmp_path, monkeypatch,
                                                                      capsys):
    """A mode is one module registered by name: its own cell key (a sequence mix instead of B),
    its own column, its floor and its bars go through the one pipeline, table, writer, reader
    and console untouched (what a prefill mode needs)."""
    import sys
    import types
    from gdnzoo.bench import args as bench_args_mod

    class Toy(pipeline.Mode):
        name, keys, clocks = "toy", ("seqs",), ("kernel",)
        columns = {"tflops": float("nan"), "bar": ""}
        times = {"floor": 1.0, "a": 2.0, "b": 1.5}

        def plan(self, plan, args):
            for mix in ("1x64", "4x16"):
                plan.groups.append(pipeline.Group(mix, [
                    (plan.cell(n, "dense", 1, "fp32", seqs=mix), ("kernel",))
                    for n in self.times], key=(mix,)))

        def measure(self, group, plan):
            return [dict(cell=c, clock="kernel", status="PASS", samples=[self.times[c.backend]],
                         tflops=4.0 / self.times[c.backend]) for c, _ in group.cells]

        def floor_of(self, row):
            return {}

        def problem(self, c, plan, **kw):
            return None

        def derive(self, table, plan):
            for r in table:
                r["bar"] = "PASS" if r["x_floor"] <= 1.6 else "MISS" if r["x_floor"] > 0 else ""

        def sections(self, plan, table):
            return [("toy, us / x floor:", lambda r: True, True, "seqs")]

        def extra_lines(self, table, plan):
            return [f"bar {r['backend']} {r['seqs']}: {r['bar']}" for r in table if r["bar"]]

    monkeypatch.setitem(sys.modules, "gdnzoo.bench.mode_toy", types.SimpleNamespace(
        MODES={"toy": Toy()}))
    monkeypatch.setitem(bench_args_mod.MODES, "toy", "mode_toy")
    args = bench_args("--mode", "toy", "--device", "cpu", "--quiet", "--out", tmp_path)
    assert pipeline.cmd_bench(args) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("toy, us / x floor:")
    assert out[at + 1].split() == ["seqs", "floor", "a", "b", "auto", "auto/best"]
    assert out[at + 2].split()[:4] == ["1x64", "1.00", "2.00/2.00x", "1.50/1.50x"]
    assert "bar a 1x64: MISS" in out and "bar b 4x16: PASS" in out
    rows, _ = report.read_results(tmp_path / "results.json")
    assert {r["seqs"] for r in rows} == {"1x64", "4x16"} and {r["bench"] for r in rows} == {"toy"}
    assert {round(r["tflops"], 3) for r in rows if r["backend"] == "b"} == {2.667}


def test_peer_state_bound_only_for_the_rounding_peers():
    """The peers that round their states (FLA's and FlashInfer's chunked prefill) are judged
    with the bf16 state's bound on any state; every other backend and operation keeps the
    strict bound, and an error past the peers' bound still fails."""
    from gdnzoo import gate
    assert gate.state_tol_of("fla-upstream", "prefill") == gate.PEER_STATE_TOL == 8e-3
    assert gate.state_tol_of("fi-baseline", "prefill") == 8e-3
    assert gate.state_tol_of("fi-baseline", "decode") is None
    assert gate.state_tol_of("triton-chunk", "prefill") is None
    ref = torch.randn(4, 64, dtype=torch.float64)
    out = ref.clone()
    state = ref * (1 + 3e-3)                         # a bf16-rounding-sized error
    strict = gate.judge(out, state.float(), ref, ref, state_dtype=torch.float32)
    peer = gate.judge(out, state.float(), ref, ref, state_dtype=torch.float32,
                      state_tol=gate.state_tol_of("fla-upstream", "prefill"))
    assert not strict.ok and "relative error" in strict.reason and peer.ok
    worse = gate.judge(out, (ref * 1.02).float(), ref, ref, state_dtype=torch.float32,
                       state_tol=gate.PEER_STATE_TOL)
    assert not worse.ok


def test_form_picks_the_prefill_forms(tmp_path, capsys):
    """--form dense (or pool) plans only that form's cells; any other mode, or a form prefill
    does not have, is a usage error."""
    base = ("--mode", "prefill", "--heads", "4,8", "--mix", "2x9", "--state-dtype", "fp32",
            "--out", str(tmp_path / "o"))
    labels = [g.label for g in bench_plan(*base).groups]
    assert labels == ["4/8 2x9 fp32 dense", "4/8 2x9 fp32 pool"]
    assert [g.label for g in bench_plan(*base, "--form", "dense").groups] == labels[:1]
    assert [g.label for g in bench_plan(*base, "--form", "pool").groups] == labels[1:]
    for argv, says in ((("--mode", "pool", "--form", "dense"), "--form: only with --mode prefill"),
                       (base + ("--form", "paged"), "expected a comma list of forms")):
        with pytest.raises(SystemExit) as e:
            bench_plan(*argv)
        assert e.value.code == 2 and says in capsys.readouterr().err


def test_prefill_times_the_slow_backends_only_by_name(tmp_path):
    """The PyTorch forms and fla-recurrent (token by token: ms a call at 8k tokens) are left
    out of a default prefill run, and timed when --algo names them."""
    base = ("--mode", "prefill", "--heads", "4,8", "--mix", "2x9", "--out", str(tmp_path / "o"))
    default = bench_plan(*base).entries
    assert "triton-chunk" in default and not {"pt-reference", "pt-compiled",
                                              "fla-recurrent"} & set(default)
    named = bench_plan(*base, "--algo", "fla-recurrent,pt-reference").entries
    assert named == ("auto", "fla-recurrent", "pt-reference")


def test_mix_only_with_a_mode_of_sequence_mixes(tmp_path, capsys):
    """--mix belongs to the modes whose cells are sequence mixes (their cell key ``mix``);
    any other mode is a usage error naming those that take it."""
    with pytest.raises(SystemExit) as e:
        bench_run(_args(tmp_path, "--mode", "pool", "--mix", "2x9"))
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "--mix: only with" in err and "prefill or engine-prefill" in err


def test_prefill_on_cpu_checks_small_cells_and_says_why_not_the_rest(tmp_path, capsys):
    """Without a CUDA device --mode prefill times nothing: cells of at most CPU_MAX_TOKENS
    tokens are checked against float64 (small mixes by default), larger ones are SKIP with the
    reason; the console counts the checked cells.  A padded mix is engine-prefill's only."""
    from gdnzoo.bench import mode_prefill as mp
    plan = bench_plan("--mode", "prefill", "--device", "cpu", "--out", str(tmp_path / "p"))
    assert {g.label.split()[1] for g in plan.groups} == set(mp.CPU_MIXES)
    assert "checked against float64" in plan.notes[0]
    code, out, _ = run_cli(["bench", "--mode", "prefill", "--device", "cpu", "--heads", "2,4",
                            "--mix",
                            "2x9,1x4096", "--state-dtype", "fp32", "--form", "dense", "--out",
                            str(tmp_path / "o")], capsys)
    assert code == 0, out
    rows, _ = read_results(tmp_path / "o" / "results.json")
    auto = {r["mix"]: r for r in rows if r["backend"] == "auto"}
    assert auto["2x9"]["status"] == "PASS" and "checked, not timed" in auto["2x9"]["note"]
    assert auto["1x4096"]["status"] == "SKIP" and "at most 2048 tokens" in auto["1x4096"]["note"]
    assert "CHECKED, not timed (no CUDA device), against the reference: auto (1 cell)" in out
    assert "bars (per cell" not in out
    with pytest.raises(SystemExit) as e:
        bench_plan("--mode", "prefill", "--mix", "2x9+1pad", "--out", str(tmp_path / "q"))
    assert e.value.code == 2 and "engine-prefill" in capsys.readouterr().err


def _h200_row(text):
    from gdnzoo.registry import parse_registry
    return [d for d in parse_registry(yaml.safe_load(text)).op("decode").defaults
            if d.gpu == "NVIDIA H200" and not d.geometry][0]


def test_tune_writes_the_k_first_tables_from_a_k_first_run(tmp_path, capsys):
    """tune --from a K-first run (--state-layout k-first; the environment's state_layout, or
    the note of a run before that key) writes the row's table_kfirst (in place) and
    table_kfirst_dest (destination passing): at each measured B the fastest correct entry of
    the file, B read by (sequence, head) pairs at the row's measured_at; every other table of
    the row kept.  A re-tune from k-last runs keeps both and their provenance."""
    from gdnzoo.registry import registry_path
    R = Path(__file__).resolve().parent.parent / "bench" / "results" / "h200" / "kfirst"
    args = _args(tmp_path, "--state-layout", "k-first", "--batch", "1")
    assert pipeline.cmd_bench(args) == 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert tune.state_layout(doc["environment"]) == "k-first"
    reg = tmp_path / "registry.yaml"
    text = registry_path().read_text()
    reg.write_text(text)
    p = tune.add_tune_args(argparse.ArgumentParser())
    before = _h200_row(text)
    assert tune.cmd_tune(p.parse_args(["--from", str(R / "results.json"), "--write",
                                       "--registry", str(reg)])) == 0
    after = _h200_row(reg.read_text())
    from gdnzoo.inputs import make_problem
    from gdnzoo.tables import table_choice
    rows, _ = report.read_results(R / "results.json")
    for mode in ("inplace", "dest"):
        for sd, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            timed = {}
            for r in rows:
                if (r["mode"], r["state_dtype"], r["clock"], r["status"]) == (
                        mode, sd, "kernel", "PASS") and r["backend"] not in ("floor", "auto"):
                    timed.setdefault(r["B"], {})[r["backend"]] = r["median_us"]
            assert timed
            for B, t in timed.items():
                call = make_problem(B=B, H=rows[0]["H"], HV=rows[0]["HV"], k_first=True,
                                    state_dtype=dt, inplace=mode == "inplace")
                pick = table_choice(after, call)
                assert t[pick] == min(t.values()), (mode, sd, B, t, pick)
    for key in ("table", "table_dest", "table_tokens", "table_pool", "table_verify"):
        assert getattr(after, key) == getattr(before, key)
    assert "k-first" in after.provenance["kfirst"]["how"]
    assert after.provenance["kfirst"]["values_us_dest"]
    assert "K-first state, destination passing" in capsys.readouterr().out
    # a re-tune from k-last runs keeps them
    reg2 = tmp_path / "registry2.yaml"
    reg2.write_text(reg.read_text())
    assert tune.cmd_tune(p.parse_args(["--from", str(R / "klast" / "results.json"), "--write",
                                       "--registry", str(reg2)])) == 0
    kept = _h200_row(reg2.read_text())
    assert (kept.table_kfirst, kept.table_kfirst_dest) == (after.table_kfirst,
                                                           after.table_kfirst_dest)
    assert kept.provenance["kfirst"] == after.provenance["kfirst"]


def test_tune_refuses_a_k_first_prefill_run():
    """The prefill table is measured on a k-last state: tune --from a prefill run on a K-first
    one (bench/results/h200/kfirst/) is refused with the reason."""
    R = Path(__file__).resolve().parent.parent / "bench" / "results" / "h200" / "kfirst"
    p = tune.add_tune_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit, match="prefill run on a K-first state"):
        tune.cmd_tune(p.parse_args(["--from", str(R / "prefill_kfirst_results.json")]))


def test_tune_refuses_k_first_results_at_heads_the_row_cannot_read_them_at():
    """K-first batch sizes are read by (sequence, head) pairs at the row's measured_at: a run
    whose value heads are not a multiple of the row's is refused with the reason."""
    rows = [dict(backend="cuda-v4", B=1, T=1, H=3, HV=6, K=128, V=128, state_dtype="fp32",
                 mode="inplace", clock="kernel", status="PASS", median_us=1.0)]
    with pytest.raises(ValueError, match="HV be a multiple of 8"):
        tune.kfirst_tables(rows, dict(H=4, HV=8, K=128, V=128))
    t, v, note = tune.kfirst_tables([dict(rows[0], H=16, HV=32)], dict(H=4, HV=8, K=128, V=128))
    assert t == {"table_kfirst": {"fp32": [(1, None, "cuda-v4")]}} and "(x4)" in note
    assert v == {"values_us": {"fp32": {1: {"cuda-v4": 1.0}}}}


def test_a_dense_k_first_call_reads_table_kfirst():
    """A dense T = 1 call on a K-first state reads the row's table_kfirst first in place,
    table_kfirst_dest with destination passing; a pool, several tokens or a verify call on one
    read their own tables."""
    from gdnzoo import registry, tables
    from gdnzoo.inputs import make_problem
    rows = tables.default_rows(registry.load_registry().op("decode").defaults, "NVIDIA H200")
    for kw, key in ((dict(), "table_kfirst"), (dict(inplace=False), "table_kfirst_dest"),
                    (dict(pool=True), "table_pool"), (dict(T=2), "table_tokens"),
                    (dict(T=2, verify="states"), "table_verify")):
        p = make_problem(B=3, H=16, HV=32, k_first=True, **kw)
        assert tables.lookup(rows, p)[1] == key, kw
    assert tables.lookup(rows, make_problem(B=3, H=16, HV=32))[1] == "table"


def test_nvbench_is_not_run_on_a_k_first_state(monkeypatch):
    """The NVBench cross-check's subprocess times a k-last state: a K-first run says so and
    does not run it (its rows would stand beside the K-first kernel's as a second opinion)."""
    from gdnzoo.bench import nvbench_xcheck
    monkeypatch.setattr(nvbench_xcheck, "cross_check",
                        lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    plan = bench_plan("--state-layout", "k-first", "--nvbench", "--batch", "1")
    rows = []
    plan.mode.finish(rows, plan, bench_args("--state-layout", "k-first", "--nvbench"))
    assert rows == [] and any("--nvbench: not with --state-layout k-first" in n
                              for n in plan.notes)


def test_prefill_on_k_first_states(tmp_path):
    """--mode prefill --state-layout k-first: dense states and pools K-first, every cell
    checked against the k-last float64 reference; a backend reading a K-first state as
    k-last fails (pt-reference told the wrong layout)."""
    from gdnzoo.backends import pt_reference
    args = bench_args("--mode", "prefill", "--algo", "pt-reference", "--heads", "1,2",
                      "--mix", "3x64", "--device", "cpu", "--no-plots", "--quiet",
                      "--state-layout", "k-first", "--out", str(tmp_path / "o"))
    plan, rows, _ = bench_run(args)
    assert {r["cell"].mode for r in rows} == {"dense", "pool"} and plan.layout == "k-first"
    assert rows and all(r["status"] == "PASS" for r in rows)
    orig = pt_reference.run

    def wrong_layout(call, *, config=None):
        problem = dataclasses.replace(call.problem, k_first=False)
        orig(call._replace(problem=problem), config=config)
    try:
        pt_reference.run = wrong_layout
        from gdnzoo import dispatch, registry
        registry.runner.cache_clear()
        dispatch._MEMO.clear()
        _, bad, _ = bench_run(args)
    finally:
        pt_reference.run = orig
        registry.runner.cache_clear()
        dispatch._MEMO.clear()
    mine = [r for r in bad if r["cell"].backend == "pt-reference"]
    assert mine and all(r["status"] == "FAIL" for r in mine)

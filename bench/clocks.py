"""Three clocks for one GDN decode call, and the cold-L2 rotation they share.

Every clock takes ``launch(i)``: issue call number ``i`` (the caller rotates state sets by ``i``).

* kernel: CUPTI activity records (cupti-python when importable, else torch.profiler, which reads
  CUPTI too).  Per iteration: last end - first start over all GPU activity (kernels, memcpy,
  memset) of that call, so the copies and fills a wrapper adds count (or, for the serving
  benchmark, the sum of those records' durations and their number).  The device is drained
  *between* iterations, never inside one: the timestamps come from the GPU, so the drain costs
  nothing that is measured (flashinfer-bench issue #195 was a sync inside an event window), and
  the drains bracket each call's records (cupti-python takes no API records).  A session's
  CUPTI clock: :func:`_detach_cupti`, :func:`_fine_timestamps`, :func:`ns_per_tick`.
* graph: per-call time inside one CUDA graph of many calls, CUDA events around each replay.
* host: wall time per eager call (Python dispatch included), in synchronized batches of calls
  issued back to back (:func:`host_times`).
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import statistics
import time

import torch

L2_FACTOR = 4            # working set >= L2_FACTOR x L2 for reads and for writes
MIN_SETS = 2             # even a state larger than 4x L2 alternates between two buffers
MAX_SETS = 4096
UNIT_TOLERANCE = 0.02    # host and CUPTI ns clocks agree far better than 2% over a session


def l2_bytes(device=None) -> int:
    """L2 size of the CUDA device (0 on CPU)."""
    return (int(torch.cuda.get_device_properties(device or 0).L2_cache_size)
            if torch.cuda.is_available() else 0)


def rotation_count(set_bytes: int, l2: int, factor: int = L2_FACTOR, min_sets: int = MIN_SETS,
                   max_sets: int = MAX_SETS) -> int:
    """How many distinct state sets make the rotated working set >= factor x L2.

    A set is re-touched only after every other set was read and written, so with this many sets
    no byte of it can still be in L2.  Never fewer than ``min_sets``."""
    if set_bytes <= 0:
        raise ValueError(f"set_bytes: expected > 0, got {set_bytes}")
    need = math.ceil(factor * max(l2, 0) / set_bytes)
    return int(min(max(need, min_sets), max_sets))


class Sets:
    """A cold source of the bench's clocks: ``sets`` visited round robin by one counter that
    every session of a cell shares, so that no session starts on sets the previous one just
    wrote (they would still be in L2).  ``kernel(call)`` and ``graph(call)`` give launch(i) of
    ``call(*set)`` on the next set; ``prepare``: nothing to refresh outside the timed window."""
    prepare = None

    def __init__(self, sets):
        self.sets, self.n, self._turn = sets, len(sets), itertools.count()

    def next_index(self) -> int:
        return next(self._turn) % self.n

    def next(self):
        return self.sets[self.next_index()]

    def kernel(self, call):
        return lambda i: call(*self.next())

    graph = kernel


class Rotation(Sets):
    """The cold-L2 rotation of every timed call: ``count`` distinct copies of ``state`` (and, for
    destination passing, as many distinct ``new_state`` buffers); a set is (state, new_state),
    new_state the state itself in place.  ``count`` defaults to :func:`rotation_count` of the
    set size and this device's L2."""

    def __init__(self, state, dest: bool = False, count: int | None = None, l2: int | None = None):
        self.set_bytes = state.numel() * state.element_size()
        n = count or rotation_count(self.set_bytes, l2_bytes() if l2 is None else l2)
        self.states = [state.clone() for _ in range(n)]
        self.dests = [torch.empty_like(state) for _ in range(n)] if dest else None
        super().__init__(list(zip(self.states, self.dests or self.states)))

    @property
    def working_set_bytes(self) -> int:
        return self.n * self.set_bytes * (1 if self.dests is None else 2)


ROW_ALIGN = 64          # index rows start every 64 int32 (256 bytes)


class IndexBank(Sets):
    """The index rows of one cell's calls on a state pool, made on the device before timing:
    ``parts`` maps a name to (values [R, ..., n] int, view shape of the n or None); row r's
    tensor of each part is an int32 view starting on a 256-byte boundary (every leading index
    its own).  With ``check``, the last row is the check row (:attr:`check`), the others the
    timed rows (:attr:`rows`).  Rows are named tuples of the parts and ``block`` (the row's
    number).  Kernel clock: every call passes the persistent tensors :attr:`index`, the next
    row copied into them before each call outside the timed window (:meth:`advance`: they were
    just written, so in L2, as an engine's freshly uploaded slot mapping is; the slots they
    name are cold and new); graph clock: the graph's N calls pass N rows, read cold.  One
    counter per bank: no session starts on rows another just touched."""

    def __init__(self, parts: dict, device, check: bool = True):
        import collections
        self.names = tuple(parts)
        self.Row = collections.namedtuple("Row", self.names + ("block",))
        self.bank, self._views = {}, {}
        for name, (values, view) in parts.items():
            n = values.shape[-1]
            b = torch.full(values.shape[:-1] + (-(-n // ROW_ALIGN) * ROW_ALIGN,), -1,
                           dtype=torch.int32)
            b[..., :n] = values.to(torch.int32)
            self.bank[name], self._views[name] = b.to(device), (n, view)
        R = len(self.bank[self.names[0]])
        every = [self._row({k: v[r] for k, v in self.bank.items()}, r) for r in range(R)]
        self.rows, self.check = (every[:-1], every[-1]) if check else (every, None)
        self._index = {k: v[R - 1 if check else 0].clone() for k, v in self.bank.items()}
        self.block = R - 1 if check else 0
        super().__init__(self.rows)

    def _row(self, full: dict, block: int):
        views = {k: (t[..., :n] if v is None else t[..., :n].view(v))
                 for k, t in full.items() for n, v in [self._views[k]]}
        return self.Row(**views, block=block)

    @property
    def index(self):
        """The persistent index tensors the kernel clock's calls pass (valid slots always)."""
        return self._row(self._index, self.block)

    def row(self, i):
        return self.rows[i % len(self.rows)]

    def advance(self, i=None):
        """Copy the next row into :attr:`index` (device copies; ``i`` is unused)."""
        self.first(self.next().block)

    def first(self, block=0):
        """Row ``block`` (default 0) into :attr:`index` (the counter unchanged)."""
        for k in self.names:
            self._index[k].copy_(self.bank[k][block])
        self.block = block

    prepare = advance

    def kernel(self, call):
        return lambda i: call(self.index)

    def graph(self, call):
        return lambda i: call(self.row(i))


def summarize(xs) -> dict:
    """median, p20, p80, n of a list of microsecond samples."""
    xs = sorted(float(x) for x in xs)
    if not xs:
        return dict(median=float("nan"), p20=float("nan"), p80=float("nan"), n=0)

    def q(p):
        k = (len(xs) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
    return dict(median=statistics.median(xs), p20=q(0.2), p80=q(0.8), n=len(xs))


# ------------------------------------------------------------------------------- kernel clock

def cupti_python_available() -> tuple[bool, str]:
    try:
        importlib.import_module("cupti.cupti")
    except Exception as e:  # ImportError, or a CUPTI/driver mismatch at import
        return False, f"cupti-python not importable ({type(e).__name__}: {e})"
    return True, "cupti-python"


def span_us(recs) -> float:
    """One call's time: last end - first start over its records [(start, end)] in ns (us)."""
    return (max(e for _, e in recs) - min(s for s, _ in recs)) / 1e3


def busy_and_count(recs) -> tuple:
    """(time covered by the records in us, number of records) of one call: the union of the
    intervals of every kernel, memcpy and memset it launched, gaps between them left out (the
    sum of their durations where none overlaps; kernels that run side by side counted once),
    and how many there were."""
    busy, end = 0, -math.inf
    for s, e in sorted(recs):
        busy += max(e - max(s, end), 0)          # the part of [s, e] not covered yet
        end = max(end, e)
    return busy / 1e3, len(recs)


def _group(windows, launch_of, gpu) -> tuple:
    """(GPU records [(start, end)] per iteration, records left in no iteration).

    windows: [(cpu_start, cpu_end)] per iteration; launch_of: {correlation id: cpu time of the
    API call}; gpu: [(start, end, correlation id)].  A record goes to the iteration whose window
    holds its launching API call; without that link, to the last window starting before it."""
    import bisect
    starts = [w[0] for w in windows]
    per = [[] for _ in windows]
    dropped = 0
    for s, e, corr in gpu:
        t = launch_of.get(corr)
        i = bisect.bisect_right(starts, s if t is None else t) - 1
        if i >= 0 and (t is None or t <= windows[i][1]):
            per[i].append((s, e))
        else:
            dropped += 1
    return per, dropped


# torch.profiler now and then links no record to one tiny call of hundreds (seen: one of 200
# on an H200, torch 2.11): up to this share of iterations may come back empty.
LOST_SHARE = 0.02


def _spans(windows, launch_of, gpu, reduce=span_us, lose=0.0) -> tuple:
    """(samples, note): ``reduce`` (default :func:`span_us`) of each iteration's GPU records
    (:func:`_group`; where its links leave iterations empty but the records' starts give every
    iteration the same number, by their starts, and the note says so).  Up to ``lose`` (a
    share, e.g. :data:`LOST_SHARE`) of the iterations may have no record: those are dropped,
    and so is every iteration holding more records than most do (a lost record may have landed
    there), and the note says how many; beyond that an iteration without any is an error."""
    per, dropped = _group(windows, launch_of, gpu)
    empty = [i for i, recs in enumerate(per) if not recs]
    if not empty:
        return [reduce(recs) for recs in per], ""
    # Links that leave iterations empty may point at other launches: after a cupti-python
    # session finalized CUPTI, a torch.profiler session of the same process left 11 of 200
    # iterations without a record, their kernels linked to other launches (H200, torch 2.11;
    # lab/clock_interplay.py).  Each iteration drains before the next, so each record's start
    # says its iteration: taken where it gives every iteration the same number of records.
    by_start, _ = _group(windows, {}, [(s, e, None) for s, e, _ in gpu])
    if by_start and len({len(r) for r in by_start}) == 1 and by_start[0]:
        return [reduce(recs) for recs in by_start], (
            f" ({len(empty)} of {len(per)} iterations linked to no record: every record "
            f"assigned by its start)")
    if len(empty) > lose * len(per):
        raise RuntimeError(f"kernel clock: iteration {empty[0]} launched no GPU activity "
                           f"({len(gpu)} GPU records: {dropped} launched outside every "
                           f"iteration, {sum(len(r) > 1 for r in per)} iterations with more than "
                           f"one; does this backend run on the GPU?)")
    counts = sorted(len(r) for r in per if r)
    usual = counts[len(counts) // 2]
    keep = [recs for recs in per if 0 < len(recs) <= usual]
    return [reduce(recs) for recs in keep], (
        f" ({len(empty)} of {len(per)} iterations without a record and "
        f"{len(per) - len(empty) - len(keep)} with more than {usual} dropped)")


def _detach_cupti(cupti):
    """Drop whatever an earlier CUPTI client left registered in this process.

    torch.profiler (Kineto) registers an activity timestamp callback (``getApproximateTime``:
    raw TSC ticks on x86) that outlives its profiling session; records taken after it are in
    ticks, not ns (a 2.1 GHz TSC read 100 us as ~206 us).  cuptiFinalize forgets every callback,
    so CUPTI's own ns clock is back; CUPTI re-attaches on the next call."""
    with contextlib.suppress(Exception):
        cupti.finalize()


def _paired_now(now):
    """(host ns, CUPTI timestamp from ``now()``) read back to back: the host read brackets it."""
    a = time.perf_counter_ns()
    c = now()
    b = time.perf_counter_ns()
    return (a + b) // 2, c


def _fine_timestamps(cupti):
    """Give CUPTI a nanosecond clock that starts near zero; returns ``(now, note)``.

    CUPTI's own timestamps are CLOCK_REALTIME nanoseconds (1.8e18, 2**60.6, in 2026), and on an
    H100 host every kernel record came in multiples of 256 ns, the step of a double at that
    size (10% of a 2.5 us decode).  Counted from the session's start, the same nanoseconds stay
    far below 2**53, where a double is exact, and the same host reads 32 ns steps, as under
    torch.profiler, whose callback returns small numbers too (bench/results/h100-80gb-hbm3/clock/).
    CUPTI wants the callback before any activity kind is enabled.  A CUPTI that refuses it
    keeps its own clock, and the note says so."""
    base = time.perf_counter_ns()

    def now():
        return time.perf_counter_ns() - base
    try:
        cupti.activity_register_timestamp_callback(now)
    except Exception as e:  # an older cupti-python, or CUPTI refusing the callback
        return cupti.get_timestamp, (f" (CUPTI's own timestamps, 256 ns steps on an H100 host: "
                                     f"no timestamp callback, {type(e).__name__}: {e})")
    return now, ""


def ns_per_tick(first, last) -> float:
    """How many ns one unit of the CUPTI timestamp is, from two (host ns, CUPTI) pairs.

    1.0 when CUPTI counts ns, as it should; anything else means a foreign timestamp callback."""
    dh, dc = last[0] - first[0], last[1] - first[1]
    if dh <= 0 or dc <= 0:
        return 1.0
    r = dh / dc
    return 1.0 if abs(r - 1.0) < UNIT_TOLERANCE else r


def _kernel_times_cupti(launch, iters, start, cupti=None, sync=None, reduce=span_us,
                        prepare=None):
    """GPU records only, each iteration's by time: its window runs from just before its launch
    to the end of the drain after it, and nothing else runs on the device in between, so
    exactly its records start inside it.  No API records are taken: with the timestamp
    callback (:func:`_fine_timestamps`) every API record would run a Python call inside the
    launches, which widened a two-kernel call's span by about 3 us on the H100 host."""
    if cupti is None:
        from cupti import cupti
    sync = sync or torch.cuda.synchronize
    K = cupti.ActivityKind
    gpu_kinds = (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET)
    gpu = []

    def requested():
        return 8 * 1024 * 1024, 0

    def completed(acts):
        gpu.extend((a.start, a.end) for a in acts if a.kind in gpu_kinds)

    windows = []
    _detach_cupti(cupti)
    try:
        now, clock_note = _fine_timestamps(cupti)
        cupti.activity_register_callbacks(requested, completed)
        for k in gpu_kinds:
            cupti.activity_enable(k)
        sync()
        first = _paired_now(now)
        for i in range(iters):
            sync()                                   # drain: between iterations only
            if windows:
                windows[-1] = (windows[-1][0], now())    # the previous call has drained
            if prepare is not None:
                prepare(start + i)                   # outside every window: not measured
                sync()
            t0 = now()
            launch(start + i)
            windows.append((t0, None))
        sync()
        windows[-1] = (windows[-1][0], now())
        last = _paired_now(now)
        cupti.activity_flush_all(1)
    finally:
        for k in gpu_kinds:
            with contextlib.suppress(Exception):
                cupti.activity_disable(k)
        cupti.finalize()
    scale = ns_per_tick(first, last)
    # A record stands in for its own launch: it goes to the window its start falls in.
    per, _ = _spans(windows, {j: s for j, (s, _) in enumerate(gpu)},
                 [(s, e, j) for j, (s, e) in enumerate(gpu)],
                 lambda recs: reduce([(s * scale, e * scale) for s, e in recs]))
    note = "" if scale == 1.0 else f" (CUPTI timestamps were not ns: rescaled by {scale:.4f} ns/tick)"
    return per, clock_note + note


def _profiler_records(events, tag: str) -> tuple:
    """(iteration windows {i: (start, end)}, {correlation id: launch time}, GPU records
    [(start, end, linked correlation id)]) of a torch.profiler session's events.

    A ``record_function`` marker shows up twice: as a CPU range (the iteration's window) and,
    in recent torch, as a GPU user annotation spanning the kernels it launched.  The GPU copy is
    no record of its own: counted, it doubled a call's summed kernel time (H200, torch 2.11)."""
    windows, launch_of, gpu = {}, {}, []
    for ev in events:
        name = ev.name()
        if ev.device_type() == torch.autograd.DeviceType.CUDA:
            if not name.startswith(tag):
                gpu.append((ev.start_ns(), ev.end_ns(), ev.linked_correlation_id()))
            continue
        if name.startswith(tag):
            windows[int(name[len(tag):])] = (ev.start_ns(), ev.end_ns())
        if ev.correlation_id():     # kernels link to the op (or our marker) that launched them
            launch_of[ev.correlation_id()] = ev.start_ns()
    return windows, launch_of, gpu


def _kernel_times_torch_profiler(launch, iters, start, reduce=span_us, prepare=None):
    from torch.profiler import ProfilerActivity, profile, record_function
    tag = "gdnzoo_iter_"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            if prepare is not None:
                torch.cuda.synchronize()
                prepare(start + i)                   # outside every window: not measured
            torch.cuda.synchronize()                 # drain: between iterations only
            with record_function(f"{tag}{i}"):
                launch(start + i)
        torch.cuda.synchronize()
    windows, launch_of, gpu = _profiler_records(prof.profiler.kineto_results.events(), tag)
    if sorted(windows) != list(range(iters)):
        raise RuntimeError("kernel clock: torch.profiler lost iteration markers")
    return _spans([windows[i] for i in range(iters)], launch_of, gpu, reduce, LOST_SHARE)


def kernel_times(launch, iters: int, warmup: int = 3, start: int = 0,
                 reduce=span_us, prepare=None) -> tuple[list, str]:
    """Per-iteration GPU time (us) of ``launch(i)`` from CUPTI records; returns (samples, method).

    ``reduce`` maps one iteration's records [(start, end)] (ns) to its sample: by default
    :func:`span_us` (last end - first start); :func:`busy_and_count` gives (sum of the records'
    durations, number of records).  ``prepare(i)``, when given, runs before ``launch(i)``
    (warm-up calls included), outside the iteration's window: what it launches is not measured
    (the serving benchmark refreshes its index tensor there)."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel clock needs a CUDA device")
    for i in range(warmup):
        if prepare is not None:
            prepare(start + i)
        launch(start + i)
    torch.cuda.synchronize()
    start += warmup
    method = "torch.profiler"
    if cupti_python_available()[0]:
        try:
            samples, note = _kernel_times_cupti(launch, iters, start, reduce=reduce,
                                                prepare=prepare)
            return samples, "cupti-python" + note
        except RuntimeError:
            raise
        except Exception as e:   # CUPTI busy (another profiler attached): fall back, say so
            method = f"torch.profiler (cupti-python failed: {type(e).__name__}: {e})"
    samples, note = _kernel_times_torch_profiler(launch, iters, start, reduce, prepare)
    return samples, method + note


def interleaved_kernel_times(launches, reps: int, prepare=None) -> tuple[list, str]:
    """Kernel-clock samples of several launchers timed side by side in one session.

    ``launches[j](i)`` runs candidate j with rotation index i; the session runs them round robin
    (``reps`` timed launches each).  Returns ``(samples per candidate, method)``.  Which
    candidate produced each sample is recorded as it runs, never inferred from positions, so
    warm-up calls cannot shift the attribution.  Only for candidates with the same cache
    policy (the floor's shapes): lines stored with normal L2 priority outlive a rotation of
    evict-first (``st.global.cs``) traffic, so mixing policies can warm a neighbour's state.
    ``prepare``: see :func:`kernel_times`."""
    m = len(launches)
    ran = []

    def launch(i):
        j = i % m
        ran.append(j)
        launches[j](i)
    extra = {} if prepare is None else dict(prepare=prepare)
    samples, method = kernel_times(launch, m * reps, **extra)
    ran = ran[len(ran) - len(samples):]
    per = [[] for _ in range(m)]
    for j, t in zip(ran, samples):
        per[j].append(t)
    return per, method


# -------------------------------------------------------------------------------- graph clock

class GraphUnsupported(RuntimeError):
    """The call cannot be captured into a CUDA graph (the reason is the message)."""


def capture(issue):
    """A CUDA graph of what ``issue()`` launches (each kernel of it run before: compiled,
    loaded, memoized; every tensor allocated); GraphUnsupported where it cannot be captured."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            issue()
    except Exception as e:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        raise GraphUnsupported(f"capture failed: {type(e).__name__}: "
                               f"{str(e).splitlines()[0][:160] if str(e) else ''}") from None
    return g


def graph_times(launch, n_calls: int, replays: int, warmup: int = 3) -> list:
    """Per-call time (us) of ``n_calls`` calls captured in one CUDA graph, one sample per replay."""
    if not torch.cuda.is_available():
        raise GraphUnsupported("no CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # first calls off the capture (lazy init, autotune)
        for i in range(warmup):
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    g = capture(lambda: [launch(i) for i in range(n_calls)])
    g.replay()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    ev[0].record()
    for r in range(replays):
        g.replay()
        ev[r + 1].record()
    torch.cuda.synchronize()
    out = [ev[r].elapsed_time(ev[r + 1]) * 1e3 / n_calls for r in range(replays)]
    del g
    return out


# --------------------------------------------------------------------------------- host clock

def host_times(call, batches: int, per_batch: int, warmup: int = 5, warm_s: float = 0.0) -> list:
    """Wall time per eager call (us): one sample per batch of ``per_batch`` back-to-back calls.

    Each batch starts and ends synchronized (on a GPU), the final wait inside its time, nothing
    synchronized inside it: a sample is max(dispatch, GPU) per call plus one call's other part
    spread over the batch, whatever the depth of the launch queue (a queue still filling read
    the dispatch alone when batches ran unsynchronized, before 2026-11-29).  Before the
    batches: ``warmup`` calls, then more calls until ``warm_s`` seconds have passed (at most
    20000 calls).  Why a time-based warm-up: on a lent H100 machine, cells of 200 calls right
    after the other clocks read 14-15 us per call where the same calls read 8.4-10.7 us after
    200 warm-up calls in 1000-call batches; our guess (unverified) is a host core that needs
    some ms of work to reach its full clock."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    i = 0
    t_end = time.perf_counter() + warm_s
    while i < warmup or (time.perf_counter() < t_end and i < 20000):
        call(i)
        i += 1
    out = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call(i)
            i += 1
        sync()
        out.append((time.perf_counter() - t0) * 1e6 / per_batch)
    sync()                                     # after the last sample, outside every batch
    return out


def event_time_us(launch, n: int) -> float:
    """Rough per-call time from CUDA events over ``n`` back-to-back calls (for budgeting only)."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for i in range(n):
            launch(i)
        return (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(n):
        launch(i)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / n

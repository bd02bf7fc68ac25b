"""Where an eager prefill call's host time goes, on a GPU: plain ``gdnzoo.prefill`` and the
engine adapters (``gdnzoo.integrations.vllm.chunked_prefill``, ``.sglang.extend``) on the
engine bench's cases (4/8 heads, K = V = 128).

Per (mix, algo, engine), printed as a table last: host us a call over back-to-back calls
without a sync ("issue"; the host clock reads max(host, GPU)), with the sync ("wall"), the GPU's
time a call from CUDA events over the batch, the host syncs one call makes (torch's sync debug
mode), the host us a call issued behind ``torch.cuda._sleep`` (the stream busy throughout, so
no launch can wait for the GPU: the host's own cost, median of 5 rounds; "waited" if a round
outlasted its sleep) and the kernel clock (CUPTI span of one call: at small cells it holds
the host's gaps between a call's launches).  Then, as asked:

    --profile ENGINES   cProfile over the batch, top functions by own time
    --breakdown         every function of the prefill path wrapped: own and inclusive us a call
    --lines             the hot functions line by line (sys.settrace; read the large lines)
    --vary [N]          N calls (default 40) of 8 sequences of 64-512 tokens, each call a new
                        token count as a server's prompts, after as many calls of other counts
    --pdl               whether a PDL launch blocks the host behind a busy stream
    --no-raw            triton-chunk's Triton kernels always through Triton's own launch
    --no-chain-pdl      the CUDA chain launched plainly after the CUDA prep

    python -m lab.host_prefill                     # the table, 16x256 and 1x8192
    python -m lab.host_prefill --algo cuda-chunk,triton-chunk --engines plain --mixes= --vary
    python -m lab.host_prefill --algo auto,cuda-chunk,get:cuda-chunk --engines plain  # the
                                                   # automatic choice beside the named forms

Host time swings up to ~2x from one process to the next on a lent host: compare trees only
in alternating processes (lab/notebook/h200/host_launch_2026-11-30/).
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import inspect
import io
import pstats
import statistics
import time
import timeit
import warnings

import torch

import gdnzoo
from gdnzoo.bench import engine_prefill as ep
from gdnzoo.bench.clocks import kernel_times
from gdnzoo.bench.mode_engine_prefill import mix_lengths
from gdnzoo.inputs import make_prefill_inputs


def plain_call(lengths, algo, state_dtype, device):
    """``gdnzoo.prefill(..., algo=algo)``; ``auto``: without ``algo`` (the automatic choice);
    ``get:NAME``: the backend's callable from ``gdnzoo.get(NAME, op="prefill")`` (as the
    prefill bench calls a named entry)."""
    x = make_prefill_inputs(lengths, H=ep.H, HV=ep.HV, K=128, V=128, seed=0, device=device,
                            state_dtype=state_dtype)
    if algo.startswith("get:"):
        fn, kw = gdnzoo.get(algo[4:], op="prefill"), {}
    else:
        fn, kw = gdnzoo.prefill, ({} if algo == "auto" else {"algo": algo})
    return lambda: fn(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, **kw)


def engine_adapter_call(engine, lengths, pads, algo, state_dtype, device):
    case = ep.make_case(engine, lengths, pads, 128, state_dtype, 0, device)
    _, pool = ep.pool_copy(case)
    return ep.adapter_call(engine, case, pool, algo)


def host_us(call, n):
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter_ns()
    a.record()
    for _ in range(n):
        call()
    b.record()
    issued = time.perf_counter_ns() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter_ns() - t0
    return issued / n / 1e3, wall / n / 1e3, a.elapsed_time(b) * 1e3 / n


def issue_behind_sleep(call, n, sleep_ms=150.0, rounds=5):
    """Host us per call issued behind torch.cuda._sleep (the stream busy throughout, so no
    launch can wait for the GPU), the median of ``rounds`` rounds, and whether any round's
    issue outlasted its sleep (then something waited for the GPU after all)."""
    got = [_behind_sleep(call, n, sleep_ms) for _ in range(rounds)]
    return statistics.median(g[0] for g in got), any(g[1] for g in got)


def _behind_sleep(call, n, sleep_ms):
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(1_000_000)
    b.record()
    b.synchronize()
    per_ms = 1_000_000 / max(a.elapsed_time(b), 1e-3)
    torch.cuda._sleep(int(sleep_ms * per_ms))
    t0 = time.perf_counter_ns()
    for _ in range(n):
        call()
    issued = (time.perf_counter_ns() - t0) / 1e6
    torch.cuda.synchronize()
    return issued * 1e3 / n, issued > sleep_ms


def vary_calls(algo, engine, n, state_dtype, device, seed=0):
    """``n`` calls of 8 sequences of 64-512 tokens each, every call another token count (as a
    server's prompts come): the inputs made first."""
    gen = torch.Generator().manual_seed(seed)
    calls = []
    for i in range(n):
        lengths = (torch.randint(64, 513, (8,), generator=gen)).tolist()
        calls.append(plain_call(lengths, algo, state_dtype, device) if engine == "plain"
                     else engine_adapter_call(engine, lengths, 0, algo, state_dtype, device))
    return calls


def vary_host_us(calls):
    """(median, mean, max) host us of calls of new token counts, each issued once behind a
    sleeping stream."""
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    each = []
    for c in calls:
        t0 = time.perf_counter_ns()
        c()
        each.append((time.perf_counter_ns() - t0) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(each), statistics.fmean(each), max(each)


def syncs_of(call):
    """The host syncs of one call, by torch's sync debug mode (its own notice on first use,
    "Synchronization debug mode is a prototype feature", is no sync)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).splitlines()[0][:90] + f" ({w.filename.split('/')[-1]}:{w.lineno})"
            for w in got if "synchroniz" in str(w.message)
            and not str(w.message).startswith("Synchronization debug mode is a prototype")]


def profile_of(call, n, top):
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(n):
        call()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


# the modules whose functions --breakdown times (each module-level function, where it is looked
# up through its module), and the launch entry points of Triton and CuPy
TIMED = ("gdnzoo.dispatch", "gdnzoo.operation", "gdnzoo.prefill_contract", "gdnzoo.contract",
         "gdnzoo.guards", "gdnzoo.integrations", "gdnzoo.integrations.vllm",
         "gdnzoo.integrations.sglang", "gdnzoo.backends.triton_chunk",
         "gdnzoo.backends._triton_launch", "gdnzoo.backends._triton_chunk_cp",
         "gdnzoo.backends._cuda_chunk_chain", "gdnzoo.backends._cuda_chunk_prep",
         "gdnzoo.backends._cuda_build", "gdnzoo.backends._tma", "gdnzoo.backends._pdl_launch",
         "gdnzoo.backends.cuda_chunk", "gdnzoo.backends.cuda_chunk_bf16")


class Timers:
    """Inclusive and own wall time of every wrapped function (a stack of children's time)."""

    def __init__(self):
        self.total, self.own, self.count, self.stack = {}, {}, {}, []

    def wrap(self, fn, label):
        @functools.wraps(fn)
        def timed(*a, **kw):
            self.stack.append(0)
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.perf_counter_ns() - t0
                child = self.stack.pop()
                if self.stack:
                    self.stack[-1] += dt
                self.total[label] = self.total.get(label, 0) + dt
                self.own[label] = self.own.get(label, 0) + dt - child
                self.count[label] = self.count.get(label, 0) + 1
        return timed

    def install(self):
        for name in TIMED:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
            for attr, obj in list(vars(mod).items()):
                if inspect.isfunction(obj) and obj.__module__ == name:
                    setattr(mod, attr, self.wrap(obj, f"{name.split('.')[-1]}.{attr}"))
        import triton.runtime.jit as jit
        jit.JITFunction.run = self.wrap(jit.JITFunction.run, "triton JITFunction.run")
        try:
            from cupy_backends.cuda.api import driver
            driver.launchKernel = self.wrap(driver.launchKernel, "cupy driver.launchKernel")
        except ImportError:
            pass

    def report(self, calls, top):
        rows = sorted(self.own, key=self.own.get, reverse=True)[:top]
        lines = [f"  {'function':<44} {'calls/call':>10} {'own us':>8} {'incl us':>8}"]
        for k in rows:
            lines.append(f"  {k:<44} {self.count[k] / calls:10.1f} "
                         f"{self.own[k] / calls / 1e3:8.1f} {self.total[k] / calls / 1e3:8.1f}")
        return "\n".join(lines)


def breakdown(t, call, n, top):
    t.total, t.own, t.count = {}, {}, {}
    torch.cuda.synchronize()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    return t.report(n, top)


# the functions --lines times line by line: "module:qualname"
LINES = ("gdnzoo.dispatch:call", "gdnzoo.backends.triton_chunk:launch",
         "gdnzoo.backends.triton_chunk:launch_state", "gdnzoo.backends.triton_chunk:launch_segments",
         "gdnzoo.backends._cuda_chunk_chain:launch", "gdnzoo.backends._cuda_chunk_chain:tensor_maps",
         "gdnzoo.backends._cuda_chunk_prep:launcher", "gdnzoo.backends._cuda_build:launch_raw_pdl",
         "gdnzoo.backends._cuda_build:launch_raw", "gdnzoo.backends._pdl_launch:PdlConfig.launch",
         "gdnzoo.backends._triton_launch:LaunchCache.__call__",
         "gdnzoo.integrations:prefill_pool", "gdnzoo.prefill_contract:record")


def line_times(call, n, top):
    """Host time per call of each line of the :data:`LINES` functions (a line's time runs to
    the next line event of its frame, callees that are not traced included), by sys.settrace:
    every line pays the tracer's own cost, so read the large ones."""
    import sys
    codes = {}
    for spec in LINES:
        mod, qual = spec.split(":")
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
        obj = inspect.unwrap(obj)
        codes[obj.__code__] = spec
    acc, hits = {}, {}

    def local(frame, event, arg):
        now = time.perf_counter_ns()
        key = id(frame)
        prev = state.get(key)
        if prev is not None:
            where = (codes[frame.f_code], prev[0])
            acc[where] = acc.get(where, 0) + now - prev[1]
            hits[where] = hits.get(where, 0) + 1
        if event == "return":
            state.pop(key, None)
        else:
            state[key] = (frame.f_lineno, time.perf_counter_ns())
        return local

    state = {}

    def glob(frame, event, arg):
        return local if frame.f_code in codes else None

    torch.cuda.synchronize()
    sys.settrace(glob)
    try:
        for _ in range(n):
            call()
    finally:
        sys.settrace(None)
    torch.cuda.synchronize()
    rows = sorted(acc, key=acc.get, reverse=True)[:top]
    import linecache
    out = [f"  {'us/call':>8} {'hits':>6}  function:line  source"]
    for spec, line in rows:
        code = next(c for c, s in codes.items() if s == spec)
        text = linecache.getline(code.co_filename, line).strip()[:70]
        out.append(f"  {acc[(spec, line)] / n / 1e3:8.1f} {hits[(spec, line)] / n:6.1f}  "
                   f"{spec.split(':')[1]}:{line}  {text}")
    return "\n".join(out)


def pdl_blocking(n=50, sleep_cycles=40_000_000):
    """Whether a launch blocks the host while the stream is busy: an empty kernel launched
    ``n`` times behind torch.cuda._sleep, plainly (cuLaunchKernel) and with programmatic
    dependent launch (cuLaunchKernelEx), host us per launch and the whole wait."""
    import ctypes

    import cupy

    from gdnzoo.backends import _cuda_build as cuda_build
    func = cupy.RawKernel(r'extern "C" __global__ void nop() {}', "nop").kernel.ptr
    argv = (ctypes.c_void_p * 1)()
    addr, dev = ctypes.addressof(argv), torch.cuda.current_device()
    lines = []
    for mode in ("plain", "pdl", "plain", "pdl"):
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            if mode == "plain":
                cuda_build.launch_raw(func, 1, 32, dev, addr, 0)
            else:
                cuda_build.launch_raw_pdl(cuda_build.pdl_config(1, 32, 0), func, dev, addr)
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        t2 = time.perf_counter_ns()
        lines.append(f"  {mode:>5}: {(t1 - t0) / n / 1e3:8.1f} us a launch on the host behind a "
                     f"busy stream; {(t2 - t0) / 1e6:.2f} ms to the end of the sleep and launches")
    return "\n".join(lines)


def python_speed():
    """us for a fixed pure-Python workload (to scale host figures between machines)."""
    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", default="cuda-chunk-bf16,cuda-chunk,triton-chunk")
    ap.add_argument("--mixes", default="16x256,1x8192")
    ap.add_argument("--engines", default="plain,vllm,sglang")
    ap.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--profile", default="", help="which engines get a cProfile listing")
    ap.add_argument("--breakdown", action="store_true",
                    help="after the table: the wrapped functions' own and inclusive times per "
                         "call, for each (mix, algo, engine) in turn (wrappers stay installed)")
    ap.add_argument("--pdl", action="store_true",
                    help="first: whether a PDL launch blocks the host behind a busy stream")
    ap.add_argument("--no-raw", action="store_true",
                    help="triton-chunk's Triton kernels always through Triton's own launch")
    ap.add_argument("--no-chain-pdl", action="store_true",
                    help="the CUDA chain launched plainly after the CUDA prep, not as its "
                         "programmatic dependent (its wait then returns at once)")
    ap.add_argument("--vary", type=int, nargs="?", const=40, default=0,
                    help="after the table: host us a call over this many calls of new token "
                         "counts (8 sequences of 64-512 tokens)")
    ap.add_argument("--lines", action="store_true",
                    help="after the table: each traced line's host time per call (see LINES)")
    args = ap.parse_args(argv)
    print(f"python: sum(range(1000)) {python_speed():.2f} us", flush=True)
    device = torch.device("cuda")
    sd = torch.float32 if args.state_dtype == "fp32" else torch.bfloat16
    if args.no_raw:
        from gdnzoo.backends import triton_chunk

        def refuse(*a):
            raise AttributeError("--no-raw")
        triton_chunk._LAUNCH.bind = refuse
    if args.no_chain_pdl:
        from gdnzoo.backends import _cuda_chunk_chain as chain
        plain = chain.launch
        chain.launch = functools.wraps(plain)(
            lambda *a, **kw: plain(*a, **{**kw, "after_prep": False}))
    if args.pdl:
        print("launches behind torch.cuda._sleep:\n" + pdl_blocking(), flush=True)
    rows, calls = [], []
    for mix in filter(None, args.mixes.split(",")):
        lengths, pads = mix_lengths(mix)
        for algo in args.algo.split(","):
            for engine in args.engines.split(","):
                call = (plain_call(list(lengths) + [0] * pads, algo, sd, device)
                        if engine == "plain"
                        else engine_adapter_call(engine, lengths, pads, algo, sd, device))
                for _ in range(5):
                    call()
                syncs = syncs_of(call)
                ktime = statistics.median(kernel_times(lambda i: call(), 20)[0])
                issued, wall, gpu = host_us(call, args.calls)
                busy, waited = issue_behind_sleep(call, args.calls)
                rows.append((mix, algo, engine, issued, wall, gpu, len(syncs), busy, waited, ktime))
                print(f"{mix:>7} {algo:>16} {engine:>6}: issue {issued:7.1f} us/call, wall "
                      f"{wall:7.1f}, GPU (events) {gpu:7.1f}, host syncs {len(syncs)}; issue "
                      f"behind a sleeping stream {busy:7.1f}{' (waited)' if waited else ''}; "
                      f"kernel clock {ktime:7.1f}",
                      flush=True)
                for s in syncs[:6]:
                    print("        sync:", s)
                if engine in args.profile.split(","):
                    print(profile_of(call, args.calls, args.top))
                calls.append((f"{mix} {algo} {engine}", call))
    print("\nmix      algo              engine   issue us  wall us  GPU us  syncs  "
          "behind sleep  kernel clock")
    for r in rows:
        print(f"{r[0]:<8} {r[1]:<17} {r[2]:<7} {r[3]:8.1f} {r[4]:8.1f} {r[5]:7.1f} {r[6]:6d}  "
              f"{r[7]:12.1f}  {r[9]:12.1f}{'  (waited)' if r[8] else ''}")
    if args.vary:
        print(f"\ncalls of 8 sequences, each call another token count ({args.vary} calls), "
              "host us a call behind a sleeping stream, after as many calls of other counts:")
        for algo in args.algo.split(","):
            for engine in args.engines.split(","):
                # warmed on as many other token counts: every kernel variant a token count
                # can pick is compiled and loaded before the timed calls
                vary_host_us(vary_calls(algo, engine, args.vary, sd, device, seed=99))
                med, mean, top = vary_host_us(vary_calls(algo, engine, args.vary, sd, device))
                print(f"  {algo:>16} {engine:>6}: median {med:8.1f}, mean {mean:8.1f}, "
                      f"max {top:8.1f}", flush=True)
    if args.lines:
        for label, call in calls:
            print(f"\n{label}: host time per call by line (traced)")
            print(line_times(call, args.calls, args.top), flush=True)
    if args.breakdown:
        t = Timers()
        t.install()
        for label, call in calls:
            print(f"\n{label}: own and inclusive host time per call (wrapped functions)")
            print(breakdown(t, call, args.calls, args.top), flush=True)


if __name__ == "__main__":
    main()

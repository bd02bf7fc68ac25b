"""The one harness of the lab scripts: where results go and keep-going parts.  A lab script
times with the bench's cold-L2 rotation (:class:`gdnzoo.bench.clocks.Rotation`) and its clocks,
and judges with the one gate (:func:`gdnzoo.gate.gated_call`), as ``gdnzoo bench`` does.

    lab = Lab("sanitize_cuda")           # results under $OUT (default /tmp/out)
    lab.part("cuda-v4 cases", fn)        # an exception is logged with its traceback; the rest runs
    lab.log("...")                       # printed and kept
    lab.save()                           # $OUT/<name>.log and $OUT/<name>.json (lab.results)

``profiled(call, reps)``: per kernel name the torch.profiler record times of ``reps`` calls.
``side_by_side(cell, call, variants, ...)``: variants of one call in turn, round by round, their
results bit for bit against the first's and their GPU spans; ``rel``: a relative error.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


class Lab:
    def __init__(self, name: str):
        self.name = name
        self.out = Path(os.environ.get("OUT") or "/tmp/out")
        self.out.mkdir(parents=True, exist_ok=True)
        self.lines, self.results, self.failed = [], {}, []
        os.environ.setdefault("PYTHONUNBUFFERED", "1")

    def log(self, *parts):
        line = " ".join(str(p) for p in parts)
        self.lines.append(line)
        print(line, flush=True)

    def part(self, name, fn, *args, **kw):
        """``fn(*args, **kw)``; on an exception log it and go on (returns None)."""
        t0 = time.time()
        try:
            result = fn(*args, **kw)
            self.log(f"[{name}] done in {time.time() - t0:.1f} s")
            return result
        except Exception:
            self.failed.append(name)
            self.log(f"[{name}] ERROR after {time.time() - t0:.1f} s\n{traceback.format_exc()}")
            return None

    def environment(self) -> dict:
        from gdnzoo.bench import report
        return report.environment(f"lab.{self.name}")

    def save(self) -> int:
        """Write the log and results; the exit status: 1 when a part failed."""
        (self.out / f"{self.name}.log").write_text("\n".join(self.lines) + "\n")
        (self.out / f"{self.name}.json").write_text(json.dumps(
            dict(environment=self.environment(), failed=self.failed, **self.results),
            indent=1, default=str))
        return 1 if self.failed else 0


def callgrind_total(argv: list, out_file, env_more: dict, cwd=None) -> int:
    """Instructions callgrind counts over ``python argv...`` (this interpreter; one thread of
    each math library; ``env_more`` on top of the environment; the profile to ``out_file``)."""
    import re
    import subprocess
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **env_more)
    r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
                        os.path.realpath(sys.executable), *map(str, argv)],
                       capture_output=True, text=True, env=env, cwd=cwd)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if m is None:
        raise RuntimeError(f"callgrind gave no total: {r.stderr[-800:]}")
    return int(m.group(1))


def event_times_us(fn, reps: int, warm: int = 3, ahead: int = 0) -> list:
    """``fn()``'s times in us over ``reps`` calls, each between two CUDA events on the current
    stream (host launch gaps included), after ``warm`` calls.  ``ahead`` > 0: a sleep kernel of
    that many cycles queued before each first event, so the host has issued the call before
    the GPU reaches it (its launch gaps left out)."""
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if ahead:
            torch.cuda._sleep(ahead)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return times


def event_median_us(fn, reps: int, warm: int = 3) -> float:
    """The median of :func:`event_times_us`."""
    import statistics
    return statistics.median(event_times_us(fn, reps, warm))


def run(name: str, fn, needs_cuda: bool = False):
    """A script's entry point: ``fn(Lab(name))``, then save and exit (1 when a part failed).
    ``needs_cuda``: without a CUDA device say so and exit 1, running nothing."""
    if needs_cuda:
        import torch
        if not torch.cuda.is_available():
            print(f"lab.{name}: needs a CUDA device (there is none here); nothing was run",
                  file=sys.stderr)
            sys.exit(1)
    lab = Lab(name)
    fn(lab)
    sys.exit(lab.save())


def profiled_events(call, reps: int, warm: int = 3) -> list:
    """[(start, end, kernel name)] of the GPU records of ``reps`` calls of ``call`` under
    torch.profiler (after ``warm`` untimed calls), in start order, us."""
    import torch
    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA)


def profiled(call, reps: int, warm: int = 3) -> dict:
    """{kernel name: [record time, us]} of ``reps`` calls of ``call`` under torch.profiler
    (after ``warm`` untimed calls)."""
    by = {}
    for start, end, name in profiled_events(call, reps, warm):
        by.setdefault(name, []).append(end - start)
    return by


def patch(obj, **attrs):
    """A :func:`side_by_side` variant: setting ``obj``'s attributes, undone by what it returns."""
    def setup():
        saved = {n: getattr(obj, n) for n in attrs}
        for n, v in attrs.items():
            setattr(obj, n, v)
        return lambda: [setattr(obj, n, v) for n, v in saved.items()]
    return setup


def rel(got, want) -> float:
    """||got - want|| / ||want|| in float64."""
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def side_by_side(cell, call, variants, rounds, reps, o64, s64, spread=False) -> dict:
    """Per round each variant in turn (``variants``: name -> a function setting it up and
    returning one that undoes it): ``call()``'s (outputs, state) against the first variant's
    first (whose errors against float64 ``o64``, ``s64`` are printed; a difference is printed
    with its size), then its GPU span (CUDA events behind a sleep kernel, median of ``reps``;
    ``spread``: every sample printed).  Prints the medians over rounds and returns them."""
    import statistics
    import torch
    first, same, spans = None, {}, {name: [] for name in variants}
    for r in range(rounds):
        for name, setup in variants.items():
            undo = setup()
            try:
                out, new = (t.clone() for t in call())
                torch.cuda.synchronize()
                if first is None:
                    first = (out, new)
                    print(f"{cell} errors vs float64: out {rel(out, o64):.3e} state "
                          f"{rel(new, s64):.3e}", flush=True)
                same[name] = same.get(name, True) and torch.equal(out, first[0]) \
                    and torch.equal(new, first[1])
                if not same[name]:
                    print(f"{cell} {name} round {r}: NOT bit-identical to the first: out "
                          f"{rel(out, first[0]):.3e} state {rel(new, first[1]):.3e}", flush=True)
                # ~1 ms of sleep ahead: an eager prefill call's launches took up to ~0.3 ms
                # on the lent H200's host, past the 0.2 ms slept before (4/8 1x8192 read
                # 107-298 us in lab/notebook/h200/chain_ldsm_2026-11-30/)
                samples = sorted(event_times_us(call, reps, ahead=2_000_000))
                spans[name].append(statistics.median(samples))
                if spread:
                    print(f"{cell} {name} round {r}: spans " + " ".join(f"{t:.0f}" for t in samples),
                          flush=True)
            finally:
                undo()
    med = {n: statistics.median(v) for n, v in spans.items()}
    print(f"{cell}: " + ", ".join(f"{n} {m:.1f} us" for n, m in med.items())
          + "; bit for bit as the first: " + ", ".join(f"{n} {s}" for n, s in same.items())
          + "; rounds " + "; ".join(f"{n} " + " ".join(f"{t:.1f}" for t in v)
                                  for n, v in spans.items()), flush=True)
    return med

"""cuda-v4's warm host path per call, an older tree against this one, counted: the Python
bytecodes each call executes and the C functions it calls (no GPU: the driver call is a no-op
Python function in both trees; the counts are exact and the same on every run, unlike a time on
a shared CPU):

    python3 -m lab.host_cpu_ab [--before REF] [--calls 2000]

Paths: ``with_pointers`` (gdnzoo.decode's dense warm path), a bound dense call, a pool call, a
verify call through cuda_v4.cu (states form, an explicit token-loop shape) and through the
tensor-core verify (the same shape with ``kernel: tc-verify``; ``chunk`` 3 on a tree from before
that field),
each after 1000 warm calls, counted with ``sys.settrace`` (opcode events) and ``sys.setprofile``
(C calls).  For wall time on a GPU with the driver call: lab/host_ab.sh.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from lab.sass_identity import REPO, _import_tree, call_record, takes_record, tree_of

PATHS = ("with_pointers", "dense", "pool", "verify", "verify-tc")


def bound_calls(cuda_v4):
    """``bound(args, pool=None, verify=None, config=None)`` -> (the bound launcher, a call of it
    as gdnzoo.decode makes it) on either backend protocol: the decode call record, or the
    positional form before it."""
    if not takes_record(cuda_v4):
        def bound(args, pool=None, verify=None, config=None):
            b = cuda_v4.bind(*args, pool, verify, config)
            more = () if pool is None and verify is None else (pool,) if verify is None else \
                (pool, verify)
            return b, lambda: b(*args, *more)
        return bound

    def bound(args, pool=None, verify=None, config=None):
        c = call_record("cuda-v4", args, pool, verify)
        b = cuda_v4.bind(c, config=config)
        return b, lambda: b(c)
    return bound


def measure(tree: Path, n: int) -> dict:
    """{path: (bytecodes, C calls) a call} of ``tree``'s cuda_v4 (run in its own process)."""
    _import_tree(tree)
    import types

    import torch
    from gdnzoo.backends import cuda_v4
    from gdnzoo.inputs import make_inputs
    from gdnzoo.pool import Pool
    from gdnzoo.verify import Verify
    build = next(m for m in vars(cuda_v4).values() if isinstance(m, types.ModuleType)
                 and hasattr(m, "get_kernel") and hasattr(m, "Launch"))
    build.get_kernel = lambda *a: types.SimpleNamespace(func=0)
    build.launch_raw = lambda *a, **kw: None
    torch.cuda.get_device_name = lambda *a, **kw: "NVIDIA H100 80GB HBM3"
    tc = (8, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1, "tc-verify") if "KERNELS" in vars(cuda_v4) else \
        (8, 1, 16, 3, 1, 0, 0, 2, 3, 3, 1)
    x = make_inputs(B=1, T=1)
    out = torch.empty(1, 1, 8, 128, dtype=x.v.dtype)
    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, x.state, False)
    y = make_inputs(B=1, T=4)
    yout = torch.empty(1, 4, 8, 128, dtype=y.v.dtype)
    yargs = (y.q, y.k, y.v, y.state, y.A_log, y.a, y.dt_bias, y.b, y.scale, yout, y.state, False)
    idx = torch.zeros(1, dtype=torch.int32)
    pool = Pool(idx, idx, -1)
    ver = Verify(torch.empty(2, 4, 8, 128, 128), idx, False, False, None)
    bound = bound_calls(cuda_v4)
    calls = {}
    b, calls["dense"] = bound(args)
    ptrs = [t.data_ptr() for t in args[:8]] + [out.data_ptr(), 0]
    calls["with_pointers"] = lambda: b.with_pointers(ptrs, x.scale)
    _, calls["pool"] = bound(args, pool)
    _, calls["verify"] = bound(yargs, pool, ver, (8, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1))
    _, calls["verify-tc"] = bound(yargs, pool, ver, tc)
    got = {"ops": 0, "c": 0}

    def opcodes(frame, event, arg):
        frame.f_trace_opcodes = True
        got["ops"] += event == "opcode"
        return opcodes

    def c_calls(frame, event, arg):
        got["c"] += event == "c_call"

    res = {}
    for path in PATHS:
        f = calls[path]
        for _ in range(1000):
            f()
        got.update(ops=0, c=0)
        for hook, how in ((sys.settrace, opcodes), (sys.setprofile, c_calls)):
            hook(how)
            for _ in range(n):
                f()
            hook(None)
        res[path] = (got["ops"] / n, got["c"] / n)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(measure(Path(a.worker[0]), int(a.worker[1]))))
        return
    trees = {"before": tree_of(a.before), "after": REPO}
    got = {}
    for t, tree in trees.items():
        out = subprocess.run([sys.executable, "-m", "lab.host_cpu_ab", "--worker", str(tree),
                              str(a.calls)], capture_output=True, text=True, cwd=REPO,
                             check=True).stdout
        got[t] = json.loads(out.splitlines()[-1])
    print(f"before: {a.before} ({trees['before']}); after: {REPO}; {a.calls} calls a path")
    print(f"{'path':<14} {'bytecodes before':>17} {'after':>7} {'C calls before':>15} {'after':>6}")
    for p in PATHS:
        (ob, cb), (oa, ca) = got["before"][p], got["after"][p]
        print(f"{p:<14} {ob:>17.1f} {oa:>7.1f} {cb:>15.1f} {ca:>6.1f}")


if __name__ == "__main__":
    main()

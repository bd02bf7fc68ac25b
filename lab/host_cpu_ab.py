"""cuda-v4's warm host path per call, an older tree against this one, as an instruction count
(no GPU: the driver call is a no-op, so what is counted is the Python of each call path):

    python3 -m lab.host_cpu_ab [--before REF] [--calls 20000]

Paths: ``with_pointers`` (gdnzoo.decode's dense warm path), a bound dense call, a pool call, a
verify call through cuda_v4.cu (states form) and through the tensor-core verify (a
``kernel: tc-verify`` shape; an 11-field ``chunk`` 3 config on a tree from before that field).
Each (tree, path) runs in its own process under valgrind's callgrind twice, with 1000 and
1000 + ``--calls`` calls after binding; the difference of the two totals over ``--calls`` is
the instructions of one call (imports, binding and first calls cancel), the same on every run.
For wall time on a GPU with the driver call: lab/host_ab.sh.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from lab.sass_identity import REPO, _import_tree, tree_of

PATHS = ("with_pointers", "dense", "pool", "verify", "verify-tc")


def measure(tree: Path, path: str, n: int):
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
    calls = {}
    b = cuda_v4.bind(*args)
    ptrs = [t.data_ptr() for t in args[:8]] + [out.data_ptr(), 0]
    calls["with_pointers"] = lambda: b.with_pointers(ptrs, x.scale)
    calls["dense"] = lambda: b(*args)
    bp = cuda_v4.bind(*args, pool)
    calls["pool"] = lambda: bp(*args, pool)
    bv = cuda_v4.bind(*yargs, pool, ver)
    calls["verify"] = lambda: bv(*yargs, pool, ver)
    bt = cuda_v4.bind(*yargs, pool, ver, tc)
    calls["verify-tc"] = lambda: bt(*yargs, pool, ver)
    f = calls[path]
    for _ in range(n):
        f()


def count(tree: Path, path: str, n: int) -> int:
    """Instructions of a worker process making ``n`` calls of ``path`` (callgrind's total)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(sys.path))      # the venv's, for the real binary
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                        os.path.realpath(sys.executable), "-m", "lab.host_cpu_ab", "--worker",
                        str(tree), path, str(n)], capture_output=True, text=True, cwd=REPO,
                       env=env)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if m is None:
        raise RuntimeError(f"callgrind gave no total: {r.stderr[-1500:]}")
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        measure(Path(a.worker[0]), a.worker[1], int(a.worker[2]))
        return
    trees = {"before": tree_of(a.before), "after": REPO}
    print(f"before: {a.before} ({trees['before']}); after: {REPO}; {a.calls} calls")
    print(f"{'path':<14} {'before':>8} {'after':>8} {'after - before':>15}  instructions a call")
    for p in PATHS:
        per = {t: (count(tree, p, 1000 + a.calls) - count(tree, p, 1000)) / a.calls
               for t, tree in trees.items()}
        print(f"{p:<14} {per['before']:>8.0f} {per['after']:>8.0f} "
              f"{per['after'] - per['before']:>+15.0f}", flush=True)


if __name__ == "__main__":
    main()

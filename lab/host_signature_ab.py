"""Host work of a prefill call whose signature is new (a server's every new token count), one
tree against another, as an instruction count (no GPU; valgrind's callgrind counts
instructions, so it repeats exactly where wall time on a shared host swings ~2x):

    python3 -m lab.host_signature_ab REV [--calls 500]

Each tree (REV's ``gdnzoo``, ``backends`` and ``registry.yaml`` unpacked by ``git archive``, and
this working tree) runs in its own process under callgrind twice, with 100 and 100 +
``--calls`` prefill calls of new token counts (8 sequences at 4/8 heads, K = V = 128, the last
one a token shorter each call) on CPU tensors, the backend's launcher a no-op (gdnzoo's own
dispatch, validation and selection only); the difference of the two totals over ``--calls`` is
the work of one call, the imports and first calls cancelled.  A callgrind run imports torch
at ~50x its speed: minutes each.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lab import harness

ROOT = Path(__file__).resolve().parents[1]

CALLS = '''
import sys
import torch, gdnzoo
from gdnzoo import registry
from gdnzoo.inputs import make_prefill_inputs
registry.launcher = lambda name, call: (lambda rec: None)
n = int(sys.argv[1])
x = make_prefill_inputs([1024] * 8, H=4, HV=8, K=128, V=128, device="cpu", seed=0)
T = x.q.shape[0]
out, new = torch.empty_like(x.v), torch.empty_like(x.state)
cus = []
for i in range(n):
    cu = x.cu_seqlens.clone()
    cu[-1] -= i
    cus.append(cu)
for i in range(n):
    m = T - i
    gdnzoo.prefill(x.q[:m], x.k[:m], x.v[:m], x.state, x.A_log, x.a[:m], x.dt_bias, x.b[:m],
                   cus[i], out=out[:m], new_state=new, use_qk_l2norm=True, algo="pt-reference")
'''


def tree_at(rev: str, work: Path) -> Path:
    """REV's gdnzoo package (``backends`` linked in as gdnzoo.backends) under ``work``."""
    src = work / f"tree_{rev}"
    src.mkdir()
    archive = subprocess.run(["git", "archive", rev, "gdnzoo", "backends", "registry.yaml"],
                             cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    (src / "gdnzoo" / "backends").symlink_to(src / "backends")
    return src


def count(work: Path, path: str, n: int) -> int:
    return harness.callgrind_total(
        [work / "calls.py", n], work / f"cg.{Path(path).name}.{n}",
        dict(PYTHONPATH=os.pathsep.join([path, *sys.path]),
             GDNZOO_REGISTRY=str(Path(path) / "registry.yaml")), cwd=work)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the other tree's git revision")
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gdnzoo_sig_ab_"))
    (work / "calls.py").write_text(CALLS)
    trees = {args.rev: str(tree_at(args.rev, work)), "this tree": str(ROOT)}
    for name, path in trees.items():
        lo, hi = count(work, path, 100), count(work, path, 100 + args.calls)
        print(f"{name}: {(hi - lo) / args.calls:,.0f} instructions a prefill call of a new "
              f"signature", flush=True)


if __name__ == "__main__":
    main()

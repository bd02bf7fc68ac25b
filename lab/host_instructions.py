"""Host work per eager ``gdnzoo.decode`` call as an instruction count, old face against this one
(no GPU needed; valgrind's callgrind counts instructions, not seconds, so it repeats exactly):

    git show REV:gdnzoo/__init__.py > /tmp/old_init.py
    python3 -m lab.host_instructions /tmp/old_init.py [--calls 40000]

Each side runs in its own process under callgrind twice, with 1000 and 1000 + ``--calls`` calls
of ``decode`` at B=1 on CPU tensors through a no-op backend (registered in a scratch registry
file, so only gdnzoo's own dispatch runs); the difference of the two totals over ``--calls`` is
the work of one call, the imports and first calls cancelled.  Named algo and automatic choice.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

from gdnzoo import registry
from lab import harness

NOOP = "def available(device): return True, 'no-op'\ndef supports(p): return True, ''\ndef run(*a): pass\n"
CALLS = '''
import importlib.util, sys
import torch, gdnzoo
from gdnzoo.inputs import make_inputs
face, n, algo = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
if face != "this":
    spec = importlib.util.spec_from_file_location("gdnzoo_face_ab", face)
    gdnzoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gdnzoo)
x = make_inputs(B=1, seed=0)
out = torch.empty(1, 1, 8, 128, dtype=torch.bfloat16)
for _ in range(n):
    gdnzoo.decode(*x.args(), out=out, algo=algo)
'''


def count(work, face, n, algo):
    return harness.callgrind_total(
        [work / "calls.py", face, n, algo], work / f"cg.{n}.{algo}.{Path(face).name}",
        dict(GDNZOO_REGISTRY=str(work / "registry.yaml"),
             PYTHONPATH=os.pathsep.join([str(work), *sys.path])))


def main(lab):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_init", help="an older gdnzoo/__init__.py")
    ap.add_argument("--calls", type=int, default=40000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gdnzoo_instr_"))
    (work / "noop_backend.py").write_text(NOOP)
    (work / "calls.py").write_text(CALLS)
    reg = yaml.safe_load(registry.registry_path().read_text())
    reg["backends"].append(dict(name="noop", entry="noop_backend:run", language="python",
                                devices=["cpu", "cuda"], state_dtypes=["fp32", "bf16"],
                                notes="no-op"))
    reg["fallback"]["cpu"] = ["noop"]
    (work / "registry.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    for algo in ("noop", ""):
        per = {}
        for face in (args.old_init, "this"):
            lo, hi = count(work, face, 1000, algo), count(work, face, 1000 + args.calls, algo)
            per[face] = (hi - lo) / args.calls
        lab.results.setdefault("per_call", []).append(dict(algo=algo or None, **per))
        lab.log(f"algo={algo or None}: {args.old_init} {per[args.old_init]:.0f} instructions a "
                f"call, this tree {per['this']:.0f} ({per['this'] - per[args.old_init]:+.0f})")


if __name__ == "__main__":
    harness.run("host_instructions", main)

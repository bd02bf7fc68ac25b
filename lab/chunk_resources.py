"""triton-chunk's two kernels compiled for sm_90 without a GPU: registers, spills, shared
memory and a SASS instruction census (tensor-core MMAs, shuffles, shared-memory and global
traffic, all instructions) per launch config.  An offline proxy for where a chunk's time goes,
to compare kernel variants before a GPU session (it measures no time).

    env -u TRITON_INTERPRET python -m lab.chunk_resources                 # the default configs
    env -u TRITON_INTERPRET python -m lab.chunk_resources --block-v 16,64 --precision bf16x3
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch

from lab.ckpt_ptx_identity import _Recorder, compile_sm90

OPS = ("HMMA", "HGMMA", "WARPSYNC", "SHFL", "LDS", "STS", "LDSM", "LDG", "STG", "LDGSTS", "BAR", "F2F", "FFMA",
       "MUFU")


def launch_args(kw):
    """{kernel name: (args, kwargs)} triton_chunk.launch passes each kernel for ``kw``."""
    import gdnzoo.backends._triton_chunk_kernel as tk
    from gdnzoo.backends import triton_chunk
    rec = {"prep": _Recorder(), "state": _Recorder()}
    saved = (tk.chunk_prep_kernel, tk.chunk_state_kernel)
    tk.chunk_prep_kernel, tk.chunk_state_kernel = rec["prep"], rec["state"]
    try:
        triton_chunk.launch(**kw)
    finally:
        tk.chunk_prep_kernel, tk.chunk_state_kernel = saved
    return {n: (r.args, r.kwargs) for n, r in rec.items()}


def census(ck):
    """(registers, spill stores, shared bytes, Counter of SASS opcodes) of a compiled kernel."""
    import triton
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
    res = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", f.name],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", f.name],
                          capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    spill = re.search(r"STACK:(\d+)", res)
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", line)
        if m:
            ops[m.group(1)] += 1
    return regs, int(spill.group(1)) if spill else 0, ck.metadata.shared, ops


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--block-v", default="16,64")
    p.add_argument("--precision", default="bf16x3")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--warps", type=int, default=0, help="0: picked as the product picks")
    p.add_argument("--prep-warps", type=int, default=4)
    p.add_argument("--base", type=int, default=16)
    a = p.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: this compiles in JIT mode")
    import gdnzoo.backends._triton_chunk_kernel as tk
    from gdnzoo.inputs import make_prefill_inputs
    x = make_prefill_inputs([130, 64], H=4, HV=8, K=128, V=128, state_dtype=torch.float32)
    print(f"{'kernel':6s} {'config':34s} {'regs':>4s} {'stack':>5s} {'smem':>6s} {'all':>6s} "
          + " ".join(f"{o:>6s}" for o in OPS))
    for bv in map(int, a.block_v.split(",")):
        cfg = dict(block_v=bv, precision=a.precision, chunk=a.chunk, warps=a.warps,
                   prep_warps=a.prep_warps, base=a.base)
        kw = dict(q=x.q, k=x.k, v=x.v, state=x.state, A_log=x.A_log, a=x.a, dt_bias=x.dt_bias,
                  b=x.b, cu_seqlens=x.cu_seqlens, scale=x.scale, out=torch.empty_like(x.v),
                  new_state=x.state, use_qk_l2norm=True, config=cfg)
        for name, (args, kwargs) in launch_args(kw).items():
            if name == "prep" and bv != int(a.block_v.split(",")[0]):
                continue
            kern = tk.chunk_prep_kernel if name == "prep" else tk.chunk_state_kernel
            regs, stack, smem, ops = census(compile_sm90(kern, args, kwargs))
            label = " ".join(f"{k}={v}" for k, v in cfg.items() if name == "state" or k in
                             ("precision", "chunk", "prep_warps", "base"))
            print(f"{name:6s} {label[:34]:34s} {regs:4d} {stack:5d} {smem:6d} "
                  f"{sum(ops.values()):6d} " + " ".join(f"{ops[o]:6d}" for o in OPS))


if __name__ == "__main__":
    main()

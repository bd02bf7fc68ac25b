"""Does triton-chunk's sequential kernel without checkpoints (CKPT at its default 0) compile to
the PTX it compiled to before checkpoints existed?  No GPU needed: both kernels compiled for
sm_90 (``triton.compile`` with ``GPUTarget("cuda", 90, 32)``, JIT mode) with the arguments
``triton_chunk.launch`` passes (recorded, not launched), the kernel before taking the same
arguments less the six checkpoint ones.  Compared: the PTX's instructions without debug lines,
less the parameter declarations and ``ld.param`` loads (six more parameters shift their
names); the parameter loads are counted.  Each case is also compiled with checkpoints on
(CKPT=1, every 64 tokens), to see that form compile for sm_90 and what it adds.

    python -m lab.ckpt_ptx_identity --before 681a86b      (TRITON_INTERPRET unset)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import torch

from gdnzoo.backends._triton_launch import compile_offline as compile_sm90


class _Recorder:
    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return record


def _state_args(call_kw):
    """(args, kwargs) triton_chunk.launch passes chunk_state_kernel for these launch keywords."""
    import gdnzoo.backends._triton_chunk_kernel as tk
    from gdnzoo.backends import triton_chunk
    rec, saved = _Recorder(), (tk.chunk_prep_kernel, tk.chunk_state_kernel)
    tk.chunk_prep_kernel, tk.chunk_state_kernel = _Recorder(), rec
    try:
        triton_chunk.launch(**call_kw)
    finally:
        tk.chunk_prep_kernel, tk.chunk_state_kernel = saved
    return rec.args, rec.kwargs


def _calls():
    from gdnzoo.inputs import make_prefill_inputs
    for sd in (torch.float32, torch.bfloat16):
        for bv in (16, 32):
            for pool in (False, True):
                x = make_prefill_inputs([130, 64, 7], H=2, HV=4, K=128, V=128, state_dtype=sd)
                kw = dict(q=x.q, k=x.k, v=x.v, state=x.state, A_log=x.A_log, a=x.a,
                          dt_bias=x.dt_bias, b=x.b, cu_seqlens=x.cu_seqlens, scale=x.scale,
                          out=torch.empty_like(x.v), new_state=x.state, use_qk_l2norm=True,
                          config=dict(block_v=bv))
                if pool:
                    kw["state_indices"] = torch.tensor([2, -1, 0], dtype=torch.int32)
                yield f"{'fp32' if sd == torch.float32 else 'bf16'}-bv{bv}-" \
                      f"{'pool' if pool else 'dense'}", kw


def body(ptx):
    """(instructions less parameter declarations and loads, number of ld.param)."""
    out, params = [], 0
    for line in ptx.split("\t.section\t.debug")[0].splitlines():
        s = line.split("//")[0].strip()
        if not s or s.startswith((".loc", ".file", "$L__tmp", "$L__func", ".param")):
            continue
        if s.startswith("ld.param"):
            params += 1
            continue
        out.append(s.rstrip(","))
    return out, params


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before", default="681a86b", help="the commit before checkpoints")
    a = p.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: this compiles in JIT mode")
    src = subprocess.run(["git", "show", f"{a.before}:backends/_triton_chunk_kernel.py"],
                         capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("chunk_kernel_before", f.name)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    from gdnzoo.backends import _triton_chunk_kernel as now
    at = now.chunk_state_kernel.arg_names.index("ckpt")
    print(f"before: {a.before}; after: this tree; sm_90 PTX of chunk_state_kernel")
    same = 0
    cases = list(_calls())
    for name, kw in cases:
        args, kwargs = _state_args(kw)
        assert "CKPT" not in kwargs, "a call without checkpoints passed CKPT"
        b_now, p_now = body(compile_sm90(now.chunk_state_kernel, args, kwargs).asm["ptx"])
        b_old, p_old = body(compile_sm90(before.chunk_state_kernel, args[:at] + args[at + 6:],
                                         kwargs).asm["ptx"])
        ok = b_now == b_old
        same += ok
        ck = torch.empty(kw["q"].shape[0] // 64, *kw["state"].shape[1:], dtype=kw["state"].dtype)
        args_ck, kwargs_ck = _state_args(dict(kw, checkpoints=ck, checkpoint_every=64))
        b_ck, _ = body(compile_sm90(now.chunk_state_kernel, args_ck, kwargs_ck).asm["ptx"])
        stores = sum(s.startswith(("st.global", "@")) and "st.global" in s for s in b_ck) - \
            sum(s.startswith(("st.global", "@")) and "st.global" in s for s in b_now)
        print(f"{name:18s} instructions {len(b_now):6d} / {len(b_old):6d}  ld.param "
              f"{p_now:3d} / {p_old:3d}  {'identical' if ok else 'DIFFERENT'};  with "
              f"checkpoints {len(b_ck):6d} (+{stores} st.global)")
    print(f"{same} of {len(cases)} identical (parameter declarations and loads aside)")


if __name__ == "__main__":
    main()

"""A decode step on a K-first state with the head's tile staged in shared memory by bulk
asynchronous copies (prototype.cu beside this file: dense, T = 1, K = V = 128, raw gates, qk
l2norm; the product's form is GDN_STAGED in backends/cuda_v4_kfirst.cu), beside cuda-v4 on a
k-last state and cuda-v4's K-first kernel as the product picks it, on a GPU: each entry gated
against the float64 oracle first, then CUDA events around replays of a CUDA graph of one call
on each of rotated input sets (states >= 2x L2), medians of 20, timed in two rounds.  From the
repository root:

    PYTHONPATH=. python3 lab/notebook/h200/kfirst_staged_2026-12-01/kfirst_staged.py \
        --geom 16/32 --state-dtype bf16 --batches 16,64,256 [--dest]

(Run as ``python -m lab.kfirst_staged`` from lab/ when measured.)
"""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.backends import _cuda_build as cuda_build
from lab.kfirst_cuda import sets_for
from lab.kfirst_rows import batches, parser, time_us

SOURCE = Path(__file__).with_name("prototype.cu")
PARAMS = struct.Struct("<10Q2q2f")


def smem_bytes(size: int) -> int:
    """The tile, raw k and q, the row groups' partial sums, the warps' sums, the mbarrier."""
    return 128 * 128 * size + 2 * 128 * 4 + 2 * 4 * 128 * 4 + 16 * 4 + 16


def staged(dest: bool):
    def call(x, st, out, new=None):
        size = st.element_size()
        dev = st.device.index or 0
        smem = smem_bytes(size)
        func = cuda_build.get_kernel(SOURCE, "kfirst_staged", (("SD", 0 if size == 4 else 1),),
                                     dev, smem).func
        ns = st if not dest else new
        HV, H = x.v.shape[2], x.q.shape[2]
        assert x.A_log.dtype == torch.float32 and x.dt_bias.dtype == torch.float32
        body = PARAMS.pack(st.data_ptr(), ns.data_ptr(), x.q.data_ptr(), x.k.data_ptr(),
                           x.v.data_ptr(), x.a.data_ptr(), x.b.data_ptr(), x.A_log.data_ptr(),
                           x.dt_bias.data_ptr(), out.data_ptr(), HV, HV // H, float(x.scale), 0.0)
        params = ctypes.create_string_buffer(body)
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        cuda_build.launch_raw(func, x.v.shape[0] * HV, 256, dev, ctypes.addressof(argv), smem)
        return out, ns
    return call


def api(kfirst: bool, dest: bool):
    def call(x, st, out, new=None):
        return gdnzoo.decode(x.q, x.k, x.v, st if kfirst else x.state, x.A_log, x.a, x.dt_bias,
                             x.b, x.scale, out=out, new_state=new if dest else None,
                             use_qk_l2norm=True, algo="cuda-v4",
                             state_layout="k-first" if kfirst else "k-last")
    return call


def gated(name, x, kfirst, fn, dest):
    """``fn`` once on a copy of the set ``x``, judged against the float64 oracle."""
    x = x.clone()
    ref_out, ref_state = x.reference(True)
    st = x.state.transpose(-1, -2).contiguous() if kfirst else x.state
    new = torch.empty_like(st) if dest else None
    o, ns = fn(x, st, torch.empty_like(x.v), new)
    j = gate.judge(o, ns.transpose(-1, -2) if kfirst else ns, ref_out, ref_state)
    if not j.ok:
        raise AssertionError(f"{name}: {j.reason}")
    return o.clone(), ns.clone()


def main(argv=None):
    p = parser(__doc__, "16,64,256")
    p.add_argument("--dest", action="store_true", help="destination passing (else in place)")
    a = p.parse_args(argv)
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    for H, HV, B, n in batches(a):
        sets = [(x, st, out, torch.empty_like(st) if a.dest else None)
                for x, st, out in sets_for(B, H, HV, sd, n)]
        entries = [("v4 k-last", False, api(False, a.dest)),
                   ("v4 K-first", True, api(True, a.dest)),
                   ("staged K-first", True, staged(a.dest))]
        row = [f"{a.geom} B={B} {a.state_dtype}{' dest' if a.dest else ''} ({n} sets)"]
        results = {}
        for name, kfirst, fn in entries:
            try:
                results[name] = gated(name, sets[0][0], kfirst, fn, a.dest)
            except (AssertionError, ValueError, RuntimeError) as e:
                row.append(f"{name}: FAIL {str(e)[:100]}")
        if "v4 K-first" in results and "staged K-first" in results:
            (o1, s1), (o2, s2) = results["v4 K-first"], results["staged K-first"]
            row.append(f"staged vs v4 K-first: out max |d| {(o1.float() - o2.float()).abs().max():.2e}, "
                       f"state {(s1.float() - s2.float()).abs().max():.2e}")
        times = {name: [] for name, _, _ in entries if name in results}
        for fn0 in (entries[0][2],):            # a process's first timing reads high: untimed
            time_us(lambda x, st, o, ns, f=fn0: f(x, st, o, ns), sets)
        for _ in range(2):
            for name, kfirst, fn in entries:
                if name in times:
                    times[name].append(time_us(lambda x, st, o, ns, f=fn: f(x, st, o, ns), sets))
        base = min(times["v4 k-last"])
        for name, ts in times.items():
            row.append(f"{name}: {min(ts):.2f} us ({min(ts) / base:.3f}x k-last; rounds "
                       f"{', '.join(f'{t:.2f}' for t in ts)})")
        print("  " + "\n    ".join(row), flush=True)


if __name__ == "__main__":
    main()

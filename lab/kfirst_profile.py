"""cuda-v4's decode on a K-first and on a k-last state, the same call a few times each, for a
profiler to read (``ncu -k regex:gdn_decode_v4 --launch-skip 2 ... python3 -m
lab.kfirst_profile``: each kind's first two calls compile and warm up).  From the repository
root:

    python -m lab.kfirst_profile --geom 16/32 --batch 256 --state-dtype bf16 [--dest]
"""
from __future__ import annotations

import argparse

import torch

import gdnzoo
from gdnzoo.inputs import make_inputs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--geom", default="16/32")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--state-dtype", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("--dest", action="store_true")
    p.add_argument("--calls", type=int, default=4)
    a = p.parse_args(argv)
    H, HV = (int(v) for v in a.geom.split("/"))
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.state_dtype]
    x = make_inputs(B=a.batch, T=1, H=H, HV=HV, state_dtype=sd, device="cuda", seed=0)
    for layout in ("k-first", "k-last"):
        st = x.state.transpose(-1, -2).contiguous() if layout == "k-first" else x.state.clone()
        new = torch.empty_like(st) if a.dest else None
        for _ in range(a.calls):
            gdnzoo.decode(x.q, x.k, x.v, st, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                          new_state=new, use_qk_l2norm=True, state_layout=layout,
                          algo="cuda-v4")
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()

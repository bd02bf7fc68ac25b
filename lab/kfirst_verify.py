"""A speculative-verify call (T tokens, intermediate states, the final state not written) on a
K-first state: cuda-v4's K-first kernel against fla-recurrent's, and cuda-v4 on the same call
k-last, on a GPU.  CUDA events around replays of a CUDA graph of one call on each of rotated
input sets (lab.kfirst_rows.time_us), in place, dense state, intermediate states [B, T, HV, .., ..]
in the state's dtype.

    python -m lab.kfirst_verify --geom 16/32 --batches 1,4,16,64 --tokens 2,4
"""
from __future__ import annotations

import torch

import gdnzoo
from gdnzoo.inputs import make_inputs
from lab.kfirst_rows import batches, parser, time_us

ENTRIES = (("cuda-v4", True), ("fla-recurrent", True), ("cuda-v4", False))


def sets_for(B, T, H, HV, sd, n, kfirst):
    out = []
    for i in range(n):
        x = make_inputs(B=B, T=T, H=H, HV=HV, state_dtype=sd, device="cuda", seed=i)
        st = x.state.transpose(-1, -2).contiguous() if kfirst else x.state
        inter = torch.empty(B, T, *st.shape[1:], dtype=st.dtype, device="cuda")
        out.append((x, st, torch.empty_like(x.v), inter))
    return out


def main(argv=None):
    p = parser(__doc__, "1,4,16,64")
    p.add_argument("--tokens", default="2,4")
    a = p.parse_args(argv)
    sd = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[a.state_dtype])
    print("us a call: " + ", ".join(f"{n} {'K-first' if kf else 'k-last'}" for n, kf in ENTRIES))
    for T in (int(t) for t in a.tokens.split(",")):
        for H, HV, B, n in batches(a):
            row = [f"{a.geom} B={B} T={T} {a.state_dtype} ({n} sets)"]
            for name, kf in ENTRIES:
                layout = "k-first" if kf else "k-last"

                def call(x, st, out, inter, name=name, layout=layout):
                    gdnzoo.decode(x.q, x.k, x.v, st, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                                  out=out, intermediate_states=inter, update_state=False,
                                  state_layout=layout, algo=name)
                row.append(f"{time_us(call, sets_for(B, T, H, HV, sd, n, kf)):8.2f}")
            print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()

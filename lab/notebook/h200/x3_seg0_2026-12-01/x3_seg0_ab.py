"""cuda-chunk's x3 chain in segments with segment 0's outputs stored into ``out`` (bf16, final;
the output pass skips segment 0; "rows": by plain stores instead of one TMA store a chunk)
against the data flow before ("before": every segment's
outputs into the fp32 buffer, the output pass reading all of them), whole calls side by side:
torch.profiler medians (each kernel, their sum, a call's span), outputs and states compared bit
for bit with the product's.  "before" is the product's kernel with its store edited back
(every segment through the fp32 store) and the output pass's ``O_AT`` given as 0.  On an sm_90
GPU with cupy, from the repository root:

    python -m lab.x3_seg0_ab --cells 4/8:1x8192,4/8:1x32768 --forms dense,pool
"""
from __future__ import annotations

import argparse

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends._triton_chunk_cp import cp_out_kernel
from lab.harness import rel
from lab.prefill_gpu import lens_of, make, oracle
from lab.source_edits import edited
from lab.x3_ab import forms_of, timed

BEFORE = [("""            if (seg > 0 || ident)
                store_rows<float>(p, Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4, ident);
            else        // segment 0's outputs are final: into ``out``
#endif""", """            store_rows<float>(p, Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4, ident);
            if (false)
#endif""")]
# segment 0's outputs by each thread's plain stores (the fp32 store's form) instead of the
# swizzled buffer and its TMA store (ptxas, sm_90a: 72 bytes of spill stores against 80)
ROWS = [("""            else        // segment 0's outputs are final: into ``out``
#endif
            store_chunk(p, sm.ob[jc & 1], Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4,
                        tid, ident);""", """            else
                store_rows<bf16_t>(p, Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4, false);
#else
            store_chunk(p, sm.ob[jc & 1], Y, rd ? 1.f : 0.f, eos - t0, t0, row0, i_hv, r0, t4,
                        tid, ident);
#endif""")]
LAUNCH = tc._LAUNCH


def o_at_zero(kernel, grid0, args, **kw):
    """tc._LAUNCH with the output pass reading every segment's outputs from the buffer."""
    if kernel is cp_out_kernel:
        args = (*args[:-1], 0)
    return LAUNCH(kernel, grid0, args, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="4/8:1x8192,4/8:1x32768")
    ap.add_argument("--forms", default="dense,pool")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    product = chain.SOURCE
    variants = {"product": (product, LAUNCH),
                "rows": (edited(product, {"rows": ROWS}, "rows"), LAUNCH),
                "before": (edited(product, {"before": BEFORE}, "before"), o_at_zero)}
    for cell in a.cells.split(","):
        geom, mix = cell.split(":")
        H, HV = map(int, geom.split("/"))
        x = make(lens_of(mix), H, HV, seed=0)
        o64, s64 = oracle(x, True)
        for form, (st, ns, kw) in forms_of(x, a.forms.split(",")).items():
            keep, got = st.clone(), {}
            for rnd in range(a.rounds):
                line = []
                for name, (src, launch) in variants.items():
                    def call(src=src, launch=launch):
                        chain.SOURCE, tc._LAUNCH = src, launch
                        tc.launch(x["q"], x["k"], x["v"], st, x["A_log"], x["a"], x["dt_bias"],
                                  x["b"], x["cu"], None, x["out"], ns, True, **kw,
                                  config=dict(precision="bf16x3", prep="cuda", chain="cuda",
                                              segments=0))
                    st.copy_(keep)
                    x["out"].fill_(float("nan"))
                    call()
                    torch.cuda.synchronize()
                    got[name] = [x["out"].clone(), ns.clone()]
                    err = ""
                    if form == "dense":
                        err = f" err out {rel(got[name][0], o64):.3e} state " \
                              f"{rel(got[name][1], s64):.3e}"
                    med, span = timed(call, a.reps)
                    st.copy_(keep)
                    same = "" if name == "product" else " bit-identical " + str(all(
                        torch.equal(u, w) for u, w in zip(got[name], got["product"])))
                    parts = " + ".join(f"{k[:14]} {v:.1f}" for k, v in med.items())
                    line.append(f"{name} {sum(med.values()):.1f} us span {span:.1f} ({parts})"
                                + same + err)
                chain.SOURCE, tc._LAUNCH = product, LAUNCH
                print(f"{cell:12s} {form:5s} r{rnd} " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()

"""cuda-chunk's x3 chain (``GDN_X3``) against edited copies of it, in the state forms the
automatic prefill serves: whole calls of triton-chunk's launch with the CUDA prep and the CUDA
chain ("bf16x3"), torch.profiler medians (the sum of a call's kernels, and its span), and
whether each variant's outputs, states and checkpoints are bit-identical to the product's.  The
Triton "bf16x3" chain is timed beside for reference.

    python -m lab.x3_ab --edits lab/notebook/h200/x3_forms_2026-12-01/edits.py \\
        --variants x3slo --cells 16/32:1x8192,16/32:8x1024 --forms dense,pool,ckpt
    python -m lab.x3_ab --segments 1,2,4,0 --cells 4/8:1x8192 --forms dense,pool

``--segments``: the CUDA chain cut into each number of segments in turn (0: the product's own
pick); a variant's results are compared bit for bit with the first CUDA entry's.

An edits file gives ``EDITS`` (lab.source_edits) and may give ``SMEM_MORE`` = {variant: bytes}
(shared memory past the product's X3_SMEM) and ``PAIR_SMEM_MORE`` (past X3_PAIR_SMEM, the
paired segmented form's).  On an sm_90 GPU with cupy, from the repository
root."""
from __future__ import annotations

import argparse
import runpy
import statistics

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import triton_chunk as tc
from lab.harness import profiled_events, rel
from lab.prefill_gpu import lens_of, make, oracle
from lab.source_edits import edited

EVERY = 512


def forms_of(x, names):
    """{form: (state, new_state, launch keywords)}: dense in place, a pool of 2N + 3 slots (a
    random permutation's first N), the dense form with checkpoints every EVERY tokens."""
    T, N, HV = x["q"].shape[0], x["cu"].shape[0] - 1, x["v"].shape[1]
    pool = torch.randn(2 * N + 3, HV, 128, 128, device="cuda") * 0.05
    slots = torch.randperm(2 * N + 3, device="cuda")[:N].to(torch.int32)
    ck = torch.empty(T // EVERY + N, HV, 128, 128, device="cuda")
    every = {"dense": (x["state"], x["new_state"], {}),
             "inplace": (x["state"], x["state"], {}),
             "pool-fresh": (pool, pool, dict(state_indices=slots)),
             # the dense state read through slots 0..N-1 (the pool kernel on the dense layout)
             "pool-id": (x["state"], x["state"], dict(state_indices=torch.arange(
                 N, device="cuda", dtype=torch.int32))),
             "pool": (pool, pool, dict(state_indices=slots)),
             "ckpt": (x["state"], x["new_state"], dict(checkpoints=ck, checkpoint_every=EVERY))}
    return {f: every[f] for f in names}


def timed(call, reps):
    """Per kernel name the median record time (every kernel but copies and fills: the "-fresh"
    forms' state copy), and the median span of a call (its first kernel's start to its last
    one's end: the kernels overlap where a programmatic dependent starts before its primary
    ends), torch.profiler, us."""
    ev = [e for e in profiled_events(call, reps) if not e[2].startswith(("Memcpy", "Memset"))]
    per = len(ev) // reps
    by, spans = {}, []
    for i in range(reps):
        call_ev = ev[i * per:(i + 1) * per]
        spans.append(max(e for _, e, _ in call_ev) - call_ev[0][0])
        for s, e, n in call_ev:
            by.setdefault(n, []).append(e - s)
    return {n: statistics.median(v) for n, v in by.items()}, statistics.median(spans)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edits", help="a Python file of EDITS (and SMEM_MORE)")
    ap.add_argument("--variants", default="", help="names of its EDITS")
    ap.add_argument("--segments", default="0",
                    help="the CUDA chain's segments, each timed (0: the product's pick)")
    ap.add_argument("--cells", default="16/32:1x8192,16/32:8x1024")
    ap.add_argument("--forms", default="dense,pool,ckpt")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--kernels", action="store_true", help="each kernel's median too")
    ap.add_argument("--errors", action="store_true",
                    help="the dense form's errors against the float64 per-token oracle")
    ap.add_argument("--no-after-prep", action="store_true",
                    help="the CUDA chain launched plainly, not as the prep's programmatic "
                         "dependent")
    a = ap.parse_args()
    if a.no_after_prep:
        plain = chain.launch

        def launch(*args, **kw):
            kw["after_prep"] = False
            return plain(*args, **kw)
        chain.launch = launch
    spec = runpy.run_path(a.edits) if a.edits else {}
    product, smem, pair_smem = chain.SOURCE, chain.X3_SMEM, chain.X3_PAIR_SMEM
    segs = [int(x) for x in a.segments.split(",")]
    sources = {}
    for v in ["product", *filter(None, a.variants.split(","))]:
        src = product if v == "product" else edited(product, spec["EDITS"], v)
        for S in segs:
            sources[v + (f" S{S}" if S else "")] = (
                src, smem + spec.get("SMEM_MORE", {}).get(v, 0),
                pair_smem + spec.get("PAIR_SMEM_MORE", {}).get(v, 0), S)
    for cell in a.cells.split(","):
        geom, mix = cell.split(":")
        H, HV = map(int, geom.split("/"))
        x = make(lens_of(mix), H, HV, seed=0)
        o64 = s64 = None
        if a.errors:
            o64, s64 = oracle(x, True)
        for form, (st, ns, kw) in forms_of(x, a.forms.split(",")).items():
            keep, got, line = st.clone(), {}, []
            for name, (src, sm, ssm, S) in [("triton", (product, smem, pair_smem, 0)),
                                            *sources.items()]:
                def call(src=src, sm=sm, ssm=ssm, name=name, S=S):
                    chain.SOURCE, chain.X3_SMEM, chain.X3_PAIR_SMEM = src, sm, ssm
                    if form.endswith("-fresh") or form == "inplace":
                        st.copy_(keep)          # the same state every call (copy not summed)
                    tc.launch(x["q"], x["k"], x["v"], st, x["A_log"], x["a"], x["dt_bias"],
                              x["b"], x["cu"], None, x["out"], ns, True, **kw,
                              config=dict(precision="bf16x3", prep="cuda", segments=S,
                                          chain="triton" if name == "triton" else "cuda"))
                st.copy_(keep)
                call()
                torch.cuda.synchronize()
                got[name] = [x["out"].clone(), ns.clone()] + (
                    [kw["checkpoints"].clone()] if "checkpoints" in kw else [])
                st.copy_(keep)
                err = f" err out {rel(got[name][0], o64):.2e} state {rel(got[name][1], s64):.2e}" \
                    if o64 is not None and form == "dense" else ""
                med, span = timed(call, a.reps)
                st.copy_(keep)
                base = next(iter(sources))
                same = "" if name in ("triton", base) else " bit-identical " + str(
                    all(torch.equal(u, w) for u, w in zip(got[name], got[base])))
                parts = " + ".join(f"{k[:12]} {v:.1f}" for k, v in med.items()) if a.kernels else ""
                line.append(f"{name} {sum(med.values()):.1f} us span {span:.1f}"
                            + (f" ({parts})" if parts else "") + same + err)
            chain.SOURCE, chain.X3_SMEM, chain.X3_PAIR_SMEM = product, smem, pair_smem
            print(f"{cell:14s} {form:6s} " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()

"""cuda-chunk's prefill (its CUDA prep kernel, then triton-chunk's sequential kernel) once per
case, for compute-sanitizer (from the repository root, on a GPU with cupy):

    compute-sanitizer --tool memcheck  python3 -m lab.sanitize_chunk
    compute-sanitizer --tool racecheck python3 -m lab.sanitize_chunk

Cases: ragged batches with zero-length and one-token sequences, int32 and int64 cu_seqlens,
GVA 2 and 3, fp32 and bf16 states, no initial state, destination passing, FLA's g/beta (beta
in [0, 2)), allow_neg_eigval, precision "bf16", a pool with padding and separate write slots,
checkpoints, PDL behind a torch kernel that rewrites q, k and v, and cu_seqlens past T (the
kernels hold their bounds; no reference there, only that nothing reads or writes outside the
tensors).  Each case with a reference is judged by the gate against pt-reference; one line a case.
"""
from __future__ import annotations

import dataclasses

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.inputs import make_prefill_inputs

F32, BF16 = torch.float32, torch.bfloat16
CASES = [
    # lengths, H, HV, state dtype, cu_seqlens dtype, gdnzoo.prefill keywords
    ([130, 0, 64, 1, 200], 2, 4, F32, torch.int32, {}),
    ([300], 1, 3, BF16, torch.int64, {}),
    ([65, 63, 0], 2, 4, F32, torch.int32, dict(state=None)),
    ([100, 29], 2, 4, F32, torch.int32, dict(dest=True)),
    ([190, 66], 2, 4, F32, torch.int32, dict(gates="g/beta")),     # beta in [0, 2)
    ([1, 17, 260], 2, 4, F32, torch.int64, dict(allow_neg_eigval=True)),
    ([200, 64], 2, 4, F32, torch.int32, dict(config=dict(precision="bf16"))),
    ([90, 0, 150], 2, 4, BF16, torch.int32, dict(pool=True)),
    ([256, 130], 2, 4, F32, torch.int32, dict(checkpoint_every=64)),
    ([120, 77], 2, 4, F32, torch.int32, dict(pdl="wait")),
]


def call(x, algo, kw):
    """gdnzoo.prefill of ``x`` by ``algo`` with the case's keywords: (out, the state written)."""
    kw = dict(kw)
    extra = {}
    if kw.pop("dest", False):
        extra["new_state"] = torch.full_like(x.state, float("nan"))
    if kw.pop("gates", None):
        gen = torch.Generator(device="cuda").manual_seed(7)
        x = dataclasses.replace(x, A_log=None, dt_bias=None, a=None, b=None)
        extra.update(g=-torch.rand(x.q.shape[0], x.v.shape[1], device="cuda", generator=gen),
                     beta=2 * torch.rand(x.q.shape[0], x.v.shape[1], device="cuda",
                                         generator=gen))
    if kw.pop("pool", False):
        N = x.cu_seqlens.numel() - 1
        pool = 0.05 * torch.randn((3 * N + 1,) + tuple(x.state.shape[1:]), device="cuda",
                                  generator=torch.Generator(device="cuda").manual_seed(3))
        x = dataclasses.replace(x, state=pool.to(x.state.dtype))
        read = torch.arange(N, dtype=torch.int32, device="cuda")
        read[1] = -1
        extra.update(state_indices=read, new_state_indices=read + N)
    every = kw.pop("checkpoint_every", None)
    if every:
        rows = x.q.shape[0] // every
        extra.update(checkpoint_every=every, checkpoints=torch.full(
            (rows,) + tuple(x.state.shape[1:]), float("nan"), device="cuda"))
    if kw.pop("state", True) is None:
        x = dataclasses.replace(x, state=None)
    config = kw.pop("config", None)
    if kw.get("pdl"):
        for t in (x.q, x.k, x.v):             # a producer right before, without PDL
            torch.mul(t.clone(), 1, out=t)
    if algo != "cuda-chunk" or config is None:
        out, st = gdnzoo.prefill(*x.args(), use_qk_l2norm=True, algo=algo, **kw, **extra)
    else:
        from gdnzoo.backends import triton_chunk as tc
        args = x.args()
        out = torch.empty_like(x.v)
        st = extra.get("new_state", x.state)
        tc.launch(*args, out, st, True, config=dict(config, prep="cuda"), **kw)
    return out, st, extra.get("checkpoints")


def main():
    ok = n = 0
    for i, (lens, H, HV, sd, cdt, kw) in enumerate(CASES):
        x = make_prefill_inputs(lens, H=H, HV=HV, state_dtype=sd, device="cuda", seed=i,
                                index_dtype=cdt)
        ref = call(dataclasses.replace(x, state=None if x.state is None else x.state.clone()),
                   "pt-reference", {k: v for k, v in kw.items() if k not in ("pdl", "config")})
        got = call(x, "cuda-chunk", kw)
        torch.cuda.synchronize()
        tol = gate.state_tol_of("triton-chunk-bf16", "prefill") if "config" in kw else None
        j = gate.judge(got[0], got[1], ref[0], ref[1], state_dtype=sd, state_tol=tol)
        ck = got[2] is None or gate.relative_error(
            got[2].nan_to_num(), ref[2].nan_to_num()) < 1e-4
        n += 1
        ok += j.ok and ck
        print(("PASS" if j.ok and ck else "FAIL"), f"case {i}: lens={lens} {H}/{HV} {sd} {cdt} "
              f"{kw}: {j.reason}", flush=True)
    # cu_seqlens past T and out of order: the bounds are held, nothing to compare
    x = make_prefill_inputs([64, 64, 64], H=2, HV=4, device="cuda", seed=11)
    x.cu_seqlens.copy_(torch.tensor([0, 500, 100, 192], dtype=torch.int32))
    gdnzoo.prefill(*x.args(), use_qk_l2norm=True, algo="cuda-chunk")
    torch.cuda.synchronize()
    print(f"ran bad cu_seqlens [0, 500, 100, 192] at T = 192; {ok}/{n} cases passed the gate")


if __name__ == "__main__":
    main()

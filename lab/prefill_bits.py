"""The bits of eager prefill calls, for comparing two trees on a GPU (each run in its own
process, then ``--compare``): per case, two calls of one signature on new tensors each (the
second finds the dispatcher's memo and the backend's bound launcher), then the same signature
with q, k, v and out 8 bytes off 16 (the CUDA kernels' copies refuse them: another form) and
aligned again.  Writes {case: [sha256 of out and the state each call]} as JSON.

    PYTHONPATH=/tmp/tree_old:. python3 -m lab.prefill_bits /tmp/old.json
    PYTHONPATH=/tmp/tree_new:. python3 -m lab.prefill_bits /tmp/new.json
    python3 -m lab.prefill_bits --compare /tmp/old.json /tmp/new.json
"""
from __future__ import annotations

import hashlib
import json
import sys

import torch

# (name, algo, heads H/HV, lengths, form); algo None: the automatic choice
CASES = [
    ("auto 4/8 1x8192", None, (4, 8), [8192], "dense"),
    ("auto 4/8 16x256 pool", None, (4, 8), [256] * 16, "pool"),
    ("auto 4/8 64x64", None, (4, 8), [64] * 64, "dense"),
    ("auto 16/32 8x1024", None, (16, 32), [1024] * 8, "dense"),
    ("bf16 4/8 1x8192", "cuda-chunk-bf16", (4, 8), [8192], "dense"),
    ("bf16 16/32 1x8192", "cuda-chunk-bf16", (16, 32), [8192], "dense"),
    ("bf16 4/8 ragged pool", "cuda-chunk-bf16", (4, 8), [2048, 1, 700, 0, 63, 65], "pool"),
    ("bf16 4/8 16x256 pdl", "cuda-chunk-bf16", (4, 8), [256] * 16, "pdl"),
    ("bf16 4/8 2x1024 k-first", "cuda-chunk-bf16", (4, 8), [1024] * 2, "kfirst"),
    ("triton 4/8 1x8192", "triton-chunk", (4, 8), [8192], "dense"),
    ("triton 4/8 16x256 nostate", "triton-chunk", (4, 8), [256] * 16, "nostate"),
]


def offset(t: torch.Tensor, off: bool) -> torch.Tensor:
    """A copy of ``t`` whose data starts 8 bytes past a 16-byte boundary when ``off``."""
    if not off:
        return t.clone()
    n = t.numel()
    buf = torch.empty(n + 8, dtype=t.dtype, device=t.device)
    y = buf[8 // t.element_size():][:n].view(t.shape)
    y.copy_(t)
    return y


def one(algo, heads, lengths, form, seed, off):
    import gdnzoo
    from gdnzoo.inputs import make_prefill_inputs
    H, HV = heads
    x = make_prefill_inputs(lengths, H=H, HV=HV, K=128, V=128, seed=seed, device="cuda",
                            state=form != "nostate")
    q, k, v = (offset(t, off) for t in (x.q, x.k, x.v))
    out = offset(torch.zeros_like(x.v), off)
    kw = dict(algo=algo, use_qk_l2norm=True, out=out)
    state = x.state
    if form == "pool":
        n = len(lengths)
        state = torch.cat([x.state, x.state.flip(0)])
        kw.update(state_indices=torch.arange(n, dtype=torch.int32, device="cuda"),
                  new_state_indices=torch.arange(n, 2 * n, dtype=torch.int32, device="cuda"))
    elif form == "pdl":
        kw["pdl"] = "wait"
    elif form == "kfirst":
        state = state.transpose(-1, -2).contiguous()
        kw["state_layout"] = "k-first"
    o, s = gdnzoo.prefill(q, k, v, state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale,
                          **kw)
    torch.cuda.synchronize()
    return [hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
            .hexdigest()[:16] for t in (o, s)]


def main():
    if sys.argv[1] == "--compare":
        a, b = (json.loads(open(p).read()) for p in sys.argv[2:4])
        bad = [c for c in a if a[c] != b.get(c) or isinstance(a[c], str)]
        for c in a:
            said = "DIFFERENT" if a[c] != b.get(c) else "REFUSED" if c in bad else "same"
            print(f"{c:28s} {said:9s} {a[c]}")
        print(f"{len(a) - len(bad)} of {len(a)} cases ran and were bit-identical")
        sys.exit(1 if bad else 0)
    res = {}
    for name, algo, heads, lengths, form in CASES:
        try:
            res[name] = [one(algo, heads, lengths, form, seed, off)
                         for seed, off in ((0, False), (1, False), (2, True), (3, False))]
        except Exception as e:          # a form a tree refuses: said, compared as such
            res[name] = f"{type(e).__name__}: {e}"
        print(name, res[name], flush=True)
    open(sys.argv[1], "w").write(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""Seeded, realistic inputs for any geometry, and the contest batch mix.

Magnitudes follow what Qwen3-Next layers produce: q and k rows of roughly unit norm, a small
state, A = exp(A_log) in [1, 16], dt_bias the inverse softplus of dt in [1e-3, 1e-1], so the
decay g sits mostly in (0.5, 1) and beta = sigmoid(b) spreads over (0, 1).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

# FlashInfer-Bench contest `gdn_decode_qk4_v8_d128_k_last`: 54 workloads.
CONTEST_BATCH_MIX = [1] * 10 + [4] * 8 + [8] * 7 + [16] * 7 + [32] * 7 + [48] * 7 + [64] * 8
CONTEST_GEOMETRY = dict(H=4, HV=8, K=128, V=128)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    state: torch.Tensor
    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    scale: float

    op = "decode"

    def args(self):
        """Positional arguments of gdnzoo.decode, in order."""
        return (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias, self.b,
                self.scale)

    @staticmethod
    def inputs() -> tuple:
        """The names of the tensors a call only reads (a gate checks they stay unchanged)."""
        return ("q", "k", "v", "A_log", "a", "dt_bias", "b")

    def reference(self, use_qk_l2norm=False, compute_dtype=torch.float64):
        """The oracle's (out, new_state) of these inputs (:mod:`gdnzoo.reference`)."""
        from gdnzoo.reference import reference_outputs
        return reference_outputs(self, use_qk_l2norm, compute_dtype)

    def clone(self) -> "Inputs":
        return Inputs(*(x.clone() if isinstance(x, torch.Tensor) else x for x in
                        (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias,
                         self.b, self.scale)))


def make_inputs(B=1, T=1, H=4, HV=8, K=128, V=128, *, state_dtype=torch.float32,
                io_dtype=torch.bfloat16, dt_bias_dtype=torch.float32, device="cpu", seed=0,
                scale=None) -> Inputs:
    """Generate one set of inputs; the same seed gives the same tensors on any device."""
    if isinstance(state_dtype, str):
        state_dtype = DTYPES[state_dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def unif(*shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float32)

    q = randn(B, T, H, K, std=1.0 / math.sqrt(K))
    k = randn(B, T, H, K, std=1.0 / math.sqrt(K))
    v = randn(B, T, HV, V, std=0.5)
    state = randn(B, HV, V, K, std=0.05)
    A_log = torch.log(unif(HV, lo=1.0, hi=16.0))
    dt = torch.exp(unif(HV, lo=math.log(1e-3), hi=math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))          # inverse softplus
    a = randn(B, T, HV, std=1.0)
    b = randn(B, T, HV, std=1.5)
    cast = dict(device=device)
    return Inputs(
        q=q.to(io_dtype).to(**cast), k=k.to(io_dtype).to(**cast), v=v.to(io_dtype).to(**cast),
        state=state.to(state_dtype).to(**cast), A_log=A_log.to(**cast),
        a=a.to(io_dtype).to(**cast), dt_bias=dt_bias.to(dt_bias_dtype).to(**cast),
        b=b.to(io_dtype).to(**cast),
        scale=(1.0 / math.sqrt(K)) if scale is None else scale)


def contest_workloads(seed=0, device="cpu", state_dtype=torch.float32):
    """The 54-workload batch mix at the contest geometry, one seed per workload."""
    for i, B in enumerate(CONTEST_BATCH_MIX):
        yield i, B, make_inputs(B=B, T=1, **CONTEST_GEOMETRY, state_dtype=state_dtype,
                                device=device, seed=seed * 1000 + i)


# ---------------------------------------------------------------------------- prefill

@dataclass
class PrefillInputs:
    """The arguments of :func:`gdnzoo.prefill`: N sequences packed on one token axis."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    state: torch.Tensor | None
    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    cu_seqlens: torch.Tensor
    scale: float

    op = "prefill"

    def args(self):
        """Positional arguments of gdnzoo.prefill, in order."""
        return (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias, self.b,
                self.cu_seqlens, self.scale)

    @staticmethod
    def inputs() -> tuple:
        """The names of the tensors a call only reads (a gate checks they stay unchanged)."""
        return ("q", "k", "v", "A_log", "a", "dt_bias", "b", "cu_seqlens")

    def reference(self, use_qk_l2norm=False, compute_dtype=torch.float64):
        """The oracle's (out, final states) of these inputs (:mod:`gdnzoo.prefill_reference`)."""
        from gdnzoo.prefill_reference import reference_outputs
        return reference_outputs(self, use_qk_l2norm, compute_dtype)

    @property
    def lengths(self) -> list:
        cu = self.cu_seqlens.tolist()
        return [e - s for s, e in zip(cu, cu[1:])]

    def clone(self) -> "PrefillInputs":
        return PrefillInputs(*(x.clone() if isinstance(x, torch.Tensor) else x for x in
                               self.args()))


def make_prefill_inputs(lengths=(64,), H=4, HV=8, K=128, V=128, *, state_dtype=torch.float32,
                        io_dtype=torch.bfloat16, dt_bias_dtype=torch.float32, device="cpu",
                        seed=0, scale=None, state=True, index_dtype=torch.int32):
    """Prefill inputs for sequences of the given ``lengths`` (zero allowed), with the decode
    inputs' magnitudes (:func:`make_inputs`); ``state=False`` gives ``state=None`` (zeros).
    The same seed gives the same tensors on any device."""
    T, N = int(sum(lengths)), len(lengths)
    x = make_inputs(B=1, T=max(T, 1), H=H, HV=HV, K=K, V=V, state_dtype=state_dtype,
                    io_dtype=io_dtype, dt_bias_dtype=dt_bias_dtype, seed=seed, scale=scale)
    s = make_inputs(B=max(N, 1), T=1, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype,
                    io_dtype=io_dtype, seed=seed + 1).state[:N]
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=index_dtype)

    def tok(t):
        return t[0, :T].contiguous().to(device)
    return PrefillInputs(q=tok(x.q), k=tok(x.k), v=tok(x.v),
                         state=s.contiguous().to(device) if state else None,
                         A_log=x.A_log.to(device), a=tok(x.a), dt_bias=x.dt_bias.to(device),
                         b=tok(x.b), cu_seqlens=cu.to(device), scale=x.scale)


# The contest's prefill definition `gdn_prefill_qk4_v8_d128_k_last`: its 100 workloads are
# captured tensors that are not available offline; this mix stands in for them (one long
# prompt, a few medium ones, many short ones, ragged mixes with a zero-length sequence).
CONTEST_PREFILL_MIX = ([[8192]] + [[1024] * 8] + [[256] * 16] + [[64] * 64]
                       + [[2048, 1, 700, 0, 63, 65, 1500]] + [[s] for s in (1, 17, 64, 65, 130)]
                       + [[3000, 5000], [128] * 4 + [4096]])


def contest_prefill_workloads(seed=0, device="cpu", state=True):
    """The prefill workload mix at the contest geometry (H=4, HV=8, K=V=128, fp32 state,
    int64 cu_seqlens), one seed per workload."""
    for i, lengths in enumerate(CONTEST_PREFILL_MIX):
        yield i, lengths, make_prefill_inputs(lengths, **CONTEST_GEOMETRY, device=device,
                                              seed=seed * 1000 + i, state=state,
                                              index_dtype=torch.int64)

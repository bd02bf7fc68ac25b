"""Seeded, realistic inputs for any geometry, and the contest batch mix.

Magnitudes follow what Qwen3-Next layers produce: q and k rows of roughly unit norm, a small
state, A = exp(A_log) in [1, 16], dt_bias the inverse softplus of dt in [1e-3, 1e-1], so the
decay g sits mostly in (0.5, 1) and beta = sigmoid(b) spreads over (0, 1).
"""
from __future__ import annotations

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

    def args(self):
        """Positional arguments of gdnzoo.decode, in order."""
        return (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias, self.b,
                self.scale)

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

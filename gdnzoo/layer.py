"""A small Gated Delta Net decode layer built on ``torch.ops.gdnzoo.decode_``: how a model calls
gdnzoo so that ``torch.compile(fullgraph=True)`` and CUDA graphs take the step whole.

One decode step (T = 1) of B sequences, hidden states ``x`` [B, hidden] in, [B, hidden] out::

    proj      = in_proj(x)                       # [B, 2*H*K + HV*V + 2*HV]
    mixed_qkv = silu(proj[:, :2*H*K + HV*V])     # the producer: packed q || k || v per row
    a, b      = the last 2*HV columns of proj    # strided views, [B, 1, HV] each
    q, k, v   = views of mixed_qkv               # [B, 1, H, K], [B, 1, H, K], [B, 1, HV, V]
    torch.ops.gdnzoo.decode_(q, k, v, state, A_log, a, dt_bias, b, ..., out, ...)
    return out_proj(out.view(B, HV*V))

The producer stands in for the short causal convolution of real models: one elementwise kernel
that writes ``mixed_qkv``, which decode then reads through views (no copies), as engines do.
The recurrent state is a buffer: a pool [slots, HV, V, K] addressed by ``state_indices`` (the
serving form), or a dense [batch, HV, V, K] state (then every call has exactly ``batch`` rows).
The layer is inference only: its parameters do not require grad (decode computes no gradients).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import gdnzoo.op  # noqa: F401  (registers torch.ops.gdnzoo.decode_)


class GatedDeltaNetDecode(nn.Module):
    """Gated Delta Net decode layer; ``slots`` (a state pool) or ``batch`` (a dense state).

    ``algo``, ``pdl`` and ``use_qk_l2norm`` are passed to every decode call; ``null_slot``
    marks a padding slot of the pool besides negative indices (vLLM: 0)."""

    def __init__(self, hidden: int, H: int, HV: int, K: int, V: int, *, slots: int | None = None,
                 batch: int | None = None, dtype=torch.bfloat16, state_dtype=torch.float32,
                 algo: str | None = None, pdl: str | None = None, use_qk_l2norm: bool = True,
                 null_slot: int | None = None, device=None, seed: int = 0):
        super().__init__()
        if (slots is None) == (batch is None):
            raise ValueError(f"slots/batch: give exactly one (a pool of slots or a dense state "
                             f"of batch rows), got slots={slots}, batch={batch}")
        if HV % H:
            raise ValueError(f"HV: expected a multiple of H={H}, got {HV}")
        self.H, self.HV, self.K, self.V = H, HV, K, V
        self.algo, self.pdl, self.null_slot = algo, pdl, null_slot
        self.use_qk_l2norm = use_qk_l2norm
        self.pooled = slots is not None
        self.width = 2 * H * K + HV * V                       # mixed_qkv's row
        gen = torch.Generator().manual_seed(seed)
        self.in_proj = nn.Linear(hidden, self.width + 2 * HV, bias=False)
        self.out_proj = nn.Linear(HV * V, hidden, bias=False)
        for lin in (self.in_proj, self.out_proj):
            nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.in_features), generator=gen)
        A = 1.0 + 15.0 * torch.rand(HV, generator=gen)                 # A in [1, 16]
        dt = torch.exp(math.log(1e-3) + math.log(100.0) * torch.rand(HV, generator=gen))
        self.register_buffer("A_log", torch.log(A))
        self.register_buffer("dt_bias", dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        rows = slots if self.pooled else batch
        self.register_buffer("state", torch.zeros(rows, HV, V, K, dtype=state_dtype))
        self.to(device=device)
        self.in_proj.to(dtype)
        self.out_proj.to(dtype)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor, state_indices: torch.Tensor | None = None) -> torch.Tensor:
        if self.pooled == (state_indices is None):
            raise ValueError("state_indices: required with a pool (slots=...), not allowed "
                             "with a dense state (batch=...)")
        B, H, HV, K, V = x.shape[0], self.H, self.HV, self.K, self.V
        proj = self.in_proj(x)
        mixed_qkv = F.silu(proj[:, :self.width])
        q = mixed_qkv[:, :H * K].view(B, 1, H, K)
        k = mixed_qkv[:, H * K:2 * H * K].view(B, 1, H, K)
        v = mixed_qkv[:, 2 * H * K:].view(B, 1, HV, V)
        a = proj[:, self.width:self.width + HV].unsqueeze(1)
        b = proj[:, self.width + HV:].unsqueeze(1)
        out = torch.empty(B, 1, HV, V, dtype=x.dtype, device=x.device)
        torch.ops.gdnzoo.decode_(q, k, v, self.state, self.A_log, a, self.dt_bias, b, None, out,
                                 None, self.use_qk_l2norm, self.algo, state_indices, None,
                                 self.null_slot, None, None, True, None, self.pdl)
        return self.out_proj(out.view(B, HV * V))

"""The engines' prefill around FlashInfer's chunk kernel, as vLLM and SGLang run it on Hopper,
and gdnzoo's adapters that replace it (``gdnzoo.integrations.vllm.chunked_prefill``,
``gdnzoo.integrations.sglang.extend``), on one case each: used by ``gdnzoo bench --mode
engine-prefill`` and ``lab/engine_prefill_gpu.py``.

A case (Qwen3-Next's linear-attention shard by default: H=4 q/k heads, HV=8 value heads,
K=V=128, bf16 q/k/v) holds the engine's own tensors: g (log decay) and beta fp32 ``[1, T,
HV]``; vLLM's q, k L2-normalized by its post-conv prep (here in fp32, cast to bf16), SGLang's
q, k, v views of one conv-output row tensor; a page-strided pool of fp32 or bf16 states, one
sequence in four without an initial state, ``pads`` padded entries (zero-length) at the end.

* vLLM (qwen_gdn_linear_attn's prefill branch): gather ``ssm_state[prefill_state_indices]``,
  zero the rows whose ``prefill_has_initial_state`` is False, then its FlashInfer wrapper
  (states to fp32, ``g = exp(g)``, ``use_qk_l2norm_in_kernel=False``), scatter the final
  states back in the pool's dtype.
* SGLang (FlashInferGDNKernel.extend on SM90): q, k L2-normalized outside the kernel,
  ``alpha = exp(g)``, negative indices remapped to the pool's last slot for the gather, the
  kernel, ``index_copy_`` of the valid sequences' final states.  SGLang zeroes a slot when it
  allocates it: the fresh sequences' slots are zero in the case.

``kernel`` is FlashInfer's ``chunk_gated_delta_rule`` or, on a machine without it, a stand-in
with its signature (:func:`stand_in`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import gdnzoo
from gdnzoo import prefill_contract
from gdnzoo.inputs import make_prefill_inputs, paged_pool
from gdnzoo.integrations import sglang as sg, vllm as vl
from gdnzoo.pool import Pool
from gdnzoo.prefill_reference import reference_prefill

H, HV = 4, 8


def flashinfer_chunk():
    """FlashInfer's chunk_gated_delta_rule, as the engines import it."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule
    return chunk_gated_delta_rule


def stand_in(algo):
    """FlashInfer's call (linear gate alpha, fp32 states) served by gdnzoo's dense prefill on
    ``algo``: the engines' sequences on a machine without FlashInfer (tests, CPU)."""

    def run(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
            use_qk_l2norm_in_kernel):
        return gdnzoo.prefill(q, k, v, initial_state, None, None, None, None, cu_seqlens, scale,
                              g=torch.log(g), beta=beta, use_qk_l2norm=use_qk_l2norm_in_kernel,
                              algo=algo)
    return run


# ------------------------------------------------------------------ the engines' sequences

def vllm_sequence(fi, q, k, v, g, beta, ssm_state, idx, has_init, cu):
    initial_state = ssm_state[idx]
    initial_state[~has_init, ...] = 0
    o, final = fi(q=q.squeeze(0).contiguous(), k=k.squeeze(0).contiguous(),
                  v=v.squeeze(0).contiguous(), g=torch.exp(g.squeeze(0).float()),
                  beta=beta.squeeze(0).float(), scale=None,
                  initial_state=initial_state.to(torch.float32), output_final_state=True,
                  cu_seqlens=cu, use_qk_l2norm_in_kernel=False)
    ssm_state[idx] = final.to(ssm_state.dtype)
    return o.unsqueeze(0)


def sglang_sequence(fi, q, k, v, g, beta, ssm_states, cache_indices, query_start_loc):
    T = q.shape[1]
    q_fi = F.normalize(q[0].contiguous().float(), dim=-1, eps=1e-6).to(q.dtype)
    k_fi = F.normalize(k[0].contiguous().float(), dim=-1, eps=1e-6).to(k.dtype)
    safe = torch.where(cache_indices >= 0, cache_indices, ssm_states.shape[0] - 1).to(torch.int64)
    o, final = fi(q=q_fi, k=k_fi, v=v[0].contiguous(), g=torch.exp(g[0].to(torch.float32)),
                  beta=beta[0].to(torch.float32), scale=None,
                  initial_state=ssm_states[safe].to(torch.float32), output_final_state=True,
                  cu_seqlens=query_start_loc.to(torch.int64), use_qk_l2norm_in_kernel=False)
    valid = cache_indices >= 0
    if valid.any():
        ssm_states.index_copy_(0, safe[valid], final[valid].to(ssm_states.dtype))
    return o.view(1, T, v.shape[2], v.shape[3])


# ------------------------------------------------------------------ one case

def make_case(engine, lengths, pads, K, state_dtype, seed, device, heads=(H, HV)):
    """The engine's tensors for ``lengths`` (+ ``pads`` padded entries), as a dict."""
    nh, nhv = heads
    lengths = list(lengths) + [0] * pads
    N = len(lengths)
    x = make_prefill_inputs(lengths, H=nh, HV=nhv, K=K, V=K, seed=seed, device=device)
    T = x.q.shape[0]
    g = (-x.A_log.float().exp() * F.softplus(x.a.float() + x.dt_bias.float()))[None]
    beta = x.b.float().sigmoid()[None]
    gen = torch.Generator().manual_seed(seed + 7)
    if engine == "vllm":
        q, k = (F.normalize(t.float(), dim=-1, eps=1e-6).to(t.dtype)[None] for t in (x.q, x.k))
        v = x.v[None].contiguous()
    else:
        HK, W = nh * K, 2 * nh * K + nhv * K
        rows = torch.empty(T, W + 64, dtype=x.q.dtype, device=device)
        q, k, v = (rows[None, :, a:b].unflatten(2, (h, K))
                   for a, b, h in ((0, HK, nh), (HK, 2 * HK, nh), (2 * HK, W, nhv)))
        for view, t in zip((q, k, v), (x.q, x.k, x.v)):
            view[0].copy_(t)
    P = 2 * N + 8
    pp = paged_pool(P, nhv, K, K, dtype=state_dtype, device=device, gen=gen)
    slots = (torch.randperm(P - 2, generator=gen)[:N] + 1).tolist()    # never 0 or P-1
    slots[N - pads:] = [0 if engine == "vllm" else -1] * pads
    idx = torch.tensor(slots, dtype=torch.int32, device=device)
    has_init = torch.tensor([n % 4 != 1 for n in range(N)], device=device)
    if engine == "sglang":                    # SGLang zeroes a fresh sequence's slot
        pp.state[slots[1:N - pads:4]] = 0     # (has_init False: n % 4 == 1)
    named = slots[:N - pads]
    return dict(q=q, k=k, v=v, g=g, beta=beta, buf=pp.buf, pool=pp.state, idx=idx,
                has_init=has_init, cu=x.cu_seqlens, named=named, pads=pads, lengths=lengths)


def pool_copy(c):
    """(storage, pool view) of a fresh copy of the case's page-strided pool."""
    buf = c["buf"].clone()
    pool = buf.as_strided(c["pool"].shape, c["pool"].stride(),
                          c["pool"].storage_offset() - c["buf"].storage_offset())
    return buf, pool


def engine_call(engine, fi, c, pool):
    """call() -> out [1, T, HV, V]: the engine's sequence around ``fi`` on ``pool``."""
    if engine == "vllm":
        return lambda: vllm_sequence(fi, c["q"], c["k"], c["v"], c["g"], c["beta"], pool,
                                     c["idx"].long(), c["has_init"], c["cu"])
    return lambda: sglang_sequence(fi, c["q"], c["k"], c["v"], c["g"], c["beta"], pool,
                                   c["idx"], c["cu"])


def adapter_call(engine, c, pool, algo):
    """call() -> out [1, T, HV, V]: gdnzoo's adapter (backend ``algo``, None: automatic) on
    ``pool`` in place."""
    if engine == "vllm":
        return lambda: vl.chunked_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], pool,
                                          c["idx"], c["has_init"], c["cu"], algo=algo)
    return lambda: sg.extend(c["q"], c["k"], c["v"], c["g"], c["beta"], ssm_states=pool,
                             cache_indices=c["idx"], query_start_loc=c["cu"], algo=algo)[0]


def adapter_problem(engine, c):
    """The prefill Problem the case's adapter call poses (what the registry decides who
    serves): the arguments ``adapter_call`` hands gdnzoo.prefill through the adapter."""
    vllm = engine == "vllm"
    return prefill_contract.validate(
        c["q"][0], c["k"][0], c["v"][0], c["pool"], cu_seqlens=c["cu"], g=c["g"][0],
        beta=c["beta"][0], use_qk_l2norm=not vllm, state_indices=c["idx"],
        has_initial_state=c["has_init"] if vllm else None,
        null_slot=vl.NULL_SLOT if vllm else sg.NULL_SLOT)[0]


def oracle(engine, c):
    """Float64 output [T, HV, V] and pool after the case's prefill (per-token loop)."""
    null = 0 if engine == "vllm" else -1
    T, K, nhv = c["q"].shape[1], c["q"].shape[3], c["v"].shape[2]
    ref_pool = c["pool"].double()
    ref_out = torch.empty(T, nhv, K, dtype=torch.float64, device=c["q"].device)
    reference_prefill(c["q"][0], c["k"][0], c["v"][0], ref_pool.clone(), None, None, None, None,
                      c["cu"], K ** -0.5, ref_out, ref_pool, engine == "sglang",
                      Pool(c["idx"], c["idx"], null),
                      c["has_init"] if engine == "vllm" else None,
                      compute_dtype=torch.float64, g=c["g"][0].double(),
                      beta=c["beta"][0].double())
    return ref_out, ref_pool


def rest_untouched(c, buf, before, pool) -> bool:
    """Whether the pool's storage outside the case's named slots is bit-identical to ``before``."""
    keep = torch.ones_like(buf, dtype=torch.bool)
    page, block = pool.stride(0), pool[0].numel()
    base = pool.storage_offset() - buf.storage_offset()
    for s in c["named"]:
        keep[base + s * page:base + s * page + block] = False
    return bool(torch.equal(buf[keep], before[keep]))


def pad_rows_zero(c, o) -> bool:
    """Whether the padded entries' output rows of ``o`` [1, T, HV, V] are zeros."""
    cu = c["cu"].tolist()
    n_real = len(c["lengths"]) - c["pads"]
    return bool(torch.count_nonzero(o[0, cu[n_real]:cu[-1]]) == 0)

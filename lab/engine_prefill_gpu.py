"""The engines' prefill around FlashInfer's chunk kernel against gdnzoo's prefill adapters
(gdnzoo.integrations.vllm.chunked_prefill, gdnzoo.integrations.sglang.extend), on a Hopper GPU.

First run on a lent H200 on 2026-11-28 (lab/notebook/h200/engine_prefill_2026-11-28.log); on CPU
its logic runs with --smoke, where gdnzoo's dense prefill (pt-reference) stands in for FlashInfer.

    python -m lab.engine_prefill_gpu                        # H100/H200, flashinfer importable
    python -m lab.engine_prefill_gpu --state-dtype bf16 --algo triton-chunk
    python -m lab.engine_prefill_gpu --smoke                # CPU: the script's logic only

Per sequence mix (Qwen3-Next's linear-attention shard: H=4 q/k heads, HV=8 value heads,
K=V=128, bf16 q/k/v, a page-strided pool of fp32 or bf16 states, some sequences without an
initial state, in the padded mix zero-length padded entries):

(a) vLLM, as qwen_gdn_linear_attn's prefill branch runs on Hopper: q, k L2-normalized by its
    post-conv prep (done here in fp32, cast to bf16), g (log decay) and beta fp32 [1, T, HV];
    gather ``ssm_state[prefill_state_indices]``, zero the rows whose
    ``prefill_has_initial_state`` is False, then its FlashInfer wrapper: squeeze, state to
    fp32, ``g = exp(g)``, beta fp32, ``flashinfer.gdn_prefill.chunk_gated_delta_rule(...,
    output_final_state=True, use_qk_l2norm_in_kernel=False)``, scatter the final states in
    the pool's dtype.  Against ``vllm.chunked_prefill`` on a copy of the same pool.
(b) SGLang, as its FlashInferGDNKernel.extend runs on SM90: q, k, v views of one conv-output
    row tensor, L2-normalized outside the kernel (F.normalize in fp32 here, for its Triton
    l2norm_fwd), ``alpha = exp(g)``, beta fp32, negative indices remapped to the pool's last
    slot for the gather (fp32), the kernel, and ``index_copy_`` of the valid sequences' final
    states back.  SGLang zeroes a slot when it allocates it: the fresh sequences' slots are
    zeroed before both runs.  Against ``sglang.extend`` (``has_initial_state`` None).

Checked: each side against a float64 per-token oracle (gdnzoo.prefill_reference, run on the
GPU) under the project gate (output and the named slots; the engine's side, a peer, with the
peers' state bound); engine against adapter (max abs
difference, output and slots); the adapter leaves the pool's storage outside the named slots
bit-identical; a padded sequence's rows are zeros from the adapter.  Timed: CUDA events around
one call, median of --reps (default 20) after 3 warm-ups, the same inputs each time (warm L2),
the pool updated in place by every call as in serving; the engine's time includes every step
of its sequence (gather, zeroing, casts, l2norm for SGLang, the kernel, the scatter).  A side
that fails the gate gets no speed figure.  Results: $OUT/engine_prefill_gpu.json and .log
(default /tmp/out).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():          # --smoke on CPU: Triton kernels interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdnzoo import gate                                    # noqa: E402
import gdnzoo                                              # noqa: E402
from gdnzoo.inputs import make_prefill_inputs, paged_pool  # noqa: E402
from gdnzoo.integrations import sglang as sg, vllm as vl   # noqa: E402
from gdnzoo.pool import Pool                               # noqa: E402
from gdnzoo.prefill_reference import reference_prefill     # noqa: E402
from lab import harness                                    # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# The engines' side is a peer: judged with the peers' state bound (FlashInfer's chunk kernel
# rounds its states; SGLang also rounds the normalized q, k to bf16 before the kernel).
ENGINE_STATE_TOL = gate.state_tol_of("fi-baseline", "prefill")
H, HV = 4, 8
# (name, lengths, padded entries appended): long, medium, many short, ragged.  No zero-length
# sequence: the engines never schedule one, and FlashInfer 0.7.2 writes no final state for one
# (on an H200, 2026-11-28, the "ragged" mix with a 0 failed on the engines' side: vLLM's
# scatter wrote zeros, SGLang's the NaN of its uninitialized buffer; gdnzoo's adapters passed).
MIXES = [("1x4096", [4096], 0), ("4x1024", [1024] * 4, 0), ("32x64", [64] * 32, 0),
         ("ragged", [2048, 1, 700, 2, 63, 65, 1500], 0), ("8x256+2pad", [256] * 8, 2)]
SMOKE_MIXES = [("ragged", [17, 1, 0, 40], 0), ("3x9+2pad", [9] * 3, 2)]


def flashinfer_chunk():
    """FlashInfer's chunk_gated_delta_rule, as the engines import it."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule
    return chunk_gated_delta_rule


def stand_in_chunk(algo):
    """--smoke: FlashInfer's call (linear gate alpha, fp32 states) served by gdnzoo's dense
    prefill on ``algo``."""
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
    safe = torch.where(cache_indices >= 0, cache_indices,
                       ssm_states.shape[0] - 1).to(torch.int64)
    o, final = fi(q=q_fi, k=k_fi, v=v[0].contiguous(), g=torch.exp(g[0].to(torch.float32)),
                  beta=beta[0].to(torch.float32), scale=None,
                  initial_state=ssm_states[safe].to(torch.float32), output_final_state=True,
                  cu_seqlens=query_start_loc.to(torch.int64), use_qk_l2norm_in_kernel=False)
    valid = cache_indices >= 0
    if valid.any():
        ssm_states.index_copy_(0, safe[valid], final[valid].to(ssm_states.dtype))
    return o.view(1, T, v.shape[2], v.shape[3])


# ------------------------------------------------------------------ inputs

def make_case(engine, lengths, pads, K, state_dtype, seed):
    lengths = list(lengths) + [0] * pads
    N = len(lengths)
    x = make_prefill_inputs(lengths, H=H, HV=HV, K=K, V=K, seed=seed, device=DEV)
    T = x.q.shape[0]
    g = (-x.A_log.float().exp() * F.softplus(x.a.float() + x.dt_bias.float()))[None]
    beta = x.b.float().sigmoid()[None]
    gen = torch.Generator().manual_seed(seed + 7)
    if engine == "vllm":
        q, k = (F.normalize(t.float(), dim=-1, eps=1e-6).to(t.dtype)[None] for t in (x.q, x.k))
        v = x.v[None].contiguous()
    else:
        W = 2 * H * K + HV * K
        rows = torch.empty(T, W + 64, dtype=x.q.dtype, device=DEV)
        rows[:, :H * K], rows[:, H * K:2 * H * K] = x.q.flatten(1), x.k.flatten(1)
        rows[:, 2 * H * K:W] = x.v.flatten(1)
        q = rows[None, :, :H * K].unflatten(2, (H, K))
        k = rows[None, :, H * K:2 * H * K].unflatten(2, (H, K))
        v = rows[None, :, 2 * H * K:W].unflatten(2, (HV, K))
    P = 2 * N + 8
    pp = paged_pool(P, HV, K, K, dtype=state_dtype, device=DEV, gen=gen)
    slots = (torch.randperm(P - 2, generator=gen)[:N] + 1).tolist()    # never 0 or P-1
    for n in range(N - pads, N):
        slots[n] = 0 if engine == "vllm" else -1
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    has_init = torch.tensor([n % 4 != 1 for n in range(N)], device=DEV)
    if engine == "sglang":                    # SGLang zeroes a fresh sequence's slot
        for n in range(N - pads):
            if not has_init[n]:
                pp.state[slots[n]] = 0
    named = [s for n, s in enumerate(slots) if n < N - pads]
    return dict(q=q, k=k, v=v, g=g, beta=beta, buf=pp.buf, pool=pp.state, idx=idx,
                has_init=has_init, cu=x.cu_seqlens, named=named, pads=pads, lengths=lengths)


def pool_copy(c):
    buf = c["buf"].clone()
    pool = buf.as_strided(c["pool"].shape, c["pool"].stride(),
                          c["pool"].storage_offset() - c["buf"].storage_offset())
    return buf, pool


def engine_call(engine, fi, c, pool):
    if engine == "vllm":
        return lambda: vllm_sequence(fi, c["q"], c["k"], c["v"], c["g"], c["beta"], pool,
                                     c["idx"].long(), c["has_init"], c["cu"])
    return lambda: sglang_sequence(fi, c["q"], c["k"], c["v"], c["g"], c["beta"], pool,
                                   c["idx"], c["cu"])


def adapter_call(engine, c, pool, algo):
    if engine == "vllm":
        return lambda: vl.chunked_prefill(c["q"], c["k"], c["v"], c["g"], c["beta"], pool,
                                          c["idx"], c["has_init"], c["cu"], algo=algo)
    return lambda: sg.extend(c["q"], c["k"], c["v"], c["g"], c["beta"], ssm_states=pool,
                             cache_indices=c["idx"], query_start_loc=c["cu"], algo=algo)[0]


def oracle(engine, c):
    """float64 output [T, HV, V] and pool after the prefill (per-token loop)."""
    null = 0 if engine == "vllm" else -1
    T, K = c["q"].shape[1], c["q"].shape[3]
    ref_pool = c["pool"].double()
    ref_out = torch.empty(T, HV, K, dtype=torch.float64, device=DEV)
    reference_prefill(c["q"][0], c["k"][0], c["v"][0], ref_pool.clone(), None, None, None, None,
                      c["cu"], K ** -0.5, ref_out, ref_pool, engine == "sglang",
                      Pool(c["idx"], c["idx"], null),
                      c["has_init"] if engine == "vllm" else None,
                      compute_dtype=torch.float64, g=c["g"][0].double(),
                      beta=c["beta"][0].double())
    return ref_out, ref_pool


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    if DEV != "cuda":
        return None
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


# ------------------------------------------------------------------ one cell

def cell(lab, engine, name, lengths, pads, args, fi, seed):
    c = make_case(engine, lengths, pads, args.head_dim, args.state_dtype, seed)
    ref_out, ref_pool = oracle(engine, c)
    named = c["named"]
    row = dict(engine=engine, mix=name, N=len(c["lengths"]), T=c["q"].shape[1],
               state=str(args.state_dtype).replace("torch.", ""), algo=args.algo)
    results = {}
    for side in ("engine", "adapter"):
        buf, pool = pool_copy(c)
        before = buf.clone()
        call = (engine_call(engine, fi, c, pool) if side == "engine"
                else adapter_call(engine, c, pool, args.algo))
        o = call()
        if DEV == "cuda":
            torch.cuda.synchronize()
        j = gate.judge(o[0], pool[named], ref_out, ref_pool[named], out_dtype=o.dtype,
                       state_dtype=pool.dtype, state_tol=ENGINE_STATE_TOL if side == "engine"
                       else None)
        row[f"{side}_ok"], row[f"{side}_err_out"], row[f"{side}_err_state"] = \
            j.ok, j.rel_err_out, j.rel_err_state
        if not j.ok:
            row[f"{side}_why"] = j.reason
        if side == "adapter":
            keep = torch.ones_like(buf, dtype=torch.bool)
            page, block = pool.stride(0), pool[0].numel()
            base = pool.storage_offset() - buf.storage_offset()
            for s in named:
                keep[base + s * page:base + s * page + block] = False
            row["adapter_rest_untouched"] = bool(torch.equal(buf[keep], before[keep]))
            cu = c["cu"].tolist()
            n_real = len(c["lengths"]) - c["pads"]
            row["adapter_pad_rows_zero"] = bool(
                torch.count_nonzero(o[0, cu[n_real]:cu[-1]]) == 0)
        results[side] = (o, pool[named].clone())
        # the timed calls run on this side's own pool copy, updated in place each time
        row[f"{side}_ms"] = median_ms(call, args.reps) if j.ok else None
    (oe, se), (oa, sa) = results["engine"], results["adapter"]
    real = slice(0, c["cu"].tolist()[len(c["lengths"]) - c["pads"]])
    row["max_diff_out"] = (oe[0, real].float() - oa[0, real].float()).abs().max().item() \
        if real.stop else 0.0
    row["max_diff_state"] = (se.float() - sa.float()).abs().max().item() if named else 0.0
    if row["engine_ms"] and row["adapter_ms"]:
        row["speedup"] = row["engine_ms"] / row["adapter_ms"]
    lab.log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in row.items()))
    return row


def main(lab, args):
    if args.smoke:
        fi, mixes = stand_in_chunk("pt-reference"), SMOKE_MIXES
        lab.log("SMOKE: gdnzoo's dense pt-reference prefill stands in for FlashInfer; "
                "no timing, no FlashInfer figure")
    else:
        if DEV != "cuda":
            lab.log("needs a CUDA GPU (SM90) with flashinfer importable; --smoke runs on CPU")
            lab.failed.append("no GPU")
            return
        fi, mixes = flashinfer_chunk(), MIXES
        cc = torch.cuda.get_device_capability()
        lab.log(f"GPU {torch.cuda.get_device_name()} sm_{cc[0]}{cc[1]}, "
                f"flashinfer {__import__('flashinfer').__version__}")
    rows = []
    for e, engine in enumerate(("vllm", "sglang")):
        for i, (name, lengths, pads) in enumerate(mixes):
            r = lab.part(f"{engine} {name}", cell, lab, engine, name, lengths, pads, args, fi,
                         seed=100 * e + i)
            if r is not None:
                rows.append(r)
                if not (r["adapter_ok"] and r["adapter_rest_untouched"]
                        and r["adapter_pad_rows_zero"]):
                    lab.failed.append(f"{engine} {name}: adapter")
    lab.results["rows"] = rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", default=None, help="the adapters' gdnzoo backend (default: "
                    "triton-chunk; pt-reference with --smoke)")
    ap.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="CPU: K=V=64, short mixes, a stand-in")
    a = ap.parse_args()
    a.state_dtype = torch.float32 if a.state_dtype == "fp32" else torch.bfloat16
    a.head_dim = 64 if a.smoke else 128
    if a.algo is None:                 # --smoke: the interpreter is slow at these sizes
        a.algo = "pt-reference" if a.smoke else "triton-chunk"
    harness.run("engine_prefill_gpu", lambda lab: main(lab, a))

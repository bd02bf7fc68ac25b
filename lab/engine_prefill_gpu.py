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
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():          # --smoke on CPU: Triton kernels interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdnzoo import gate                                    # noqa: E402
from gdnzoo.bench.engine_prefill import (                  # noqa: E402
    adapter_call, engine_call, flashinfer_chunk, make_case, oracle, pad_rows_zero, pool_copy,
    rest_untouched, stand_in)
from lab import harness                                    # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# The engines' side is a peer: judged with the peers' state bound (FlashInfer's chunk kernel
# rounds its states; SGLang also rounds the normalized q, k to bf16 before the kernel).
ENGINE_STATE_TOL = gate.state_tol_of("fi-baseline", "prefill")
# (name, lengths, padded entries appended): long, medium, many short, ragged.  No zero-length
# sequence: the engines never schedule one, and FlashInfer 0.7.2 writes no final state for one
# (on an H200, 2026-11-28, the "ragged" mix with a 0 failed on the engines' side: vLLM's
# scatter wrote zeros, SGLang's the NaN of its uninitialized buffer; gdnzoo's adapters passed).
MIXES = [("1x4096", [4096], 0), ("4x1024", [1024] * 4, 0), ("32x64", [64] * 32, 0),
         ("ragged", [2048, 1, 700, 2, 63, 65, 1500], 0), ("8x256+2pad", [256] * 8, 2)]
SMOKE_MIXES = [("ragged", [17, 1, 0, 40], 0), ("3x9+2pad", [9] * 3, 2)]


def median_ms(fn, reps):
    if DEV != "cuda":
        for _ in range(3):
            fn()
        return None
    return harness.event_median_us(fn, reps) / 1e3


# ------------------------------------------------------------------ one cell

def cell(lab, engine, name, lengths, pads, args, fi, seed):
    c = make_case(engine, lengths, pads, args.head_dim, args.state_dtype, seed, DEV)
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
            row["adapter_rest_untouched"] = rest_untouched(c, buf, before, pool)
            row["adapter_pad_rows_zero"] = pad_rows_zero(c, o)
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
        fi, mixes = stand_in("pt-reference"), SMOKE_MIXES
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

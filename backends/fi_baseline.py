"""fi-baseline: FlashInfer's CuTe-DSL GDN kernels: decode (``gated_delta_rule_decode_pretranspose``)
and prefill (``flashinfer.gdn_prefill.chunk_gated_delta_rule``, its SM90 chunked kernel).

Prefill: FlashInfer takes a linear decay ``alpha = exp(g)`` and beta, both fp32 [T, HV], so the
gates are computed first in torch (three small elementwise kernels, counted in its time); the
k-last state [N, HV, V, K] and ``out`` are passed as its ``initial_state``, ``output_state`` and
``output`` (in place through its pool form, ``state_indices`` = arange(N) cached here, with
``output_state is initial_state``; destination passing and a zero state in its packed form).  It has no per-sequence ``has_initial_state`` and its pool
form has no padding rule: those calls are refused.  State checkpoints are FlashInfer's own
(``state_checkpoints``, ``checkpoint_every_n_tokens``): gdnzoo's packing is its convention, and
its ``checkpoint_cu_starts`` is computed on the device from cu_seqlens (two small kernels, no
sync); its kernel addresses the checkpoints as contiguous rows, so a strided ``checkpoints``
goes through a contiguous copy.

Decode:

This is the contest's baseline kernel (FlashInfer 0.7.2.post1, k-last state ``[B, HV, V, K]``),
called through FlashInfer's public function with ``backend="flashinfer"`` so that its generic
CuTe-DSL kernels run (not the optional "cake" or Rubin variants):

- fp32 state, T = 1: ``state=`` (the direct path the contest baseline uses; FlashInfer keeps its
  index tensors cached, so a call launches one kernel).
- bf16 state (any T), and fp32 state with T > 1 (FlashInfer's MTP kernels, T <= 8 in
  registry.yaml): ``initial_state=`` with ``initial_state_indices`` = arange(B), an int32 tensor
  cached here per (B, device).  Through ``state=`` FlashInfer would allocate that arange on every
  call (an extra kernel); fp32 T > 1 is only offered in this pool form.

Speculative verify (:mod:`gdnzoo.verify`), T >= 2, on a dense state only (the registry refuses
pools: FlashInfer's padding is not gdnzoo's): ``update_state=False`` is FlashInfer's
``disable_state_update``, and ``intermediate_states`` its ``intermediate_states_buffer``, which
its MTP kernels index by batch row with a row pitch of T states.  So served: no
``intermediate_indices`` (row n) and a contiguous [B, T, HV, V, K] buffer (``Problem.intermediate
== "rows"``).  FlashInfer's bf16-state MTP kernels skip the final-state write whenever the buffer
is given, so bf16 with intermediate states needs ``update_state=False`` (fp32 writes both).
supports() refuses the rest, saying why.

FlashInfer always updates the state in place.  Destination-passing calls (``new_state`` distinct
from ``state``) therefore first copy ``state`` into ``new_state`` and run in place there: one extra
device copy of the whole state (read + write of ``B*HV*V*K*sizeof(state)`` bytes, about as much
traffic as the kernel itself), which the benchmark includes in this backend's time.

Other costs, all FlashInfer's: the fp32 kernel bakes ``scale`` and ``use_qk_l2norm`` into the
compiled code, so each new (shape, dtypes, scale, l2norm) compiles once (seconds to tens of
seconds; FlashInfer also caches the result on disk under ``~/.cache/flashinfer``).  A state whose
strides are not the contiguous ones is gathered into a copy and written back by FlashInfer (fp32
path).  The first call per variant logs to stderr and records its wall time in
:data:`compile_seconds` (cold compile, or a disk-cache load if FlashInfer has it already).
"""
from __future__ import annotations

import sys
import time

import torch

from gdnzoo.backends import _peer_checks
from gdnzoo.prefill_contract import checkpoint_offsets

#: variant description -> wall seconds of its first call in this process (JIT compile + launch)
compile_seconds: dict = {}

_seen: set = set()
_indices: dict = {}


def available(device):
    ok, why = _peer_checks.available(("flashinfer", "cutlass"),
                                     "flashinfer-python 0.7.2.post1 and nvidia-cutlass-dsl",
                                     "FlashInfer's GDN kernels are GPU-only",
                                     "FlashInfer CuTe-DSL gated_delta_rule_decode_pretranspose "
                                     "(JIT-compiled on first call)")
    broken = ok and _peer_checks.cute_dsl_missing_libs()
    return (False, broken) if broken else (ok, why)


def supports(problem):
    p = problem
    if p.op == "prefill":
        return _prefill_supports(p)
    ok, why = _peer_checks.on_sm90(p, "FlashInfer's GDN CuTe-DSL decode")
    if not ok:
        return ok, why
    if p.io_dtype != torch.bfloat16:
        return False, ("FlashInfer's GDN kernels read q/k/v as bf16; fp16 inputs would be rounded "
                       "to bf16 by an extra conversion on every call")
    if p.K != 128 or p.V != 128:
        return False, (f"needs K = V = 128, got K={p.K} V={p.V}: the bf16-state kernels assert it, "
                       f"and the fp32-state kernel loads q/k/v as 32 lanes x 4 elements (TILE_K=128) "
                       f"although its API only asserts K, V >= 128")
    if p.state_dtype not in (torch.float32, torch.bfloat16):
        return False, f"state dtype {p.state_name} not supported (fp32 or bf16)"
    if p.verify and p.T < 2:
        return False, ("FlashInfer takes intermediate_states_buffer and disable_state_update only "
                       "for T >= 2 tokens (its MTP kernels), got T=1")
    if p.intermediate == "indexed":
        return False, ("FlashInfer's MTP kernels store step t of sequence n at block n*T + t of "
                       "one contiguous buffer: intermediate_states must be a contiguous [B, T, "
                       "HV, V, K] tensor addressed by row (no intermediate_indices)")
    if p.intermediate and p.verify == "states+update" and p.state_dtype == torch.bfloat16:
        return False, ("FlashInfer's bf16-state MTP kernels skip the final-state write when "
                       "intermediate_states_buffer is given: pass update_state=False and commit "
                       "later")
    return True, ""


def _prefill_supports(p):
    ok, why = _peer_checks.on_sm90(p, "FlashInfer's GDN prefill")
    if not ok:
        return ok, why
    if p.io_dtype != torch.bfloat16:
        return False, "FlashInfer's GDN prefill is called with bf16 q/k/v here"
    if p.K != 128 or p.V != 128:
        return False, f"needs K = V = 128 (its SM90 kernel's head size), got K={p.K} V={p.V}"
    if p.initial == "mixed":
        return False, ("FlashInfer's chunk_gated_delta_rule has no has_initial_state: engines "
                       "zero those rows before the call")
    return True, ""


def prefill(c):
    """FlashInfer's chunked prefill on a prefill call record (see the module docstring)."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule
    if c.g is not None:
        alpha, beta = torch.exp(c.g), c.beta.float()
    else:
        x = c.a.float() + c.dt_bias.float()
        alpha = torch.exp(-torch.exp(c.A_log) * torch.nn.functional.softplus(x))
        beta = torch.sigmoid(c.b.float()) * (2.0 if c.allow_neg_eigval else 1.0)
    inplace = c.new_state is c.state
    ck, every = c.checkpoints, c.checkpoint_every
    fi_ck = {}
    if ck is not None:
        fi_ck = dict(state_checkpoints=ck if ck.is_contiguous() else ck.contiguous(),
                     checkpoint_cu_starts=checkpoint_offsets(c.cu_seqlens, every),
                     checkpoint_every_n_tokens=every)
    chunk_gated_delta_rule(
        c.q, c.k, c.v, g=alpha, beta=beta, scale=c.scale, initial_state=c.state,
        output_final_state=True, cu_seqlens=c.cu_seqlens,
        use_qk_l2norm_in_kernel=c.use_qk_l2norm, output=c.out, output_state=c.new_state,
        state_indices=_pool_indices(c.problem.N, c.q.device) if inplace else None, **fi_ck)
    if ck is not None and fi_ck["state_checkpoints"] is not ck:
        ck.copy_(fi_ck["state_checkpoints"])
    if not inplace:
        _empty_sequences_keep_their_state(c)


def _empty_sequences_keep_their_state(c):
    """FlashInfer 0.7.2 writes no final state for a zero-length sequence (seen on an H200: the
    destination's rows stay as they were, NaN in a NaN-filled buffer); the contract says its
    final state is its initial state.  One elementwise launch, no host sync; calls in place
    need none (the state is left as it is)."""
    cu = c.cu_seqlens
    empty = (cu[1:] == cu[:-1]).view(-1, 1, 1, 1)
    init = c.state if c.state is not None else torch.zeros((), device=c.new_state.device)
    torch.where(empty, init.to(c.new_state.dtype), c.new_state, out=c.new_state)


def _pool_indices(B: int, device) -> torch.Tensor:
    key = (B, device)
    idx = _indices.get(key)
    if idx is None:
        idx = torch.arange(B, dtype=torch.int32, device=device)
        _indices[key] = idx
    return idx


def _variant(q, v, state, use_qk_l2norm, scale, mtp) -> str:
    B, T, H, K = q.shape
    HV = v.shape[2]
    sd = "fp32" if state.dtype == torch.float32 else "bf16"
    verify = "" if not mtp else (f" verify(update={not mtp['disable_state_update']}, "
                                 f"states={mtp['intermediate_states_buffer'] is not None})")
    return (f"{sd}-state T={T} H={H} HV={HV} K={K} V={v.shape[3]} l2norm={use_qk_l2norm} "
            f"scale={scale:.6g}" + (f" B={B}" if sd == "bf16" else "") + verify)


def run(call, *, config=None):
    """A decode or prefill call record; its ``pool`` is always None (the registry refuses pools
    for this backend)."""
    if call.op == "prefill":
        prefill(call)
        return
    q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm = \
        call.positional()
    verify = call.verify
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose as fi_decode

    mtp = {}
    if verify is not None:
        mtp = dict(intermediate_states_buffer=verify.states,
                   disable_state_update=not verify.update)
    if new_state is not state:
        new_state.copy_(state)           # FlashInfer only updates in place: see module docstring
    target = new_state
    B, T = q.shape[0], q.shape[1]
    key = _variant(q, v, state, use_qk_l2norm, scale, mtp)
    first = key not in _seen
    if first:
        print(f"fi-baseline: compiling FlashInfer CuTe-DSL kernel for {key} (first call, may take "
              f"tens of seconds; FlashInfer caches it on disk)...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
    if state.dtype == torch.float32 and T == 1:
        fi_decode(q, k, v, target, A_log, a, dt_bias, b, scale=scale, output=out,
                  use_qk_l2norm=use_qk_l2norm, backend="flashinfer")
    else:
        fi_decode(q, k, v, None, A_log, a, dt_bias, b, scale=scale, output=out,
                  use_qk_l2norm=use_qk_l2norm, initial_state=target,
                  initial_state_indices=_pool_indices(B, q.device), backend="flashinfer", **mtp)
    if first:
        compile_seconds[key] = time.perf_counter() - t0
        _seen.add(key)

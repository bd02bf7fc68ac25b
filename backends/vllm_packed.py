"""vllm-packed: vLLM 0.33.0's packed decode kernel, the serving peer.

vLLM decodes a Gated Delta Net layer with one Triton kernel a step,
``fused_recurrent_gated_delta_rule_packed_decode`` (module :data:`MODULE`): q, k and v read from
one packed conv1d output row ``mixed_qkv`` [B, 2*H*K + HV*V], the raw gates ``a``, ``b`` [B, HV]
(gates computed in the kernel), the state pool [P, HV, V, K] updated in place at
``ssm_state_indices``, and an index <= 0 taken as padding (block 0 is vLLM's null block: zeros in
``out``, no state read or written).  This backend calls that function as vLLM does, behind
gdnzoo's signature, so it serves only what it computes:

- T = 1, a pool (``state_indices``) updated in place: no distinct ``new_state``, no
  ``new_state_indices``, and ``null_slot=0``;
- q, k, v views of one packed row (k right behind q, v right behind k, in the same rows: what
  :mod:`gdnzoo.integrations` passes); ``a``, ``b`` with a unit last stride; ``out``, ``A_log`` and
  ``dt_bias`` contiguous.

The registry refuses what a :class:`~gdnzoo.contract.Problem` shows (a dense state, destination
passing, T > 1, CPU).  The rest needs the tensors: :func:`bind` checks the padding rule, the
write indices and the layouts once per call signature (gdnzoo's memo keys on all of them), and
the launcher checks on every call that k and v still sit behind q (pointers are not part of a
signature).  Both raise ``ValueError`` saying why it cannot serve, before anything runs.

Unlike gdnzoo's contract, an index >= P is not padding here: vLLM's kernel reads and writes past
the pool (vLLM never passes one).  It does not run on CPU: under ``TRITON_INTERPRET=1`` the kernel's
``exp`` (bound to ``tl.exp`` when vLLM's ``op`` module is imported) is not patched by the
interpreter and fails.
"""
from __future__ import annotations

import importlib

import torch

from gdnzoo.backends import _peer_checks

MODULE = "vllm.third_party.flash_linear_attention.ops.fused_recurrent"
FUNCTION = "fused_recurrent_gated_delta_rule_packed_decode"


def _kernel():
    return getattr(importlib.import_module(MODULE), FUNCTION)


def available(device):
    ok, why = _peer_checks.available(("vllm", "triton"),
                                     "vLLM 0.33.0 (its GDN Triton kernels) and triton",
                                     "vLLM's packed decode kernel is launched on CUDA only",
                                     f"vLLM 0.33.0 {FUNCTION}, in place on a pool")
    if not ok:
        return ok, why
    try:
        _kernel()
    except (ImportError, AttributeError) as e:
        return False, f"vllm is installed but {MODULE}.{FUNCTION} cannot be imported: {e}"
    return True, why


def supports(problem):
    if problem.device != "cuda":
        return False, "vLLM's packed decode kernel runs only on CUDA devices"
    if not problem.pool:
        return False, ("vLLM's packed decode reads the state through slot indices only: pass "
                       "state_indices (a pool) with null_slot=0")
    if not problem.inplace:
        return False, ("vLLM's packed decode updates the pool in place: new_state must be None "
                       "or state")
    return True, ""


def _cannot(why):
    return ValueError(f"vllm-packed cannot serve this call, because {why}")


def _check_signature(q, k, v, state, A_log, a, dt_bias, b, out, new_state, pool):
    """What vLLM's kernel needs beyond the Problem, decided by shapes, strides and the pool's
    padding rule (so once per memoized signature); raises ValueError saying what is missing."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if pool is None:
        raise _cannot("vLLM's kernel reads the state through slot indices only (state_indices)")
    if T != 1:
        raise _cannot(f"vLLM's packed decode takes one token a sequence, got T={T}")
    if new_state is not state or not pool.same_indices:
        raise _cannot("vLLM's kernel writes each new state back to the slot it read "
                      "(no new_state, no new_state_indices)")
    if pool.null_slot != 0:
        got = "None" if pool.null_slot < 0 else pool.null_slot
        raise _cannot("vLLM's kernel takes every index <= 0 as padding (slot 0 is its null "
                      f"block), so null_slot must be 0, got {got}")
    rows = {q.stride(0), k.stride(0), v.stride(0)} if B > 1 else set()
    heads = (H == 1 or (q.stride(2) == K and k.stride(2) == K)) and (HV == 1 or v.stride(2) == V)
    same = q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() \
        == v.untyped_storage().data_ptr()
    if len(rows) > 1 or not heads or not same:
        raise _cannot("q, k and v are not views of one packed mixed_qkv [B, 2*H*K + HV*V] "
                      "(q || k || v per row: one row stride, heads contiguous, one storage)")
    if a.stride(2) != 1 or b.stride(2) != 1:
        raise _cannot(f"vLLM's kernel reads a and b [B, HV] with a unit last stride, got "
                      f"strides {tuple(a.stride())} and {tuple(b.stride())}")
    if not out.is_contiguous():
        raise _cannot(f"vLLM's kernel writes out [B, 1, HV, V] contiguous, got strides "
                      f"{tuple(out.stride())}")
    if A_log.stride(0) != 1 or dt_bias.stride(0) != 1:
        raise _cannot(f"vLLM's kernel needs A_log and dt_bias contiguous, got strides "
                      f"{A_log.stride(0)} and {dt_bias.stride(0)}")


def bind(call, *, config=None):
    q, k, v, state, A_log, a, dt_bias, b, _, out, new_state, _ = call.positional()
    _check_signature(q, k, v, state, A_log, a, dt_bias, b, out, new_state, call.pool)
    fn = _kernel()
    B, _, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    width = 2 * H * K + HV * V
    size = q.element_size()
    k_at, v_at = H * K * size, 2 * H * K * size
    rows = ((B, width), (q.stride(0) if B > 1 else width, 1))
    device = q.device

    def launch(c):
        q0 = c.q.data_ptr()
        if c.k.data_ptr() - q0 != k_at or c.v.data_ptr() - q0 != v_at:
            raise _cannot("k and v do not sit right behind q in one packed mixed_qkv row "
                          "(q || k || v)")
        mixed_qkv = c.q.as_strided(*rows)
        # Triton launches on the current device; vLLM calls it on the layer's own.
        with torch.cuda.device(device):
            fn(mixed_qkv, c.a[:, 0], c.b[:, 0], c.A_log, c.dt_bias, c.scale, c.state, c.out,
               c.pool.read, c.use_qk_l2norm)
    return launch


def run(call, *, config=None):
    bind(call)(call)

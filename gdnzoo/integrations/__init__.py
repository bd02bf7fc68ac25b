"""Drop-in replacements for the serving engines' Gated Delta Net decode call.

vLLM and SGLang decode a Gated Delta Net layer with one call per step::

    fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
        use_qk_l2norm_in_kernel=False) -> (out, initial_state)

``mixed_qkv`` [B, 2*H*K + HV*V] is the conv1d output, each row q || k || v (last dim contiguous,
any row stride); ``a``, ``b`` [B, HV] the raw gates (unit last stride, any row stride);
``initial_state`` the engine's state pool [P, HV, V, K], updated in place at slot
``ssm_state_indices[n]`` ([B] int32/int64); ``out`` [B, 1, HV, V] is written.

:func:`gdnzoo.integrations.vllm.packed_decode` and :func:`gdnzoo.integrations.sglang.packed_decode`
take exactly these arguments (and an optional ``algo=`` naming a gdnzoo backend), view
``mixed_qkv`` as q [B, 1, H, K], k [B, 1, H, K], v [B, 1, HV, V] and the gates as [B, 1, HV]
(views only: no copy, no kernel) and call :func:`gdnzoo.decode` on the pool in place.  They
differ in the engine's padding rule: vLLM pads with index <= 0 (slot 0 is its null block), SGLang
with index < 0 (slot 0 is a real slot).  A padded sequence gets zeros in ``out`` and its slot is
neither read nor written; gdnzoo also treats an index >= P as padding, which neither engine does.

Importing this package imports gdnzoo and nothing else.
"""
from __future__ import annotations

import gdnzoo

__all__ = ["packed_views", "packed_decode"]


def _shape_error(name, x, expected):
    return ValueError(f"{name}: expected {expected}, got shape {tuple(x.shape)}")


def packed_views(mixed_qkv, a, b, A_log, initial_state, out):
    """(q, k, v, a, b) as views for :func:`gdnzoo.decode`: q, k [B, 1, H, K] and v [B, 1, HV, V]
    of ``mixed_qkv``'s rows, a and b [B, 1, HV].  HV comes from ``A_log``, V and K from the pool
    ``initial_state`` [P, HV, V, K], then H = (mixed_qkv.shape[1] - HV*V) // (2*K).  Raises
    ValueError naming the argument whose shape does not fit."""
    # Unpacking the shapes checks the ranks too (host time matters here: this runs every step).
    try:
        (HV,) = A_log.shape
    except ValueError:
        raise _shape_error("A_log", A_log, "[HV]") from None
    try:
        _, HVs, V, K = initial_state.shape
    except ValueError:
        HVs = None
    if HVs != HV:
        raise _shape_error("initial_state", initial_state,
                           f"a state pool [P, HV={HV}, V, K] (HV from A_log)")
    try:
        B, W = mixed_qkv.shape
    except ValueError:
        raise _shape_error("mixed_qkv", mixed_qkv, "[B, 2*H*K + HV*V]") from None
    s0, s1 = mixed_qkv.stride()
    if s1 != 1:
        raise ValueError(f"mixed_qkv: expected the last dim contiguous (stride 1), got strides "
                         f"{(s0, s1)}")
    qk = W - HV * V
    if qk <= 0 or qk % (2 * K):
        raise ValueError(f"mixed_qkv: last dim {W} is not 2*H*K + HV*V for HV={HV}, V={V}, "
                         f"K={K} (HV from A_log, V and K from initial_state)")
    H = qk // (2 * K)
    if HV % H:
        raise ValueError(f"mixed_qkv: gives H={H} q/k heads, which does not divide HV={HV}")
    if a.shape != (B, HV):
        raise _shape_error("a", a, f"[B={B}, HV={HV}]")
    if b.shape != (B, HV):
        raise _shape_error("b", b, f"[B={B}, HV={HV}]")
    if out.shape != (B, 1, HV, V):
        raise _shape_error("out", out, f"[B={B}, 1, HV={HV}, V={V}]")
    at = mixed_qkv.storage_offset()
    q = mixed_qkv.as_strided((B, 1, H, K), (s0, s0, K, 1), at)
    k = mixed_qkv.as_strided((B, 1, H, K), (s0, s0, K, 1), at + H * K)
    v = mixed_qkv.as_strided((B, 1, HV, V), (s0, s0, V, 1), at + 2 * H * K)
    return q, k, v, a.unsqueeze(1), b.unsqueeze(1)


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                  use_qk_l2norm_in_kernel, null_slot, algo):
    """The engines' packed decode through :func:`gdnzoo.decode`, in place on the pool, with
    ``null_slot`` (0 or None) as the padding rule; returns ``(out, initial_state)``."""
    q, k, v, a1, b1 = packed_views(mixed_qkv, a, b, A_log, initial_state, out)
    gdnzoo.decode(q, k, v, initial_state, A_log, a1, dt_bias, b1, scale, out=out,
                  use_qk_l2norm=use_qk_l2norm_in_kernel, algo=algo,
                  state_indices=ssm_state_indices, null_slot=null_slot)
    return out, initial_state

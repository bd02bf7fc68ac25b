"""vLLM's packed Gated Delta Net decode, served by gdnzoo.

vLLM 0.33.0 decodes every Gated Delta Net layer with
``fused_recurrent_gated_delta_rule_packed_decode`` (its Triton kernel, in
``vllm.third_party.flash_linear_attention.ops.fused_recurrent``).  :func:`packed_decode` takes the
same arguments, shapes and layout and returns the same ``(out, initial_state)``, so swapping one
import in the module that calls it routes the step through :func:`gdnzoo.decode`::

    # in vLLM's Gated Delta Net layer, instead of importing vLLM's kernel:
    from gdnzoo.integrations.vllm import packed_decode as \\
        fused_recurrent_gated_delta_rule_packed_decode

(rebind the name where the layer imports it: ``from ... import`` copies the reference at import
time, so replacing the attribute in vLLM's kernel module afterwards does not reach the layer).

vLLM's padding: an index <= 0 is padding (block 0 is vLLM's null block), so this adapter passes
``null_slot=0``.  A padded sequence gets zeros in ``out``; its slot is neither read nor written.
``algo=`` names a gdnzoo backend (default: gdnzoo's automatic choice; ``"vllm-packed"`` runs
vLLM's own kernel through gdnzoo, the peer).  The adapter adds views only, no kernel.
"""
from __future__ import annotations

from gdnzoo import integrations

NULL_SLOT = 0       # vLLM's null block: padding, never read or written


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                  use_qk_l2norm_in_kernel=False, *, algo=None):
    """vLLM's ``fused_recurrent_gated_delta_rule_packed_decode`` through :func:`gdnzoo.decode`.

    mixed_qkv [B, 2*H*K + HV*V] (q || k || v per row, last dim contiguous), a and b [B, HV],
    A_log and dt_bias [HV], initial_state a pool [P, HV, V, K] updated in place,
    out [B, 1, HV, V] written, ssm_state_indices [B] (index <= 0: padding).  Returns
    ``(out, initial_state)``."""
    return integrations.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                      ssm_state_indices, use_qk_l2norm_in_kernel, NULL_SLOT, algo)

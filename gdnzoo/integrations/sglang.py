"""SGLang's packed Gated Delta Net decode, served by gdnzoo.

SGLang's Triton GDN kernel backend decodes with
``fused_recurrent_gated_delta_rule_packed_decode`` from its ``fla.fused_recurrent`` module, the
same packed design as vLLM's.  :func:`packed_decode` takes the same arguments, shapes and layout
and returns the same ``(out, initial_state)``, so swapping one import in the module that calls it
routes the step through :func:`gdnzoo.decode`::

    # where SGLang's GDN kernel backend imports its packed decode:
    from gdnzoo.integrations.sglang import packed_decode as \\
        fused_recurrent_gated_delta_rule_packed_decode

(rebind the name in that module: ``from ... import`` copies the reference at import time).

SGLang's padding: an index < 0 is padding; slot 0 is a real slot (SGLang reserves it as a dummy,
but the kernel reads and writes it like any other), so this adapter passes no ``null_slot``.
A padded sequence gets zeros in ``out``; no slot is read or written for it.  ``algo=`` names a
gdnzoo backend (default: gdnzoo's automatic choice).  The adapter adds views only, no kernel.
"""
from __future__ import annotations

from gdnzoo import integrations

NULL_SLOT = None    # only negative indices pad


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                  use_qk_l2norm_in_kernel=False, *, algo=None):
    """SGLang's ``fused_recurrent_gated_delta_rule_packed_decode`` through :func:`gdnzoo.decode`.

    mixed_qkv [B, 2*H*K + HV*V] (q || k || v per row, last dim contiguous), a and b [B, HV],
    A_log and dt_bias [HV], initial_state a pool [P, HV, V, K] updated in place,
    out [B, 1, HV, V] written, ssm_state_indices [B] (index < 0: padding).  Returns
    ``(out, initial_state)``."""
    return integrations.packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                      ssm_state_indices, use_qk_l2norm_in_kernel, NULL_SLOT, algo)

"""vLLM's Gated Delta Net decode and speculative verify, served by gdnzoo.

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

vLLM verifies T draft tokens per sequence with ``fused_sigmoid_gating_delta_rule_update``
(``vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating``, imported by
``vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn``);
:func:`fused_sigmoid_gating_delta_rule_update` here has its signature and returns what it
returns, serving sequences of one length T (see below).

vLLM's padding: an index <= 0 is padding (block 0 is vLLM's null block), so these adapters pass
``null_slot=0``.  A padded sequence gets zeros in ``out``; its slot is neither read nor written.
``algo=`` names a gdnzoo backend (default: gdnzoo's automatic choice; ``"vllm-packed"`` runs
vLLM's own packed kernel through gdnzoo, the peer).  The adapters add views only, no kernel.
For the prefill, the automatic choice keeps fp32-accurate products; ``algo="cuda-chunk-bf16"``
rounds them to bf16 as FlashInfer's kernel does and is faster than the engine's own call
(``docs/serving.md`` has the numbers).

vLLM prefills (``_forward_core``'s prefill branch) by gathering ``ssm_state`` at
``prefill_state_indices``, zeroing the rows whose ``prefill_has_initial_state`` is False,
running its chunk kernel (FlashInfer's on Hopper) and scattering the final states back;
:func:`chunked_prefill` does those four steps as one :func:`gdnzoo.prefill` call on the pool.
"""
from __future__ import annotations

import gdnzoo
from gdnzoo import integrations
from gdnzoo.integrations import check_gate, first_rows, gates, refuse, sequences, tokens

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


def _unserved(beta, threshold, scale, initial_state, ssm_state_indices, is_kda):
    if is_kda:
        raise refuse("is_kda", "Kimi Delta Attention (per-channel gates) is not served: gdnzoo "
                               "computes Gated Delta Net's per-head gate")
    check_gate("beta", beta, "threshold", threshold, scale, "vLLM")
    if initial_state is None:
        raise refuse("initial_state", "required: gdnzoo serves vLLM's state pool "
                                      "[P, HV, V, K] (vLLM's layer always passes it)")
    if ssm_state_indices is None:
        raise refuse("ssm_state_indices", "required: gdnzoo serves the pool through its slots "
                                          "(without them vLLM's kernel reads a dense state at "
                                          "row n*T, which gdnzoo does not reproduce)")


# The verify call's tensor arguments (engine_error), and gdnzoo's names for them.
VERIFY_TENSORS = ("A_log", "a", "b", "dt_bias", "q", "k", "v", "initial_state", "cu_seqlens",
                  "ssm_state_indices", "num_accepted_tokens")
VERIFY_TENSORS_OPTIONAL = ("initial_state", "cu_seqlens", "ssm_state_indices",
                           "num_accepted_tokens")
VERIFY_NAMES = {"state": "initial_state", "state_indices": "ssm_state_indices",
                "use_qk_l2norm": "use_qk_l2norm_in_kernel"}


def fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, beta=1.0,
                                           threshold=20.0, scale=None, initial_state=None,
                                           inplace_final_state=True, cu_seqlens=None,
                                           ssm_state_indices=None, num_accepted_tokens=None,
                                           use_qk_l2norm_in_kernel=False, is_kda=False, *,
                                           algo=None):
    """vLLM's ``fused_sigmoid_gating_delta_rule_update`` through one :func:`gdnzoo.decode` call.

    q, k [1, N*T, H, K] and v [1, N*T, HV, V] with ``cu_seqlens`` [N+1] = [0, T, ..., N*T]
    (or q, k, v [N, T, ...] without it); a, b [N*T, HV] (or [1, N*T, HV], [N, T, HV]);
    ``initial_state`` the pool [P, HV, V, K].  Returns ``(o, final_state)`` as vLLM does: ``o``
    shaped like v in q's dtype; ``final_state`` the pool itself, or with
    ``inplace_final_state=False`` a new [k.shape[1], HV, V, K] tensor of the pool's dtype whose
    row n*T + t holds the state after token t of sequence n (the pool is only read).

    ``ssm_state_indices`` [N, T] (vLLM's verify): token t's state goes to slot
    ``ssm_state_indices[n, t]``; the initial state is read from column
    ``num_accepted_tokens[n] - 1`` (``num_accepted_tokens`` [N]; None: column 0).  A count
    outside 1..T pads the sequence (vLLM would read outside its row).  With cu_seqlens, T is
    the index's width; a [N] index means one token a sequence (vLLM's decode).  Longer index
    and count tensors (graph-padded buffers) are cut to their first N rows, views.  Index <= 0:
    padding; a padded sequence gets zeros in ``o`` (vLLM leaves its rows unwritten).

    Not served (ValueError naming the argument): ``cu_seqlens`` other than [0, T, ..., N*T]
    (sequences of different lengths, or of a length other than T); beta != 1 or
    threshold != 20; ``is_kda``; no ``initial_state`` or ``ssm_state_indices``; a [N] index
    with T > 1 in place (vLLM would take the next rows' entries as slots); with
    ``inplace_final_state=False``, ``num_accepted_tokens`` or a [N, T > 1] index (the read
    slots would need a gather) and N > 1 without cu_seqlens (vLLM sizes final_state for one
    sequence); index tensors that are not contiguous.
    """
    try:
        _unserved(beta, threshold, scale, initial_state, ssm_state_indices, is_kda)
        varlen = cu_seqlens is not None
        per_token = ssm_state_indices.dim() == 2
        width = ssm_state_indices.shape[-1] if per_token else 1
        N, T = sequences(cu_seqlens, q, width if varlen else None,
                         "the width of ssm_state_indices [N, T]" if per_token
                         else "a [N] ssm_state_indices: one token a sequence")
        qs, ks, vs = (tokens(n, x, N, T, varlen) for n, x in (("q", q), ("k", k), ("v", v)))
        HV, V, K = vs.shape[2], vs.shape[3], qs.shape[3]
        a_, b_ = gates("a", a, N, T, HV), gates("b", b, N, T, HV)
        idx = first_rows("ssm_state_indices", ssm_state_indices, N, 2 if per_token else 1)
        if per_token and idx.shape[1] != T:
            raise refuse("ssm_state_indices", f"expected [N, T={T}] (one slot per token of q), "
                                              f"got shape {tuple(ssm_state_indices.shape)}")
        acc = None if num_accepted_tokens is None else \
            first_rows("num_accepted_tokens", num_accepted_tokens, N, 1)
        o = q.new_empty(v.shape)
        args = (qs, ks, vs, initial_state, A_log, a_, dt_bias, b_, scale)
        kw = dict(out=tokens("o", o, N, T, varlen), use_qk_l2norm=use_qk_l2norm_in_kernel,
                  algo=algo, null_slot=NULL_SLOT)
        if inplace_final_state:
            if not per_token and T > 1:
                raise refuse("ssm_state_indices", f"a [N] index with T={T} tokens a sequence: "
                                                  f"vLLM's kernel would take the next rows' "
                                                  f"entries as token slots; pass [N, T]")
            if acc is not None and not per_token:
                idx = idx.view(N, 1)
            if idx.dim() == 2:
                kw["num_accepted_tokens"] = acc
            gdnzoo.decode(*args, state_indices=idx, **kw)
            return o, initial_state
        if acc is not None:
            raise refuse("num_accepted_tokens", "not with inplace_final_state=False: the read "
                                                "slot would be column num_accepted_tokens[n]-1, "
                                                "a gather gdnzoo does not make")
        if per_token:
            if T > 1:
                raise refuse("ssm_state_indices", "[N, T > 1] with inplace_final_state=False: "
                                                  "the read slots are its column 0, a strided "
                                                  "view, and gdnzoo reads index tensors densely")
            idx = idx.view(N)
        if not varlen and N > 1:
            raise refuse("inplace_final_state", f"False without cu_seqlens and N={N} > 1: "
                                                f"vLLM's kernel sizes final_state [T, ...] for "
                                                f"one sequence")
        final = q.new_empty(k.shape[1], HV, V, K, dtype=initial_state.dtype)
        gdnzoo.decode(*args, state_indices=idx, update_state=False,
                      intermediate_states=final[:N * T].view(N, T, HV, V, K), **kw)
        return o, final
    except (AttributeError, TypeError, ValueError) as e:
        raise integrations.engine_error(e, locals(), VERIFY_TENSORS, VERIFY_TENSORS_OPTIONAL,
                                        VERIFY_NAMES) from None


# ------------------------------------------------------------------ prefill

# The prefill call's tensor arguments (engine_error), and gdnzoo's names for them.
PREFILL_TENSORS = ("q", "k", "v", "g", "beta", "ssm_state", "prefill_state_indices",
                   "prefill_has_initial_state", "cu_seqlens", "core_attn_out")
PREFILL_OPTIONAL = ("prefill_has_initial_state", "core_attn_out")
PREFILL_NAMES = {"state": "ssm_state", "state_indices": "prefill_state_indices",
                 "new_state_indices": "prefill_state_indices",
                 "has_initial_state": "prefill_has_initial_state", "out": "core_attn_out",
                 "use_qk_l2norm": "use_qk_l2norm_in_kernel"}


def chunked_prefill(q, k, v, g, beta, ssm_state, prefill_state_indices,
                    prefill_has_initial_state, cu_seqlens, use_qk_l2norm_in_kernel=False,
                    scale=None, *, core_attn_out=None, algo=None):
    """vLLM's prefill of a Gated Delta Net layer's state pool as one :func:`gdnzoo.prefill`
    call, in place on the pool.  Replaces, in the prefill branch of the layer's
    ``_forward_core``, the four steps around ``self.chunk_gated_delta_rule``::

        initial_state = ssm_state[prefill_state_indices]              # gather (a copy)
        initial_state[~prefill_has_initial_state, ...] = 0
        o, final_state = self.chunk_gated_delta_rule(q=..., initial_state=initial_state,
            output_final_state=True, cu_seqlens=..., use_qk_l2norm_in_kernel=False, ...)
        ssm_state[prefill_state_indices] = final_state.to(ssm_state.dtype)   # scatter

    with ``o = chunked_prefill(q, k, v, g, beta, ssm_state, prefill_state_indices,
    prefill_has_initial_state, attn_metadata.prefill_query_start_loc)``.

    q, k [1, T, H, K] and v [1, T, HV, V] as ``fused_post_conv_prep`` leaves them (q and k
    already L2-normalized, hence ``use_qk_l2norm_in_kernel=False``); g (log decay, fp32) and
    beta (fp32) [1, T, HV]; ``ssm_state`` the pool [P, HV, V, K] (fp32 or bf16, any slot
    stride); ``prefill_state_indices`` [N] int32/int64; ``prefill_has_initial_state`` [N]
    bool (False: the sequence starts from zeros, its slot is not read; None: every slot is
    read); ``cu_seqlens`` [N+1].  ``scale`` None: 1/sqrt(K), as vLLM's call.

    Returns ``o`` [1, T, HV, V] in q's dtype.  With ``core_attn_out`` (a buffer [>= T, HV, V]
    of q's dtype, V contiguous) its first T rows are written and ``o`` is a view of them.
    Index <= 0 is padding (slot 0 is vLLM's null block): the sequence's rows of ``o`` are
    zeros and no slot is read or written for it (vLLM's gather would read, and its scatter
    write, the null block, or with -1 the pool's last slot).  Bad inputs raise TypeError or
    ValueError naming vLLM's argument, before anything is read or written."""
    try:
        return integrations.prefill_pool(q, k, v, g, beta, ssm_state, prefill_state_indices,
                                         cu_seqlens, prefill_has_initial_state,
                                         use_qk_l2norm_in_kernel, scale, core_attn_out,
                                         NULL_SLOT, algo)
    except (AttributeError, TypeError, ValueError) as e:
        raise integrations.engine_error(e, locals(), PREFILL_TENSORS, PREFILL_OPTIONAL,
                                        PREFILL_NAMES) from None

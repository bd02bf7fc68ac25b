"""SGLang's Gated Delta Net decode, speculative verify and commit, served by gdnzoo.

SGLang's Triton GDN kernel backend decodes with
``fused_recurrent_gated_delta_rule_packed_decode`` from its ``fla.fused_recurrent`` module, the
same packed design as vLLM's.  :func:`packed_decode` takes the same arguments, shapes and layout
and returns the same ``(out, initial_state)``, so swapping one import in the module that calls it
routes the step through :func:`gdnzoo.decode`::

    # where SGLang's GDN kernel backend imports its packed decode:
    from gdnzoo.integrations.sglang import packed_decode as \\
        fused_recurrent_gated_delta_rule_packed_decode

(rebind the name in that module: ``from ... import`` copies the reference at import time).

SGLang 0.5.23 verifies (``target_verify`` of its Triton GDN kernel backend) with
``fused_sigmoid_gating_delta_rule_update`` of
``sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent``: T draft tokens per
sequence, ``disable_state_update=True``, the state after each token stored in
``intermediate_states_buffer``.  After accepting, it commits the accepted step of every layer
with ``fused_mamba_state_scatter_with_mask``
(``sglang.kernels.ops.mamba.mamba_state_scatter_triton``).  The functions of those names
here take their signatures and serve them through :func:`gdnzoo.decode` and
:func:`gdnzoo.commit`.

SGLang's padding: an index < 0 is padding; slot 0 is a real slot (SGLang reserves it as a dummy,
but the kernels read and write it like any other), so these adapters pass no ``null_slot``.
A padded sequence gets zeros in ``out``; no slot is read or written for it.  ``algo=`` names a
gdnzoo backend (default: gdnzoo's automatic choice).  The adapters add views only, no kernel.
For the prefill, the automatic choice keeps fp32-accurate products; ``algo="cuda-chunk-bf16"``
rounds them to bf16 as FlashInfer's kernel does and is faster than the engine's own call
(``docs/serving.md`` has the numbers).

SGLang prefills (``forward_extend``) through its kernel dispatcher's ``extend``; its FlashInfer
kernel gathers ``ssm_states[cache_indices]``, runs FlashInfer's chunk kernel and copies the
final states back.  :func:`extend` takes the same arguments and returns the same tuple, with
one :func:`gdnzoo.prefill` call on the pool in place.
"""
from __future__ import annotations

import gdnzoo
from gdnzoo import integrations
from gdnzoo.integrations import check_gate, first_rows, gates, refuse, sequences, tokens

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


def _unserved(softplus_beta, softplus_threshold, scale, initial_state_source,
              initial_state_indices, is_kda, lower_bound, retrieve_parent_token, ring,
              match_cutedsl_decode):
    if is_kda or lower_bound is not None or match_cutedsl_decode:
        name = "is_kda" if is_kda else ("lower_bound" if lower_bound is not None
                                        else "match_cutedsl_decode")
        raise refuse(name, "Kimi Delta Attention's gates are not served: gdnzoo computes Gated "
                           "Delta Net's per-head softplus gate and sigmoid beta")
    check_gate("softplus_beta", softplus_beta, "softplus_threshold", softplus_threshold, scale,
               "SGLang's GDN backend")
    if retrieve_parent_token is not None:
        raise refuse("retrieve_parent_token", "draft trees (EAGLE tree verify, each token "
                                              "starting from its parent's state) are not served: "
                                              "gdnzoo verifies a chain of T tokens")
    if ring is not None:
        raise refuse(ring, "the ReplaySSM ring (cache_ring, replayssm_*) is not served")
    if initial_state_source is None or initial_state_indices is None:
        raise refuse("initial_state_source" if initial_state_source is None
                      else "initial_state_indices",
                      "required: gdnzoo serves SGLang's state pool [P, HV, V, K] through its slots")


def _buffer(x, HV, V, K):
    """SGLang's kernel stores row r, step t at block r * (stride(0) // (HV*V*K)) + t."""
    slot = HV * V * K
    if x.dim() != 5 or tuple(x.shape[2:]) != (HV, V, K):
        raise integrations._shape_error("intermediate_states_buffer", x,
                                        f"[S, T_max, HV={HV}, V={V}, K={K}]")
    if tuple(x.stride()[1:]) != (slot, V * K, K, 1) or x.stride(0) % slot:
        raise refuse("intermediate_states_buffer",
                     f"SGLang's kernel stores row r, step t at state block "
                     f"r*(stride(0)//(HV*V*K)) + t, so expected strides (m*{slot}, {slot}, "
                     f"{V * K}, {K}, 1), got {tuple(x.stride())}")


# The tensor arguments of the verify and commit calls (engine_error), and gdnzoo's names for them.
VERIFY_TENSORS = ("A_log", "a", "dt_bias", "q", "k", "v", "b", "initial_state_source",
                  "initial_state_indices", "cu_seqlens", "intermediate_states_buffer",
                  "intermediate_state_indices", "retrieve_parent_token", "replayssm_rawv",
                  "replayssm_rawk", "replayssm_g", "replayssm_beta")
VERIFY_TENSORS_OPTIONAL = VERIFY_TENSORS[7:]
VERIFY_NAMES = {"state": "initial_state_source", "state_indices": "initial_state_indices",
                "intermediate_states": "intermediate_states_buffer",
                "intermediate_indices": "intermediate_state_indices",
                "use_qk_l2norm": "use_qk_l2norm_in_kernel"}
COMMIT_TENSORS = ("dst", "src", "dst_indices_raw", "step_indices_raw", "src_indices_raw")
COMMIT_NAMES = {"intermediate_states": "src", "intermediate_indices": "src_indices_raw",
                "accepted_steps": "step_indices_raw", "state": "dst",
                "state_indices": "dst_indices_raw"}


def fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
        initial_state_indices, scale=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
        is_kda=False, lower_bound=None, disable_state_update=False,
        intermediate_states_buffer=None, intermediate_state_indices=None, cache_steps=None,
        retrieve_parent_token=None, cache_ring=False, replayssm_rawv=None, replayssm_rawk=None,
        replayssm_g=None, replayssm_beta=None, match_cutedsl_decode=False, *, algo=None):
    """SGLang's ``fused_sigmoid_gating_delta_rule_update`` through one :func:`gdnzoo.decode`
    call; returns ``o`` shaped like v in q's dtype, as SGLang does.

    q, k [1, N*T, H, K] and v [1, N*T, HV, V] (any token stride, heads contiguous) with
    ``cu_seqlens`` [N+1] = [0, T, ..., N*T] (or [N, T, ...] without it); a, b [N*T, HV] (or
    [1, N*T, HV], [N, T, HV]); ``initial_state_source`` the pool [P, HV, V, K] read at
    ``initial_state_indices`` [>= N] (index < 0: padding) and, unless
    ``disable_state_update``, written there.  ``intermediate_states_buffer``
    [S, T_max, HV, V, K] (T_max >= T) receives the state after token t of sequence n at
    ``[intermediate_state_indices[n], t]`` (a row < 0 or >= S stores nothing; None: row n;
    ignored without the buffer, as SGLang does).  ``cache_steps`` is accepted and unused:
    SGLang's kernel takes the buffer's row pitch from its stride(0).

    Padding differs from SGLang in what SGLang leaves undefined: a padded sequence gets zeros
    in ``o`` and no intermediate state (SGLang runs it from a zero state and stores its steps
    when its row is >= 0).

    Not served (ValueError naming the argument): ``cu_seqlens`` other than [0, T, ..., N*T]
    with T q's tokens over N (sequences of different lengths);
    ``retrieve_parent_token`` (draft trees); softplus_beta != 1 or softplus_threshold != 20;
    ``is_kda``, ``lower_bound``, ``match_cutedsl_decode``; the ReplaySSM ring; a buffer whose
    steps are not contiguous state blocks; index tensors that are not contiguous.
    """
    try:
        ring = "cache_ring" if cache_ring else next(
            (n for n, x in (("replayssm_rawv", replayssm_rawv), ("replayssm_rawk", replayssm_rawk),
                            ("replayssm_g", replayssm_g), ("replayssm_beta", replayssm_beta))
             if x is not None), None)
        _unserved(softplus_beta, softplus_threshold, scale, initial_state_source,
                  initial_state_indices, is_kda, lower_bound, retrieve_parent_token, ring,
                  match_cutedsl_decode)
        varlen = cu_seqlens is not None
        N, T = sequences(cu_seqlens, q)
        qs, ks, vs = (tokens(n, x, N, T, varlen) for n, x in (("q", q), ("k", k), ("v", v)))
        HV, V, K = vs.shape[2], vs.shape[3], qs.shape[3]
        kw = {}
        if intermediate_states_buffer is not None:
            _buffer(intermediate_states_buffer, HV, V, K)
            kw["intermediate_states"] = intermediate_states_buffer
            if intermediate_state_indices is not None:
                kw["intermediate_indices"] = first_rows("intermediate_state_indices",
                                                        intermediate_state_indices, N, 1)
        if disable_state_update:
            kw["update_state"] = False
        o = q.new_empty(v.shape)
        gdnzoo.decode(qs, ks, vs, initial_state_source, A_log, gates("a", a, N, T, HV), dt_bias,
                      gates("b", b, N, T, HV), scale, out=tokens("o", o, N, T, varlen),
                      use_qk_l2norm=use_qk_l2norm_in_kernel, algo=algo,
                      state_indices=first_rows("initial_state_indices", initial_state_indices,
                                               N, 1),
                      **kw)
        return o
    except (AttributeError, TypeError, ValueError) as e:
        raise integrations.engine_error(e, locals(), VERIFY_TENSORS, VERIFY_TENSORS_OPTIONAL,
                                        VERIFY_NAMES) from None


def fused_mamba_state_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw,
                                        src_indices_raw=None):
    """SGLang's commit of the accepted verify step, for the Gated Delta Net state, through
    :func:`gdnzoo.commit` (one call per layer):
    ``dst[l, dst_indices_raw[i]] = src[l, src_indices_raw[i], step_indices_raw[i]]``.

    dst [L, P, HV, V, K] (every layer's pool), src [L, S, T_max, HV, V, K] (every layer's
    intermediate states), the index tensors [R] (``src_indices_raw`` None: row i).  As in
    SGLang, a negative step or one >= T_max, a destination outside [0, P) and a source row
    outside [0, S) copy nothing.  SGLang's function also commits conv-state windows (other
    trailing shapes): those are not Gated Delta Net states and raise ValueError."""
    try:
        if dst.dim() != 5:
            raise integrations._shape_error("dst", dst,
                                            "[L, P, HV, V, K] (Gated Delta Net states)")
        if src.dim() != 6 or src.shape[0] != dst.shape[0] or src.shape[3:] != dst.shape[2:]:
            raise integrations._shape_error("src", src, f"[L={dst.shape[0]}, S, T_max, "
                                                        f"{', '.join(map(str, dst.shape[2:]))}]")
        for layer in range(dst.shape[0]):
            gdnzoo.commit(src[layer], src_indices_raw, step_indices_raw, dst[layer],
                          dst_indices_raw)
    except (AttributeError, TypeError, ValueError) as e:
        raise integrations.engine_error(e, locals(), COMMIT_TENSORS, ("src_indices_raw",),
                                        COMMIT_NAMES) from None


# ------------------------------------------------------------------ prefill (extend)

# The extend call's tensor arguments (engine_error), and gdnzoo's names for them.
EXTEND_TENSORS = ("q", "k", "v", "g", "beta", "ssm_states", "cache_indices", "query_start_loc",
                  "has_initial_state")
EXTEND_NAMES = {"state": "ssm_states", "state_indices": "cache_indices",
                "new_state_indices": "cache_indices",
                "cu_seqlens": "query_start_loc"}


def extend(q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc,
           has_initial_state=None, inplace_update=True, algo=None):
    """SGLang's GDN ``extend`` (prefill) kernel call as one :func:`gdnzoo.prefill` call, in
    place on the pool.  Takes what ``GDNAttnBackend.forward_extend`` passes to its kernel
    dispatcher's ``extend`` and returns what the kernels return,
    ``(core_attn_out, None, None)``: no final state to copy back and no per-chunk states
    ``h``, so ``forward_extend`` skips ``_track_mamba_state_extend`` (SGLang's FlashInfer
    kernel returns the same; its gather of ``ssm_states[cache_indices]`` and its
    ``index_copy_`` back are what this call saves).

    q, k [1, T, H, K] and v [1, T, HV, V] as split from the conv output (any token stride, last
    dim contiguous), not normalized: both of SGLang's kernels L2-normalize q and k, and so
    does this call; g (log decay, fp32) and beta [1, T, HV] from ``fused_gdn_gating``;
    ``ssm_states`` the pool [P, HV, V, K]; ``cache_indices`` [N]; ``query_start_loc`` [N+1].
    SGLang zeroes a slot when it allocates it, so by default every sequence reads its slot;
    ``has_initial_state`` ([N] bool, e.g. ``forward_batch.extend_prefix_lens > 0``) lets a
    sequence start from zeros without reading it.  Returns ``core_attn_out`` [1, T, HV, V]
    in q's dtype.

    Index < 0 is padding (slot 0 is a real slot): the sequence's rows are zeros and no slot is
    read or written (SGLang's FlashInfer path reads the pool's last slot for it and writes
    nothing).  ``inplace_update=False`` (multi-item scoring: the pool only read) is not
    served: ValueError.  Bad inputs raise TypeError or ValueError naming SGLang's argument,
    before anything is read or written."""
    try:
        if inplace_update is not True:
            raise refuse("inplace_update", f"only True is served (the final states written to "
                                           f"the pool), got {inplace_update!r}")
        out = integrations.prefill_pool(q, k, v, g, beta, ssm_states, cache_indices,
                                        query_start_loc, has_initial_state, True, None, None,
                                        NULL_SLOT, algo)
        return out, None, None
    except (AttributeError, TypeError, ValueError) as e:
        raise integrations.engine_error(e, locals(), EXTEND_TENSORS, ("has_initial_state",),
                                        EXTEND_NAMES) from None

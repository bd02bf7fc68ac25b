"""The math of the decode step (see :func:`gdnzoo.decode`) in readable PyTorch: the test oracle,
and the ``pt-reference`` backend.

Vectorized over batch and heads, tokens applied in order.  All arithmetic in fp32 by default;
tests run it in float64 (``compute_dtype=torch.float64``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gdnzoo.pool import real_slots


def gates(A_log, a, dt_bias, b, compute_dtype=torch.float32, *, g=None, beta=None,
          neg=False):
    """Decay g in (0, 1) and write strength beta, both [B, T, HV], from the raw gates (beta =
    sigmoid(b), 2 sigmoid(b) with ``neg``: allow_neg_eigval) or the precomputed ``g`` (log
    decay) and ``beta``."""
    if g is not None:
        return torch.exp(g.to(compute_dtype)), beta.to(compute_dtype)
    A = A_log.to(compute_dtype)
    x = a.to(compute_dtype) + dt_bias.to(compute_dtype)
    g = torch.exp(-torch.exp(A) * F.softplus(x, beta=1.0, threshold=20.0))
    beta = torch.sigmoid(b.to(compute_dtype))
    return g, 2 * beta if neg else beta


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def reference_decode(q, k, v, state, A_log, a, dt_bias, b, scale: float, out, new_state,
                     use_qk_l2norm: bool = False, compute_dtype=torch.float32, *, g=None,
                     beta=None, neg=False, k_first=False):
    """Write ``out`` [B,T,HV,V] and ``new_state`` [B,HV,V,K] (which may be ``state`` itself);
    ``g``/``beta``: the precomputed gates instead of the raw ones, ``neg``: allow_neg_eigval;
    ``k_first``: the states are [B,HV,K,V]."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    g, beta = gates(A_log, a, dt_bias, b, compute_dtype, g=g, beta=beta, neg=neg)
    if k_first:
        state, new_state = state.transpose(-1, -2), new_state.transpose(-1, -2)
    # GVA: value head h reads q/k head h // (HV // H), as repeat_interleave gives.
    qx = q.to(compute_dtype).repeat_interleave(HV // H, dim=2)       # [B,T,HV,K]
    kx = k.to(compute_dtype).repeat_interleave(HV // H, dim=2)
    if use_qk_l2norm:
        qx, kx = l2norm(qx), l2norm(kx)
    vx = v.to(compute_dtype)
    S = state.to(compute_dtype)                                       # [B,HV,V,K], a copy
    for t in range(T):
        S = S * g[:, t, :, None, None]                                # 1) decay first
        sk = torch.einsum("bhvk,bhk->bhv", S, kx[:, t])               # 2) read k from decayed S
        u = beta[:, t, :, None] * (vx[:, t] - sk)
        S = S + u[..., None] * kx[:, t, :, None, :]                   # 3) rank-1 update
        o = scale * torch.einsum("bhvk,bhk->bhv", S, qx[:, t])        # 4) output from updated S
        out[:, t].copy_(o)
    new_state.copy_(S)
    return out, new_state


def reference_pool_decode(q, k, v, state, A_log, a, dt_bias, b, scale: float, out, new_state,
                          use_qk_l2norm: bool = False, pool=None, compute_dtype=torch.float32,
                          step=None, **form):
    """The pool form (:mod:`gdnzoo.pool`): gather the read slots, decode them as a dense batch
    (with ``step``, a dense decode of the one signature; default :func:`reference_decode` in
    ``compute_dtype``), zero the outputs of padded sequences, write the new states to their
    write slots.  All slots are read before any is written.  One host sync (the scatter's row
    selection)."""
    from gdnzoo import pool as pools
    P, PN = state.shape[0], new_state.shape[0]
    dense, rd, wr = pools.gathered(state, pool, P, PN)
    dense_new = torch.empty(dense.shape, dtype=new_state.dtype, device=dense.device)
    if step is None:
        reference_decode(q, k, v, dense, A_log, a, dt_bias, b, scale, out, dense_new,
                         use_qk_l2norm, compute_dtype, **form)
    else:
        step(q, k, v, dense, A_log, a, dt_bias, b, scale, out, dense_new, use_qk_l2norm,
             **form)
    out.masked_fill_(~rd[:, None, None, None], 0)
    pools.scatter(new_state, dense_new, pool, wr)
    return out, new_state


def _put(dst, rows, ok, src):
    """dst[rows[i]] = src[i] where ok[i] (one host sync for the selection)."""
    sel = ok.nonzero().flatten()
    if sel.numel():
        dst.index_copy_(0, rows.index_select(0, sel), src.index_select(0, sel).to(dst.dtype))


def reference_verify(q, k, v, state, A_log, a, dt_bias, b, scale: float, out, new_state,
                     use_qk_l2norm: bool = False, pool=None, verify=None,
                     compute_dtype=torch.float32, step=None, **form):
    """The verify forms (:mod:`gdnzoo.verify`), plainly: gather each sequence's initial state
    (a dense batch, pool slot, or per-token column ``num_accepted_tokens - 1``), run the tokens
    one at a time (with ``step``, a dense one-token decode of the one signature; default
    :func:`reference_decode` in ``compute_dtype``), store each token's state where the form
    says, then the final state unless ``update_state=False``.  All reads happen before any
    write; padded sequences get zero outputs and write nothing."""
    from gdnzoo.verify import read_columns
    B, T = q.shape[:2]
    dev = q.device
    P, PN = state.shape[0], new_state.shape[0]
    null = -1 if pool is None else pool.null_slot
    if pool is None:
        rd = torch.ones(B, dtype=torch.bool, device=dev)
        src = torch.arange(B, device=dev)
    else:
        r = pool.read.long()
        if verify.per_token:
            col, ok = read_columns(verify, T)
            r = r[:, 0] if col is None else r.gather(1, col[:, None])[:, 0]
        rd = real_slots(r, P, null)
        if verify.per_token and verify.accepted is not None:
            rd &= ok
        src = torch.where(rd, r, 0)
    cur = torch.where(rd[:, None, None, None], state.index_select(0, src), 0).to(compute_dtype)
    run = step or (lambda *args, **kw: reference_decode(*args, compute_dtype=compute_dtype,
                                                        **kw))

    def token(x, tok):
        return None if x is None else x[:, tok]
    if verify.states is not None:
        S = verify.states.shape[0]
        rows = torch.arange(B, device=dev) if verify.indices is None else verify.indices.long()
        keep = rd & (rows >= 0) & (rows < S)
    for t in range(T):
        tok = slice(t, t + 1)
        nxt = torch.empty_like(cur)
        run(q[:, tok], k[:, tok], v[:, tok], cur, A_log, token(a, tok), dt_bias, token(b, tok),
            scale, out[:, tok], nxt, use_qk_l2norm,
            **{n: token(x, tok) if n in ("g", "beta") else x for n, x in form.items()})
        if verify.states is not None:
            _put(verify.states[:, t], rows, keep, nxt)
        if verify.per_token:
            w = pool.read[:, t].long()
            _put(new_state, w, rd & real_slots(w, PN, null), nxt)
        cur = nxt
    if verify.update and not verify.per_token:
        if pool is None:
            new_state.copy_(cur)
        else:
            w = pool.write.long()
            _put(new_state, w, rd & real_slots(w, PN, null), cur)
    out.masked_fill_(~rd[:, None, None, None], 0)
    return out, new_state


def reference_verify_outputs(x, verify, use_qk_l2norm=False, pool=None, new_pool=None,
                             compute_dtype=torch.float64):
    """Fresh (out, state after the call, intermediate states after the call) in
    ``compute_dtype`` for an :class:`gdnzoo.inputs.Inputs` whose ``state`` is the pool (or
    dense batch) that a verify call reads: copies of what the call writes (``new_pool``,
    default ``x.state`` in place; ``verify.states``) with the written parts replaced."""
    B, T = x.q.shape[:2]
    HV, V = x.v.shape[2], x.v.shape[3]
    out = torch.empty(B, T, HV, V, dtype=compute_dtype, device=x.q.device)
    target = (x.state if new_pool is None else new_pool).to(compute_dtype, copy=True)
    src = target if new_pool is None else x.state
    inter = None if verify.states is None else verify.states.to(compute_dtype, copy=True)
    reference_verify(x.q, x.k, x.v, src, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, target,
                     use_qk_l2norm, pool, verify._replace(states=inter), compute_dtype)
    return out, target, inter


def reference_commit(intermediate_states, intermediate_indices, accepted_steps, state,
                     state_indices, null_slot=None):
    """:func:`gdnzoo.commit` plainly: ``state[slot n] = intermediate[row n, accepted_steps[n]]``
    for every sequence whose step, row and slot are real (one host sync)."""
    S, T_max = intermediate_states.shape[:2]
    B = accepted_steps.shape[0]
    dev = accepted_steps.device
    rows = torch.arange(B, device=dev) if intermediate_indices is None \
        else intermediate_indices.long()
    slots = torch.arange(B, device=dev) if state_indices is None else state_indices.long()
    steps = accepted_steps.long()
    ok = ((steps >= 0) & (steps < T_max) & (rows >= 0) & (rows < S)
          & real_slots(slots, state.shape[0], -1 if null_slot is None else null_slot))
    picked = intermediate_states[torch.where(ok, rows, 0), torch.where(ok, steps, 0)]
    _put(state, slots, ok, picked)
    return state


def run(call, compute_dtype=torch.float32, step=None):
    """The math of a decode call record (:data:`gdnzoo.contract.Call`): its dense, pool or
    verify form, writing ``call.out`` and the state it names.  ``step``: a dense decode of the
    one signature for the pool and verify forms' tokens (default :func:`reference_decode` in
    ``compute_dtype``)."""
    c = call
    args = (c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b, c.scale, c.out, c.new_state,
            c.use_qk_l2norm)
    form = dict(g=c.g, beta=c.beta, neg=c.allow_neg_eigval, k_first=c.problem.k_first)
    if c.verify is not None:
        reference_verify(*args, c.pool, c.verify, compute_dtype, step, **form)
    elif c.pool is not None:
        reference_pool_decode(*args, c.pool, compute_dtype, step, **form)
    elif step is not None:
        step(*args, **form)
    else:
        reference_decode(*args, compute_dtype=compute_dtype, **form)


def reference_outputs(x, use_qk_l2norm=False, compute_dtype=torch.float64, pool=None,
                      new_pool=None):
    """Fresh (out [B,T,HV,V], new_state) in ``compute_dtype`` for an
    :class:`gdnzoo.inputs.Inputs`; float64 by default, the oracle of tests and benchmarks.
    With ``pool`` (a :class:`gdnzoo.pool.Pool`), ``x.state`` is a pool and new_state is the
    whole pool after the call: a float64 copy of ``new_pool`` (default ``x.state``, in place)
    with the written slots replaced."""
    if pool is not None:
        B, T = x.q.shape[:2]
        HV, V = x.v.shape[2], x.v.shape[3]
        out = torch.empty(B, T, HV, V, dtype=compute_dtype, device=x.q.device)
        target = (x.state if new_pool is None else new_pool).to(compute_dtype, copy=True)
        src = target if new_pool is None else x.state
        reference_pool_decode(x.q, x.k, x.v, src, x.A_log, x.a, x.dt_bias, x.b, x.scale, out,
                              target, use_qk_l2norm, pool, compute_dtype)
        return out, target
    B, T = x.q.shape[:2]
    HV, V = x.v.shape[2], x.v.shape[3]
    out = torch.empty(B, T, HV, V, dtype=compute_dtype, device=x.q.device)
    new_state = torch.empty(x.state.shape, dtype=compute_dtype, device=x.q.device)
    reference_decode(*x.args(), out, new_state, use_qk_l2norm, compute_dtype=compute_dtype)
    return out, new_state


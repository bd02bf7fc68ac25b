"""The math of the prefill (see :func:`gdnzoo.prefill`) in readable PyTorch: the test oracle,
the ``pt-reference`` backend's prefill, and the chunked (WY) form ``pt-compiled`` compiles.

Each sequence is the decode step's recurrence over its tokens (:func:`gdnzoo.reference.
reference_decode` on the sequence as a batch of one), from its initial state; the lengths are
read on the host (a sync).  Tests run it in float64 (``compute_dtype=torch.float64``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gdnzoo.pool import real_slots
from gdnzoo.prefill_contract import check_on_host
from gdnzoo.reference import l2norm, reference_decode

CHUNK = 64          # tokens per chunk of the chunked form
# The chunked forms take each token's log decay as at least this: exp of it is already 0 in
# fp32, so no result changes, but the within-chunk sums G stay finite and small, where a hard
# reset (g = -inf) made G_i - G_j NaN and a huge negative g cancelled to garbage.
LOG_DECAY_MIN = -128.0


def initial_states(state, N, HV, V, K, pool=None, has_initial_state=None,
                   compute_dtype=torch.float32, k_first=False, device=None):
    """([N, HV, V, K] initial states in ``compute_dtype`` (K-first: [N, HV, K, V]), [N] bool:
    the sequence is real).
    Padded sequences (a pool's padding slots) and those whose ``has_initial_state`` is False
    start from zeros; every read happens here, before any write.  ``device``: the inputs'
    (where the zeros of ``state=None`` go)."""
    dev = state.device if state is not None else device
    real = torch.ones(N, dtype=torch.bool, device=dev)
    if state is None:
        blk = (HV, K, V) if k_first else (HV, V, K)
        return torch.zeros(N, *blk, dtype=compute_dtype, device=dev), real
    if pool is None:
        init = state.to(compute_dtype)
    else:
        real = real_slots(pool.read, state.shape[0], pool.null_slot)
        init = state.index_select(0, torch.where(real, pool.read, 0).long()).to(compute_dtype)
    keep = real if has_initial_state is None else real & has_initial_state
    return torch.where(keep[:, None, None, None], init, 0), real


def write_states(new_state, finals, real, pool=None):
    """The final states of the real sequences to their rows (or write slots of a pool)."""
    N = finals.shape[0]
    if pool is None:
        rows, ok = torch.arange(N, device=finals.device), real
    else:
        rows = pool.write.long()
        ok = real & real_slots(pool.write, new_state.shape[0], pool.null_slot)
    sel = ok.nonzero().flatten()
    if sel.numel():
        new_state.index_copy_(0, rows.index_select(0, sel),
                              finals.index_select(0, sel).to(new_state.dtype))


def reference_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale: float, out,
                      new_state, use_qk_l2norm=False, pool=None, has_initial_state=None,
                      compute_dtype=torch.float32, chunk_step=None, *, g=None, beta=None,
                      neg=False, k_first=False, checkpoints=None, checkpoint_every=None):
    """Write ``out`` [T, HV, V] and the final states into ``new_state`` (which may be
    ``state`` itself, or a pool).  ``chunk_step``: run each sequence in the chunked form
    through it (:func:`chunked_sequence`) instead of token by token.  ``g``/``beta``: the
    precomputed gates instead of the raw ones, ``neg``: allow_neg_eigval, ``k_first``: the
    states are [.., HV, K, V].  ``checkpoints``: the state after every ``checkpoint_every``
    tokens of each real sequence, at its rows
    (:func:`gdnzoo.prefill_contract.checkpoint_offsets`)."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu_seqlens.shape[0] - 1
    bounds = check_on_host(cu_seqlens, T)      # read on the host anyway: checked, not trusted
    init, real = initial_states(state, N, HV, V, K, pool, has_initial_state, compute_dtype,
                                k_first, q.device)

    def tok(x, s, e, batch=False):
        return None if x is None else (x[None, s:e] if batch else x[s:e])
    finals = init.clone()
    every = checkpoint_every if checkpoints is not None else 0
    row = 0                   # sequence n's first checkpoint row

    def save(m, S):
        """Sequence n's m-th checkpoint (m >= 1), S in the state's layout."""
        checkpoints[row + m - 1] = S.to(checkpoints.dtype)
    for n in range(N):
        if n:
            row += (bounds[n] - bounds[n - 1]) // every if every else 0
        s, e = bounds[n], bounds[n + 1]
        if e == s:
            continue
        if not bool(real[n]):
            out[s:e].zero_()
            continue
        if chunk_step is not None:
            S0 = init[n].transpose(-1, -2) if k_first else init[n]
            o, S = chunked_sequence(
                q[s:e], k[s:e], v[s:e], S0, A_log, tok(a, s, e), dt_bias, tok(b, s, e), scale,
                use_qk_l2norm, chunk_step, g=tok(g, s, e), beta=tok(beta, s, e), neg=neg,
                every=every, save=lambda m, S: save(m, S.transpose(-1, -2) if k_first else S))
            finals[n] = S.transpose(-1, -2) if k_first else S
            out[s:e].copy_(o)
            continue
        # Token by token, in segments that end at the checkpoints.
        S = init[n:n + 1]
        edges = list(range(s, e, every)) + [e] if every else [s, e]
        for p, r in zip(edges, edges[1:]):
            S, S_in = torch.empty_like(S), S
            reference_decode(q[None, p:r], k[None, p:r], v[None, p:r], S_in, A_log,
                             tok(a, p, r, True), dt_bias, tok(b, p, r, True), scale,
                             out[None, p:r], S, use_qk_l2norm, compute_dtype,
                             g=tok(g, p, r, True), beta=tok(beta, p, r, True), neg=neg,
                             k_first=k_first)
            if every and (r - s) % every == 0:
                save((r - s) // every, S[0])
        finals[n] = S[0]
    write_states(new_state, finals, real, pool)
    return out, new_state


def run(call, compute_dtype=torch.float32, chunk_step=None):
    """The math of a prefill call record (:data:`gdnzoo.prefill_contract.Call`)."""
    c = call
    reference_prefill(c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b, c.cu_seqlens,
                      c.scale, c.out, c.new_state, c.use_qk_l2norm, c.pool,
                      c.has_initial_state, compute_dtype, chunk_step, g=c.g, beta=c.beta,
                      neg=c.allow_neg_eigval, k_first=c.problem.k_first,
                      checkpoints=c.checkpoints, checkpoint_every=c.checkpoint_every)


def reference_outputs(x, use_qk_l2norm=False, compute_dtype=torch.float64, pool=None,
                      new_pool=None, has_initial_state=None, checkpoints=None,
                      checkpoint_every=None):
    """Fresh (out [T, HV, V], final states) in ``compute_dtype`` for prefill inputs ``x``
    (:class:`gdnzoo.inputs.PrefillInputs`): float64 by default, the oracle of tests and the
    bench.  With ``pool``, ``x.state`` is a pool and the states returned are the whole pool
    after the call: a copy of ``new_pool`` (default ``x.state``) with the written slots
    replaced.  ``checkpoints`` (a tensor in ``compute_dtype``) receives the state after every
    ``checkpoint_every`` tokens of each sequence (see :func:`gdnzoo.prefill`)."""
    T, HV, V = x.v.shape
    N, K = x.cu_seqlens.shape[0] - 1, x.q.shape[2]
    out = torch.empty(T, HV, V, dtype=compute_dtype, device=x.q.device)
    if pool is not None:
        target = (x.state if new_pool is None else new_pool).to(compute_dtype, copy=True)
    else:
        target = torch.empty(N, HV, V, K, dtype=compute_dtype, device=x.q.device)
    reference_prefill(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
                      x.scale, out, target, use_qk_l2norm, pool, has_initial_state,
                      compute_dtype, checkpoints=checkpoints, checkpoint_every=checkpoint_every)
    return out, target


# ------------------------------------------------------------------ the chunked (WY) form

def log_gates(A_log, a, dt_bias, b, compute_dtype=torch.float32, *, g=None, beta=None,
              neg=False):
    """(log decay, beta) [T, HV]: ``log g = -exp(A_log) * softplus(a + dt_bias)``, beta =
    sigmoid(b) (2 sigmoid(b) with ``neg``), or the precomputed ``g`` and ``beta``."""
    if g is not None:
        return g.to(compute_dtype), beta.to(compute_dtype)
    x = a.to(compute_dtype) + dt_bias.to(compute_dtype)
    lg = -torch.exp(A_log.to(compute_dtype)) * F.softplus(x, beta=1.0, threshold=20.0)
    beta = torch.sigmoid(b.to(compute_dtype))
    return lg, 2 * beta if neg else beta


def chunk(S, q, k, v, lg, beta, scale):
    """One chunk of C tokens of one sequence, every head at once, in the WY form: S [HV, V, K]
    the state before it; q, k [C, HV, K] (GVA already applied), v [C, HV, V], lg and beta
    [C, HV].  Returns (out [C, HV, V], the state after it).

    With G the cumulative log decay within the chunk, the C rank-1 delta updates fold into one
    through the unit lower-triangular system (I + A), A[i, j] = beta_i (k_i . k_j)
    exp(G_i - G_j) for j < i:  W = (I + A)^-1 diag(beta) (K * exp(G)), U = (I + A)^-1
    diag(beta) V; the new values V' = U - W S^T; out = scale ((Q * exp(G)) S^T + (QK^T *
    exp(G_i - G_j), j <= i) V'); S' = exp(G_last) S + (V' * exp(G_last - G))^T K."""
    C = q.shape[0]
    G = lg.clamp_min(LOG_DECAY_MIN).cumsum(0).transpose(0, 1)   # [HV, C]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)   # [HV, C, *]
    bh = beta.transpose(0, 1)                             # [HV, C]
    diff = G[:, :, None] - G[:, None, :]                  # G_i - G_j
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, diff, float("-inf")).exp()  # exp(G_i - G_j), j <= i; else 0
    A = (bh[:, :, None] * (kh @ kh.transpose(1, 2)) * decay).tril(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device).expand_as(A)
    W = torch.linalg.solve_triangular(eye + A, (bh * G.exp())[..., None] * kh, upper=False,
                                      unitriangular=True)
    U = torch.linalg.solve_triangular(eye + A, bh[..., None] * vh, upper=False,
                                      unitriangular=True)
    Vn = U - W @ S.transpose(1, 2)                        # [HV, C, V]
    o = ((qh * G.exp()[..., None]) @ S.transpose(1, 2) + ((qh @ kh.transpose(1, 2)) * decay)
         @ Vn) * scale
    last = G[:, -1:]                                      # [HV, 1]
    S = last.exp()[..., None] * S + (Vn * (last - G).exp()[..., None]).transpose(1, 2) @ kh
    return o.transpose(0, 1), S


def chunked_sequence(q, k, v, S, A_log, a, dt_bias, b, scale, use_qk_l2norm=False,
                     chunk_step=chunk, C=CHUNK, *, g=None, beta=None, neg=False, every=0,
                     save=None):
    """One sequence of L tokens in the chunked form, in ``S``'s dtype: (out [L, HV, V], final
    state [HV, V, K]).  The last chunk is padded with tokens of beta 0 and decay 1 (which
    leave the state as it is), so every ``chunk_step`` call sees C tokens.  ``every`` (a
    multiple of C): ``save(m, state)`` gets the state after each m * every tokens <= L."""
    L, H, _ = q.shape
    HV = v.shape[1]
    dt = S.dtype
    qx = q.to(dt).repeat_interleave(HV // H, dim=1)
    kx = k.to(dt).repeat_interleave(HV // H, dim=1)
    if use_qk_l2norm:
        qx, kx = l2norm(qx), l2norm(kx)
    vx = v.to(dt)
    lg, beta = log_gates(A_log, a, dt_bias, b, dt, g=g, beta=beta, neg=neg)
    pad = (-L) % C
    if pad:
        def more(x):
            return torch.cat([x, x.new_zeros((pad,) + x.shape[1:])])
        qx, kx, vx, lg, beta = map(more, (qx, kx, vx, lg, beta))
    outs = []
    for s in range(0, L + pad, C):
        o, S = chunk_step(S, qx[s:s + C], kx[s:s + C], vx[s:s + C], lg[s:s + C],
                          beta[s:s + C], scale)
        outs.append(o)
        if every and (s + C) % every == 0 and s + C <= L:
            save((s + C) // every, S)
    return torch.cat(outs)[:L], S

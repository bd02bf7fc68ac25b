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

Both engines verify speculative drafts with ``fused_sigmoid_gating_delta_rule_update`` (T draft
tokens per sequence, flattened [1, N*T, ...] with ``cu_seqlens``).  The adapters of the same
name in :mod:`gdnzoo.integrations.vllm` and :mod:`gdnzoo.integrations.sglang` serve the uniform
case, every sequence of one length T, as views [N, T, ...] of the engines' tensors (no copy) and
one :func:`gdnzoo.decode` call; what they do not serve raises ValueError naming the argument.
Every adapter names arguments as its engine does: a non-tensor where a tensor goes raises
TypeError naming it, before anything is read or written.
``cu_seqlens`` must then be ``[0, T, 2T, ..., N*T]``: its values are read on the host only when
it lives on the CPU or ``GDNZOO_CHECK_INDICES=1`` is set (reading a device tensor would sync),
and never while torch.compile traces (the adapters compile with ``fullgraph=True``).

Both engines prefill (Hopper, FlashInfer's chunk kernel) by gathering the sequences' states out
of the pool, running the chunk kernel on the copies and scattering the final states back.
:func:`gdnzoo.integrations.vllm.chunked_prefill` and :func:`gdnzoo.integrations.sglang.extend`
take the engines' tensors at that call site (q, k, v [1, T, ...], the precomputed gates g and
beta [1, T, HV], the pool and its indices) and make one :func:`gdnzoo.prefill` call that reads
and writes the pool in place (:func:`prefill_pool`), with the engine's padding rule.

Importing this package imports gdnzoo and nothing else.
"""
from __future__ import annotations

import re

import gdnzoo
from gdnzoo.compiling import when_compiled

__all__ = ["packed_views", "packed_decode", "prefill_pool"]


def _compiling() -> bool:
    """Whether torch.compile is tracing (a tensor's values cannot be read on the host then)."""
    import torch
    return torch.compiler.is_compiling()


def _shape_error(name, x, expected):
    return ValueError(f"{name}: expected {expected}, got shape {tuple(x.shape)}")


def packed_views(mixed_qkv, a, b, A_log, initial_state, out):
    """(q, k, v, a, b) as views for :func:`gdnzoo.decode`: q, k [B, 1, H, K] and v [B, 1, HV, V]
    of ``mixed_qkv``'s rows, a and b [B, 1, HV].  HV comes from ``A_log``, V and K from the pool
    ``initial_state`` [P, HV, V, K], then H = (mixed_qkv.shape[1] - HV*V) // (2*K).  Raises
    ValueError naming the argument whose shape does not fit, TypeError naming one that is not a
    tensor."""
    try:
        return _views(mixed_qkv, a, b, A_log, initial_state, out, False)
    except (AttributeError, TypeError, ValueError) as e:
        raise engine_error(e, locals(), PACKED_TENSORS) from None


# ------------------------------------------------------------------ errors in the engine's terms

PACKED_TENSORS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state", "out",
                  "ssm_state_indices")
# gdnzoo.decode's argument names for the packed call's (q, k and v are views of mixed_qkv).
PACKED_NAMES = {"q": "mixed_qkv: its q columns", "k": "mixed_qkv: its k columns",
                "v": "mixed_qkv: its v columns", "state": "initial_state",
                "state_indices": "ssm_state_indices",
                "use_qk_l2norm": "use_qk_l2norm_in_kernel"}


def engine_error(e, args, tensors, optional=(), names=None):
    """The error ``e`` of an engine call, in the engine's terms.  Only a failed call comes here
    (the adapters read shapes and gdnzoo validates; the valid path pays nothing for this).
    Returns a TypeError naming the first of ``tensors`` (argument names; those in ``args``, the
    call's locals) that is not a tensor (None allowed for those in ``optional``), or naming
    ``scale`` if it is not a number or None; else ``e``, with a leading gdnzoo argument name
    that the engine calls otherwise (``names``) replaced."""
    import numbers

    import torch

    from gdnzoo.checks import type_name
    for name in tensors:
        x = args.get(name)
        if name in args and not (isinstance(x, torch.Tensor) or (x is None and name in optional)):
            what = "a torch.Tensor or None" if name in optional else "a torch.Tensor"
            return TypeError(f"{name}: expected {what}, got {type_name(x)}")
    scale = args.get("scale")
    if isinstance(scale, bool) or not (scale is None or isinstance(scale, numbers.Real)
                                       or isinstance(scale, torch.Tensor)):
        return TypeError(f"scale: expected a float or None, got {type_name(scale)}")
    head, sep, rest = str(e).partition(": ")
    name = head.split("[", 1)[0]              # "cu_seqlens[2] = 5": the debug checks' form
    if sep and names and name in names and type(e) in (TypeError, ValueError):
        return type(e)(f"{names[name]}{head[len(name):]}: {_renamed(rest, names)}")
    return e


def _renamed(text, names):
    """``text`` with gdnzoo's argument names that read as names (``cu_seqlens``,
    ``state_indices``; not words such as ``state``) replaced by the engine's, whole words."""
    for ours, theirs in names.items():
        if "_" in ours and theirs.isidentifier():
            text = re.sub(rf"(?<!\w){ours}(?!\w)", theirs, text)
    return text


def _views(mixed_qkv, a, b, A_log, initial_state, out, traced):
    """:func:`packed_views`; ``traced``: as torch.compile traces it."""
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
    if traced:      # torch.compile cannot trace storage_offset(): views of slices keep the
        # offsets (not as_strided of a slice, whose offset torch 2.11's inductor drops: k and v
        # then read q's columns)
        q = mixed_qkv[:, :H * K].view(B, 1, H, K)
        k = mixed_qkv[:, H * K:2 * H * K].view(B, 1, H, K)
        v = mixed_qkv[:, 2 * H * K:].view(B, 1, HV, V)
    else:           # eager: three as_strided, no slice (host time matters every step)
        at = mixed_qkv.storage_offset()
        q = mixed_qkv.as_strided((B, 1, H, K), (s0, s0, K, 1), at)
        k = mixed_qkv.as_strided((B, 1, H, K), (s0, s0, K, 1), at + H * K)
        v = mixed_qkv.as_strided((B, 1, HV, V), (s0, s0, V, 1), at + 2 * H * K)
    return q, k, v, a.unsqueeze(1), b.unsqueeze(1)


def _traced_views(mixed_qkv, a, b, A_log, initial_state, out):
    """:func:`packed_views` as torch.compile traces it."""
    return _views(mixed_qkv, a, b, A_log, initial_state, out, True)


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                  use_qk_l2norm_in_kernel, null_slot, algo):
    """The engines' packed decode through :func:`gdnzoo.decode`, in place on the pool, with
    ``null_slot`` (0 or None) as the padding rule; returns ``(out, initial_state)``."""
    q, k, v, a1, b1 = packed_views(mixed_qkv, a, b, A_log, initial_state, out)
    try:
        gdnzoo.decode(q, k, v, initial_state, A_log, a1, dt_bias, b1, scale, out=out,
                      use_qk_l2norm=use_qk_l2norm_in_kernel, algo=algo,
                      state_indices=ssm_state_indices, null_slot=null_slot)
    except (TypeError, ValueError) as e:
        raise engine_error(e, locals(), PACKED_TENSORS, names=PACKED_NAMES) from None
    return out, initial_state


# ------------------------------------------------------------------ verify: uniform T, views

def refuse(name, why):
    """The ValueError of an engine argument that gdnzoo does not serve."""
    return ValueError(f"{name}: {why}")


def check_gate(beta_name, beta, threshold_name, threshold, scale, engine):
    """Refuse an engine's softplus other than beta=1, threshold=20 (gdnzoo's gate; what the
    engines pass) and a scale that is not > 0 or None, naming the engine's arguments."""
    if beta != 1.0 or threshold != 20.0:
        raise refuse(beta_name if beta != 1.0 else threshold_name,
                     f"gdnzoo's gate is softplus with beta=1 and threshold=20 (what {engine} "
                     f"passes), got {beta_name}={beta}, {threshold_name}={threshold}")
    if scale is not None and not scale > 0:
        raise refuse("scale", f"expected a value > 0 or None ({engine} asserts it), got {scale}")


def sequences(cu_seqlens, q, T=None, T_from=None):
    """(N, T) of an engine's verify call: with ``cu_seqlens`` [N+1], N sequences of T tokens
    back to back (T given, ``T_from`` saying where from; or q's token count over N); without
    it, q [N, T, H, K].  Checks ``cu_seqlens`` values (see the package docstring) and raises
    ValueError naming what does not fit."""
    if cu_seqlens is None:
        if q.dim() != 4:
            raise _shape_error("q", q, "[N, T, H, K] (no cu_seqlens)")
        return q.shape[0], q.shape[1]
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise _shape_error("cu_seqlens", cu_seqlens, "[N+1] with N >= 1")
    if q.dim() != 4 or q.shape[0] != 1:
        raise _shape_error("q", q, "[1, N*T, H, K] (flattened: cu_seqlens given)")
    from gdnzoo.checks import INDEX_DTYPES, need_dtype
    need_dtype("cu_seqlens", cu_seqlens, INDEX_DTYPES)
    if cu_seqlens.device.type != "cpu" and cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens: expected device {q.device} (the device of q) or the "
                         f"CPU, got {cu_seqlens.device}")
    N = cu_seqlens.shape[0] - 1
    if T is None:
        if q.shape[1] % N:
            raise refuse("cu_seqlens", f"N={N} sequences, and q's {q.shape[1]} tokens are not "
                                       f"N of one length: gdnzoo serves only sequences of one "
                                       f"length T (q's tokens over N)")
        T, T_from = q.shape[1] // N, f"q's {q.shape[1]} tokens over N={N}"
    from gdnzoo import pool as pools
    if (cu_seqlens.device.type == "cpu" or pools.checking()) and not _compiling():
        got = cu_seqlens.tolist()
        for n in range(N):
            if (got[n], got[n + 1]) != (n * T, n * T + T):
                raise refuse("cu_seqlens", f"sequence {n} spans tokens [{got[n]}, {got[n + 1]}), "
                                           f"expected [{n * T}, {n * T + T}): gdnzoo serves only "
                                           f"N sequences of one length T back to back, and here "
                                           f"T={T} ({T_from})")
    return N, T


def tokens(name, x, N, T, varlen):
    """``x`` [1, >= N*T, ...] (varlen) or [N, T, ...] as a view [N, T, ...]."""
    if varlen:
        if x.dim() < 3 or x.shape[0] != 1 or x.shape[1] < N * T:
            raise _shape_error(name, x, f"[1, N*T={N * T}, ...] (N={N} sequences of T={T})")
        return x[0, :N * T].view(N, T, *x.shape[2:])
    if x.dim() < 3 or tuple(x.shape[:2]) != (N, T):
        raise _shape_error(name, x, f"[N={N}, T={T}, ...]")
    return x


def gates(name, x, N, T, HV):
    """A gate tensor ([N*T, HV], [1, N*T, HV] or [N, T, HV]; extra trailing tokens unused) as a
    view [N, T, HV]."""
    if x.dim() == 3 and tuple(x.shape) == (N, T, HV):
        return x
    y = x[0] if x.dim() == 3 and x.shape[0] == 1 else x
    if y.dim() != 2 or y.shape[1] != HV or y.shape[0] < N * T:
        raise _shape_error(name, x, f"[N*T={N * T}, HV={HV}], [1, N*T, HV] or [N, T, HV]")
    return y[:N * T].view(N, T, HV)


def first_rows(name, x, N, dim):
    """An index tensor of rank ``dim`` with at least N rows, cut to its first N (a view; an
    engine may pass a longer, graph-padded buffer)."""
    if x.dim() != dim or x.shape[0] < N:
        raise _shape_error(name, x, f"rank {dim} with at least N={N} rows")
    if not x.is_contiguous():
        raise refuse(name, f"expected a contiguous tensor (gdnzoo reads index tensors densely, "
                           f"and a copy would cost a kernel), got strides {tuple(x.stride())}")
    return x[:N]



# ------------------------------------------------------------------ prefill: the pool in place

def _one_batch(name, x, rank, layout, shape=None):
    """An engine's [1, T, ...] tensor (rank ``rank``; with ``shape``, [1, *shape]) as the view
    [T, ...]."""
    if x.dim() != rank or x.shape[0] != 1 or (shape is not None and x.shape[1:] != shape):
        raise _shape_error(name, x, layout)
    return x[0]


def prefill_pool(q, k, v, g, beta, state, state_indices, cu_seqlens, has_initial_state,
                 use_qk_l2norm, scale, out, null_slot, algo):
    """The engines' chunked prefill as one :func:`gdnzoo.prefill` call on the pool ``state``
    [P, HV, V, K], read and written in place at ``state_indices`` [N] (``null_slot`` 0 or None
    with negative indices as the padding rule; ``has_initial_state`` [N] bool or None).
    q, k [1, T, H, K] and v [1, T, HV, V] (last dim contiguous, any token stride), g (log decay,
    fp32) and beta [1, T, HV]; ``out`` None or a buffer [>= T, HV, V] whose first T rows are
    written.  Returns the output as [1, T, HV, V] (a view of ``out`` when given).  Errors name
    gdnzoo's arguments (``state``, ``out``, ...): the engine's adapter renames them."""
    qs = _one_batch("q", q, 4, "[1, T, H, K]")
    T, H, K = qs.shape
    ks = _one_batch("k", k, 4, f"[1, T={T}, H={H}, K={K}] (as q)", qs.shape)
    vs = _one_batch("v", v, 4, f"[1, T={T}, HV, V]")
    if vs.shape[0] != T:
        raise _shape_error("v", v, f"[1, T={T}, HV, V] (T as q)")
    HV = vs.shape[1]
    gs = _one_batch("g", g, 3, f"[1, T={T}, HV={HV}] (log decay)", (T, HV))
    bs = _one_batch("beta", beta, 3, f"[1, T={T}, HV={HV}]", (T, HV))
    if out is not None:
        if out.dim() != 3 or out.shape[0] < T:
            raise _shape_error("out", out, f"[>= T={T}, HV, V] (its first T rows are written)")
        out = out[:T]
    o, _ = gdnzoo.prefill(qs, ks, vs, state, None, None, None, None, cu_seqlens, scale,
                          out=out, g=gs, beta=bs, use_qk_l2norm=use_qk_l2norm,
                          state_indices=state_indices, has_initial_state=has_initial_state,
                          null_slot=null_slot, algo=algo)
    return o.unsqueeze(0)


when_compiled(packed_views, _traced_views)

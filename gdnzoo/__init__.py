"""gdnzoo: every way to compute the Gated Delta Net decode step, behind one signature.

    out, new_state = gdnzoo.decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, *,
                                   out=None, new_state=None, use_qk_l2norm=False, algo=None,
                                   state_indices=None, new_state_indices=None, null_slot=None)

The public API is this module: :func:`decode`, :func:`select`, :func:`get`,
:func:`list_backends`, and the records they return.
"""
from __future__ import annotations

from gdnzoo import dispatch as _dispatch
from gdnzoo.contract import Problem, validate as _validate
from gdnzoo.registry import BackendInfo, Selection, list_backends
from gdnzoo.registry import load_registry as _load_registry, select as _select

__all__ = ["decode", "get", "list_backends", "select", "Problem", "BackendInfo", "Selection"]
__version__ = "0.1.0"

_decode = _dispatch.decode


def decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
           use_qk_l2norm=False, algo=None, state_indices=None, new_state_indices=None,
           null_slot=None):
    """One Gated Delta Net decode step of T tokens; returns ``(out, new_state)``.

    Per sequence n, token t and value head h (q/k head ``h // (HV // H)``), in fp32::

        g    = exp(-exp(A_log[h]) * softplus(a[n,t,h] + dt_bias[h]))
        beta = sigmoid(b[n,t,h])
        S    = g * S                       # S = state[n, h], stored [V, K]
        u    = beta * (v[n,t,h] - S @ k)
        S    = S + outer(u, k)
        o    = scale * (S @ q)

    Shapes: q, k [B, T, H, K] and v [B, T, HV, V] (bf16 or fp16, last axis contiguous); state
    [B, HV, V, K] (fp32 or bf16, K contiguous); A_log [HV] fp32; a, b [B, T, HV]; dt_bias [HV]
    (fp32 or bf16); out [B, T, HV, V] in v's dtype.  HV must be a multiple of H.

    ``new_state`` None or ``state``: the state is updated in place; a distinct ``new_state``
    receives it and ``state`` is only read (destination passing).  ``out`` None allocates it.
    T >= 1 tokens are applied in order.  ``scale`` None or 0 means 1/sqrt(K).
    ``use_qk_l2norm`` normalizes q and k first.  ``algo`` names a backend
    (:func:`list_backends`); else the ``ALGO`` environment variable, else this GPU's measured
    default table, else a fallback order (:func:`select` says which and why).

    State pools (serving engines): with ``state_indices`` ([B] int32/int64 on q's device),
    ``state`` is a pool [P, HV, V, K] (each slot's [HV, V, K] block contiguous, any
    ``stride(0)`` >= HV*V*K) and sequence n reads slot ``state_indices[n]`` and writes its new
    state to slot ``new_state_indices[n]`` (default: the same) of ``new_state`` (default: the
    same pool).  A negative index is padding, and so is ``null_slot`` (vLLM's null block:
    ``null_slot=0``); an index >= P is never dereferenced.  A padded sequence gets zeros in
    ``out`` and no state is read or written.  No host sync: CUDA-graph capturable.
    ``GDNZOO_CHECK_INDICES=1`` checks the indices on the host (see :mod:`gdnzoo.pool`).

    Bad inputs raise ``ValueError`` or ``TypeError`` naming the argument, before any kernel
    runs, so ``state`` is untouched.  An explicit algo that is unknown or cannot serve these
    inputs raises, listing the valid names and the reason.
    """
    return _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                   algo, state_indices, new_state_indices, null_slot)


def select(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
           use_qk_l2norm=False, algo=None, state_indices=None, new_state_indices=None,
           null_slot=None) -> Selection:
    """Which backend :func:`decode` would use for these inputs, from which rule, and why."""
    p, _ = _validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                     use_qk_l2norm=use_qk_l2norm, state_indices=state_indices,
                     new_state_indices=new_state_indices, null_slot=null_slot)
    return _select(p, algo)


def get(name: str):
    """A callable with :func:`decode`'s signature that always uses backend ``name``.

    Raises ``ValueError`` listing the valid names if ``name`` is unknown.
    """
    reg = _load_registry()
    if name not in reg.backends:
        raise ValueError(f"algo: unknown backend {name!r}; valid names: {', '.join(reg.names)}")

    def call(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
             use_qk_l2norm=False, state_indices=None, new_state_indices=None, null_slot=None):
        return _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                       use_qk_l2norm, name, state_indices, new_state_indices, null_slot)
    call.__name__ = f"decode[{name}]"
    call.__doc__ = f"gdnzoo.decode with algo={name!r}."
    return call

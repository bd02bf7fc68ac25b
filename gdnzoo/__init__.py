"""gdnzoo: every way to compute the Gated Delta Net decode step, behind one signature.

    out, new_state = gdnzoo.decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, *,
                                   out=None, new_state=None, use_qk_l2norm=False, algo=None,
                                   state_indices=None, new_state_indices=None, null_slot=None,
                                   intermediate_states=None, intermediate_indices=None,
                                   update_state=True, num_accepted_tokens=None, pdl=None)
    gdnzoo.commit(intermediate_states, intermediate_indices, accepted_steps, state,
                  state_indices, null_slot=None)

The public API is this module: :func:`decode`, :func:`commit`, :func:`select`, :func:`get`,
:func:`list_backends`, and the records they return.  Its submodules (``gdnzoo.inputs``,
``gdnzoo.reference``, ...) load on first use: importing gdnzoo imports no torch, so the
command line starts fast.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

    from gdnzoo.contract import Problem
    from gdnzoo.registry import BackendInfo, Selection

__all__ = ["decode", "commit", "get", "list_backends", "select", "Problem", "BackendInfo", "Selection"]
__version__ = "0.1.0"

_NAMES = {"Problem": "gdnzoo.contract", "BackendInfo": "gdnzoo.registry",
          "Selection": "gdnzoo.registry", "list_backends": "gdnzoo.registry"}
_SUBMODULES = {"backends", "bench", "cli", "contract", "dispatch", "gate", "guards", "inputs",
               "integrations", "pool", "reference", "registry", "tables", "verify",
               "commit_state", "op", "layer"}


def __getattr__(name: str):
    """The public records and the submodules, imported when first asked for."""
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"gdnzoo.{name}")
    raise AttributeError(f"module 'gdnzoo' has no attribute {name!r}")


def decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
           A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
           scale: float | None = None, *, out: torch.Tensor | None = None,
           new_state: torch.Tensor | None = None, use_qk_l2norm: bool = False,
           algo: str | None = None, state_indices: torch.Tensor | None = None,
           new_state_indices: torch.Tensor | None = None, null_slot: int | None = None,
           intermediate_states: torch.Tensor | None = None,
           intermediate_indices: torch.Tensor | None = None, update_state: bool = True,
           num_accepted_tokens: torch.Tensor | None = None,
           pdl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    (fp32 or bf16); out [B, T, HV, V] in v's dtype.  HV must be a multiple of H.  Every
    tensor is a dense tensor on one device (cpu or cuda) that does not require grad: decode
    computes no gradients.

    ``new_state`` None or ``state``: the state is updated in place; a distinct ``new_state``
    receives it and ``state`` is only read (destination passing).  ``out`` None allocates
    ``torch.empty_like(v)``.
    Written tensors (``out``, ``new_state``, ``state`` in place) may not overlap any other
    argument (their byte ranges, first to last element, are disjoint) nor themselves (no
    stride 0 on a dimension of size > 1); a state that is only read may be expanded.
    T >= 1 tokens are applied in order.  ``scale`` None or 0 means 1/sqrt(K); else a real
    number >= 0 (not a bool).  ``use_qk_l2norm`` (a bool) normalizes q and k first.  ``algo``
    names a backend (:func:`list_backends`); None: the ``ALGO`` environment variable, else
    this GPU's measured default table, else a fallback order (:func:`select` says which and
    why).

    State pools (serving engines): with ``state_indices`` ([B] int32/int64 on q's device),
    ``state`` is a pool [P, HV, V, K] (each slot's [HV, V, K] block contiguous, any
    ``stride(0)`` >= HV*V*K) and sequence n reads slot ``state_indices[n]`` and writes its new
    state to slot ``new_state_indices[n]`` (default: the same) of ``new_state`` (default: the
    same pool).  A negative index is padding, and so is ``null_slot`` (an int; vLLM's null
    block: ``null_slot=0``); an index >= P is never dereferenced.  A padded sequence gets
    zeros in ``out`` and no state is read or written.  No host sync: CUDA-graph capturable.
    ``GDNZOO_CHECK_INDICES=1`` checks the indices on the host (see :mod:`gdnzoo.pool`).

    Speculative verify (:mod:`gdnzoo.verify`), T draft tokens in one call: with
    ``intermediate_states`` [S, T_max, HV, V, K] (the state's dtype), the state after token t
    of sequence n is stored at ``[intermediate_indices[n], t]`` (default row n; a negative
    row or one >= S stores nothing); ``update_state=False`` writes no final state (the pool
    stays as it was; :func:`commit` later keeps the accepted step).  vLLM's form:
    ``state_indices`` of shape [B, T] stores the state after token t in slot
    ``state_indices[n, t]`` and reads the initial state from column
    ``num_accepted_tokens[n] - 1`` (default column 0; a count outside 1..T pads the sequence).

    Programmatic dependent launch (``pdl``; None: the ``GDNZOO_PDL`` environment variable,
    unset means "off"): the kernel may start while the kernel before it in the stream still
    runs, hiding its launch.  ``"wait"`` waits for that kernel before any load (always
    correct); ``"early"`` loads the state (its slot indices, A_log, dt_bias) before the wait
    and q, k, v, a, b after it: correct only when the state's last writer completed before
    the kernel right before this one started, which holds whenever a kernel launched without
    PDL lies between two steps on the same state (as in every engine's layer).  Served by
    fla-recurrent and cuda-v4 on compute capability >= 9.0; results are bit-identical to
    ``"off"``.

    Bad inputs raise ``ValueError`` or ``TypeError`` naming the argument, before any kernel
    runs, so every argument is untouched; whether an earlier call was memoized never changes
    that.  An explicit algo that is unknown or cannot serve these inputs raises, listing the
    valid names and the reason.
    """
    return _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                   algo, state_indices, new_state_indices, null_slot, intermediate_states,
                   intermediate_indices, update_state, num_accepted_tokens, pdl)


def _decode(*args):
    """decode's first call: import the hot path (:mod:`gdnzoo.dispatch`, and torch), which
    then serves every call directly."""
    global _decode
    from gdnzoo.dispatch import decode as hot_path
    _decode = hot_path
    return hot_path(*args)


def select(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
           A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
           scale: float | None = None, *, out: torch.Tensor | None = None,
           new_state: torch.Tensor | None = None, use_qk_l2norm: bool = False,
           algo: str | None = None, state_indices: torch.Tensor | None = None,
           new_state_indices: torch.Tensor | None = None, null_slot: int | None = None,
           intermediate_states: torch.Tensor | None = None,
           intermediate_indices: torch.Tensor | None = None, update_state: bool = True,
           num_accepted_tokens: torch.Tensor | None = None, pdl: str | None = None) -> Selection:
    """Which backend :func:`decode` would use for these inputs, from which rule, and why."""
    from gdnzoo import registry
    from gdnzoo.contract import validate
    from gdnzoo.registry import env_pdl
    p, _ = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                    use_qk_l2norm=use_qk_l2norm, state_indices=state_indices,
                    new_state_indices=new_state_indices, null_slot=null_slot,
                    intermediate_states=intermediate_states,
                    intermediate_indices=intermediate_indices, update_state=update_state,
                    num_accepted_tokens=num_accepted_tokens, pdl=pdl,
                    pdl_env=env_pdl() if pdl is None else None)
    return registry.select(p, algo)


def get(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A callable with :func:`decode`'s signature that always uses backend ``name``.

    Raises ``ValueError`` listing the valid names if ``name`` is unknown.
    """
    from gdnzoo import registry
    if name is None:
        raise TypeError("algo: expected a backend name, got None (gdnzoo.decode chooses "
                        "automatically)")
    registry.check_algo(name)
    reg = registry.load_registry()
    if name not in reg.backends:
        raise ValueError(f"algo: unknown backend {name!r}; valid names: {', '.join(reg.names)}")

    def call(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
             use_qk_l2norm=False, state_indices=None, new_state_indices=None, null_slot=None,
             intermediate_states=None, intermediate_indices=None, update_state=True,
             num_accepted_tokens=None, pdl=None):
        return _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                       use_qk_l2norm, name, state_indices, new_state_indices, null_slot,
                       intermediate_states, intermediate_indices, update_state,
                       num_accepted_tokens, pdl)
    call.__name__ = f"decode[{name}]"
    call.__doc__ = f"gdnzoo.decode with algo={name!r}."
    return call


def commit(intermediate_states: torch.Tensor, intermediate_indices: torch.Tensor | None,
           accepted_steps: torch.Tensor, state: torch.Tensor,
           state_indices: torch.Tensor | None, null_slot: int | None = None) -> torch.Tensor:
    """Keep the accepted step of a verify call (``update_state=False``): copy
    ``intermediate_states[intermediate_indices[n], accepted_steps[n]]`` into slot
    ``state_indices[n]`` of the pool ``state`` (``state_indices`` None: row n of a dense
    [B, HV, V, K] state; ``intermediate_indices`` None: row n).  A negative step or one >=
    T_max, a row that is negative or >= S, and a padded slot (negative, ``null_slot``, >= P)
    copy nothing.  One launch on the GPU, no host sync: CUDA-graph capturable.  Returns
    ``state``."""
    from gdnzoo.commit_state import commit as run
    return run(intermediate_states, intermediate_indices, accepted_steps, state,
               state_indices, null_slot)

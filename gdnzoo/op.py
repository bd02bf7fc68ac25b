"""``torch.ops.gdnzoo.decode_``: :func:`gdnzoo.decode` as a PyTorch operator, for models that
are compiled (``torch.compile(fullgraph=True)``) or captured in CUDA graphs.

Importing this module registers the operator once per process (importing or reloading it again
registers nothing).  Its schema::

    gdnzoo::decode_(Tensor q, Tensor k, Tensor v, Tensor(a!) state, Tensor A_log, Tensor a,
                    Tensor dt_bias, Tensor b, float? scale, Tensor(b!) out,
                    Tensor(c!)? new_state, bool use_qk_l2norm, str? algo,
                    Tensor? state_indices, Tensor? new_state_indices, int? null_slot,
                    Tensor(d!)? intermediate_states, Tensor? intermediate_indices,
                    bool update_state, Tensor? num_accepted_tokens, str? pdl) -> ()

It returns nothing and writes its results into its arguments: ``out`` (required: an operator may
not return a tensor that aliases an input), ``state`` (in place; a pool's slots),
``new_state`` and ``intermediate_states``.  ``state`` is declared written in every form, also
when a distinct ``new_state`` or ``update_state=False`` leaves it untouched, so a compiler never
assumes it is unchanged.  Pass ``new_state=None`` for an in-place update, never ``state`` itself
(two written arguments may not alias).  Every argument means what it means for
:func:`gdnzoo.decode`, which the operator calls on CPU and CUDA tensors: the same checks, the same
errors, the same backends (the operator calls decode's hot path, :mod:`gdnzoo.dispatch`).

The fake (meta) implementation does nothing: the operator has no outputs whose shapes it must
describe, and the checks run when the real call runs.  Registered through
``torch.library.Library`` and ``register_fake`` rather than ``torch.library.custom_op``, whose
Python wrapper layers cost some 30 times more per eager call (``docs/model.md``).

:func:`decode_` is the keyword form of the operator.
"""
from __future__ import annotations

import torch

from gdnzoo.dispatch import decode as _hot_path
from gdnzoo.operation import DECODE

# Generated from decode's argument table (gdnzoo.operation): the schema above.
SCHEMA = "decode_(" + ", ".join(f"{a.schema} {a.name}" for a in DECODE.args) + ") -> ()"


def _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
            state_indices, new_state_indices, null_slot, intermediate_states,
            intermediate_indices, update_state, num_accepted_tokens, pdl):
    """The operator on CPU and CUDA tensors: :func:`gdnzoo.decode`."""
    _hot_path(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
              state_indices, new_state_indices, null_slot, intermediate_states,
              intermediate_indices, update_state, num_accepted_tokens, pdl)


def _fake(*args):
    """The operator under fake tensors (torch.compile's tracing): nothing to allocate."""
    return None


if not hasattr(torch.ops.gdnzoo, "decode_"):       # once per process, also across reloads
    _LIB = torch.library.Library("gdnzoo", "FRAGMENT")     # kept: freeing it unregisters
    _LIB.define(SCHEMA)
    _LIB.impl("decode_", _decode, "CompositeExplicitAutograd")
    torch.library.register_fake("gdnzoo::decode_", _fake, lib=_LIB)

OP = torch.ops.gdnzoo.decode_.default


def decode_(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
            use_qk_l2norm=False, algo=None, state_indices=None, new_state_indices=None,
            null_slot=None, intermediate_states=None, intermediate_indices=None,
            update_state=True, num_accepted_tokens=None, pdl=None):
    """``torch.ops.gdnzoo.decode_`` with :func:`gdnzoo.decode`'s keywords; returns ``out``
    (allocated like v when None).  ``new_state=state`` is passed as None (in place)."""
    if out is None:
        out = torch.empty_like(v)
    OP(q, k, v, state, A_log, a, dt_bias, b, scale, out,
       None if new_state is state else new_state, use_qk_l2norm, algo, state_indices,
       new_state_indices, null_slot, intermediate_states, intermediate_indices, update_state,
       num_accepted_tokens, pdl)
    return out

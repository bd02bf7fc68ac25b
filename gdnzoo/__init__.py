"""gdnzoo: every way to compute the Gated Delta Net layer, behind one signature per operation.

    out, new_state = gdnzoo.decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, ...)
    out, new_state = gdnzoo.prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens,
                                    scale=None, *, ...)
    gdnzoo.commit(intermediate_states, intermediate_indices, accepted_steps, state,
                  state_indices, null_slot=None)

The public API is this module: the operations :func:`decode`, :func:`prefill` and
:func:`commit` (their docstrings are the contracts, in :mod:`gdnzoo.contract`,
:mod:`gdnzoo.prefill_contract` and :mod:`gdnzoo.commit_state`), :func:`select`, :func:`get`,
:func:`list_backends`, and the records they return.  The operations' signatures are generated
from :mod:`gdnzoo.operation`, and every submodule
(``gdnzoo.inputs``, ``gdnzoo.reference``, ...) loads on first use: importing gdnzoo imports no
torch, so the command line starts fast.
"""
from __future__ import annotations

import importlib

from gdnzoo import compiling as _compiling, operation as _operation

__all__ = ["decode", "prefill", "commit", "get", "list_backends", "select", "Problem",
           "BackendInfo", "Selection"]
__version__ = "0.2.0"

_NAMES = {"Problem": "gdnzoo.contract", "BackendInfo": "gdnzoo.registry",
          "Selection": "gdnzoo.registry", "list_backends": "gdnzoo.registry"}
_SUBMODULES = {"backends", "bench", "checks", "cli", "commit_state", "compiling", "contract",
               "dispatch", "gate", "guards", "inputs", "integrations", "layer", "op", "operation",
               "pool", "prefill_contract", "prefill_reference", "reference", "registry", "tables",
               "verify"}
_OPERATIONS = {"decode": "gdnzoo.dispatch:decode", "prefill": "gdnzoo.dispatch:prefill",
               "commit": "gdnzoo.dispatch:commit"}


def __getattr__(name: str):
    """The operations' functions (built from their contracts on first use), the public
    records and the submodules, imported when first asked for."""
    if name in _OPERATIONS:
        value = _operation.public(_operation.get(name), _OPERATIONS[name])
        _compiling.compiled_as_operator(value, name)
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES:
        return importlib.import_module(f"gdnzoo.{name}")
    else:
        raise AttributeError(f"module 'gdnzoo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    """What is here and what :func:`__getattr__` imports on first use (tab completion)."""
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)


def select(*args, op: str = "decode", **kwargs):
    """Which backend ``op``'s function (default :func:`decode`) would use for these
    arguments, from which rule, and why: a :class:`Selection`.  Validates them as the call
    would."""
    from gdnzoo import registry
    from gdnzoo.registry import env_pdl
    o = _operation.get(op)
    bound = _operation.binder(o)(*args, **kwargs)
    problem, _ = o.module().verdict(bound, env_pdl)
    return registry.select(problem, bound[o.index("algo")])


def get(name: str, op: str = "decode"):
    """A callable with ``op``'s signature (default :func:`decode`'s, less ``algo``) that
    always uses backend ``name``.  Raises ``ValueError`` listing the valid names if ``name``
    is unknown."""
    from gdnzoo import registry
    if name is None:
        raise TypeError("algo: expected a backend name, got None (gdnzoo chooses "
                        "automatically)")
    registry.check_algo(name, op)
    registry.spec(name, op)
    module, function = _OPERATIONS[op].split(":")
    hot = getattr(importlib.import_module(module), function)
    call = _operation.function(_operation.get(op), op, "_hot({args})", drop=("algo",),
                               doc=f"gdnzoo.{op} with algo={name!r}.",
                               scope={"_hot": hot, "algo": name})
    call.__name__ = f"{op}[{name}]"
    _compiling.compiled_as_operator(call, op, name)
    return call

"""gdnzoo's operations as PyTorch operators, ``torch.ops.gdnzoo.decode_``, ``prefill_`` and
``commit_``, and how ``torch.compile`` sees the public functions.

Importing this module registers the operators once per process (importing or reloading it again
registers nothing).  Each schema is generated from the operation's argument table
(:mod:`gdnzoo.operation`); decode's is::

    gdnzoo::decode_(Tensor q, Tensor k, Tensor v, Tensor(a!) state, Tensor? A_log,
                    Tensor? a, Tensor? dt_bias, Tensor? b, float? scale, Tensor(b!) out,
                    Tensor(c!)? new_state=None, bool use_qk_l2norm=False, str? algo=None,
                    Tensor? state_indices=None, Tensor? new_state_indices=None,
                    int? null_slot=None, Tensor(d!)? intermediate_states=None,
                    Tensor? intermediate_indices=None, bool update_state=True,
                    Tensor? num_accepted_tokens=None, str? pdl=None, Tensor? g=None,
                    Tensor? beta=None, bool allow_neg_eigval=False,
                    str state_layout="k-last") -> ()

An operator returns nothing and writes its results into its arguments: ``out`` (required: an
operator may not return a tensor that aliases an input), the state (in place; a pool's slots),
``new_state`` and ``intermediate_states``.  The state is declared written in every form, also
when a distinct ``new_state`` or ``update_state=False`` leaves it untouched, so a compiler never
assumes it is unchanged.  Pass ``new_state=None`` for an in-place update, never the state itself
(two written arguments may not alias).  Every argument means what it means for the public
function, which the operator calls on CPU and CUDA tensors: the same checks, errors and
backends (the operator calls the dispatcher, :mod:`gdnzoo.dispatch`).

The fake (meta) implementation does nothing: the operators have no outputs whose shapes they
must describe, and the checks run when the real call runs.  Registered through
``torch.library.Library`` and ``register_fake`` rather than ``torch.library.custom_op``, whose
Python wrapper layers cost some 30 times more per eager call (``docs/model.md``).

**The public functions under torch.compile.**  :func:`traced` is, for a public function
(``gdnzoo.decode``, ``gdnzoo.prefill``, ``gdnzoo.commit``, a ``gdnzoo.get(...)`` callable), the
function dynamo traces in its place: one call of the operator, with ``out`` (and a prefill's
``new_state`` without a state) allocated first.  Eager calls never see it (no cost on the hot
path).  gdnzoo registers it for every public function it makes as soon as ``torch._dynamo`` is
imported (:func:`gdnzoo.compiling.compiled_as_operator`), so ``torch.compile(fullgraph=True)``
takes models that call the public functions, or the engine adapters, as they are.

:func:`decode_` is the keyword form of decode's operator.
"""
from __future__ import annotations

import torch

from gdnzoo import dispatch
from gdnzoo.checks import need_no_grad
from gdnzoo.operation import COMMIT, DECODE, PREFILL, REQUIRED, function


def schema(op) -> str:
    """The operator schema of an operation, from its argument table: the arguments after the
    last one an operator requires (``out``) carry their defaults."""
    required = max(i for i, a in enumerate(op.args)
                   if a.default is REQUIRED or a.name == "out")

    def default(x):
        return f'"{x}"' if isinstance(x, str) else str(x)
    return f"{op.name}_(" + ", ".join(
        f"{a.schema} {a.name}" + (f"={default(a.default)}" if i > required else "")
        for i, a in enumerate(op.args)) + ") -> ()"


SCHEMA = schema(DECODE)


def _impl(op):
    hot = {"decode": dispatch.decode, "prefill": dispatch.prefill,
           "commit": dispatch.commit}[op.name]
    defaults = tuple(a.default for a in op.args)

    def impl(*args):
        """The operator on CPU and CUDA tensors: the operation's dispatcher (the trailing
        arguments a caller left out at their defaults)."""
        hot(*args, *defaults[len(args):])
    return impl


def _fake(op):
    defaults = tuple(a.default for a in op.args)

    def fake(*args):
        """The operator under fake tensors (torch.compile's tracing): nothing to allocate; the
        eager call's refusal of a tensor that requires grad (the one trace-time check, for
        the public functions compiled through :func:`call` and for a graph that calls the
        operator itself)."""
        _outside_autograd(op, (*args, *defaults[len(args):]))
        return None
    return fake


if not hasattr(torch.ops.gdnzoo, "decode_"):       # once per process, also across reloads
    _LIB = torch.library.Library("gdnzoo", "FRAGMENT")     # kept: freeing it unregisters
    for _op in (DECODE, PREFILL, COMMIT):
        _LIB.define(schema(_op))
        _LIB.impl(f"{_op.name}_", _impl(_op), "CompositeExplicitAutograd")
        torch.library.register_fake(f"gdnzoo::{_op.name}_", _fake(_op), lib=_LIB)

OP = torch.ops.gdnzoo.decode_.default
OPS = {name: getattr(torch.ops.gdnzoo, f"{name}_").default for name in ("decode", "prefill",
                                                                          "commit")}


def _outside_autograd(op, args):
    """The eager call's refusal of a tensor that requires grad, checked while dynamo traces:
    inside a compiled graph the operator runs with grad mode off, where it would pass."""
    in_place = "new_state" not in op.names or args[op.index("new_state")] is None \
        or args[op.index("new_state")] is args[op.index("state")]
    for a, x in zip(op.args, args):
        if isinstance(x, torch.Tensor):
            need_no_grad(a.name, x, a.written and (a.name != "state" or in_place))


def call(op, args):
    """``op``'s operator on the arguments of its public function (positional, its order), with
    what an operator cannot allocate allocated first; returns what the public function
    returns.  Traceable by dynamo: what torch.compile runs in place of a public function."""
    args = list(args)
    if op.name == "commit":
        OPS["commit"](*args)
        return args[op.index("state")]
    q, v = args[op.index("q")], args[op.index("v")]
    i_out, i_dst, i_src = op.index("out"), op.index("new_state"), op.index("state")
    if args[i_out] is None:
        args[i_out] = torch.empty_like(v)
    state, new_state = args[i_src], args[i_dst]
    if new_state is state:
        new_state = args[i_dst] = None
    if state is None and new_state is None:      # a prefill from zeros: its fp32 final states
        N = args[op.index("cu_seqlens")].shape[0] - 1
        HV, V, K = v.shape[-2], v.shape[-1], q.shape[-1]
        blk = (HV, K, V) if args[op.index("state_layout")] == "k-first" else (HV, V, K)
        new_state = args[i_dst] = torch.empty(N, *blk, dtype=torch.float32, device=v.device)
    OPS[op.name](*args)
    return args[i_out], state if new_state is None else new_state


def traced(op, algo=None):
    """A function with ``op``'s public signature (less ``algo`` when it is fixed) that calls
    the operator through :func:`call`: the substitute dynamo traces."""
    scope = {"_call": call, "_op": op}
    if algo is not None:
        scope["algo"] = algo
    return function(op, f"{op.name}_traced", "_call(_op, ({args},))",
                    drop=("algo",) if algo is not None else (), scope=scope)


decode_ = function(DECODE, "decode_", "_call(_op, ({args},))[0]",
                   scope={"_call": call, "_op": DECODE},
                   doc="``torch.ops.gdnzoo.decode_`` with :func:`gdnzoo.decode`'s keywords; returns "
                       "``out`` (allocated like v when None).  ``new_state=state`` is passed as None "
                       "(in place).")

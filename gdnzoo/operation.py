"""The operations gdnzoo computes, each one record that everything else is keyed by.

An :class:`Operation` names its arguments once (:class:`Arg`: order, default, tensor or value,
written or read, its torch-operator type) and points to the modules that implement it: its
contract (``validate``: the arguments -> a :class:`gdnzoo.call.Call`), its reference math, the
features a backend must declare to serve a call (``registry.yaml``), and how a per-GPU default
table picks a backend.  The public face (:mod:`gdnzoo`), the dispatcher's memo and guards, the
overlap checks, the torch operator's schema, the registry, the gate and the CLI read these
records, so a new argument is one :class:`Arg` here plus its check in the contract, its math in
the reference and its support in the backends that serve it.

This module imports no torch: the face is generated from it at ``import gdnzoo``.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field

REQUIRED = object()      # an Arg default: the argument must be given


@dataclass(frozen=True)
class Arg:
    """One argument of an operation's public function, in order."""
    name: str
    default: object = REQUIRED
    tensor: bool = False           # a tensor (or None where the default is None)
    written: bool = False          # the call writes it (out, a state in place, a buffer)
    keyword: bool = True           # keyword-only in the public function
    schema: str = ""               # its type in the torch operator's schema


def _pos(name, schema="Tensor", default=REQUIRED, tensor=True, written=False):
    return Arg(name, default, tensor, written, False, schema)


def _kw(name, default=None, schema="Tensor?", tensor=True, written=False):
    return Arg(name, default, tensor, written, True, schema)


@dataclass(frozen=True)
class Operation:
    """What gdnzoo knows of one operation; see the module docstring."""
    name: str
    summary: str                   # one line, for `gdnzoo list`
    args: tuple                    # Arg, in the public function's order
    contract: str                  # module (of this package) with the contract: validate,
    #                                verdict, record, Call, Problem and the public docstring
    reference: str                 # module:function (of this package) of the reference math
    features: tuple                # (registry field, Problem attribute, "cannot <what>" when
    #                                the problem has it and the backend's field is not true;
    #                                {!r} takes the attribute's value)
    tables: tuple = ("table",)     # the keys of a per-GPU default-table row (registry.yaml)
    inplace: tuple | None = ("new_state", "state")   # (written, read): "written is read" (or
    #                                written None) = in place; None: no destination passing
    state: str = "state"           # the argument holding the recurrent state
    result: tuple = ("out", "new_state")      # the Call fields the public function returns
    doc: str = ""                  # the public function's docstring (the contract's)
    extra: dict = field(default_factory=dict)

    @functools.cached_property
    def names(self) -> tuple:
        return tuple(a.name for a in self.args)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def module(self, what: str = "contract"):
        """The implementing module of ``contract`` (validation) or ``reference``: a module of
        this package, named relative to it (so a vendored copy finds its own)."""
        return importlib.import_module(f"{__package__}.{getattr(self, what).split(':')[0]}")

    def validate(self, *args):
        """The contract's verdict on a call given positionally (this op's order): a
        :class:`gdnzoo.call.Call`, or a raised ValueError/TypeError naming the argument."""
        return self.module().validate(**dict(zip(self.names, args)))


# The raw gates (the model's own: g = exp(-exp(A_log) softplus(a + dt_bias)), beta =
# sigmoid(b)), positional and optional: the precomputed form (g, beta) replaces them.
_RAW_GATES = (Arg("A_log", None, True, False, False, "Tensor?"),
              Arg("a", None, True, False, False, "Tensor?"),
              Arg("dt_bias", None, True, False, False, "Tensor?"),
              Arg("b", None, True, False, False, "Tensor?"))
K_LAST = "k-last"       # state_layout's default: the dispatcher's dense path tests it by identity
_GATE_AND_LAYOUT = (_kw("g"), _kw("beta"),
                    _kw("allow_neg_eigval", False, "bool", tensor=False),
                    _kw("state_layout", K_LAST, "str", tensor=False))
_FORM_FEATURES = (("precomputed_gates", "precomputed", "take precomputed gates (g, beta)"),
                  ("neg_eigval", "neg_eigval", "take allow_neg_eigval (beta = 2 sigmoid(b))"),
                  ("k_first", "k_first", "take a K-first state (state_layout='k-first')"))

DECODE = Operation(
    name="decode",
    summary="one step of T tokens per sequence (T=1 decode, T>1 speculative verify)",
    args=(_pos("q"), _pos("k"), _pos("v"), _pos("state", "Tensor(a!)", written=True),
          *_RAW_GATES, Arg("scale", None, False, False, False, "float?"),
          _kw("out", schema="Tensor(b!)", written=True),
          _kw("new_state", schema="Tensor(c!)?", written=True),
          _kw("use_qk_l2norm", False, "bool", tensor=False),
          _kw("algo", None, "str?", tensor=False),
          _kw("state_indices"), _kw("new_state_indices"),
          _kw("null_slot", None, "int?", tensor=False),
          _kw("intermediate_states", schema="Tensor(d!)?", written=True),
          _kw("intermediate_indices"),
          _kw("update_state", True, "bool", tensor=False),
          _kw("num_accepted_tokens"),
          _kw("pdl", None, "str?", tensor=False), *_GATE_AND_LAYOUT),
    contract="contract",
    reference="reference:run",
    tables=("table", "table_dest", "table_tokens", "table_pool", "table_verify",
            "table_kfirst", "table_kfirst_dest"),
    features=(("pools", "pool", "serve state pools (state_indices)"),
              ("verify", "verify", "serve speculative verify (intermediate_states, "
                                   "update_state=False, per-token state_indices)"),
              ("pdl", "pdl", "launch with programmatic dependent launch (pdl={!r})"),
              *_FORM_FEATURES),
)

PREFILL = Operation(
    name="prefill",
    summary="N variable-length sequences packed on one token axis (cu_seqlens), chunked",
    args=(_pos("q"), _pos("k"), _pos("v"),
          _pos("state", "Tensor(a!)?", written=True), *_RAW_GATES,
          Arg("cu_seqlens", None, True, False, False, "Tensor?"),   # required (validated)
          Arg("scale", None, False, False, False, "float?"),
          _kw("out", schema="Tensor(b!)", written=True),
          _kw("new_state", schema="Tensor(c!)?", written=True),
          _kw("use_qk_l2norm", False, "bool", tensor=False),
          _kw("state_indices"), _kw("new_state_indices"), _kw("has_initial_state"),
          _kw("null_slot", None, "int?", tensor=False),
          _kw("algo", None, "str?", tensor=False), *_GATE_AND_LAYOUT,
          _kw("checkpoints", schema="Tensor(d!)?", written=True),
          _kw("checkpoint_every", None, "int?", tensor=False),
          _kw("pdl", None, "str?", tensor=False)),
    contract="prefill_contract",
    reference="prefill_reference:run",
    tables=("table", "table_pool"),
    features=(("pools", "pool", "serve state pools (state_indices)"), *_FORM_FEATURES,
              ("checkpoints", "checkpoint_every",
               "write state checkpoints (checkpoints, checkpoint_every={!r})"),
              ("pdl", "pdl", "launch with programmatic dependent launch (pdl={!r})")),
)

COMMIT = Operation(
    name="commit",
    summary="keep a verify call's accepted step: its intermediate state into the pool",
    args=(_pos("intermediate_states"), _pos("intermediate_indices", "Tensor?"),
          _pos("accepted_steps"), _pos("state", "Tensor(a!)", written=True),
          _pos("state_indices", "Tensor?"), Arg("null_slot", None, False, False, False, "int?"),
          _kw("algo", None, "str?", tensor=False)),
    contract="commit_state",
    reference="reference:reference_commit",
    features=(("pools", "pool", "serve state pools (state_indices)"),),
    inplace=None,
    result=("state",),
)

OPERATIONS: dict = {}


def register(op: Operation) -> Operation:
    """Make ``op`` known by its name (the registry, dispatcher, bench and CLI look it up
    here); registering a name again replaces it."""
    OPERATIONS[op.name] = op
    return op


def get(name: str) -> Operation:
    """The operation called ``name``; ValueError listing the known ones."""
    try:
        return OPERATIONS[name]
    except KeyError:
        raise ValueError(f"op: unknown operation {name!r}; known: "
                         f"{', '.join(OPERATIONS)}") from None


register(DECODE)
register(PREFILL)
register(COMMIT)


# ---------------------------------------------------------------- the public functions

def function(op: Operation, name: str, body: str, *, drop=(), doc=None, scope=None):
    """A function with ``op``'s public signature (less the arguments ``drop``), named ``name``,
    that returns ``body`` (source text over the argument names; ``{args}`` stands for all of
    them in order, positionally) evaluated in ``scope``.  Generated, so that a call binds its
    arguments as fast as a hand-written function would."""
    params, star = [], False
    ns = {} if scope is None else scope        # the function's globals
    for a in op.args:
        if a.name in drop:
            continue
        if a.keyword and not star:
            params.append("*")
            star = True
        # a default is the Arg's own object (the dispatcher tells defaults apart by identity)
        ns[f"_default_{a.name}"] = a.default
        params.append(a.name if a.default is REQUIRED else f"{a.name}=_default_{a.name}")
    src = (f"def {name}({', '.join(params)}):\n"
           f"    return {body.format(args=', '.join(op.names))}\n")
    exec(compile(src, f"<gdnzoo.{op.name} {name}>", "exec"), ns)
    fn = ns[name]
    fn.__doc__, fn.__module__, fn.__qualname__ = doc, "gdnzoo", name
    return fn


def public(op: Operation, target: str):
    """The public function of ``op`` (``gdnzoo.decode``): its signature, the contract's
    docstring, and a body that hands every argument, positionally, to ``target``
    (``module:function``), imported on the first call."""
    scope = {}

    def first(*args):
        mod, fn = target.split(":")
        scope["_target"] = hot = getattr(importlib.import_module(mod), fn)
        return hot(*args)
    scope["_target"] = first
    return function(op, op.name, "_target({args})", doc=op.module().PUBLIC_DOC, scope=scope)


def binder(op: Operation):
    """A function with ``op``'s public signature that returns its arguments as a tuple in
    order (what ``select`` and ``get`` pass on)."""
    return function(op, "arguments", "({args},)")

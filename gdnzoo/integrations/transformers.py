"""Hugging Face transformers' Qwen3-Next, Qwen3.5 and Qwen3.5-MoE Gated DeltaNet layers on gdnzoo.

    from gdnzoo.integrations import transformers as gdn_transformers
    gdn_transformers.enable()     # every such layer, made before or after, runs on gdnzoo
    model.generate(...)           # prefill and decode steps, the model's cache as before
    gdn_transformers.disable()    # transformers exactly as it was

transformers' GDN layer projects and convolves its inputs, computes the log decay ``g`` in fp32
and ``beta = sigmoid(b)`` in the model's dtype (up to 5.22 it also repeats q and k to the value
heads), and calls a module-level function of its modeling file:
``torch_recurrent_gated_delta_rule`` for a one-token step with a cache,
``torch_chunk_gated_delta_rule`` otherwise (prefill, or several tokens).  Those names hold
FLA's kernels when FLA is importable, else transformers' torch loops.

:func:`enable` replaces, in each of the three modeling modules, both names with
:mod:`gdnzoo.integrations.fla`'s entry points (so no call reaches FLA or the torch loops), and
wraps the layer class's ``forward`` to see two things the functions are not given:

- the raw ``b`` (the output of ``in_proj_b`` in Qwen3.5, captured by a forward hook put on each
  layer's projection when the layer first runs; the ``b`` returned by
  ``fix_query_key_value_ordering`` in Qwen3-Next, whose method is wrapped): beta is computed
  from it in fp32, not rounded to bf16 as the model's own ``b.sigmoid()`` is;
- the cache's recurrent-state buffer of the layer: a call whose initial state is that buffer
  updates it in place, and the cache's copy of the returned state onto it is then a no-op
  (the buffer is overwritten by that copy anyway, so nothing observable changes).

The cache keeps transformers' layout, a K-first fp32 state ``[B, HV, K, V]``.  The causal
convolutions stay transformers' own.  gdnzoo serves bf16 and fp16 models (its io dtypes): an
fp32 model's first GDN call raises TypeError naming q.  Forward only: under ``torch.no_grad()``
or ``torch.inference_mode()``, as ``generate()`` runs.

:func:`disable` puts back every attribute it replaced (the same objects) and removes the hooks.
Both are idempotent.  Supported: transformers 5.17 through 5.24 (:data:`SUPPORTED`; tested with
5.17.0, 5.20.2, 5.23.0 and 5.24.0); :func:`enable` refuses any other version, or a modeling file
not laid out as described, with RuntimeError, before changing anything.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import threading
import weakref
from dataclasses import dataclass

import torch

from gdnzoo.integrations import fla

__all__ = ["enable", "disable", "is_enabled", "SUPPORTED", "FAMILIES"]

SUPPORTED = ((5, 17), (5, 24))       # (major, minor), first and last, inclusive
RECURRENT, CHUNK = "torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule"


@dataclass(frozen=True)
class Family:
    """One model family's GDN layer: where it lives and where its raw ``b`` can be seen."""
    name: str
    module: str
    layer: str
    b_from: str        # "in_proj_b": the submodule's output; else a method returning b 5th


FAMILIES = (
    Family("qwen3_next", "transformers.models.qwen3_next.modeling_qwen3_next",
           "Qwen3NextGatedDeltaNet", "fix_query_key_value_ordering"),
    Family("qwen3_5", "transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5GatedDeltaNet",
           "in_proj_b"),
    Family("qwen3_5_moe", "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
           "Qwen3_5MoeGatedDeltaNet", "in_proj_b"),
)

_MISSING = object()
_REPLACED = {}                          # (owner, name) -> what owner.__dict__ held (or _MISSING)
_HOOKS = weakref.WeakKeyDictionary()    # layer -> (its in_proj_b, the hook's handle)
_LOCAL = threading.local()              # .frame: the _Frame of the GDN forward running now


class _Frame:
    """What one GDN layer's forward lets its recurrence call see."""
    __slots__ = ("b", "state")

    def __init__(self, state):
        self.b = None              # the raw b of this forward, once its projection ran
        self.state = state         # the cache's recurrent-state buffer of this layer, or None


def is_enabled() -> bool:
    return bool(_REPLACED)


def enable() -> None:
    """Run transformers' Qwen3-Next, Qwen3.5 and Qwen3.5-MoE GDN layers on gdnzoo (see the
    module docstring).  Idempotent.  Raises RuntimeError, changing nothing, on an unsupported
    transformers version or layout."""
    if _REPLACED:
        return
    version = _check_version()
    plan = []
    for family in FAMILIES:
        plan += _plan(family, version)
    for owner, name, value in plan:
        _REPLACED[(owner, name)] = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)


def disable() -> None:
    """Put transformers back exactly as before :func:`enable` (the same objects) and remove the
    hooks on the layers' projections.  Idempotent."""
    for (owner, name), value in reversed(list(_REPLACED.items())):
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _REPLACED.clear()
    for _, handle in list(_HOOKS.values()):
        handle.remove()
    _HOOKS.clear()


# ------------------------------------------------------------------ checks and the plan

def _check_version() -> str:
    import transformers
    version = transformers.__version__
    try:
        got = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        got = None
    if got is None or not SUPPORTED[0] <= got <= SUPPORTED[1]:
        lo, hi = (".".join(map(str, v)) for v in SUPPORTED)
        raise RuntimeError(f"transformers {version}: gdnzoo.integrations.transformers supports "
                           f"transformers {lo} through {hi}")
    return version


def _plan(family: Family, version: str) -> list:
    """[(owner, attribute, new value)] for one family, after checking its modeling file is
    laid out as the hook expects."""
    def refuse(why):
        return RuntimeError(f"transformers {version}: {family.module}.{family.layer} {why}; "
                            f"gdnzoo.integrations.transformers cannot hook it")
    try:
        module = importlib.import_module(family.module)
    except ImportError as e:
        raise refuse(f"cannot be imported ({e})") from None
    cls = getattr(module, family.layer, None)
    if cls is None or not callable(getattr(module, RECURRENT, None)) \
            or not callable(getattr(module, CHUNK, None)):
        raise refuse(f"is missing (or so is {RECURRENT} or {CHUNK})")
    names = set(inspect.unwrap(cls.forward).__code__.co_names)
    if not {RECURRENT, CHUNK, "sigmoid"} <= names:
        raise refuse(f"has a forward that does not call {RECURRENT}/{CHUNK} after b.sigmoid()")
    if family.b_from == "in_proj_b":
        if "in_proj_b" not in cls.__init__.__code__.co_names:
            raise refuse("has no in_proj_b projection")
    elif family.b_from not in vars(cls):
        raise refuse(f"has no {family.b_from} method")
    plan = [(module, RECURRENT, _recurrent), (module, CHUNK, _chunk),
            (cls, "forward", _forward(cls.forward, family.b_from == "in_proj_b"))]
    if family.b_from != "in_proj_b":
        plan.append((cls, family.b_from, _returns_b(vars(cls)[family.b_from])))
    return plan


# ------------------------------------------------------------------ the wrappers

def _forward(original, hook_in_proj_b: bool):
    """The layer's ``forward``, run inside a :class:`_Frame`."""
    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if hook_in_proj_b:
            _hook_in_proj_b(self)
        outer = getattr(_LOCAL, "frame", None)
        _LOCAL.frame = _Frame(_cache_state(self, args, kwargs))
        try:
            return original(self, *args, **kwargs)
        finally:
            _LOCAL.frame = outer
    return forward


def _returns_b(original):
    """Qwen3-Next's ``fix_query_key_value_ordering``, which returns (q, k, v, z, b, a): b kept
    for the recurrence of the forward running."""
    @functools.wraps(original)
    def fix_query_key_value_ordering(self, *args, **kwargs):
        parts = original(self, *args, **kwargs)
        frame = getattr(_LOCAL, "frame", None)
        if frame is not None:
            frame.b = parts[4]
        return parts
    return fix_query_key_value_ordering


def _hook_in_proj_b(layer):
    """A forward hook on ``layer.in_proj_b`` (once per projection module) that keeps its
    output, the raw b, for the forward running."""
    proj = layer.in_proj_b
    held = _HOOKS.get(layer)
    if held is not None and held[0] is proj:
        return
    if held is not None:
        held[1].remove()
    _HOOKS[layer] = (proj, proj.register_forward_hook(_keep_b))


def _keep_b(module, args, output):
    frame = getattr(_LOCAL, "frame", None)
    if frame is not None:
        frame.b = output


def _cache_state(layer, args, kwargs):
    """The cache's recurrent-state buffer of ``layer`` for this forward, or None.  The cache
    is the forward's second argument: ``cache_params`` up to 5.23, ``cache`` from 5.24."""
    cache = kwargs.get("cache", kwargs.get("cache_params", args[1] if len(args) > 1 else None))
    if cache is None:
        return None
    try:
        return cache.layers[layer.layer_idx].recurrent_states[0]
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


def _recurrent(query, key, value, g=None, beta=None, initial_state=None,
               output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
               **kwargs):
    """transformers' one-token step (``torch_recurrent_gated_delta_rule``'s call) on gdnzoo."""
    return _run(query, key, value, g, beta, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens)


def _chunk(query, key, value, g=None, beta=None, chunk_size=64, initial_state=None,
           output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """transformers' prefill (``torch_chunk_gated_delta_rule``'s call) on gdnzoo."""
    return _run(query, key, value, g, beta, initial_state, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens)


def _run(q, k, v, g, beta, initial_state, output_final_state, l2, cu_seqlens):
    frame = getattr(_LOCAL, "frame", None)
    inplace = False
    if frame is not None:
        b, frame.b = frame.b, None
        if b is not None and beta is not None and b.shape == beta.shape:
            beta = torch.sigmoid(b.float())     # fp32, where the model rounds it to its dtype
        inplace = output_final_state and initial_state is not None \
            and initial_state is frame.state
    return fla.run(q, k, v, g, beta, None, initial_state, output_final_state, l2, False, None,
                   None, False, False, False, cu_seqlens, None, inplace)

"""gdnzoo: every way to compute the Gated Delta Net decode step, behind one signature.

    out, new_state = gdnzoo.decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, *,
                                   out=None, new_state=None, use_qk_l2norm=False, algo=None)

Per sequence n, token t and value head h (q/k head h // (HV // H))::

    g    = exp(-exp(A_log[h]) * softplus(a[n,t,h] + dt_bias[h]))
    beta = sigmoid(b[n,t,h])
    S    = g * S;  u = beta * (v - S @ k);  S = S + outer(u, k);  o = scale * (S @ q)

with the state S = state[n, h] stored [V, K] (K contiguous).  ``new_state`` None or ``state``
updates the state in place; a distinct ``new_state`` leaves ``state`` untouched.  T >= 1 tokens
are applied in order.  ``scale`` None or 0 means 1/sqrt(K).  ``algo`` names a backend
(see :func:`list_backends`); else the ``ALGO`` environment variable, else this GPU's measured
default table, else a fallback order.  Bad inputs raise ``ValueError``/``TypeError`` before any
kernel runs.
"""
from __future__ import annotations

import os

import torch

from gdnzoo import guards
from gdnzoo.contract import Problem, byte_span, check_aliasing, signature, validate
from gdnzoo.registry import BackendInfo, Selection, launcher, list_backends
from gdnzoo.registry import select as _select

__all__ = ["decode", "get", "list_backends", "select", "Problem", "BackendInfo", "Selection"]
__version__ = "0.1.0"


_FAST = {}          # signature + algo (+ ALGO env) -> [Problem, scale, launcher, name, spans, guard]
_FAST_MAX = 4096    # and ("guards", mode) -> up to _GUARDS_PER_MODE of those entries, newest first
_GUARDS_PER_MODE = 4


# POSIX CPython: os.environ's own dict, of bytes keys and values.
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _env_algo():
    """``os.environ.get("ALGO")``, read from os.environ's underlying dict where it is one of
    bytes (POSIX CPython; 0.04 us instead of 0.6-1.4): decode reads it on every call that
    names no algo."""
    if _ENV_DATA is not None:
        try:
            value = _ENV_DATA.get(b"ALGO")
            return None if value is None else os.fsdecode(value)
        except TypeError:
            pass
    return os.environ.get("ALGO")


def _resolve(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
             key):
    """Validate and select (the slow path); the verdict is memoized under ``key`` if any."""
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                    use_qk_l2norm=use_qk_l2norm)
    spans = (byte_span(state), None if out is None else byte_span(out),
             None if new_state is None or new_state is state else byte_span(new_state))
    hit = [p, s, None, _select(p, algo).name, spans, None]
    if key is not None:
        if len(_FAST) >= _FAST_MAX:
            _FAST.clear()
        _FAST[key] = hit
    return hit


def _lookup(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo):
    """The memoized verdict for calls like this one and, on a miss, what to memoize it under.

    First the guards of this mode (one C++ check of all tensors each, gdnzoo.guards), then the
    Python signature; a signature hit gets a guard so that the next such call takes the first
    way.  Raises TypeError/AttributeError for non-tensors and unhashable or tensor scales."""
    if isinstance(scale, torch.Tensor):   # its value may change in place: never memoized
        raise TypeError
    env = _env_algo() if algo is None else None    # only matters when no algo
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    mode = ("guards", algo, env, scale, use_qk_l2norm, out is None, ns)
    recent = _FAST.get(mode)
    if recent:
        tensors = _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns)
        for hit in recent:
            if hit[5].check(*tensors):
                return hit, None
    return _by_signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                         use_qk_l2norm, mode)


def _by_signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                  mode):
    """_lookup's second way, once this ``mode``'s guards have missed: the Python signature."""
    algo, env, ns = mode[1], mode[2], mode[6]
    key = (signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                     use_qk_l2norm), algo, env)
    hit = _FAST.get(key)
    if hit is not None and hit[5] is not False:
        _remember(hit, mode, _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns))
    return hit, (key, mode, ns)


def _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns):
    """The tensors a guard checks: those of the signature (new_state only when distinct)."""
    t = (q, k, v, state, A_log, a, dt_bias, b)
    if out is not None:
        t += (out,)
    return t + (new_state,) if ns == 2 else t


def _remember(hit, mode, tensors):
    """Put ``hit`` first among ``mode``'s guarded verdicts (building its guard once)."""
    if hit[5] is None:
        hit[5] = guards.make(tensors) or False      # False: no guards in this process
    if hit[5] is not False:
        older = [h for h in _FAST.get(mode, ()) if h is not hit]
        _FAST[mode] = [hit] + older[:_GUARDS_PER_MODE - 1]     # replaced whole: thread-safe


def _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo):
    # Hot path, inline (every call costs here): this mode's guarded verdicts, one C++ check of
    # all tensors each (_lookup's first way); then the signature, else _resolve validates.
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    hit, fresh, mode = None, False, None
    if not isinstance(scale, torch.Tensor):  # a tensor scale may change in place: never memoized
        mode = ("guards", algo, None if algo is not None else _env_algo(), scale, use_qk_l2norm,
                out is None, ns)
        try:
            recent = _FAST.get(mode)
        except TypeError:                    # unhashable scale: never memoized
            recent = mode = None
        if recent:
            t = (q, k, v, state, A_log, a, dt_bias, b) if out is None else \
                (q, k, v, state, A_log, a, dt_bias, b, out)
            if ns == 2:
                t += (new_state,)
            for h in recent:
                if h[5].check(*t):
                    hit = h
                    break
    if hit is None:
        hit = miss = None
        if mode is not None:
            try:
                hit, miss = _by_signature(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                          new_state, use_qk_l2norm, mode)
            except (AttributeError, TypeError):  # non-tensors: validate() says what is wrong
                hit, miss = None, None
        if hit is None:
            hit = _resolve(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                           use_qk_l2norm, algo, miss and miss[0])
            if miss is not None:
                _remember(hit, miss[1], _tensors(q, k, v, state, A_log, a, dt_bias, b, out,
                                                 new_state, miss[2]))
            fresh = True                     # validated just now: no overlap check below
    if not fresh:
        # Data-dependent checks a signature cannot cover (validate() made them on the slow
        # path): byte ranges from the pointers and the signature's fixed extents.
        ext_s, ext_o, ext_n = hit[4]         # ext None: no such buffer, or state itself
        if ext_o is not None or ext_n is not None:
            s0 = state.data_ptr()
            if ext_o is not None:
                b0 = out.data_ptr()
                if b0 < s0 + ext_s and s0 < b0 + ext_o:
                    check_aliasing(state, out, new_state)      # raises with the message
            if ext_n is not None:
                b0 = new_state.data_ptr()
                if b0 < s0 + ext_s and s0 < b0 + ext_n:
                    check_aliasing(state, out, new_state)
    launch = hit[2]
    if out is None:
        p = hit[0]
        out = torch.empty((p.B, p.T, p.HV, p.V), dtype=v.dtype, device=v.device)
    if new_state is None:
        new_state = state
    if launch is None:
        # A backend's optional bind() does its per-signature work once; decode's signature
        # guarantees later calls share shapes, strides, dtypes, scale and mode.
        launch = hit[2] = launcher(hit[3], q, k, v, state, A_log, a, dt_bias, b, hit[1], out,
                                   new_state, use_qk_l2norm)
    launch(q, k, v, state, A_log, a, dt_bias, b, hit[1], out, new_state, use_qk_l2norm)
    return out, new_state


def decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
           use_qk_l2norm=False, algo=None):
    """One GDN decode step (T tokens); returns ``(out, new_state)``.  See the module docstring."""
    return _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                   algo)


def select(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
           use_qk_l2norm=False, algo=None) -> Selection:
    """Which backend :func:`decode` would use for these inputs, from which rule, and why."""
    p, _ = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                    use_qk_l2norm=use_qk_l2norm)
    return _select(p, algo)


def get(name: str):
    """A callable with :func:`decode`'s signature that always uses backend ``name``.

    Raises ``ValueError`` listing the valid names if ``name`` is unknown.
    """
    from gdnzoo.registry import load_registry
    reg = load_registry()
    if name not in reg.backends:
        raise ValueError(f"algo: unknown backend {name!r}; valid names: {', '.join(reg.names)}")

    def call(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
             use_qk_l2norm=False):
        return _decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                       use_qk_l2norm, name)
    call.__name__ = f"decode[{name}]"
    call.__doc__ = f"gdnzoo.decode with algo={name!r}."
    return call

"""decode's hot path: validate and select once per call signature, then only launch.

A call's verdict (the validated :class:`~gdnzoo.contract.Problem`, the resolved scale, the
backend that serves it, the byte extents for the overlap check, and the backend's bound
launcher) is memoized as a :class:`Resolved` under the call's signature
(:func:`gdnzoo.contract.signature`: shapes, strides, dtypes, devices, scale, mode, algo and the
ALGO variable).  Building that key in Python costs some 40 attribute reads, so each resolved
signature also gets a guard (:mod:`gdnzoo.guards`, one C++ check of all tensors) and the last
few guards of a calling mode are tried first.  A memo skips validation and selection, never the
data-dependent overlap check of ``out`` and ``new_state`` against ``state``.
"""
from __future__ import annotations

import torch

from gdnzoo import guards, registry
from gdnzoo.registry import env_algo
from gdnzoo.contract import byte_span, check_aliasing, signature, validate

_MEMO = {}          # (signature, algo, ALGO) -> Resolved; ("guards", mode...) -> [Resolved]
_MEMO_MAX = 4096
_GUARDS_PER_MODE = 4

registry.on_reset(_MEMO.clear)


class Resolved:
    """What decode decided for one call signature."""
    __slots__ = ("problem", "scale", "backend", "spans", "launch", "guard")

    def __init__(self, problem, scale, backend, spans):
        self.problem, self.scale, self.backend, self.spans = problem, scale, backend, spans
        self.launch = None       # the backend's bound launcher, made by the first call
        self.guard = None        # guards.make(...) once asked; False: no guards in this process


def _resolve(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
             key):
    """Validate and select (the slow path); the verdict is memoized under ``key`` if any."""
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                    use_qk_l2norm=use_qk_l2norm)
    spans = (byte_span(state), None if out is None else byte_span(out),
             None if new_state is None or new_state is state else byte_span(new_state))
    hit = Resolved(p, s, registry.select(p, algo).name, spans)
    if key is not None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = hit
    return hit


def lookup(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo):
    """The memoized verdict for calls like this one (None: it would validate from scratch),
    the way :func:`decode` finds it: this mode's guards first, then the Python signature.
    Raises TypeError/AttributeError for non-tensors and unhashable or tensor scales."""
    if isinstance(scale, torch.Tensor):   # its value may change in place: never memoized
        raise TypeError
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    mode = ("guards", algo, env_algo() if algo is None else None, scale,
            use_qk_l2norm, out is None, ns)
    recent = _MEMO.get(mode)
    if recent:
        tensors = _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns)
        for hit in recent:
            if hit.guard.check(*tensors):
                return hit
    return _by_signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                         use_qk_l2norm, mode)[0]


def _by_signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                  mode):
    """The second way, once this ``mode``'s guards have missed: the Python signature.  Returns
    (hit or None, what to memoize a miss under)."""
    algo, env, ns = mode[1], mode[2], mode[6]
    key = (signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                     use_qk_l2norm), algo, env)
    hit = _MEMO.get(key)
    if hit is not None and hit.guard is not False:
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
    if hit.guard is None:
        hit.guard = guards.make(tensors) or False      # False: no guards in this process
    if hit.guard is not False:
        older = [h for h in _MEMO.get(mode, ()) if h is not hit]
        _MEMO[mode] = [hit] + older[:_GUARDS_PER_MODE - 1]     # replaced whole: thread-safe


def decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo):
    """:func:`gdnzoo.decode` with every argument positional."""
    # Hot path, inline (every call costs here): this mode's guarded verdicts, one C++ check of
    # all tensors each (lookup's first way); then the signature, else _resolve validates.
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    hit, fresh, mode = None, False, None
    if not isinstance(scale, torch.Tensor):  # a tensor scale may change in place: never memoized
        mode = ("guards", algo, None if algo is not None else env_algo(), scale,
                use_qk_l2norm, out is None, ns)
        try:
            recent = _MEMO.get(mode)
        except TypeError:                    # unhashable scale: never memoized
            recent = mode = None
        if recent:
            t = (q, k, v, state, A_log, a, dt_bias, b) if out is None else \
                (q, k, v, state, A_log, a, dt_bias, b, out)
            if ns == 2:
                t += (new_state,)
            for h in recent:
                if h.guard.check(*t):
                    hit = h
                    break
    if hit is None:
        miss = None
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
        ext_s, ext_o, ext_n = hit.spans      # None: no such buffer, or state itself
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
    launch = hit.launch
    if out is None:
        p = hit.problem
        out = torch.empty((p.B, p.T, p.HV, p.V), dtype=v.dtype, device=v.device)
    if new_state is None:
        new_state = state
    if launch is None:
        # A backend's optional bind() does its per-signature work once; decode's signature
        # guarantees later calls share shapes, strides, dtypes, scale and mode.
        launch = hit.launch = registry.launcher(hit.backend, q, k, v, state, A_log, a, dt_bias,
                                                b, hit.scale, out, new_state, use_qk_l2norm)
    launch(q, k, v, state, A_log, a, dt_bias, b, hit.scale, out, new_state, use_qk_l2norm)
    return out, new_state

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
from gdnzoo import pool as pools
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
             key, pool_args=None):
    """Validate and select (the slow path); the verdict is memoized under ``key`` if any.
    ``pool_args``: (state_indices, new_state_indices, null_slot) of a pool call."""
    si, nsi, null = pool_args or (None, None, None)
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                    use_qk_l2norm=use_qk_l2norm, state_indices=si, new_state_indices=nsi,
                    null_slot=null)
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
                  mode, pool_args=None):
    """The second way, once this ``mode``'s guards have missed: the Python signature.  Returns
    (hit or None, what to memoize a miss under)."""
    algo, env, ns = mode[1], mode[2], mode[6]
    key = (signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                     use_qk_l2norm, *(pool_args or ())), algo, env)
    hit = _MEMO.get(key)
    if hit is not None and hit.guard is not False:
        _remember(hit, mode, _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns,
                                      pool_args))
    return hit, (key, mode, ns)


def _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args=None):
    """The tensors a guard checks: those of the signature (new_state only when distinct; a
    pool call's index tensors last)."""
    t = (q, k, v, state, A_log, a, dt_bias, b)
    if out is not None:
        t += (out,)
    if ns == 2:
        t += (new_state,)
    if pool_args is not None:
        t += (pool_args[0],) if pool_args[1] is None else pool_args[:2]
    return t


def _remember(hit, mode, tensors):
    """Put ``hit`` first among ``mode``'s guarded verdicts (building its guard once)."""
    if hit.guard is None:
        hit.guard = guards.make(tensors) or False      # False: no guards in this process
    if hit.guard is not False:
        older = [h for h in _MEMO.get(mode, ()) if h is not hit]
        _MEMO[mode] = [hit] + older[:_GUARDS_PER_MODE - 1]     # replaced whole: thread-safe


def decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
           state_indices=None, new_state_indices=None, null_slot=None):
    """:func:`gdnzoo.decode` with every argument positional."""
    if state_indices is not None or new_state_indices is not None or null_slot is not None:
        return decode_pool(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                           use_qk_l2norm, algo, (state_indices, new_state_indices, null_slot))
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


def _overlap_check(hit, state, out, new_state):
    """The per-call overlap check of a memoized verdict (decode's inline one, as a function)."""
    ext_s, ext_o, ext_n = hit.spans
    s0 = state.data_ptr()
    for buf, ext in ((out, ext_o), (new_state, ext_n)):
        if ext is not None:
            b0 = buf.data_ptr()
            if b0 < s0 + ext_s and s0 < b0 + ext:
                check_aliasing(state, out, new_state)


def decode_pool(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                algo, pool_args):
    """decode of a pool call (:mod:`gdnzoo.pool`): the same memo, guards and checks as the
    dense path, with the index tensors guarded and the padding rule in the mode; the backend
    gets a :class:`gdnzoo.pool.Pool` as its 13th argument."""
    si, nsi, null = pool_args
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    hit, fresh, mode = None, False, None
    if not isinstance(scale, torch.Tensor):
        mode = ("pool", algo, None if algo is not None else env_algo(), scale, use_qk_l2norm,
                out is None, ns, nsi is None, null)
        try:
            recent = _MEMO.get(mode)
        except TypeError:
            recent = mode = None
        if recent and si is not None:
            t = _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args)
            for h in recent:
                if h.guard.check(*t):
                    hit = h
                    break
    if hit is None:
        miss = None
        if mode is not None and si is not None:
            try:
                hit, miss = _by_signature(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                          new_state, use_qk_l2norm, mode, pool_args)
            except (AttributeError, TypeError):
                hit, miss = None, None
        if hit is None:
            hit = _resolve(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                           use_qk_l2norm, algo, miss and miss[0], pool_args)
            if miss is not None:
                _remember(hit, miss[1], _tensors(q, k, v, state, A_log, a, dt_bias, b, out,
                                                 new_state, miss[2], pool_args))
            fresh = True
    if not fresh:
        _overlap_check(hit, state, out, new_state)
    p = hit.problem
    if out is None:
        out = torch.empty((p.B, p.T, p.HV, p.V), dtype=v.dtype, device=v.device)
    if new_state is None:
        new_state = state
    pool = pools.Pool(si, si if nsi is None else nsi, -1 if null is None else null)
    if pools.checking():
        pools.check_on_host(pool, state.shape[0], new_state.shape[0], new_state is state)
    launch = hit.launch
    if launch is None:
        launch = hit.launch = registry.launcher(hit.backend, q, k, v, state, A_log, a, dt_bias,
                                                b, hit.scale, out, new_state, use_qk_l2norm,
                                                pool)
    launch(q, k, v, state, A_log, a, dt_bias, b, hit.scale, out, new_state, use_qk_l2norm, pool)
    return out, new_state

"""decode's hot path: validate and select once per call signature, then only launch.

A call's verdict (the validated :class:`~gdnzoo.contract.Problem`, the resolved scale, the
backend that serves it, the overlap probe, and the backend's bound launcher) is memoized as a
:class:`Resolved` under the call's signature (:func:`gdnzoo.contract.signature`: shapes,
strides, dtypes, devices, requires_grad, scale, mode, algo and the ALGO variable, pdl and the
GDNZOO_PDL variable, the Python values with their types, as ``1 == 1.0 == True``). Building that
key in Python costs some 40 attribute reads, so each resolved signature also gets a guard
(:mod:`gdnzoo.guards`, one C++ check of all tensors) and the last few guards of a calling mode
are tried first.

A memo skips work, never a check: whatever validate would refuse for a call, the memoized path
refuses with the same error.  What a signature cannot fix, that no written tensor (``out``,
``new_state``, ``state`` in place) overlaps another argument, is checked on every call from the
data pointers (:func:`gdnzoo.contract.overlap_probe`, no device sync).
"""
from __future__ import annotations

import torch

from gdnzoo import guards, registry
from gdnzoo import pool as pools
from gdnzoo import verify as verifies
from gdnzoo.registry import env_algo, env_pdl
from gdnzoo.contract import PDL_LEVELS, check_aliasing, overlap_probe, signature, validate

_MEMO = {}          # (signature, algo, type, ALGO) -> Resolved; (mode...) -> [Resolved]
_MEMO_MAX = 4096
_GUARDS_PER_MODE = 4
_DISJOINT_MAX = 256  # pointer sets remembered per signature as free of overlaps
_DENSE = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")

registry.on_reset(_MEMO.clear)


class Resolved:
    """What decode decided for one call signature."""
    __slots__ = ("problem", "scale", "backend", "probe", "last", "disjoint", "launch", "guard",
                 "fast")

    def __init__(self, problem, scale, backend, probe, ptrs):
        self.problem, self.scale, self.backend, self.probe = problem, scale, backend, probe
        self.last = ptrs         # the data pointers (a tuple) of the last call found free of
        self.disjoint = {ptrs}   # overlaps, and of up to _DISJOINT_MAX such calls
        self.launch = None       # the backend's bound launcher, made by the first call
        self.fast = None         # its with_pointers(ptrs, scale) -> launched?, if it has one
        self.guard = None        # guards.make(...) once asked; False: no guards in this process


# A call without ``out`` gets ``torch.empty_like(v)``: out's shape and dtype are v's, and its
# strides a function of v's alone (v's own when v is dense, else contiguous; the last axis
# contiguous either way), so they are fixed by the call's signature as a bound launcher needs;
# and it is the quickest allocation torch has (some 1 us, against 1.7 for torch.empty with a
# shape, dtype and device).  Fresh memory overlaps no argument.


def _pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args=None):
    """The data pointers of a call, a tuple in contract.POINTERS order, 0 for an absent one
    (decode builds the same inline)."""
    p = (q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), A_log.data_ptr(),
         a.data_ptr(), dt_bias.data_ptr(), b.data_ptr(), 0 if out is None else out.data_ptr(),
         new_state.data_ptr() if ns == 2 else 0)
    if pool_args is None:
        return p
    si, nsi, _, inter, inter_idx, _, acc = pool_args
    return p + tuple(0 if x is None else x.data_ptr() for x in (si, nsi, inter, inter_idx, acc))


def _overlaps(hit, ptrs, q, k, v, state, A_log, a, dt_bias, b, out, new_state, *serve):
    """The overlap check of a memoized call whose data pointers ``ptrs`` differ from the last
    call's: raises as validate would, else remembers them (the verdict is a function of the
    pointers and the signature's byte spans alone)."""
    if ptrs not in hit.disjoint:
        if hit.probe(ptrs):
            check_aliasing(q, k, v, state, A_log, a, dt_bias, b, out, new_state, *serve)
        if len(hit.disjoint) >= _DISJOINT_MAX:
            hit.disjoint = set()
        hit.disjoint.add(ptrs)
    hit.last = ptrs


def _names(out, ns, pool_args):
    """The names of the tensors a call passes to its guard and probe, in their order."""
    names = _DENSE + (("out",) if out is not None else ()) + (("new_state",) if ns == 2 else ())
    if pool_args is not None:
        names += tuple(n for n, x in zip(_SERVED, _served(pool_args)) if x is not None)
    return names


_SERVED = ("state_indices", "new_state_indices", "intermediate_states", "intermediate_indices",
           "num_accepted_tokens")


def _served(pool_args):
    """The tensors among a serving call's pool and verify arguments (None: absent)."""
    return pool_args[:2] + pool_args[3:5] + pool_args[6:]


def _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args=None):
    """The tensors of :func:`_names` (new_state only when distinct; a pool call's indices
    last)."""
    t = (q, k, v, state, A_log, a, dt_bias, b)
    if out is not None:
        t += (out,)
    if ns == 2:
        t += (new_state,)
    if pool_args is not None:
        t += tuple(x for x in _served(pool_args) if x is not None)
    return t


def _mode(algo, scale, use_qk_l2norm, out, ns, pdl):
    """The calling mode of a dense call, whose guarded verdicts decode tries first (Python
    values with their types; decode builds the same inline; ``pdl`` None is the GDNZOO_PDL
    variable's value).  Raises TypeError when one is unhashable."""
    if pdl is None:
        pdl = env_pdl()
    mode = ("guards", algo, algo.__class__, None if algo is not None else env_algo(), scale,
            scale.__class__, use_qk_l2norm, use_qk_l2norm.__class__, out is None, ns, pdl,
            pdl.__class__)
    hash(mode)
    return mode


def _resolve(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
             key, ns, pool_args=None, pdl=None):
    """Validate and select (the slow path); the verdict is memoized under ``key`` if any.
    ``pool_args``: (state_indices, new_state_indices, null_slot, intermediate_states,
    intermediate_indices, update_state, num_accepted_tokens) of a pool or verify call."""
    si, nsi, null, inter, inter_idx, update, acc = pool_args or _NO_SERVE
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state,
                    use_qk_l2norm=use_qk_l2norm, state_indices=si, new_state_indices=nsi,
                    null_slot=null, intermediate_states=inter, intermediate_indices=inter_idx,
                    update_state=update, num_accepted_tokens=acc, pdl=pdl,
                    pdl_env=env_pdl() if pdl is None else None)
    named = dict(zip(_names(out, ns, pool_args),
                     _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns,
                              pool_args)))
    probe = overlap_probe(named, p.inplace, 10 if pool_args is None else 15)
    hit = Resolved(p, s, registry.select(p, algo).name, probe,
                   _pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns,
                             pool_args))
    if key is not None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = hit
    return hit


def _signature_key(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                   mode, pool_args=None):
    """The memo key of a call's Python signature, or None when there is none (a non-tensor
    argument: validate says what is wrong)."""
    try:
        return (signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                          use_qk_l2norm, *(pool_args or ())), mode[1], mode[2], mode[3],
                mode[10], mode[11])
    except Exception:
        return None


def _miss(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
          mode, ns, t, pool_args=None, pdl=None):
    """decode's verdict when no guard of ``mode`` matched ``t``: by the Python signature
    (checking overlaps), else validated and selected now; either way guarded from now on.
    Returns it with the call's data pointers (:func:`_pointers`)."""
    key = None if mode is None else _signature_key(
        q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, mode,
        pool_args)
    hit = None if key is None else _MEMO.get(key)
    if hit is not None:
        ptrs = _pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args)
        if ptrs != hit.last:
            _overlaps(hit, ptrs, q, k, v, state, A_log, a, dt_bias, b, out, new_state,
                      *_check_args(pool_args))
    else:
        hit = _resolve(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                       use_qk_l2norm, algo, key, ns, pool_args, pdl)
        ptrs = _pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args)
    if key is not None and hit.guard is not False:
        _remember(hit, mode, t)
    return hit, ptrs


_NO_SERVE = (None, None, None, None, None, True, None)


def _check_args(pool_args):
    """check_aliasing's optional arguments of a call (none for a dense call)."""
    return () if pool_args is None else _served(pool_args)


def _remember(hit, mode, tensors):
    """Put ``hit`` first among ``mode``'s guarded verdicts (building its guard once)."""
    if hit.guard is None:
        hit.guard = guards.make(tensors) or False      # False: no guards in this process
    if hit.guard is not False:
        older = [h for h in _MEMO.get(mode, ()) if h is not hit]
        _MEMO[mode] = [hit] + older[:_GUARDS_PER_MODE - 1]     # replaced whole: thread-safe


def lookup(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
           pdl=None):
    """The memoized verdict for dense calls like this one (None: decode would validate from
    scratch), found the way :func:`decode` finds it: this mode's guards first, then the
    Python signature.  Checks nothing and memoizes nothing."""
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    try:
        mode = _mode(algo, scale, use_qk_l2norm, out, ns, pdl)
    except TypeError:
        return None
    if isinstance(scale, torch.Tensor):
        return None
    t = _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns)
    for hit in _MEMO.get(mode, ()):
        if hit.guard.check(*t):
            return hit
    key = _signature_key(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                         use_qk_l2norm, mode)
    return None if key is None else _MEMO.get(key)


def decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
           state_indices=None, new_state_indices=None, null_slot=None, intermediate_states=None,
           intermediate_indices=None, update_state=True, num_accepted_tokens=None, pdl=None):
    """:func:`gdnzoo.decode` with every argument positional."""
    if (state_indices is not None or new_state_indices is not None or null_slot is not None
            or intermediate_states is not None or intermediate_indices is not None
            or update_state is not True or num_accepted_tokens is not None):
        return decode_pool(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                           use_qk_l2norm, algo,
                           (state_indices, new_state_indices, null_slot, intermediate_states,
                            intermediate_indices, update_state, num_accepted_tokens), pdl)
    # Hot path, inline (every call costs here): this mode's guarded verdicts, one C++ check of
    # all tensors each, then the overlap probe; on a miss, _miss (signature, else validate).
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    t = (q, k, v, state, A_log, a, dt_bias, b) if out is None else \
        (q, k, v, state, A_log, a, dt_bias, b, out)
    if ns == 2:
        t += (new_state,)
    hit = mode = None
    if not isinstance(scale, torch.Tensor):  # a tensor scale may change in place: never memoized
        pv = pdl if pdl is not None else env_pdl()
        mode = ("guards", algo, algo.__class__, None if algo is not None else env_algo(), scale,
                scale.__class__, use_qk_l2norm, use_qk_l2norm.__class__, out is None, ns, pv,
                pv.__class__)
        try:
            recent = _MEMO.get(mode)
        except TypeError:                    # unhashable scale or algo: never memoized
            recent = mode = None
        if recent:
            for h in recent:
                if h.guard.check(*t):
                    hit = h
                    break
    if hit is None:
        hit, ptrs = _miss(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                          use_qk_l2norm, algo, mode, ns, t, None, pdl)
    else:                                    # no written tensor may overlap another argument
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), A_log.data_ptr(),
                a.data_ptr(), dt_bias.data_ptr(), b.data_ptr(),
                0 if out is None else out.data_ptr(), new_state.data_ptr() if ns == 2 else 0)
        if ptrs != hit.last:
            _overlaps(hit, ptrs, q, k, v, state, A_log, a, dt_bias, b, out, new_state)
    fast = hit.fast
    if out is None:
        out = torch.empty_like(v)           # see _new_out
        ptrs = ptrs[:8] + (out.data_ptr(), ptrs[9])
    # A launcher with_pointers takes the pointers read above (contract.POINTERS order;
    # new_state's 0 in place) instead of reading them again; False: it needs the tensors.
    if fast is not None and fast(ptrs, hit.scale):
        return out, state if new_state is None else new_state
    if new_state is None:
        new_state = state
    launch = hit.launch
    if launch is None:
        # A backend's optional bind() does its per-signature work once; decode's signature
        # guarantees later calls share shapes, strides, dtypes, scale and mode.
        launch = hit.launch = registry.launcher(hit.backend, q, k, v, state, A_log, a, dt_bias,
                                                b, hit.scale, out, new_state, use_qk_l2norm,
                                                pdl=PDL_LEVELS[hit.problem.pdl or "off"])
        hit.fast = getattr(launch, "with_pointers", None)
    launch(q, k, v, state, A_log, a, dt_bias, b, hit.scale, out, new_state, use_qk_l2norm)
    return out, new_state


def decode_pool(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                algo, pool_args, pdl=None):
    """decode of a pool or verify call (:mod:`gdnzoo.pool`, :mod:`gdnzoo.verify`): the same
    memo, guards and checks as the dense path, with the index and intermediate tensors
    guarded and probed, and the padding rule and update_state in the mode.  The backend gets
    a :class:`gdnzoo.pool.Pool` (None: a dense state) as its 13th argument and, for a verify
    call, a :class:`gdnzoo.verify.Verify` as its 14th."""
    si, nsi, null, inter, inter_idx, update, acc = pool_args
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    t = _tensors(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args)
    hit = mode = None
    if not isinstance(scale, torch.Tensor):
        try:
            mode = _mode(algo, scale, use_qk_l2norm, out, ns, pdl) + tuple(
                x is None for x in _served(pool_args)) + (null, null.__class__, update,
                                                           update.__class__)
            mode = ("pool",) + mode[1:]
            hash(mode)
        except TypeError:                    # unhashable scale, algo or null_slot
            mode = None
        else:
            hit = next((h for h in _MEMO.get(mode, ()) if h.guard.check(*t)), None)
    if hit is None:
        hit = _miss(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                    algo, mode, ns, t, pool_args, pdl)[0]
    else:
        ptrs = _pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state, ns, pool_args)
        if ptrs != hit.last:
            _overlaps(hit, ptrs, q, k, v, state, A_log, a, dt_bias, b, out, new_state,
                      *_served(pool_args))
    p = hit.problem
    if out is None:
        out = torch.empty_like(v)
    if new_state is None:
        new_state = state
    pool = None if si is None else pools.Pool(si, si if nsi is None else nsi,
                                              -1 if null is None else null)
    ver = None if not p.verify else verifies.Verify(inter, inter_idx, update,
                                                    p.verify == "slots", acc)
    if pools.checking():
        if pool is not None and not (ver is not None and ver.per_token):
            pools.check_on_host(pool, state.shape[0], new_state.shape[0], new_state is state)
        if ver is not None:
            verifies.check_on_host(ver, pool, p.T, state.shape[0], new_state.shape[0])
    launch = hit.launch
    if launch is None:
        launch = hit.launch = registry.launcher(hit.backend, q, k, v, state, A_log, a, dt_bias,
                                                b, hit.scale, out, new_state, use_qk_l2norm,
                                                pool, ver, PDL_LEVELS[p.pdl or "off"])
    if ver is None:
        launch(q, k, v, state, A_log, a, dt_bias, b, hit.scale, out, new_state, use_qk_l2norm,
               pool)
    else:
        launch(q, k, v, state, A_log, a, dt_bias, b, hit.scale, out, new_state, use_qk_l2norm,
               pool, ver)
    return out, new_state

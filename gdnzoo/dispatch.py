"""Every operation's hot path: validate and select once per call signature, then only launch.

A call's verdict (the validated problem, the resolved scale, the backend that serves it, the
overlap probe, and the backend's bound launcher) is memoized as a :class:`Resolved` under the
call's signature (:func:`gdnzoo.checks.signature`: shapes, strides, dtypes, devices,
requires_grad of every tensor, the other arguments with their types, as ``1 == 1.0 == True``,
and the ALGO and GDNZOO_PDL variables where they apply).  Building that key in Python costs some
40 attribute reads, so a signature seen a second time also gets a guard (:mod:`gdnzoo.guards`,
one C++ check of all tensors) and the last few guards of a calling mode are tried first.

A memo skips work, never a check: whatever validate would refuse for a call, the memoized path
refuses with the same error.  What a signature cannot fix, that no written tensor overlaps
another argument, is checked on every call from the data pointers
(:func:`gdnzoo.checks.overlap_probe`, no device sync).

Every call reaches its backend as one call record (the operation's ``Call``, built by its
contract's ``record``), through the launcher the backend bound to the first call of the
signature.  Dense decode, the call an engine makes every layer and step, has its path written
out inline (:func:`decode`): a launcher may take it straight from the data pointers
(``with_pointers``) without building the record.
"""
from __future__ import annotations

import torch

from gdnzoo import guards, registry
from gdnzoo.checks import check_aliasing, overlap_probe, signature
from gdnzoo.operation import COMMIT, DECODE, K_LAST, PREFILL
from gdnzoo.registry import env_algo, env_pdl

_MEMO = {}          # signature key (a tuple first) -> Resolved; calling mode (a str first) ->
#                     [Resolved], guarded
_MEMO_MAX = 4096
_GUARDS_PER_MODE = 4
_DISJOINT_MAX = 256  # pointer sets remembered per signature as free of overlaps
# Decode's dense pointer tuple: the data pointers a dense call's launcher may take, 0 for an
# absent out and for new_state in place.
DENSE_POINTERS = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "out", "new_state")

registry.on_reset(_MEMO.clear)


class Resolved:
    """What the dispatcher decided for one call signature."""
    __slots__ = ("problem", "scale", "backend", "probe", "names", "inplace", "last", "disjoint",
                 "launch", "guard", "fast", "record", "inference")

    def __init__(self, problem, scale, backend, probe, names, inplace, ptrs, record):
        self.problem, self.scale, self.backend, self.probe = problem, scale, backend, probe
        self.names, self.inplace = names, inplace   # the probed tensors' names; in place?
        self.last = ptrs         # the data pointers (a tuple) of the last call found free of
        self.disjoint = {ptrs}   # overlaps, and of up to _DISJOINT_MAX such calls
        self.launch = None       # the backend's bound launcher, made by the first call
        self.fast = None         # its with_pointers(ptrs, scale) -> launched?, if it has one
        self.guard = None        # guards.make(...) once asked; False: no guards in this process
        self.record = record     # the operation's record(args, problem, scale, algo)
        self.inference = False   # a tensor made under inference mode: launch inside it


class _Layout:
    """Where an operation's tensors, values and in-place pair sit in its argument tuple."""

    def __init__(self, op):
        self.op = op
        self.contract = op.module()
        self.tensors = tuple(i for i, a in enumerate(op.args) if a.tensor)
        self.values = tuple(i for i, a in enumerate(op.args) if not a.tensor)
        self.dst, self.src = (-1, -1) if op.inplace is None else map(op.index, op.inplace)
        fields = op.result
        self.result = (lambda r: getattr(r, fields[0])) if len(fields) == 1 else \
            (lambda r: tuple(getattr(r, f) for f in fields))
        self.algo = op.index("algo")
        self.pdl = op.index("pdl") if "pdl" in op.names else None


_LAYOUTS = {}


def _layout(op) -> _Layout:
    lay = _LAYOUTS.get(op.name)
    if lay is None or lay.op is not op:
        lay = _LAYOUTS[op.name] = _Layout(op)
    return lay


def _present(lay, args):
    """(names, tensors) of a call's tensors, in the operation's order: None left out, and the
    in-place argument when it is the state."""
    names, tensors, op = [], [], lay.op
    for i in lay.tensors:
        x = args[i]
        if x is None or (i == lay.dst and x is args[lay.src]):
            continue
        names.append(op.args[i].name)
        tensors.append(x)
    return tuple(names), tuple(tensors)


def _signature_key(lay, args, slots=None):
    """The memo key of a call's signature, or None when there is none: a non-tensor where a
    tensor belongs (validate says what is wrong), an unhashable value, or a tensor where a value
    belongs (a tensor scale may change in place: never memoized).  ``slots``: the pointer tuple
    the verdict's probe takes, where it is not the tensors present (dense decode's path)."""
    try:
        if any(isinstance(args[i], torch.Tensor) for i in lay.values):
            return None
        key = (signature(lay.op, args), lay.op.name,
               env_algo() if args[lay.algo] is None else None,
               env_pdl() if lay.pdl is not None and args[lay.pdl] is None else None, slots)
        hash(key)
        return key
    except Exception:
        return None


def _resolve(lay, args, key, names, tensors, ptrs, slots, verdict):
    """Select for a validated call (``verdict``: its problem and scale), the slow path; the
    verdict is memoized under ``key`` if any.  ``slots``: the names of the pointer tuple the
    probe takes."""
    problem, scale = verdict
    if problem.empty:                        # nothing to compute: no backend is launched
        registry.check_algo(args[lay.algo], problem.op)
        name = args[lay.algo] or "(empty call)"
    else:
        sel = registry.select(problem, args[lay.algo])
        name, problem = sel.name, sel.problem or problem
    named = dict(zip(names, tensors))
    probe = overlap_probe(lay.op, named, problem.inplace, slots)
    hit = Resolved(problem, scale, name, probe, names, problem.inplace, ptrs,
                   lay.contract.record)
    if problem.empty:
        hit.launch = _nothing
    # Torch refuses writes to inference tensors outside inference mode: such calls launch
    # inside it.  A tensor that requires grad is read under no_grad only: the signature holds
    # the grad mode, so such calls are never guarded.
    hit.inference = any(t.is_inference() for t in tensors)
    if any(t.requires_grad for t in tensors):
        hit.guard = False
    if key is not None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = hit
    return hit


def _nothing(call):
    """The launcher of an empty call (no sequence, or no token of any sequence)."""


def _overlaps(hit, ptrs, lay, args):
    """The overlap check of a memoized call whose data pointers ``ptrs`` differ from the last
    call's: raises as validate would, else remembers them (the verdict is a function of the
    pointers and the signature's byte spans alone)."""
    if ptrs not in hit.disjoint:
        if hit.probe(ptrs):
            names, tensors = _present(lay, args)
            check_aliasing(lay.op, dict(zip(names, tensors)), hit.inplace)
        if len(hit.disjoint) >= _DISJOINT_MAX:
            hit.disjoint = set()
        hit.disjoint.add(ptrs)
    hit.last = ptrs


def _remember(hit, mode, tensors):
    """Put ``hit`` first among ``mode``'s guarded verdicts (building its guard once)."""
    if hit.guard is None:
        hit.guard = guards.make(tensors) or False      # False: no guards in this process
    if hit.guard is not False:
        older = [h for h in _MEMO.get(mode, ()) if h is not hit]
        _MEMO[mode] = [hit] + older[:_GUARDS_PER_MODE - 1]     # replaced whole: thread-safe


def _miss(lay, args, mode, tensors, pointers, slots=None):
    """The verdict when no guard of ``mode`` matched: by the signature (checking overlaps),
    else validated and selected now.  A signature seen again is guarded from then on; one seen
    once is not (a server's prefill meets a new token count nearly every call: a guard for each
    would cost its making and push the recurring signatures' guards out of ``mode``'s few).
    ``pointers()``: the call's pointer tuple, one per name of ``slots`` (default: the tensors
    present), asked for once the arguments are known to be tensors.  Returns the verdict and
    the pointers."""
    key = _signature_key(lay, args, slots)
    hit = None if key is None else _MEMO.get(key)
    if hit is not None:
        ptrs = pointers()
        if ptrs != hit.last:
            _overlaps(hit, ptrs, lay, args)
        if mode is not None and hit.guard is not False:
            _remember(hit, mode, tensors)
    else:
        names, present = _present(lay, args)
        problem_scale = lay.contract.verdict(args, env_pdl)
        ptrs = pointers()
        hit = _resolve(lay, args, key, names, present, ptrs, slots or names, problem_scale)
    return hit, ptrs


def _mode(lay, args):
    """The calling mode whose guarded verdicts a call tries first: the operation, which tensor
    arguments are given (and whether the in-place one is the state), the other arguments with
    their types, and the environment variables that stand in for None ones.  None when a value
    is unhashable or a tensor (a tensor scale may change in place: never memoized)."""
    mode = [lay.op.name]
    for i in lay.tensors:
        x = args[i]
        mode.append(0 if x is None else 1 if i == lay.dst and x is args[lay.src] else 2)
    for i in lay.values:
        x = args[i]
        if isinstance(x, torch.Tensor):
            return None
        mode += (x, x.__class__)
    mode += (env_algo() if args[lay.algo] is None else None,
             env_pdl() if lay.pdl is not None and args[lay.pdl] is None else None)
    mode = tuple(mode)
    try:
        hash(mode)
    except TypeError:
        return None
    return mode


def call(op, args):
    """One call of ``op`` (an :class:`gdnzoo.operation.Operation`) with every argument
    positional in its order; returns the operation's result (``out, new_state``)."""
    lay = _layout(op)
    names, t = _present(lay, args)
    mode = _mode(lay, args)
    hit = None
    if mode is not None:
        for h in _MEMO.get(mode, ()):
            if h.guard.check(*t):
                hit = h
                break
    if hit is None:
        hit = _miss(lay, args, mode, t, lambda: tuple(x.data_ptr() for x in t))[0]
    else:
        ptrs = tuple(x.data_ptr() for x in t)
        if ptrs != hit.last:
            _overlaps(hit, ptrs, lay, args)
    rec = hit.record(args, hit.problem, hit.scale, hit.backend)
    launch = hit.launch
    if launch is None:
        launch = hit.launch = registry.launcher(hit.backend, rec)
    if hit.inference:
        with torch.inference_mode():
            launch(rec)
    else:
        launch(rec)
    return lay.result(rec)


def record(op, args, algo=None):
    """The call record of ``op``'s positional ``args`` for backend ``algo`` (None: the one the
    dispatcher would select), validated as a call would be, memoizing nothing: for launching a
    backend's ``run(record, config=...)`` directly (the tuner, the bench)."""
    lay = _layout(op)
    problem, scale = lay.contract.verdict(args, env_pdl)
    if algo is None:
        sel = registry.select(problem, args[lay.algo])
        algo, problem = sel.name, sel.problem or problem
    return lay.contract.record(args, problem, scale, algo)


def lookup(op, args):
    """The memoized verdict for calls like this one (None: the dispatcher would validate from
    scratch), found as :func:`call` finds it: this mode's guards first, then the signature.
    Checks nothing and memoizes nothing."""
    lay = _layout(op)
    dense = (op is DECODE and args[18] is True and args[23] is False and args[24] == K_LAST
             and all(args[i] is None for i in (13, 14, 15, 16, 17, 19, 21, 22)))
    mode = _dense_mode(*args[:13], args[20]) if dense else _mode(lay, args)
    if mode is None:
        return None
    t = _present(lay, args)[1]
    try:
        for h in _MEMO.get(mode, ()):
            if h.guard.check(*t):
                return h
    except TypeError:                        # an unhashable value: never memoized
        return None
    key = _signature_key(lay, args, DENSE_POINTERS if dense else None)
    return None if key is None else _MEMO.get(key)


def _dense_mode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                algo, pdl):
    """The calling mode of a dense decode call (decode builds the same inline)."""
    ns = 0 if new_state is None else (1 if new_state is state else 2)
    pv = pdl if pdl is not None else env_pdl()
    return ("guards", algo, algo.__class__, None if algo is not None else env_algo(), scale,
            scale.__class__, use_qk_l2norm, use_qk_l2norm.__class__, out is None, ns, pv,
            pv.__class__)


_NO_SERVE = (None, None, None, None, None, True, None)
_RAW_K_LAST = (None, None, False, K_LAST)          # g, beta, allow_neg_eigval, state_layout


def decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, algo,
           state_indices=None, new_state_indices=None, null_slot=None, intermediate_states=None,
           intermediate_indices=None, update_state=True, num_accepted_tokens=None, pdl=None,
           g=None, beta=None, allow_neg_eigval=False, state_layout=K_LAST):
    """:func:`gdnzoo.decode` with every argument positional."""
    if (state_indices is not None or new_state_indices is not None or null_slot is not None
            or intermediate_states is not None or intermediate_indices is not None
            or update_state is not True or num_accepted_tokens is not None or g is not None
            or beta is not None or allow_neg_eigval is not False
            or (state_layout is not K_LAST and state_layout != K_LAST)):
        return call(DECODE, (q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                             use_qk_l2norm, algo, state_indices, new_state_indices, null_slot,
                             intermediate_states, intermediate_indices, update_state,
                             num_accepted_tokens, pdl, g, beta, allow_neg_eigval, state_layout))
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
    args = None
    if hit is None:
        args = (q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                algo) + _NO_SERVE + (pdl,) + _RAW_K_LAST
        hit, ptrs = _miss(_layout(DECODE), args, mode, t, lambda: (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), A_log.data_ptr(),
            a.data_ptr(), dt_bias.data_ptr(), b.data_ptr(),
            0 if out is None else out.data_ptr(), new_state.data_ptr() if ns == 2 else 0),
            DENSE_POINTERS)
    else:                                    # no written tensor may overlap another argument
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), A_log.data_ptr(),
                a.data_ptr(), dt_bias.data_ptr(), b.data_ptr(),
                0 if out is None else out.data_ptr(), new_state.data_ptr() if ns == 2 else 0)
        if ptrs != hit.last:
            _overlaps(hit, ptrs, _layout(DECODE), (q, k, v, state, A_log, a, dt_bias, b, scale,
                                                   out, new_state, use_qk_l2norm, algo)
                      + _NO_SERVE + (pdl,) + _RAW_K_LAST)
    fast = hit.fast
    if out is None:
        out = torch.empty_like(v)           # see contract.record
        ptrs = ptrs[:8] + (out.data_ptr(), ptrs[9])
    # A launcher's with_pointers takes the pointers read above (DENSE_POINTERS order;
    # new_state's 0 in place) instead of reading them again; False: it needs the record.
    if fast is not None and fast(ptrs, hit.scale):
        return out, state if new_state is None else new_state
    if args is None:
        args = (q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                algo) + _NO_SERVE + (pdl,) + _RAW_K_LAST
    else:
        args = args[:9] + (out,) + args[10:]
    rec = hit.record(args, hit.problem, hit.scale, hit.backend)
    launch = hit.launch
    if launch is None:
        # A backend's optional bind() does its per-signature work once; the signature
        # guarantees later calls share shapes, strides, dtypes, scale and mode.
        launch = hit.launch = registry.launcher(hit.backend, rec)
        hit.fast = getattr(launch, "with_pointers", None)
    if hit.inference:
        with torch.inference_mode():
            launch(rec)
    else:
        launch(rec)
    return rec.out, rec.new_state


def prefill(*args):
    """:func:`gdnzoo.prefill` with every argument positional."""
    return call(PREFILL, args)


def commit(*args):
    """:func:`gdnzoo.commit` with every argument positional."""
    return call(COMMIT, args)

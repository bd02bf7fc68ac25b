"""pt-compiled: ``torch.compile(fullgraph=True)`` of the pt-reference math.

Compiled once per input signature (shapes, strides, dtypes, device, scale, l2norm, in place or not)
and reused; the prefill compiles the chunked (WY) form's one chunk (64 tokens, every head) and
runs each sequence's chunks through it (the lengths read on the host: a sync).  Each signature gets its own copy of the step's code object, so dynamo's per-code
recompile limit never trips however many shapes a process sees, and no global dynamo setting
is changed.  A state pool is gathered and scattered in eager torch around the compiled dense
step (one host sync per call for the scatter's rows); speculative verify runs the compiled
step once per token around eager stores of each token's state.
"""
from __future__ import annotations

import types

import torch

from gdnzoo import prefill_reference, reference
from gdnzoo.reference import reference_decode

_compiled = {}


def _step(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, g, beta,
          neg, k_first):
    return reference_decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                            use_qk_l2norm, g=g, beta=beta, neg=neg, k_first=k_first)


def _signature(tensors, scale, use_qk_l2norm, inplace):
    # scale is in the key because dynamo may specialize on a Python float's value.
    return (tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors),
            scale, use_qk_l2norm, inplace)


def _compile_for(key, step=_step):
    code = step.__code__.replace(co_name=f"{step.__name__.strip('_')}_{len(_compiled)}")
    fn = types.FunctionType(code, step.__globals__, code.co_name)
    return torch.compile(fn, fullgraph=True, dynamic=False)


def _chunk_step(S, q, k, v, lg, beta, scale):
    """One chunk of a prefill sequence (:func:`gdnzoo.prefill_reference.chunk`), through the
    compiled chunk of its signature."""
    key = ("chunk", _signature((S, q, k, v, lg, beta), float(scale), False, False))
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = _compile_for(key, prefill_reference.chunk)
    return fn(S, q, k, v, lg, beta, float(scale))


def available():
    return True, "torch.compile (inductor); CPU needs a C++ compiler, GPU needs Triton"


def supports(problem):
    if problem.device == "cuda":
        import importlib.util
        if importlib.util.find_spec("triton") is None:
            return False, "inductor on CUDA needs the triton package, which is not installed"
    return True, ""


def _dense(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, g=None,
           beta=None, neg=False, k_first=False):
    """One dense decode through the compiled step of its signature."""
    tensors = tuple(t for t in (q, k, v, state, A_log, a, dt_bias, b, out, new_state, g, beta)
                    if t is not None)
    key = _signature(tensors, float(scale), bool(use_qk_l2norm), new_state is state) + (
        g is None, neg, k_first)
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = _compile_for(key)
    fn(q, k, v, state, A_log, a, dt_bias, b, float(scale), out, new_state, bool(use_qk_l2norm),
       g, beta, neg, k_first)


def run(call, *, config=None):
    if call.op == "prefill":
        prefill_reference.run(call, chunk_step=_chunk_step)
    else:
        reference.run(call, step=_dense)

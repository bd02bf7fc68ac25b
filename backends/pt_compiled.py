"""pt-compiled: ``torch.compile(fullgraph=True)`` of the pt-reference math.

Compiled once per input signature (shapes, strides, dtypes, device, scale, l2norm, in place or not)
and reused.  Each signature gets its own copy of the step's code object, so dynamo's per-code
recompile limit never trips however many shapes a process sees, and no global dynamo setting
is changed.  A state pool is gathered and scattered in eager torch around the compiled dense
step (one host sync per call for the scatter's rows); speculative verify runs the compiled
step once per token around eager stores of each token's state.
"""
from __future__ import annotations

import types

import torch

from gdnzoo.reference import reference_decode, reference_pool_decode, reference_verify

_compiled = {}


def _step(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm):
    return reference_decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                            use_qk_l2norm)


def _signature(tensors, scale, use_qk_l2norm, inplace):
    # scale is in the key because dynamo may specialize on a Python float's value.
    return (tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors),
            scale, use_qk_l2norm, inplace)


def _compile_for(key):
    code = _step.__code__.replace(co_name=f"gdn_step_{len(_compiled)}")
    fn = types.FunctionType(code, _step.__globals__, code.co_name)
    return torch.compile(fn, fullgraph=True, dynamic=False)


def available():
    return True, "torch.compile (inductor); CPU needs a C++ compiler, GPU needs Triton"


def supports(problem):
    if problem.device == "cuda":
        import importlib.util
        if importlib.util.find_spec("triton") is None:
            return False, "inductor on CUDA needs the triton package, which is not installed"
    return True, ""


def run(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, pool=None,
        verify=None):
    if verify is not None:
        reference_verify(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                         use_qk_l2norm, pool, verify, step=run)
        return
    if pool is not None:
        reference_pool_decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                              use_qk_l2norm, pool, step=run)
        return
    tensors = (q, k, v, state, A_log, a, dt_bias, b, out, new_state)
    key = _signature(tensors, float(scale), bool(use_qk_l2norm), new_state is state)
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = _compile_for(key)
    fn(q, k, v, state, A_log, a, dt_bias, b, float(scale), out, new_state, bool(use_qk_l2norm))

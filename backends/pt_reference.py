"""pt-reference: the math in readable PyTorch (:mod:`gdnzoo.reference`) as a backend.

Eager, fp32 arithmetic, vectorized over batch and heads; runs on CPU and GPU.  It is the
speedup baseline of ``gdnzoo bench``; the tests and the bench's correctness gate call the same
function in float64 as their oracle.  A state pool is gathered, decoded dense and scattered back
(one host sync per call for the scatter's rows: not CUDA-graph capturable in pool mode).
Speculative verify (:mod:`gdnzoo.verify`) runs the tokens one at a time, storing each state.
"""
from __future__ import annotations

from gdnzoo.reference import reference_decode, reference_pool_decode, reference_verify


def available():
    return True, "PyTorch eager; runs on CPU and GPU"


def supports(problem):
    return True, ""


def run(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, pool=None,
        verify=None):
    if verify is not None:
        reference_verify(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                         use_qk_l2norm, pool, verify)
    elif pool is None:
        reference_decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                         use_qk_l2norm)
    else:
        reference_pool_decode(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                              use_qk_l2norm, pool)

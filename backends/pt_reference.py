"""pt-reference: the math in readable PyTorch (:mod:`gdnzoo.reference`,
:mod:`gdnzoo.prefill_reference`) as a backend of both operations.

Eager, fp32 arithmetic, vectorized over batch and heads; runs on CPU and GPU.  It is the
speedup baseline of ``gdnzoo bench``; the tests and the bench's correctness gate call the same
functions in float64 as their oracle.  A decode state pool is gathered, decoded dense and
scattered back (one host sync per call for the scatter's rows: not CUDA-graph capturable in pool
mode); speculative verify runs the tokens one at a time, storing each state.  Prefill runs each
sequence's tokens in order (the lengths are read on the host: a sync).  Commit copies the
accepted steps with torch indexing (one host sync).
"""
from __future__ import annotations

from gdnzoo import prefill_reference, reference


def available(device):
    return True, "PyTorch eager; runs on CPU and GPU"


def supports(problem):
    return True, ""


def run(call, *, config=None):
    if call.op == "commit":
        c = call
        reference.reference_commit(c.intermediate_states, c.intermediate_indices,
                                   c.accepted_steps, c.state, c.state_indices,
                                   None if c.null_slot < 0 else c.null_slot)
    else:
        (reference if call.op == "decode" else prefill_reference).run(call)

"""pt-compiled: ``torch.compile(fullgraph=True)`` of the pt-reference math.

Compiled once per input signature (shapes, strides, dtypes, device, scale, l2norm, in place or not)
and reused; the prefill compiles the chunked (WY) form's one chunk (64 tokens, every head) and
runs each sequence's chunks through it (the lengths read on the host: a sync).  Each signature
gets its own copy of the step's code object, so dynamo's per-code recompile limit never trips however many shapes a process sees, and no global dynamo setting
is changed.  A state pool is gathered and scattered in eager torch around the compiled dense
step (one host sync per call for the scatter's rows); speculative verify runs the compiled
step once per token around eager stores of each token's state.

On the CPU inductor builds C++: without a working C++ compiler (inductor's own lookup, $CXX or
g++, run with ``--version`` once and remembered) pt-compiled is unavailable there, with the
reason.  A compile that still fails when a call runs raises RuntimeError naming pt-compiled
and the cause.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import types

import torch

from gdnzoo import prefill_reference, reference
from gdnzoo.reference import reference_decode

_compiled = {}
_scratch = {}           # in place on CPU: a state-sized buffer a signature (see _dense)


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
    try:
        return fn(S, q, k, v, lg, beta, float(scale))
    except torch._dynamo.exc.BackendCompilerFailed as e:
        raise _compile_error(key, e) from None


@functools.lru_cache(maxsize=None)
def cpp_compiler():
    """(the C++ compiler inductor would build CPU code with, or None; why not): the first of
    inductor's candidates that runs with ``--version``, as inductor looks it up; nothing is
    compiled."""
    tried = []
    for cxx in _cxx_candidates():
        try:
            ok = subprocess.run([cxx, "--version"], capture_output=True,
                                timeout=30).returncode == 0
            why = "" if ok else "--version failed"
        except (OSError, subprocess.SubprocessError) as e:
            ok, why = False, type(e).__name__
        if ok:
            return cxx, ""
        tried.append(f"{cxx}: {why}")
    return None, (f"no working C++ compiler for inductor's CPU code (tried "
                  f"{'; '.join(tried) or 'none'}); install g++ or set CXX")


def _cxx_candidates():
    """``torch._inductor.config.cpp.cxx`` where inductor is loaded; else its default ($CXX,
    else g++), read without importing inductor (seconds).  Its None (fetch g++ with conda,
    only when TORCH_INDUCTOR_INSTALL_GXX is set) is not probed."""
    config = sys.modules.get("torch._inductor.config")
    if config is None:
        return [os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")]
    cxx = config.cpp.cxx
    return [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c is not None]


def available(device):
    """Inductor's CPU code needs a C++ compiler, its CUDA code Triton (and no C++ compiler)."""
    if device == "cuda":
        import importlib.util
        if importlib.util.find_spec("triton") is None:
            return False, "inductor on CUDA needs the triton package, which is not installed"
        return True, "torch.compile (inductor): Triton kernels"
    cxx, why = cpp_compiler()
    if cxx is None:
        return False, why
    return True, f"torch.compile (inductor): C++ built with {cxx}"


def supports(problem):
    return True, ""


def _compile_error(key, e):
    """A compile that failed (no working C++ compiler, a toolchain error): forgotten, and
    raised as a RuntimeError naming pt-compiled and the cause, without dynamo's traceback."""
    _compiled.pop(key, None)
    # The message's paragraphs but the compiler's command line and dynamo's advice.
    cause = " ".join(" ".join(p.split()) for p in str(e).split("\n\n")
                     if p.strip() and not p.strip().startswith(("Command:", "Set TORCHDYNAMO")))
    if len(cause) > 2000:
        cause = cause[:2000] + " [...]"
    return RuntimeError(f"pt-compiled: torch.compile could not compile this call's step: {cause}")


def _dense(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, g=None,
           beta=None, neg=False, k_first=False):
    """One dense decode through the compiled step of its signature.  In place on CPU the step
    writes a scratch state of its signature, copied into ``state`` after it: inductor's CPU
    code generation (torch 2.13) fails on the step that updates its own input in place at one
    sequence and T >= 2 ("KeyError: 'buf4'", its outer-loop fusion with a local buffer)."""
    tensors = tuple(t for t in (q, k, v, state, A_log, a, dt_bias, b, out, new_state, g, beta)
                    if t is not None)
    inplace = new_state is state
    key = _signature(tensors, float(scale), bool(use_qk_l2norm), inplace) + (
        g is None, neg, k_first)
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = _compile_for(key)
    dest = new_state
    if inplace and state.device.type == "cpu":
        dest = _scratch.get(key)
        if dest is None:
            dest = _scratch[key] = torch.empty_like(state)
    try:
        fn(q, k, v, state, A_log, a, dt_bias, b, float(scale), out, dest,
           bool(use_qk_l2norm), g, beta, neg, k_first)
    except torch._dynamo.exc.BackendCompilerFailed as e:
        raise _compile_error(key, e) from None
    if dest is not new_state:
        new_state.copy_(dest)


def run(call, *, config=None):
    if call.op == "prefill":
        prefill_reference.run(call, chunk_step=_chunk_step)
    else:
        reference.run(call, step=_dense)

"""cuda_v4.run of a verify case with an explicit launch shape, its check against the float64
reference, and the decoding of a recorded parameter block (shared by the cuda-v4 tests)."""
from __future__ import annotations

import ctypes
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from gdnzoo import gate
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import cuda_v4
from gdnzoo.contract import validate
from gdnzoo.pool import Pool, live
from gdnzoo.reference import reference_verify_outputs
from verify_cases import expected_writes
from helpers import record, run


NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the "
                                                     "CUDA sources")
H100 = "NVIDIA H100 80GB HBM3"         # the GPU name the recorded launches look rows up for


def case_pool(case, write=None):
    """The case's pool, with separate write slots ``write`` when given."""
    pool = case.pool()
    return pool if write is None else Pool(pool.read, write, pool.null_slot)


def run_case(case, l2=False, config=None, write=None):
    """cuda_v4.run of a verify case (validated first, as gdnzoo.decode does); ``write``: the
    pool's separate write slots (new_state_indices)."""
    x = case.x
    B, T = x.q.shape[:2]
    out = torch.empty(B, T, *x.v.shape[2:], dtype=x.v.dtype, device=x.q.device)
    more = {} if write is None else dict(new_state_indices=write)
    validate(*x.args(), out=out, use_qk_l2norm=l2, **case.kwargs(), **more)
    run(cuda_v4, *x.args(), out, x.state, l2, case_pool(case, write), case.verify(), config=config)
    return out


def check_run(case, l2, what, config, write=None):
    """cuda_v4.run with an explicit launch shape (``write``: separate write slots), checked
    like check_verify_call."""
    x = case.x
    pool = case_pool(case, write)
    ref_out, ref_state, ref_inter = reference_verify_outputs(x, case.verify(), l2, pool)
    buf0 = case.buf.clone()
    ibuf0 = None if case.inter_buf is None else case.inter_buf.clone()
    out = run_case(case, l2, config, write)
    torch.cuda.synchronize()
    padded, slots, inter = expected_writes(case)
    rows = sorted(slots)
    if write is not None:                  # the final states went to the write slots
        P = x.state.shape[0]
        rows = sorted(write[live(pool, P, P)[1]].tolist()) if case.update else []
    j = gate.judge(out, x.state[rows], ref_out, ref_state[rows], state_dtype=x.state.dtype)
    assert j.ok, f"{what}: {j.reason}"
    for n in padded:
        assert bool((out[n] == 0).all()), f"{what}: padded row {n} not zero"
    want = buf0.clone()
    view = want.as_strided(x.state.shape, x.state.stride(),
                           x.state.storage_offset() - case.buf.storage_offset())
    for s in rows:
        view[s] = x.state[s]
    assert torch.equal(want, case.buf), f"{what}: state written outside its slots"
    if case.inter is not None:
        want = ibuf0.clone()
        iview = want.as_strided(case.inter.shape, case.inter.stride(),
                                case.inter.storage_offset() - case.inter_buf.storage_offset())
        for r, t, _ in inter:
            j = gate.judge(out, case.inter[r, t], ref_out, ref_inter[r, t],
                           state_dtype=x.state.dtype)
            assert j.ok, f"{what}: intermediate [{r}, {t}]: {j.reason}"
            iview[r, t] = case.inter[r, t]
        assert torch.equal(want, case.inter_buf), f"{what}: intermediate written elsewhere"


def params_at(argv_addr):
    """The GdnParams block a void*[1] at argv_addr points to (a recorded launch), as a dict."""
    ptr = ctypes.c_void_p.from_address(argv_addr).value
    raw = ctypes.string_at(ptr, cuda_build.PARAMS.size)
    return dict(zip(cuda_build.PARAM_FIELDS, cuda_build.PARAMS.unpack(raw)))


def compile_failures(nvcc, jobs) -> list:
    """Run ``nvcc(*job)`` (-> (command, CompletedProcess)) for every job, four at a time; the
    command and the end of stderr of each that failed."""
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda j: nvcc(*j), jobs))
    return [f"{' '.join(c)}\n{r.stderr[-2000:]}" for c, r in results if r.returncode]

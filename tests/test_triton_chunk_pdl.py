"""Programmatic dependent launch (PDL) in triton-chunk's two kernels (the ``PDL`` constexpr).

No GPU needed: both kernels compiled for sm_90 (``triton.compile`` with ``GPUTarget("cuda",
90, 32)``, the arguments triton_chunk.launch passes) in a subprocess in Triton's JIT mode, for
a dense and a pool call.  Without PDL each kernel compiles to the PTX of its source with the
PDL code taken out (:func:`without_pdl`, debug line info aside) and has no grid dependency
instruction;
with it, each executes ``griddepcontrol.wait`` before its first global load or store, then
``griddepcontrol.launch_dependents``, and both launches carry Triton's ``launch_pdl``.  The
refusals (CPU and the interpreter; the backends that take no PDL, with their reasons) and the
argument's checks run here too; a GPU run compares results with ``pdl="off"``.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gdnzoo
from conftest import HAS_CUDA
from helpers import ptx_code
from gdnzoo import registry
from gdnzoo.backends._triton_launch import compile_offline
from gdnzoo.inputs import make_prefill_inputs

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "backends" / "_triton_chunk_kernel.py"
KERNELS = ("chunk_prep_kernel", "chunk_state_kernel")


def without_pdl(src: str) -> str:
    """The kernels' source with their PDL code taken out (the ``if PDL:`` blocks of two
    ``gdc_*`` calls and the ``PDL`` parameters): what PDL 0 must compile to."""
    block = r"\n    if PDL:\n        gdc_wait\(\).*\n        gdc_launch_dependents\(\).*\n"
    out, n = re.subn(block, "\n", src)
    out, m = re.subn(r" PDL: tl\.constexpr = 0,", "", out)
    assert n == m == len(KERNELS), (n, m)
    return out


class _Recorder:
    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return record


def _launch_args(kw):
    """{kernel name: (args, kwargs)} that triton_chunk.launch passes for ``kw``."""
    import gdnzoo.backends._triton_chunk_kernel as tk
    from gdnzoo.backends import triton_chunk
    rec = {n: _Recorder() for n in KERNELS}
    saved = {n: getattr(tk, n) for n in KERNELS}
    for n in KERNELS:
        setattr(tk, n, rec[n])
    try:
        triton_chunk.launch(**kw)
    finally:
        for n in KERNELS:
            setattr(tk, n, saved[n])
    return {n: (r.args, r.kwargs) for n, r in rec.items()}


def _calls():
    """(case, launch keywords): dense and pool without V_AHEAD, and "ahead", dense with it."""
    for name, pool, ahead in (("dense", False, 0), ("pool", True, 0), ("ahead", False, 1)):
        x = make_prefill_inputs([130, 64, 7], H=2, HV=4, K=128, V=128)
        kw = dict(q=x.q, k=x.k, v=x.v, state=x.state, A_log=x.A_log, a=x.a, dt_bias=x.dt_bias,
                  b=x.b, cu_seqlens=x.cu_seqlens, scale=x.scale, out=torch.empty_like(x.v),
                  new_state=x.state, use_qk_l2norm=True,
                  config=dict(block_v=16, v_ahead=ahead))
        if pool:
            kw["state_indices"] = torch.tensor([2, -1, 0], dtype=torch.int32)
        yield name, kw


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_all(before_path, out_path):
    """The subprocess's work (JIT mode): each case's two kernels at PDL 0 and 1, and the
    kernels at ``before_path`` as PDL 0 calls them; JSON to ``out_path``."""
    now, before = _module(KERNEL, "chunk_now"), _module(before_path, "chunk_before")
    result = {}
    for name, kw in _calls():
        plain, with_pdl = _launch_args(kw), _launch_args(dict(kw, pdl=True))
        for kern in KERNELS:
            args, kwargs = plain[kern]
            assert "PDL" not in kwargs and "launch_pdl" not in kwargs
            pargs, pkwargs = with_pdl[kern]
            k1 = compile_offline(getattr(now, kern), pargs, pkwargs)
            result[f"{name}/{kern}"] = dict(
                now0=compile_offline(getattr(now, kern), args, kwargs).asm["ptx"],
                before=compile_offline(getattr(before, kern), args, kwargs).asm["ptx"],
                now1=k1.asm["ptx"], launch_pdl=bool(k1.metadata.launch_pdl),
                options=sorted(k for k in pkwargs if k in ("PDL", "launch_pdl")))
    Path(out_path).write_text(json.dumps(result))


def _memory_ops(ptx):
    return re.findall(r"^\s*(?:@!?%p\d+\s+)?(ld\.global|st\.global|griddepcontrol\.\w+)", ptx,
                      re.M)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    pytest.importorskip("triton")
    d = tmp_path_factory.mktemp("chunk_pdl")
    before = d / "before.py"
    before.write_text(without_pdl(KERNEL.read_text()))
    env = dict(os.environ, TRITON_INTERPRET="0")    # JIT mode (conftest keeps a set value)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    out = d / "ptx.json"
    r = subprocess.run([sys.executable, __file__, str(before), str(out)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", [f"{c}/{k}" for c in ("dense", "pool", "ahead")
                                  for k in KERNELS])
def test_without_pdl_the_kernels_are_as_before(compiled, case):
    got = compiled[case]
    assert ptx_code(got["now0"]) == ptx_code(got["before"])
    assert not [op for op in _memory_ops(got["now0"]) if op.startswith("griddepcontrol")]


@pytest.mark.parametrize("case", [f"{c}/{k}" for c in ("dense", "pool", "ahead")
                                  for k in KERNELS])
def test_with_pdl_each_kernel_waits_before_any_memory_access(compiled, case):
    got = compiled[case]
    ops = _memory_ops(got["now1"])
    assert ops[:2] == ["griddepcontrol.wait", "griddepcontrol.launch_dependents"], ops[:4]
    assert ops.count("griddepcontrol.wait") == 1 and len(ops) > 2
    assert got["launch_pdl"] and got["options"] == ["PDL", "launch_pdl"]


# ------------------------------------------------------------------ the argument and who serves it

def _x():
    return make_prefill_inputs([5, 0, 70], H=2, HV=4, K=64, V=64)


@pytest.mark.parametrize("bad,exc", [(3, TypeError), ("fast", ValueError), (True, TypeError)])
def test_pdl_is_checked_before_anything_runs(bad, exc):
    x = _x()
    before = x.state.clone()
    for _ in range(2):                                     # cold, then after a valid call
        with pytest.raises(exc, match="pdl"):
            gdnzoo.prefill(*x.args(), use_qk_l2norm=True, pdl=bad)
        assert torch.equal(x.state, before)
        gdnzoo.prefill(*x.args(), new_state=torch.empty_like(x.state), use_qk_l2norm=True)


def test_who_serves_pdl():
    served = {n for n in registry.names("prefill")
              if registry.spec(n, "prefill").features.get("pdl") is True}
    assert served == {"triton-chunk", "triton-chunk-bf16", "cuda-chunk", "cuda-chunk-bf16"}
    for n in set(registry.names("prefill")) - served:
        why = registry.spec(n, "prefill").features.get("pdl")
        assert isinstance(why, str) and len(why) > 20, n


@pytest.mark.skipif(HAS_CUDA, reason="the refusal on a machine without a CUDA GPU")
def test_pdl_needs_a_cuda_gpu():
    x = _x()
    with pytest.raises(ValueError, match="programmatic dependent launch needs a CUDA GPU"):
        gdnzoo.prefill(*x.args(), use_qk_l2norm=True, pdl="wait", algo="triton-chunk")
    with pytest.raises(ValueError, match="does not declare pdl|PyTorch eager"):
        gdnzoo.prefill(*x.args(), use_qk_l2norm=True, pdl="wait", algo="pt-reference")
    # the automatic choice drops a PDL request nobody here serves (always correct) and says so
    sel = gdnzoo.select(*x.args(), op="prefill", use_qk_l2norm=True, pdl="wait")
    assert sel.problem.pdl == "" and "launched without it" in sel.reason


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.is_available() and
                    torch.cuda.get_device_capability() < (9, 0), reason="needs an SM90+ GPU")
@pytest.mark.parametrize("algo", ["triton-chunk", "triton-chunk-bf16", "cuda-chunk",
                                  "cuda-chunk-bf16"])
@pytest.mark.parametrize("level", ["wait", "early"])
def test_pdl_results_are_bit_identical_to_off(algo, level):
    if algo == "cuda-chunk-bf16" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda-chunk-bf16's chain kernel is sm_90a only")
    x = make_prefill_inputs([300, 0, 64, 1000], H=4, HV=8, K=128, V=128, device="cuda")
    res = {}
    for pdl in ("off", level):
        ns = torch.empty_like(x.state)
        out, _ = gdnzoo.prefill(*x.args(), new_state=ns, use_qk_l2norm=True, algo=algo,
                                pdl=pdl)
        torch.cuda.synchronize()
        res[pdl] = (out.clone(), ns.clone())
    assert torch.equal(res["off"][0], res[level][0]) and torch.equal(res["off"][1],
                                                                      res[level][1])


if __name__ == "__main__":
    compile_all(sys.argv[1], sys.argv[2])

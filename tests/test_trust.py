"""Trust: what the package says about itself holds.

* pt-compiled is available only where inductor has a working C++ compiler (CPU), decided
  without compiling or importing inductor; a compile that still fails raises an error naming
  pt-compiled and the cause, and ``gdnzoo run`` says so without a traceback.
* The engine adapters raise TypeError naming the engine's own argument when a tensor argument
  is not a tensor, and name every argument as the engine does; cold (nothing memoized) and
  right after a valid call, with every argument bit-identical.
* The vLLM verify adapter says what it refuses in a cu_seqlens of one length but another T.
* The README's backend table lists every decode backend the registry has.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gdnzoo import registry
from gdnzoo.integrations import sglang as sg, vllm as vl
from test_bad_inputs import memo  # noqa: F401  (decode's memo emptied, both layers)
from helpers import served_twice
from test_integrations import make_packed, nan_out
from test_integrations_verify import _sglang_buffer, make_call, slots

ROOT = Path(__file__).resolve().parent.parent
ENGINES = {"vllm": vl, "sglang": sg}


def _gdnzoo(argv, env=None, cwd=None):
    """The installed ``gdnzoo`` command (this Python's), in a fresh process."""
    e = dict(os.environ, **(env or {}))
    exe = Path(sys.executable).with_name("gdnzoo")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gdnzoo"]
    return subprocess.run(cmd + argv, capture_output=True, text=True, env=e, cwd=cwd,
                          timeout=600)


# ------------------------------------------------------------------ pt-compiled: availability

RUN = ["run", "--algo", "pt-compiled", "--batch", "1", "--heads", "1,2", "--dim", "16",
       "--device", "cpu", "--iters", "1"]


def test_pt_compiled_without_a_cpp_compiler_is_unavailable_with_the_reason(tmp_path):
    """$CXX names no compiler: `gdnzoo list --device cpu` says pt-compiled is unavailable and
    why (both operations), and `gdnzoo run --algo pt-compiled` refuses with that reason (exit
    2), on a machine with a GPU too (inductor's CUDA code needs no C++ compiler, its CPU code
    does)."""
    env = {"CXX": str(tmp_path / "no-such-g++")}
    r = _gdnzoo(["list", "--device", "cpu"], env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("pt-compiled ")]
    assert len(rows) == 2, r.stdout
    for row in rows:
        assert row.split()[1] == "no", row
        assert "no working C++ compiler" in row and "no-such-g++" in row, row
    r = _gdnzoo(RUN, env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no working C++ compiler" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_pt_compiled_availability_compiles_nothing():
    """Deciding availability runs the compiler's --version only: inductor is not imported (it
    costs seconds), and the answer is remembered."""
    code = ("import sys\n"
            "from gdnzoo import registry\n"
            "from gdnzoo.backends import pt_compiled\n"
            "print(registry.availability('pt-compiled', 'cpu')[0])\n"
            "print('torch._inductor' in sys.modules)\n"
            "pt_compiled.cpp_compiler()\n"
            "print(pt_compiled.cpp_compiler.cache_info().misses)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False", "1"], r.stdout


def test_pt_compiled_compile_failure_names_pt_compiled_and_the_cause(tmp_path):
    """A compiler that answers --version but cannot compile: pt-compiled is available, and its
    first call raises RuntimeError naming pt-compiled and the compiler's message; `gdnzoo run`
    prints it as an error (exit 1), no traceback."""
    cxx = tmp_path / "cxx"
    cxx.write_text('#!/bin/sh\n[ "$1" = "--version" ] && { echo "cxx 1.0"; exit 0; }\n'
                   'echo "cxx: this compiler compiles nothing" >&2\nexit 1\n')
    cxx.chmod(0o755)
    env = {"CXX": str(cxx), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    r = _gdnzoo(RUN, env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error: pt-compiled: torch.compile could not compile" in r.stderr, r.stderr
    assert "this compiler compiles nothing" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_availability_is_per_device(monkeypatch):
    """On a machine with a GPU, what a backend needs differs by the call's device: pt-compiled
    on CPU needs a C++ compiler and on CUDA only Triton; a Triton kernel on CPU needs the
    interpreter.  `gdnzoo list --device cpu` says so there instead of the GPU's answer."""
    from gdnzoo.backends import _triton_launch as tlaunch, pt_compiled
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pt_compiled, "cpp_compiler", lambda: (None, "no working C++ compiler (x)"))
    assert pt_compiled.available("cpu") == (False, "no working C++ compiler (x)")
    assert pt_compiled.available("cuda")[0]
    monkeypatch.setattr(tlaunch, "interpreter_on", lambda: False)
    ok, why = registry.backend_module("fla-recurrent").available("cpu")
    assert not ok and "TRITON_INTERPRET=1" in why
    ok, why = registry.backend_module("triton-commit", "commit").available("cpu")
    assert not ok and "TRITON_INTERPRET=1" in why
    monkeypatch.setattr(tlaunch, "interpreter_on", lambda: True)
    assert registry.backend_module("fla-recurrent").available("cpu")[0]


@pytest.mark.parametrize("text,want", [("3.0.0", (3, 0, 0)), ("3.5.1", (3, 5, 1)),
                                       ("3.6.0+git1a2b3c", (3, 6, 0)), ("3.10.0rc1", (3, 10, 0))])
def test_a_triton_older_than_the_kernels_is_unavailable_with_the_reason(monkeypatch, text, want):
    """torch 2.4 pins Triton 3.0, which lacks what the kernels use (they failed at import):
    every Triton backend says which Triton it needs instead."""
    import importlib.metadata
    from gdnzoo.backends import _triton_launch as tlaunch
    monkeypatch.setattr(importlib.metadata, "version", lambda name: text)
    monkeypatch.setattr(tlaunch, "interpreter_on", lambda: True)
    tlaunch.triton_version.cache_clear()
    try:
        assert tlaunch.triton_version() == want
        for name, op in (("fla-recurrent", "decode"), ("fla-tma", "decode"),
                         ("triton-chunk", "prefill"), ("triton-commit", "commit")):
            ok, why = registry.backend_module(name, op).available("cpu")
            assert ok == (want >= (3, 6)), (name, why)
            if not ok:
                assert "needs triton >= 3.6" in why and "found " + text in why, why
    finally:
        tlaunch.triton_version.cache_clear()


def test_a_torch_without_substitute_in_graph_keeps_dynamo_working(monkeypatch):
    """Before torch 2.5 dynamo has no substitute_in_graph: registering the public functions'
    substitutes does nothing instead of raising inside torch._dynamo's import (which left that
    module half made and every torch.compile of the process broken, torch 2.4)."""
    import torch._dynamo
    from gdnzoo import compiling
    entry = [lambda: None, lambda: None, False]
    monkeypatch.delattr(torch._dynamo, "substitute_in_graph")
    monkeypatch.setattr(compiling, "_SUBSTITUTES", [entry])
    compiling._substitute_all()
    assert entry[2] is False


def test_pt_compiled_is_available_here_with_a_compiler():
    """This machine has g++: pt-compiled serves CPU problems (the suite compiles with it)."""
    from gdnzoo.backends import pt_compiled
    cxx, why = pt_compiled.cpp_compiler()
    if cxx is None:
        pytest.skip(why)
    assert registry.availability("pt-compiled", "cpu")[0]


# ------------------------------------------------------------------ the CLI: what it reports

SMALL = ["--batch", "1", "--heads", "1,2", "--dim", "16", "--device", "cpu"]


def test_a_pdl_request_in_the_environment_breaks_no_command(tmp_path):
    """GDNZOO_PDL=wait where no backend can launch with PDL (CPU): `gdnzoo run` takes the
    automatic choice, which runs without it; bench, check and tune --shapes, which name each
    backend (and a named backend that cannot launch with PDL is refused), say they do not apply
    it and call every backend without it: no ERROR, exit 0."""
    env = {"GDNZOO_PDL": "wait"}
    r = _gdnzoo(["run", *SMALL, "--iters", "1"], env)
    assert r.returncode == 0 and "PASS" in r.stdout and "Traceback" not in r.stderr, \
        r.stdout + r.stderr
    r = _gdnzoo(["bench", "--algo", "pt-reference", *SMALL, "--no-plots", "--quiet",
                 "--out", str(tmp_path / "b")], env)
    assert r.returncode == 0 and "ERROR" not in r.stdout, r.stdout + r.stderr
    assert "GDNZOO_PDL=wait is not applied by gdnzoo bench" in r.stdout, r.stdout
    r = _gdnzoo(["check", "--algo", "pt-reference", "--device", "cpu"], env)
    assert r.returncode == 0 and "PASS  pt-reference" in r.stdout, r.stdout + r.stderr
    assert "GDNZOO_PDL=wait is not applied by gdnzoo check" in r.stdout, r.stdout
    r = _gdnzoo(["tune", "--shapes", "--algo", "cuda-v4", "--out", str(tmp_path / "t")], env)
    assert "GDNZOO_PDL=wait is not applied by gdnzoo tune --shapes" in r.stdout, r.stdout


def test_bench_with_only_gpu_clocks_on_the_cpu_says_it_checked(tmp_path):
    """`--timing kernel` where there is no CUDA device: each entry is checked, not timed, and
    the console says so (not "host clock only", which was not asked for)."""
    r = _gdnzoo(["bench", "--timing", "kernel", "--algo", "pt-reference", *SMALL, "--no-plots",
                 "--quiet", "--out", str(tmp_path / "b")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CHECKED, not timed" in r.stdout and "pt-reference (1 cell)" in r.stdout, r.stdout
    assert "host clock only" not in r.stdout, r.stdout


def test_check_with_nothing_checked_fails():
    """Every backend named skipped (cuda-v4 on the CPU): not a pass, exit 1, and says why."""
    r = _gdnzoo(["check", "--algo", "cuda-v4", "--device", "cpu"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "SKIP  cuda-v4" in r.stdout and "nothing was checked" in r.stderr, r.stdout + r.stderr


def test_a_backend_module_that_fails_to_load_is_an_error(tmp_path):
    """A registered backend whose module raises on import: `gdnzoo list` shows why, bench and
    check report ERROR and exit 1 (a broken install or a new backend's bug is no skip)."""
    import yaml
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "gdnzoo_broken_backend.py").write_text('raise ImportError("broken on purpose")\n')
    reg = yaml.safe_load(registry.registry_path().read_text())
    reg["operations"]["decode"]["backends"].append(dict(
        name="pt-broken", entry="gdnzoo_broken_backend:run", language="python",
        devices=["cpu", "cuda"], state_dtypes=["fp32", "bf16"], notes="broken by a test"))
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(reg, sort_keys=False))
    env = {"GDNZOO_REGISTRY": str(path),
           "PYTHONPATH": os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")])}
    r = _gdnzoo(["list", "--device", "cpu", "--op", "decode"], env)
    assert r.returncode == 0 and "broken on purpose" in r.stdout, r.stdout + r.stderr
    r = _gdnzoo(["check", "--algo", "pt-broken,pt-reference", "--device", "cpu"], env)
    assert r.returncode == 1 and "ERROR pt-broken" in r.stdout, r.stdout + r.stderr
    r = _gdnzoo(["bench", "--algo", "pt-broken,pt-reference", *SMALL, "--no-plots", "--quiet",
                 "--out", str(tmp_path / "b")], env)
    assert r.returncode == 1 and "broken on purpose" in r.stdout, r.stdout + r.stderr


def test_pack_refuses_a_bad_out(tmp_path):
    """`gdnzoo pack --out` an existing file or a folder that cannot be made: exit 2, said in
    one line, no traceback."""
    f = tmp_path / "a-file"
    f.write_text("")
    for out in (f, f / "below"):
        r = _gdnzoo(["pack", "--algo", "pt-reference", "--out", str(out)])
        assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr, \
            r.stdout + r.stderr


# ------------------------------------------------------------------ adapters: type errors

def _bits(xs):
    return [x.detach().contiguous().view(torch.uint8).clone() for x in xs]


def _refused(call, storages, exc):
    """(type, message) of ``call()``'s refusal; every storage bit-identical after it."""
    before = _bits(storages)
    with pytest.raises(exc) as ei:
        call()
    assert all(torch.equal(a, b) for a, b in zip(before, _bits(storages))), \
        "a refused call changed an argument"
    return type(ei.value), str(ei.value)


def _cold_and_warm(bad, good, storages, exc, name):
    """``bad()`` refused naming ``name`` cold, then the same right after ``good()``."""
    cold = _refused(bad, storages, exc)
    assert cold[0] is exc and cold[1].startswith(f"{name}: "), cold
    served_twice(good)
    assert _refused(bad, storages, exc) == cold


NOT_TENSORS = ("list", "None", "numpy")
PACKED_ARGS = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
               "ssm_state_indices", "use_qk_l2norm_in_kernel")


def _not_tensor(x, what):
    if what == "numpy":
        return np.zeros(tuple(x.shape), dtype=np.float32)
    return None if what == "None" else [1, 2]


def _packed(engine, name, mutate):
    c = make_packed(engine, device="cpu")
    out = nan_out(c)
    good = list(c.args(out, False))
    bad = list(good)
    i = PACKED_ARGS.index(name)
    bad[i] = mutate(good[i])
    fn = ENGINES[engine].packed_decode
    return (lambda: fn(*bad, algo="pt-reference"), lambda: fn(*good, algo="pt-reference"),
            [c.buf, c.rows, c.ab, c.A_log, c.dt_bias, c.idx, out])


@pytest.mark.parametrize("what", NOT_TENSORS)
@pytest.mark.parametrize("name", ["mixed_qkv", "a", "b", "A_log", "dt_bias", "initial_state",
                                  "out", "ssm_state_indices"])
@pytest.mark.parametrize("engine", ENGINES)
def test_packed_decode_non_tensor_names_the_argument(engine, name, what, memo):
    """The issue's reproduction, packed_decode([1, 2], ...), for every tensor argument."""
    bad, good, storages = _packed(engine, name, lambda x: _not_tensor(x, what))
    _cold_and_warm(bad, good, storages, TypeError, name)


@pytest.mark.parametrize("name,mutate", [
    ("scale", lambda x: "0.1"), ("use_qk_l2norm_in_kernel", lambda x: "yes"),
    ("ssm_state_indices", lambda x: x.float()), ("initial_state", lambda x: x.half()),
    ("mixed_qkv", lambda x: x.float())],
    ids=["scale", "use_qk_l2norm_in_kernel", "ssm_state_indices", "initial_state",
         "mixed_qkv"])
@pytest.mark.parametrize("engine", ENGINES)
def test_packed_decode_names_arguments_as_the_engine(engine, name, mutate, memo):
    """gdnzoo's own checks, reported under the engine's names (not state_indices,
    use_qk_l2norm, state or q)."""
    bad, good, storages = _packed(engine, name, mutate)
    _cold_and_warm(bad, good, storages, TypeError, name)


VLLM_VERIFY = ("A_log", "a", "b", "dt_bias", "q", "k", "v", "initial_state", "cu_seqlens",
               "ssm_state_indices", "num_accepted_tokens")


@pytest.mark.parametrize("name", VLLM_VERIFY + ("scale",))
def test_vllm_verify_non_tensor_names_the_argument(name, memo):
    c = make_call(seed=80, device="cpu")
    idx, acc = slots(c, 6, 2), torch.ones(c.N, dtype=torch.int32)
    good = dict(A_log=c.x.A_log, a=c.a, b=c.b, dt_bias=c.x.dt_bias, q=c.q, k=c.k, v=c.v,
                initial_state=c.pool, cu_seqlens=c.cu, ssm_state_indices=idx,
                num_accepted_tokens=acc, algo="pt-reference")
    bad = dict(good, **{name: "0.1" if name == "scale" else [0, 1]})
    fn = vl.fused_sigmoid_gating_delta_rule_update
    _cold_and_warm(lambda: fn(**bad), lambda: fn(**good), [c.buf, c.rows, c.ab, idx, acc],
                   TypeError, name)


SGLANG_VERIFY = ("A_log", "a", "dt_bias", "q", "k", "v", "b", "initial_state_source",
                 "initial_state_indices", "cu_seqlens", "intermediate_states_buffer",
                 "intermediate_state_indices", "retrieve_parent_token", "replayssm_g")


@pytest.mark.parametrize("name", SGLANG_VERIFY + ("scale",))
def test_sglang_verify_non_tensor_names_the_argument(name, memo):
    c = make_call(seed=81, device="cpu")
    idx = slots(c, 13, 1)
    ibuf, inter = _sglang_buffer(c, c.N)
    rows = torch.arange(c.N, dtype=torch.int32)
    good = dict(A_log=c.x.A_log, a=c.a, dt_bias=c.x.dt_bias, softplus_beta=1.0,
                softplus_threshold=20.0, q=c.q, k=c.k, v=c.v, b=c.b,
                initial_state_source=c.pool, initial_state_indices=idx, cu_seqlens=c.cu,
                intermediate_states_buffer=inter, intermediate_state_indices=rows,
                disable_state_update=True, algo="pt-reference")
    bad = dict(good, **{name: "0.1" if name == "scale" else [0, 1]})
    fn = sg.fused_sigmoid_gating_delta_rule_update
    _cold_and_warm(lambda: fn(**bad), lambda: fn(**good), [c.buf, c.rows, c.ab, idx, ibuf],
                   TypeError, name)


@pytest.mark.parametrize("name,value", [
    ("dst", [0]), ("src", None), ("dst_indices_raw", [0, 1]), ("step_indices_raw", [1, 0]),
    ("src_indices_raw", [0, 1]), ("dst_indices_raw", "float")])
def test_sglang_commit_names_the_argument(name, value):
    gen = torch.Generator().manual_seed(82)
    dst, src = torch.randn(2, 5, 2, 8, 16, generator=gen), torch.randn(2, 3, 2, 2, 8, 16,
                                                                      generator=gen)
    args = dict(dst=dst, src=src, dst_indices_raw=torch.tensor([3, 1]),
                step_indices_raw=torch.tensor([1, 0]), src_indices_raw=torch.tensor([2, 0]))
    good = dict(args)
    bad = dict(args, **{name: args[name].float() if value == "float" else value})
    fn = sg.fused_mamba_state_scatter_with_mask
    for _ in range(2):                         # cold, then right after a valid call
        assert _refused(lambda: fn(**bad), [dst, src], TypeError)[1].startswith(f"{name}: ")
        fn(**good)


def test_vllm_verify_says_what_it_refuses_in_a_uniform_batch():
    """cu_seqlens of one length (3) while ssm_state_indices [N, 4] says T = 4: refused for
    that, not called ragged."""
    c = make_call(N=3, T=3, seed=83, device="cpu")
    idx = torch.arange(1, 13, dtype=torch.int32).view(3, 4)
    with pytest.raises(ValueError, match=r"^cu_seqlens: ") as ei:
        vl.fused_sigmoid_gating_delta_rule_update(
            A_log=c.x.A_log, a=c.a, b=c.b, dt_bias=c.x.dt_bias, q=c.q, k=c.k, v=c.v,
            initial_state=c.pool, cu_seqlens=c.cu, ssm_state_indices=idx, algo="pt-reference")
    msg = str(ei.value)
    assert "ragged" not in msg and "T=4 (the width of ssm_state_indices" in msg, msg


# ------------------------------------------------------------------ README

def test_readme_backend_table_lists_every_decode_backend():
    text = (ROOT / "README.md").read_text()
    table = text.split("## Backends", 1)[1].split("\n\n", 2)[1]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert listed == registry.names("decode"), listed

"""The peer backends' availability and limits, `gdnzoo pack`, `gdnzoo check` and its rule (CPU)."""
import argparse
import ast
import importlib.util
import inspect
import json

import pytest
import torch

import gdnzoo
from gdnzoo import registry
from gdnzoo.gate import compare
from gdnzoo.inputs import make_inputs, make_problem
from gdnzoo.reference import reference_decode


_problem = make_problem         # the contest geometry on an sm_90 GPU


# ------------------------------------------------------------------ availability and limits

@pytest.mark.parametrize("name,pkg", [("fi-baseline", "flashinfer"), ("fla-upstream", "fla")])
def test_available_names_the_missing_package(monkeypatch, name, pkg):
    mod = registry.backend_module(name)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == pkg else real(n, *a))
    ok, why = mod.available("cuda")
    assert not ok and pkg in why


@pytest.mark.parametrize("name", ["fi-baseline", "fla-upstream"])
def test_available_without_gpu_says_so(monkeypatch, name):
    mod = registry.backend_module(name)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = mod.available("cuda")
    assert not ok and "CUDA" in why


def test_fi_baseline_unavailable_when_the_cute_dsl_lacks_its_compiler(monkeypatch, tmp_path):
    """``import cutlass`` works without the DSL's per-CUDA compiler library (a separate wheel),
    and then every FlashInfer GDN call fails to compile ("No CTK flavor installed"): the backend
    is unavailable and says why, rather than chosen and failing."""
    import importlib.machinery
    mod = registry.backend_module("fi-baseline")
    libs = tmp_path / "cutlass" / "_mlir" / "_mlir_libs"
    libs.mkdir(parents=True)
    (libs / "__init__.py").write_text("")
    fake = importlib.machinery.ModuleSpec("cutlass", None, is_package=True)
    fake.submodule_search_locations = [str(tmp_path / "cutlass")]
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: fake if n == "cutlass" else object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok, why = mod.available("cuda")
    assert not ok and "compiler library" in why and "cu13" in why
    (libs / "_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    assert mod.available("cuda")[0]


def test_importing_peer_modules_imports_no_optional_package():
    import subprocess
    import sys
    code = ("import sys, gdnzoo.backends.fi_baseline as f, gdnzoo.backends.fla_upstream as u; "
            "f.available(\"cuda\"); u.available(\"cuda\"); "
            "bad = [m for m in ('flashinfer', 'fla', 'triton', 'cutlass') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("kw,word", [
    (dict(cc=(8, 0)), "SM90"), (dict(io_dtype=torch.float16), "bf16"), (dict(K=64, V=64), "128"),
    (dict(V=256), "128"), (dict(device="cpu", cc=None), "CUDA")])
def test_fi_baseline_refuses_with_reason(kw, word):
    ok, why = registry.backend_module("fi-baseline").supports(_problem(**kw))
    assert not ok and word in why


@pytest.mark.parametrize("kw", [dict(), dict(state_dtype=torch.bfloat16), dict(B=512, cc=(10, 0)),
                                dict(H=16, HV=64, use_qk_l2norm=True, inplace=False)])
def test_fi_baseline_accepts_its_shapes(kw):
    assert registry.backend_module("fi-baseline").supports(_problem(**kw)) == (True, "")


def test_fla_upstream_limits():
    mod = registry.backend_module("fla-upstream")
    assert mod.supports(_problem(T=3, H=16, HV=32, K=64, V=64, io_dtype=torch.float16))[0]
    ok, why = mod.supports(_problem(device="cpu", cc=None))
    assert not ok and "CUDA" in why


def test_fla_path_switch(monkeypatch):
    mod = registry.backend_module("fla-upstream")
    assert mod.path() == "kernel"
    monkeypatch.setenv(mod.PATH_ENV, "api")
    assert mod.path() == "api"
    monkeypatch.setenv(mod.PATH_ENV, "fast")
    with pytest.raises(ValueError, match="GDNZOO_FLA_PATH"):
        mod.path()


# ------------------------------------------------------------------ the comparison rule

def _t(*vals, dtype=torch.float32):
    return torch.tensor(vals, dtype=dtype)


def test_rule_abs_only_passes():      # |d| = 0.05 > atol but relative 0.5% < rtol
    v = compare(_t(10.05, 1.0), _t(10.0, 1.0))
    assert (v.ok, v.max_abs, v.max_rel, v.n_bad) == (True, pytest.approx(0.05, rel=1e-3),
                                                      pytest.approx(0.005, rel=1e-3), 0)


def test_rule_rel_only_passes():      # relative 100% but |d| = 1e-4 < atol
    v = compare(_t(2e-4, 1.0), _t(1e-4, 1.0))
    assert v.ok and v.n_bad == 0 and v.max_rel == pytest.approx(1.0, rel=1e-3)


def test_rule_both_fails_and_counts():
    v = compare(_t(1.05, 1.0, -3.0), _t(1.0, 1.0, -3.1))
    assert not v.ok and v.n_bad == 2 and v.max_abs == pytest.approx(0.1, rel=1e-3)
    v = compare(_t(1.05, 1.0), _t(1.0, 1.0))
    assert "1/2 elements" in v.reason


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_rule_non_finite_fails(bad):
    v = compare(_t(bad, 1.0), _t(1.0, 1.0))
    assert not v.ok and v.n_bad == -1


def test_rule_dtype_and_shape():
    ref = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert not compare(torch.zeros(2, 3), ref, dtype=torch.bfloat16).ok
    assert "dtype" in compare(torch.zeros(2, 3), ref, dtype=torch.bfloat16).reason
    assert not compare(torch.zeros(3, 2, dtype=torch.bfloat16), ref).ok
    assert "shape" in compare(torch.zeros(6, dtype=torch.bfloat16), ref).reason
    assert compare(torch.zeros(2, 3, dtype=torch.bfloat16), ref, dtype=torch.bfloat16).ok


# ------------------------------------------------------------------ check

def _workloads(n=3):
    from gdnzoo.bench.check import _reference
    out = []
    for i, B in enumerate((1, 4, 8)[:n]):
        x = make_inputs(B=B, seed=i)
        out.append((i, B, x) + _reference(x, "cpu"))
    return out


def test_check_backend_passes_reference():
    from gdnzoo.bench.check import check_backend
    status, reason, rows = check_backend("pt-reference", _workloads(), "cpu")
    assert status == "PASS" and len(rows) == 3 and all(r["ok"] for r in rows)


@pytest.mark.parametrize("defect,word", [("scale", "out:"), ("state", "new_state:"),
                                         ("mutate", "state: modified"), ("raise", "raised")])
def test_check_backend_catches_a_broken_backend(monkeypatch, defect, word):
    from gdnzoo.bench.check import check_backend
    good = gdnzoo.get("pt-reference")

    def broken(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
               use_qk_l2norm=False):
        if defect == "raise":
            raise RuntimeError("kernel exploded")
        got = good(q, k, v, state, A_log, a, dt_bias, b, scale, out=out, new_state=new_state)
        if defect == "scale":
            out.mul_(3.0)
        elif defect == "state":
            new_state[0, 0, 0, :4] += 1.0
        elif defect == "mutate":
            state[0, 0, 0, 0] += 1.0
        return got
    monkeypatch.setattr(gdnzoo, "get", lambda name, op="decode": broken)
    status, reason, rows = check_backend("pt-reference", _workloads(2), "cpu")
    assert status == "FAIL" and word in reason


def test_cmd_check_exit_codes_and_table(capsys):
    from gdnzoo.bench.check import add_check_args, cmd_check
    p = argparse.ArgumentParser()
    add_check_args(p)
    rc = cmd_check(p.parse_args(["--algo", "pt-reference,fi-baseline", "--device", "cpu"]))
    text = capsys.readouterr().out
    assert rc == 0
    assert "PASS  pt-reference   54/54" in text and "SKIP  fi-baseline" in text
    assert cmd_check(p.parse_args(["--algo", "no-such-backend", "--device", "cpu"])) == 2


# ------------------------------------------------------------------ pack

@pytest.fixture(scope="module")
def packed():
    from gdnzoo.bench.pack import build_solution
    return build_solution("pt-reference")


def test_pack_solution_schema(packed):
    from gdnzoo.bench.pack import DEFINITION, validate_with_fib
    sol = json.loads(json.dumps(packed))
    assert sol["definition"] == DEFINITION == "gdn_decode_qk4_v8_d128_k_last"
    spec = sol["spec"]
    assert spec["entry_point"] == "kernel.py::run" and spec["destination_passing_style"] is True
    assert spec["language"] == "python" and spec["target_hardware"]
    paths = [s["path"] for s in sol["sources"]]
    assert "kernel.py" in paths and len(paths) == len(set(paths))
    assert all(s["content"].strip() and not s["path"].startswith("/") and ".." not in s["path"]
               for s in sol["sources"])
    try:
        import flashinfer_bench.data  # noqa: F401
    except Exception:
        return
    assert validate_with_fib(sol).spec.entry_point == "kernel.py::run"


def test_pack_vendors_a_named_file_from_a_checkouts_root_too():
    """registry.yaml, which a vendored module names (gdnzoo.tables), lies beside the installed
    package in a wheel and at the root of a checkout: vendored either way (it was only from a
    wheel), so that a Solution and its name are the same from both."""
    from gdnzoo import registry
    from gdnzoo.bench.pack import build_solution
    got = {s["path"]: s["content"] for s in build_solution("cuda-v4")["sources"]}
    assert got["gdnzoo_vendored/registry.yaml"] == registry.registry_path().read_text()


def test_pack_vendors_instead_of_importing_gdnzoo(packed):
    for s in packed["sources"]:
        if s["path"].endswith(".py"):
            for node in ast.walk(ast.parse(s["content"])):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    assert not (node.module or "").startswith("gdnzoo"), s["path"]
                if isinstance(node, ast.Import):
                    assert not any(a.name.startswith("gdnzoo") for a in node.names), s["path"]


def test_packed_entry_matches_reference(packed, tmp_path):
    from gdnzoo.bench.pack import load_entry
    run = load_entry(packed, tmp_path)
    assert len(inspect.signature(run).parameters) == 11
    assert not run.__module__.startswith("gdnzoo.")
    x = make_inputs(B=3, seed=11)
    ref_out = torch.empty(3, 1, 8, 128, dtype=torch.bfloat16)
    ref_state = torch.empty_like(x.state)
    reference_decode(*x.args(), ref_out, ref_state, False)
    before = x.state.clone()
    output = torch.full_like(ref_out, float("nan"))
    new_state = torch.full_like(x.state, float("nan"))
    assert run(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, output, new_state) is None
    assert torch.equal(output, ref_out) and torch.equal(new_state, ref_state)
    assert torch.equal(x.state, before)
    with pytest.raises(TypeError, match="new_state"):
        run(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, output,
            new_state.to(torch.bfloat16))


def test_cmd_pack_writes_json(tmp_path, capsys):
    from gdnzoo.bench.pack import add_pack_args, cmd_pack
    p = argparse.ArgumentParser()
    add_pack_args(p)
    assert cmd_pack(p.parse_args(["--algo", "pt-reference", "--out", str(tmp_path)])) == 0
    sol = json.loads((tmp_path / "solution.json").read_text())
    assert sol["spec"]["entry_point"] == "kernel.py::run"
    assert cmd_pack(p.parse_args(["--algo", "nope", "--out", str(tmp_path / "x")])) == 2


def test_fib_definition_reference_matches_ours():
    from gdnzoo.bench.fib_definition import definition_dict
    d = definition_dict()
    assert list(d["inputs"]) == ["q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale"]
    assert list(d["outputs"]) == ["output", "new_state"]
    ns = {}
    exec(compile(d["reference"], "reference", "exec"), ns)
    x = make_inputs(B=2, seed=3)
    o, s = ns["run"](*x.args())
    ref_out = torch.empty(2, 1, 8, 128, dtype=torch.bfloat16)
    ref_state = torch.empty_like(x.state)
    reference_decode(*x.args(), ref_out, ref_state, False)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert compare(o, ref_out).ok and compare(s, ref_state, atol=1e-5, rtol=1e-5).ok


@pytest.mark.parametrize("name", registry.names())
def test_pack_every_backend(name, tmp_path):
    """Every registered backend packs; a tunable one's vendored copy reads the vendored launch
    tables and picks the rows the installed one picks."""
    import importlib

    from gdnzoo.bench.pack import build_solution, load_entry
    sol = build_solution(name)
    run = load_entry(sol, tmp_path)
    assert len(inspect.signature(run).parameters) == 11
    if name not in registry.tunables():
        return
    assert any(s["path"].endswith("backends/tables/h100.yaml") for s in sol["sources"])
    mine = registry.backend_module(name)
    pkg = run.__module__.rsplit(".", 1)[0]
    packed = importlib.import_module(f"{pkg}.gdnzoo_vendored.backends.{mine.__name__.rsplit('.', 1)[1]}")
    for B, sd in ((1, torch.float32), (48, torch.bfloat16), (512, torch.float32)):
        p = _problem(B=B, state_dtype=sd)
        for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200"):
            assert packed.launch_config(p, gpu) == mine.launch_config(p, gpu)

"""registry.yaml validation, availability reasons, and the selection precedence."""
import copy
import re

import pytest
import yaml

import gdnzoo
from gdnzoo import registry, tables
from gdnzoo.contract import Problem
from gdnzoo.inputs import make_inputs
import torch

# The public names (users know them from the published comparison): registered, whatever else is.
PUBLIC_NAMES = ["pt-reference", "pt-compiled", "fla-recurrent", "fla-tma", "cuda-v1", "cuda-v4",
                "fi-baseline", "fla-upstream"]


@pytest.fixture
def raw():
    return yaml.safe_load(registry.registry_path().read_text())


@pytest.fixture
def fake_registry(tmp_path, monkeypatch, raw):
    """Install a modified registry and a fake GPU; restore caches afterwards."""
    def install(data, gpu=("NVIDIA FAKE-GPU 80GB", (9, 0))):
        p = tmp_path / "registry.yaml"
        p.write_text(yaml.safe_dump(data))
        monkeypatch.setattr(registry, "registry_path", lambda: p)
        registry.reset_caches()
        monkeypatch.setattr(registry, "_cuda_info", lambda: gpu)
        monkeypatch.setattr(registry, "availability", _fake_availability)
        return p
    yield install
    registry.reset_caches()


def dec(data):
    """The decode section of a parsed registry file."""
    return data["operations"]["decode"]


def _fake_availability(name, device=None, op="decode"):
    # Only the two PyTorch backends "exist" on the fake GPU.
    return (name in ("pt-reference", "pt-compiled"), "fake: only pt-* here")


def cuda_problem(B=1, sd=torch.float32):
    return Problem(B=B, T=1, H=4, HV=8, K=128, V=128, state_dtype=sd, io_dtype=torch.bfloat16,
                   device="cuda", cc=(9, 0))


def test_the_public_names_are_registered_and_their_modules_derived():
    reg = registry.load_registry()
    assert set(PUBLIC_NAMES) <= set(registry.names())
    specs = [s for o in reg.ops.values() for s in o.backends.values()]
    for spec in specs:                           # in-tree: the module is named after the backend
        assert spec.entry == registry.default_entry(spec.name), spec.name
        assert spec.module_name == f"gdnzoo.backends.{spec.name.replace('-', '_')}"


def test_every_backend_module_is_registered():
    """backends/<name>.py is a backend unless its name starts with "_"."""
    import pkgutil

    import gdnzoo.backends
    mods = {m.name for m in pkgutil.iter_modules(gdnzoo.backends.__path__)}
    backends = {m for m in mods if not m.startswith("_")}
    assert backends == {registry.default_entry(n).split(":")[0].rsplit(".", 1)[1]
                        for op in registry.load_registry().ops for n in registry.names(op)}


def test_list_backends_reports_reasons():
    rows = {b.name: b for b in gdnzoo.list_backends(op="decode")}
    assert set(rows) == set(registry.names())
    assert rows["pt-reference"].available
    for b in rows.values():
        if not b.available:
            assert b.reason, f"{b.name} unavailable without a reason"


def test_import_touches_no_optional_package():
    import subprocess, sys
    code = ("import sys, gdnzoo; gdnzoo.list_backends; "
            "bad=[m for m in sys.modules if m.split('.')[0] in ('triton','cupy','flashinfer','fla','cutlass')]; "
            "import torch; init=torch.cuda.is_initialized(); print(bad, init); "
            "sys.exit(1 if bad or init else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("mutate,frag", [
    (lambda d: dec(d)["backends"][2].pop("language"), "'fla-recurrent': missing fields ['language']"),
    (lambda d: dec(d)["backends"][2].update(colour="red"), "'fla-recurrent': missing fields [], unknown fields ['colour']"),
    (lambda d: dec(d)["backends"][0].update(language="fortran"), "'pt-reference': language 'fortran'"),
    (lambda d: dec(d)["backends"][1].update(state_dtypes=["fp8"]), "'pt-compiled': state_dtypes"),
    (lambda d: dec(d)["backends"][3].update(min_cc="nine"), "'fla-tma': min_cc"),
    (lambda d: dec(d)["backends"][4].update(entry="nomodule"), "'cuda-v1': entry must be"),
    (lambda d: dec(d)["backends"].append(copy.deepcopy(dec(d)["backends"][0])), "'pt-reference': duplicate"),
    (lambda d: dec(d)["defaults"][0]["table"]["fp32"][0].update(backend="ghost"), "unknown backend 'ghost'"),
    (lambda d: dec(d)["defaults"][0].pop("provenance"), "defaults[0] (NVIDIA B200)"),
    (lambda d: dec(d)["fallback"]["cuda"].append("ghost"), "fallback[cuda]: unknown backend 'ghost'"),
    (lambda d: dec(d)["defaults"][0].update(table_dest={"fp32": [{"batch": [1, None], "backend": "x"}]}),
     "(NVIDIA B200) table_dest fp32: unknown backend 'x'"),
    (lambda d: dec(d)["defaults"][0].update(table_dest=["fp32"]), "table_dest: expected a mapping"),
])
def test_malformed_registry_names_the_entry(raw, mutate, frag):
    mutate(raw)
    with pytest.raises(registry.RegistryError) as ei:
        registry.parse_registry(raw)
    assert frag in str(ei.value)


def test_precedence_algo_env_table_fallback(fake_registry, raw, monkeypatch):
    dec(raw)["defaults"].append({"gpu": "FAKE-GPU", "provenance": {"how": "test"},
                            "table": {"fp32": [{"batch": [1, 8], "backend": "pt-compiled"},
                                               {"batch": [9, None], "backend": "fla-recurrent"}]}})
    fake_registry(raw)
    monkeypatch.delenv("ALGO", raising=False)
    p = cuda_problem(B=4)
    s = registry.select(p)
    assert (s.name, s.source) == ("pt-compiled", "default table FAKE-GPU")
    # the table's choice for B=16 is unavailable: auto-selection falls back and says why
    s = registry.select(cuda_problem(B=16))
    assert s.source == "fallback" and s.name == "pt-compiled"
    assert "fla-recurrent cannot serve" in s.reason
    # no bf16 range: fallback
    assert registry.select(cuda_problem(B=4, sd=torch.bfloat16)).source == "fallback"
    # ALGO env beats the table; algo= beats ALGO
    monkeypatch.setenv("ALGO", "pt-reference")
    assert registry.select(p).name == "pt-reference"
    assert registry.select(p).source == "ALGO env"
    s = registry.select(p, algo="pt-compiled")
    assert (s.name, s.source) == ("pt-compiled", "algo")


def test_destination_passing_uses_table_dest(fake_registry, raw, monkeypatch):
    import dataclasses
    dec(raw)["defaults"].append({"gpu": "FAKE-GPU", "provenance": {"how": "test"},
                            "table": {"fp32": [{"batch": [1, None], "backend": "pt-compiled"}],
                                      "bf16": [{"batch": [1, None], "backend": "pt-compiled"}]},
                            "table_dest": {"fp32": [{"batch": [1, 8], "backend": "pt-reference"},
                                                    {"batch": [9, None], "backend": "pt-compiled"}]}})
    fake_registry(raw)
    monkeypatch.delenv("ALGO", raising=False)
    dest = dataclasses.replace(cuda_problem(B=4), inplace=False)
    s = registry.select(dest)
    assert (s.name, s.source) == ("pt-reference", "default table FAKE-GPU")
    assert "destination passing" in s.reason
    assert registry.select(cuda_problem(B=4)).name == "pt-compiled"          # in place: table
    assert registry.select(dataclasses.replace(dest, B=16)).name == "pt-compiled"
    # no bf16 table_dest: destination passing takes the in-place table
    s = registry.select(dataclasses.replace(dest, state_dtype=torch.bfloat16))
    assert s.name == "pt-compiled" and "destination passing" not in s.reason


def test_several_tokens_use_table_tokens(fake_registry, raw, monkeypatch):
    import dataclasses
    dec(raw)["defaults"].append({"gpu": "FAKE-GPU", "provenance": {"how": "test"},
                            "table": {"fp32": [{"batch": [1, None], "backend": "pt-compiled"}]},
                            "table_dest": {"fp32": [{"batch": [1, None], "backend": "pt-compiled"}]},
                            "table_tokens": {"fp32": [{"batch": [1, None], "backend": "pt-reference"}]}})
    fake_registry(raw)
    monkeypatch.delenv("ALGO", raising=False)
    p = cuda_problem(B=4)
    assert registry.select(p).name == "pt-compiled"                          # T=1
    for inplace in (True, False):                                            # T >= 2, either mode
        s = registry.select(dataclasses.replace(p, T=3, inplace=inplace))
        assert s.name == "pt-reference" and "3 tokens per call" in s.reason
    s = registry.select(dataclasses.replace(p, T=2, state_dtype=torch.bfloat16))
    assert s.source == "fallback"                                            # no bf16 tables


def test_explicit_unavailable_or_unknown_raises(fake_registry, raw, monkeypatch):
    fake_registry(raw)
    with pytest.raises(ValueError, match="fake: only pt-"):
        registry.select(cuda_problem(), algo="cuda-v4")
    monkeypatch.setenv("ALGO", "bogus")
    with pytest.raises(ValueError, match="ALGO env: unknown backend 'bogus'.*pt-reference"):
        registry.select(cuda_problem())


def test_cpu_auto_selection_reports_what_served():
    x = make_inputs(B=1, H=2, HV=4, K=16, V=8)
    s = gdnzoo.select(*x.args())
    assert s.name == "pt-reference" and s.source in ("fallback", "ALGO env")


def test_get_returns_callable_with_the_signature():
    x = make_inputs(B=1, H=2, HV=4, K=16, V=8)
    f = gdnzoo.get("pt-reference")
    out, st = f(*x.args())
    assert st is x.state and out.shape == (1, 1, 4, 8)
    with pytest.raises(ValueError, match="valid names"):
        gdnzoo.get("nope")


@pytest.mark.parametrize("name,exc,frag", [(None, TypeError, "None"), ("", ValueError, "''"),
                                            (["cuda-v4"], TypeError, "list"),
                                            (3, TypeError, "int")])
def test_algo_must_be_a_name(name, exc, frag):
    """algo is None (automatic) or a backend's name: '' is not automatic, a list is no name."""
    x = make_inputs(B=1, H=2, HV=4, K=16, V=8)
    with pytest.raises(exc, match=f"algo: .*{re.escape(frag)}"):
        gdnzoo.get(name)
    if name is not None:
        with pytest.raises(exc, match="algo: expected a backend name"):
            gdnzoo.select(*x.args(), algo=name)


def test_b200_row_seeded_from_published_numbers():
    row = registry.default_row("NVIDIA B200")
    assert row is not None and tables.table_choice(row, cuda_problem(B=1)) == "fla-recurrent"
    assert row.provenance["values_us"]["fla-recurrent"] == 2.56


def test_default_table_is_read_by_sequence_head_pairs():
    """A row measured at HV_m value heads serves another geometry at as many (sequence, head)
    pairs: its range [lo, hi] serves B*HV in ((lo - 1)*HV_m, hi*HV_m] (the H200's kernel times
    follow B*HV, bench/results/h200/geometries/); the measured geometry reads as before, a row
    without measured_at and the prefill table read the batch as is."""
    import dataclasses
    row = registry.default_row("NVIDIA H200")
    assert row.measured_at["HV"] == 8
    at = {B: tables.table_choice(row, cuda_problem(B)) for B in range(1, 257)}

    def read(B, H, HV):
        return tables.table_choice(row, dataclasses.replace(cuda_problem(B), H=H, HV=HV))
    for B in (1, 2, 4, 8, 16, 32, 64):
        assert read(B, 16, 32) == at[4 * B]                       # 4x the pairs of 4/8
        assert read(B, 8, 8) == at[B]                             # same HV, other H
    for B, at8 in ((1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (8, 6)):
        assert read(B, 2, 6) == at[at8], B                        # B*6 in ((at8-1)*8, at8*8]
    assert tables.read_point(row, dataclasses.replace(cuda_problem(3), H=2, HV=6)) == (18, 8)
    raw = dataclasses.replace(row, measured_at=None)
    assert [tables.table_choice(raw, dataclasses.replace(cuda_problem(B), H=16, HV=32))
            for B in (1, 2, 4, 8)] == [at[1], at[2], at[4], at[8]]
    rows = yaml.safe_load(registry.registry_path().read_text())["operations"]["decode"]["defaults"]
    for bad in ({"H": 4}, {"HV": 0}, {"HV": 8, "T": 1}, {"HV": "8"}, [8]):
        item = dict(next(r for r in rows if r["gpu"] == "NVIDIA H200"), measured_at=bad)
        with pytest.raises(registry.RegistryError, match="measured_at must give HV"):
            tables.parse_default_rows([item], registry.names(), registry.RegistryError)


def test_a_row_by_geometry_serves_its_geometry_first():
    """A row with ``geometry`` serves only calls of that geometry, before the GPU's general
    row, table key by table key: a pool call at that geometry takes the general row's pool
    table when the geometry's row has none; other geometries never see the row."""
    import dataclasses
    reg = yaml.safe_load(registry.registry_path().read_text())
    rows = reg["operations"]["decode"]["defaults"]
    h200 = next(r for r in rows if r["gpu"] == "NVIDIA H200" and "geometry" not in r)
    mine = dict(gpu="NVIDIA H200", provenance={"how": "test"}, geometry={"H": 8, "HV": 24},
                measured_at={"H": 8, "HV": 24, "K": 128, "V": 128},
                table={"fp32": [{"batch": [1, None], "backend": "pt-reference"}]})
    parsed = tables.parse_default_rows(rows + [mine], registry.names(), registry.RegistryError)
    got = tables.default_rows(parsed, "NVIDIA H200")
    assert {"H": 8, "HV": 24} in [r.geometry for r in got] and got[-1].geometry is None
    assert [r.geometry is None for r in got] == sorted(r.geometry is None for r in got)
    assert tables.default_row(parsed, "NVIDIA H200").geometry is None
    p48 = dataclasses.replace(cuda_problem(4), H=8, HV=24)
    row, key, _ = tables.lookup(got, p48)
    assert (row.label(), key) == ("NVIDIA H200 at H=8 HV=24", "table")
    assert tables.table_choice(row, p48, key) == "pt-reference"
    assert tables.read_point(row, p48) == (4 * 24, 24)
    row, key, _ = tables.lookup(got, dataclasses.replace(p48, pool=True))
    assert row.geometry is None and key == "table_pool"
    row, key, _ = tables.lookup(got, dataclasses.replace(p48, state_dtype=torch.bfloat16))
    assert row.geometry is None and key == "table"
    for H, HV in ((16, 32), (4, 24)):
        row, key, _ = tables.lookup(got, dataclasses.replace(cuda_problem(4), H=H, HV=HV))
        assert row.geometry is None
    row, key, _ = tables.lookup(got, dataclasses.replace(cuda_problem(4), H=16, HV=48))
    assert row.geometry == {"H": 16, "HV": 48} and row.provenance["results"].endswith(
        "dense_16_48_results.json")                              # the H200's GVA-3 row
    assert h200.get("geometry") is None
    for bad, match in ((dict(mine), "a second row for NVIDIA H200"),
                       (dict(mine, geometry={"HV": 0}), "geometry must give"),
                       (dict(mine, geometry={}), "geometry must give"),
                       (dict(mine, geometry={"N": 2}), "geometry must give")):
        with pytest.raises(registry.RegistryError, match=match):
            tables.parse_default_rows(rows + [mine, bad] if match.startswith("a second")
                                      else rows + [bad], registry.names(),
                                      registry.RegistryError)


def test_registry_file_from_the_environment(tmp_path, monkeypatch, raw):
    p = tmp_path / "mine.yaml"
    dec(raw)["backends"] = dec(raw)["backends"][:1]
    dec(raw)["defaults"], dec(raw)["fallback"] = [], {"cpu": ["pt-reference"]}
    p.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(registry.REGISTRY_ENV, str(p))
    assert registry.registry_path() == p and registry.names() == ["pt-reference"]
    monkeypatch.setenv(registry.REGISTRY_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(registry.RegistryError, match="no such file"):
        registry.load_registry()


def test_algo_env_is_read_in_one_place(monkeypatch):
    monkeypatch.setenv("ALGO", "pt-compiled")
    assert registry.env_algo() == "pt-compiled"
    monkeypatch.setenv("ALGO", "")
    assert registry.env_algo() is None
    monkeypatch.delenv("ALGO")
    assert registry.env_algo() is None
    root = registry.registry_path().parent
    readers = [str(f.relative_to(root)) for d in ("gdnzoo", "bench", "backends")
               for f in sorted((root / d).glob("*.py")) if '"ALGO"' in f.read_text()]
    assert readers == ["gdnzoo/registry.py"]


def test_nothing_below_the_face_imports_it():
    """Modules of the library, backends and bench import gdnzoo's submodules, never the face
    (``import gdnzoo`` / ``from gdnzoo import decode``); the CLI and bench commands may."""
    import ast
    root = registry.registry_path().parent
    for d in ("gdnzoo", "backends"):
        for f in (root / d).glob("*.py"):
            if f.name in ("__init__.py", "cli.py", "__main__.py"):
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    assert all(a.name != "gdnzoo" for a in node.names), f"{f}: import gdnzoo"
                if isinstance(node, ast.ImportFrom) and node.module == "gdnzoo" and node.level == 0:
                    public = {"decode", "get", "select", "list_backends"}
                    assert not public & {a.name for a in node.names}, f"{f}: {ast.dump(node)}"


def test_prefill_has_its_own_default_table():
    """The prefill operation's default table is its own (read at tokens per sequence, T/N),
    apart from decode's: the H200's measured row picks cuda-chunk for fp32 and bf16 states;
    the fallback order (GPUs without a row) tries cuda-chunk, then triton-chunk (which serves
    what cuda-chunk cannot)."""
    import dataclasses

    from gdnzoo import prefill_contract
    from gdnzoo.inputs import make_prefill_inputs
    row = registry.default_row("NVIDIA H200", "prefill")
    assert row is not None and row.provenance["results"].startswith("bench/results/h200/prefill")
    p = prefill_contract.validate(*make_prefill_inputs([3, 5], H=2, HV=4, K=16, V=16).args())[0]
    assert tables.table_choice(row, p) == "cuda-chunk"
    assert registry.load_registry().op("prefill").fallback["cuda"][:2] == ["cuda-chunk",
                                                                           "triton-chunk"]
    assert tables.table_choice(row, dataclasses.replace(p, state_dtype=torch.bfloat16)) \
        == "cuda-chunk"
    assert p.table_heads is None and tables.read_point(
        dataclasses.replace(row, measured_at={"HV": 8}), p) == (p.batch, 1)
    assert registry.default_row("NVIDIA H200", "decode") is not row


@pytest.mark.parametrize("op", ["decode", "prefill", "commit"])
def test_every_backend_follows_the_documented_protocol(op):
    """What backends/__init__.py documents: available(device), supports(problem), the entry
    point run(call, *, config=None) and an optional bind with the same parameters."""
    import inspect

    def params(fn):
        ps = inspect.signature(fn).parameters
        return [(p.name, p.kind, p.default) for p in ps.values()]

    want = [("call", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
            ("config", inspect.Parameter.KEYWORD_ONLY, None)]
    for name in registry.names(op):
        mod = registry.backend_module(name, op)
        assert callable(mod.available) and callable(mod.supports), name
        assert [p[0] for p in params(mod.available)] == ["device"], name
        assert params(registry.runner(name, op)) == want, name
        if hasattr(mod, "bind"):
            assert params(mod.bind) == want, name

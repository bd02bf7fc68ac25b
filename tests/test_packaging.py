"""A package that installs anywhere: the source archive carries everything the package reads
(registry.yaml, launch tables, CUDA sources, py.typed) and the whole test suite, installs
without the checkout, and its `gdnzoo` runs from another directory, writing results there and
nothing into the install."""
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import gdnzoo

ROOT = Path(__file__).resolve().parent.parent


def _source_files():
    """The checkout's files as a clean clone has them (tracked and new, not ignored)."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        r = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0:
            return [f for f in r.stdout.splitlines() if (ROOT / f).is_file()]
    skip = {".git", "__pycache__", ".pytest_cache", "build", "dist", "gdnzoo-results"}
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for f in _source_files():
        if f.startswith("bench/results/"):
            continue                                  # measurements: not in the archive anyway
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; "
                        "print(b.build_sdist(sys.argv[1]))", str(out)], cwd=src,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out / r.stdout.strip().splitlines()[-1]


def test_sdist_carries_the_data_files(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for f in ("registry.yaml", "gdnzoo/py.typed", "backends/tables/h100.yaml",
              "backends/tables/default.yaml", "backends/cuda_v4.cu", "backends/gdn_common.cuh",
              "gdnzoo/integrations/vllm.py", "MANIFEST.in", "README.md"):
        assert f in names, f"{f} is not in {sdist.name}"


def test_sdist_ships_the_whole_test_suite(sdist):
    """All of tests/ or none: the archive's tests are the checkout's, conftest.py, helpers and
    case modules included (the suite runs from it), and no bytecode."""
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    shipped = {n for n in names if n.startswith("tests/") and not n.endswith("/")}
    checkout = {f for f in _source_files() if f.startswith("tests/")}
    assert {"tests/conftest.py", "tests/helpers.py"} <= checkout
    assert shipped == checkout, (f"missing: {sorted(checkout - shipped)}; "
                                 f"extra: {sorted(shipped - checkout)}")
    assert not [n for n in names if n.endswith((".pyc", ".pyo")) or "__pycache__" in n]


@pytest.fixture(scope="module")
def installed(sdist, tmp_path_factory):
    """The archive pip-installed into a directory of its own (no deps: torch is here)."""
    target = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
           "--target", str(target), str(sdist)]
    r = subprocess.run(cmd + ["--no-build-isolation"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:              # no setuptools in this Python: pip fetches a build backend
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return target


def _run(installed, cwd, *argv):
    env = dict(os.environ, PYTHONPATH=str(installed))
    env.pop("GDNZOO_REGISTRY", None)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_installed_archive_runs_from_another_directory(installed, tmp_path):
    r = _run(installed, tmp_path, sys.executable, "-c",
             "import gdnzoo, gdnzoo.registry as r, gdnzoo.integrations.vllm, gdnzoo.tables as t; "
             "print(gdnzoo.__file__); print(r.registry_path()); print(r.default_row('NVIDIA H100 "
             "80GB HBM3').gpu)")
    assert r.returncode == 0, r.stderr[-2000:]
    init, reg, row = r.stdout.split("\n")[:3]
    assert Path(init).parent == installed / "gdnzoo" and Path(reg).parent == installed / "gdnzoo"
    assert row == "NVIDIA H100 80GB HBM3" and (installed / "gdnzoo" / "py.typed").is_file()
    r = _run(installed, tmp_path, str(installed / "bin" / "gdnzoo"), "list")
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(b.name in r.stdout for b in gdnzoo.list_backends())


def test_installed_bench_writes_into_the_working_directory(installed, tmp_path):
    before = {p for p in installed.rglob("*")}
    r = _run(installed, tmp_path, str(installed / "bin" / "gdnzoo"), "bench", "--algo",
             "pt-reference", "--batch", "1", "--heads", "1,2", "--dim", "16", "--iters", "3",
             "--no-plots", "--quiet", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(list(tmp_path.glob("gdnzoo-results/*/results.json"))) == 1
    assert {p for p in installed.rglob("*") if "__pycache__" not in p.parts} <= before


def test_metadata():
    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11 has no tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = meta["project"]["optional-dependencies"]
    assert "gdnzoo[triton,cuda,flashinfer,fla,bench]" in extras["gpu"]
    assert set(extras["all"]) == {"gdnzoo[gpu,nvbench,fib,test]"}
    packages = set(meta["tool"]["setuptools"]["packages"])
    subpackages = {"gdnzoo." + p.parent.name for p in (ROOT / "gdnzoo").glob("*/__init__.py")}
    assert subpackages <= packages, f"not installed: {subpackages - packages}"
    from importlib import metadata
    assert metadata.version("gdnzoo") == gdnzoo.__version__

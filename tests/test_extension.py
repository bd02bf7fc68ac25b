"""The two recipes of the README, done as a user would (CPU):

* adding a backend = one module + one registry entry: a small backend registered through the
  same path (a registry file naming it, ``GDNZOO_REGISTRY``) is listed by the CLI, run by the
  test matrix and timed by the bench;
* adding a GPU = running the tuner there and committing what it wrote: the launch rows
  ``gdnzoo tune --shapes --write`` writes for a new GPU, and its default-table row from
  ``gdnzoo tune --from ... --write``, are what that GPU then gets.
"""
import argparse
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from gdnzoo import registry, tables

ROOT = Path(__file__).resolve().parent.parent

# A backend of its own: the one-pass form of the update (each V-row's k and q products taken
# on the old row), vectorized in torch; not the reference's code.
EXTRA = '''
"""pt-onepass: the one-pass form of the decode step in torch (a test's extra backend)."""
import torch
import torch.nn.functional as F


def available(device):
    return True, "torch, one pass over the state"


def supports(problem):
    return True, ""


def run(call, *, config=None):
    q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm = call[:12]
    B, T, H, K = q.shape
    rep = v.shape[2] // H
    S = state.float()
    for t in range(T):
        qt = q[:, t].float().repeat_interleave(rep, 1)
        kt = k[:, t].float().repeat_interleave(rep, 1)
        if use_qk_l2norm:
            qt = qt * torch.rsqrt((qt * qt).sum(-1, keepdim=True) + 1e-6)
            kt = kt * torch.rsqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
        g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a[:, t].float() + dt_bias.float()))
        beta = torch.sigmoid(b[:, t].float())
        sk = (S * kt[:, :, None]).sum(-1)
        sq = (S * qt[:, :, None]).sum(-1)
        u = beta[..., None] * (v[:, t].float() - g[..., None] * sk)
        out[:, t] = scale * (g[..., None] * sq + u * (kt * qt).sum(-1, keepdim=True))
        S = g[..., None, None] * S + u[..., None] * kt[:, :, None, :]
    new_state.copy_(S)
'''


@pytest.fixture
def extra_backend(tmp_path, monkeypatch):
    """The extra module on the path and a registry file with one more entry for it."""
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    (mod_dir / "gdnzoo_extra_backend.py").write_text(textwrap.dedent(EXTRA))
    reg = yaml.safe_load(registry.registry_path().read_text())
    reg["operations"]["decode"]["backends"].append(dict(name="pt-onepass", entry="gdnzoo_extra_backend:run",
                                language="python", devices=["cpu", "cuda"],
                                state_dtypes=["fp32", "bf16"],
                                notes="one-pass torch form, registered by a test"))
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(reg, sort_keys=False))
    env = dict(os.environ, GDNZOO_REGISTRY=str(path),
               PYTHONPATH=os.pathsep.join([str(mod_dir), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(mod_dir))
    monkeypatch.setenv("GDNZOO_REGISTRY", str(path))
    registry.reset_caches()
    yield env
    monkeypatch.delenv("GDNZOO_REGISTRY")
    registry.reset_caches()


def test_an_added_backend_is_listed_run_by_the_matrix_and_benched(extra_backend, tmp_path):
    listed = subprocess.run([sys.executable, "-m", "gdnzoo", "list", "--device", "cpu"],
                            capture_output=True, text=True, env=extra_backend, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next(ln for ln in listed.stdout.splitlines() if ln.startswith("pt-onepass"))
    assert " yes " in row and "one-pass" in row
    matrix = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(ROOT / "tests" / "test_matrix.py"), "-k", "pt-onepass"],
                            capture_output=True, text=True, env=extra_backend, cwd=ROOT)
    assert matrix.returncode == 0, matrix.stdout[-2000:]
    assert " passed" in matrix.stdout.splitlines()[-1] and " failed" not in matrix.stdout
    from helpers import bench_args, bench_run
    args = bench_args("--algo", "pt-onepass,pt-reference", "--batch", "1,2", "--heads", "2,4",
                      "--dim", "32", "--tokens", "2", "--iters", "10", "--device", "cpu",
                      "--no-plots", "--quiet", "--mode", "inplace,dest",
                      "--out", str(tmp_path / "bench"))
    _, rows, _ = bench_run(args)
    mine = [r for r in rows if r["cell"].backend == "pt-onepass" and r["clock"] == "host"]
    assert len(mine) == 4 and all(r["status"] == "PASS" and r["samples"] for r in mine)


# ------------------------------------------------------------------------------ a GPU

@pytest.fixture
def table_copy(tmp_path, monkeypatch):
    """The launch tables in a scratch copy (the tuner writes there)."""
    d = tmp_path / "tables"
    shutil.copytree(tables.tables_dir(), d)
    monkeypatch.setattr(tables, "tables_dir", lambda: d)
    tables.reset()
    yield d
    tables.reset()


def test_the_tuner_writes_a_new_gpus_rows(table_copy):
    from gdnzoo.backends import cuda_v4
    from gdnzoo.bench import shapes
    gpu, h100 = "NVIDIA FAKE-GPU 96GB", "NVIDIA H100 80GB HBM3"
    v4 = cuda_v4.CONFIG.normalize

    def now(B, sd=torch.float32, inplace=True, on=gpu):       # the row this GPU runs at B
        return cuda_v4.table_config(on, sd, B, 4, 8, 128, 128, inplace)
    assert now(4) == now(4, on=h100)                   # no file of its own: default, then H100
    new = {1: v4((8, 1, 16, 3)), 64: v4((4, 1, 4, 3, 1, 0, 0, 1)), 512: v4((1, 4, 16, 3))}
    results = {("cuda-v4", "fp32"): {1: (new[1], 1.9, 1.7, True), 4: (now(4), 2.6, 2.5, False),
                                     64: (new[64], 21.0, 20.0, True),
                                     512: (new[512], 160.0, 158.0, True)}}
    args = argparse.Namespace(mode="inplace", tokens=1, rows_from_tokens=None)
    made, cited = shapes.new_rows(tables.launch_tables(), gpu, results, args, "tune-x")
    path = shapes.write_table(gpu, made, {"tune-x": {"how": "gdnzoo tune --shapes, a fake GPU"},
                                          **cited})
    assert path == table_copy / "fake-gpu-96gb.yaml"
    f = tables.LaunchTables.load(table_copy).files["fake-gpu-96gb"]
    assert (f.match, f.fallback, f.gpu) == (gpu, "default", gpu)
    assert set(f.sources) == {"tune-x", "h100:v4-inplace"}
    # measured: the winners; kept or not measured: what it ran before (the H100 rows)
    assert (now(1), now(64), now(300), now(4096)) == (new[1], new[64], new[512], new[512])
    for B in (3, 8, 40, 100, 200):
        assert now(B) == now(B, on=h100), B
    assert {r.source for r in f.rows if r.lo <= 4 <= (r.hi or 10**9)} == {"h100:v4-inplace"}
    # what it did not measure falls back: bf16, and destination passing, to the H100 rows
    for sd, inplace in ((torch.bfloat16, True), (torch.float32, False)):
        assert now(4, sd, inplace) == now(4, sd, inplace, on=h100)
    # a second tune of one batch size changes the range up to it only
    made2, cited2 = shapes.new_rows(tables.launch_tables(), gpu, {("cuda-v4", "fp32"): {
        16: (v4((2, 2, 8, 3)), 6.0, 5.9, True)}}, args, "tune-y")
    assert [(r.lo, r.hi, r.source) for r in made2 if r.source == "tune-y"] == [(9, 16, "tune-y")]
    assert [(r.lo, r.hi) for r in made2] == [(r.lo, r.hi) for r in f.rows]
    assert set(cited2) == {"tune-x", "h100:v4-inplace"}
    # a tune that kept every row writes nothing
    assert shapes.new_rows(tables.launch_tables(), gpu, {("cuda-v4", "fp32"): {
        64: (new[64], 21.0, 20.0, False)}}, args, "tune-z")[0] == []


def test_the_tuner_writes_a_new_gpus_default_row(tmp_path, capsys):
    from gdnzoo.bench import report, tune
    from helpers import bench_plan
    gpu = "NVIDIA FAKE-GPU 96GB"
    plan = bench_plan("--algo", "pt-reference")
    raw = [dict(cell=plan.cell(be, "inplace", B, "fp32"), clock="kernel",
                status="PASS", note="", flags="", samples=[us] * 5)
           for be, B, us in (("cuda-v4", 1, 1.9), ("fla-recurrent", 1, 2.0),
                             ("cuda-v4", 64, 21.0), ("fla-recurrent", 64, 20.5))]
    env = dict(gpu=gpu, driver="d", cuda="13.0", date="2026-11-23T00:00:00+00:00",
               commit="abc", method="m", notes=[], versions={"torch": "2.11"})
    report.write_results(report.build_table(raw, None, plan), env, tmp_path / "run")
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry.registry_path(), reg)
    p = tune.add_tune_args(argparse.ArgumentParser())
    assert tune.cmd_tune(p.parse_args(["--from", str(tmp_path / "run" / "results.json"),
                                       "--write", "--registry", str(reg)])) == 0
    rows = registry.parse_registry(yaml.safe_load(reg.read_text())).op("decode").defaults
    row = tables.default_row(rows, gpu)
    assert row.gpu == gpu and row.table["fp32"] == [(1, 63, "cuda-v4"), (64, None, "fla-recurrent")]
    assert tables.default_row(rows, "NVIDIA H100 80GB HBM3").gpu == "NVIDIA H100 80GB HBM3"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_tune_shapes_needs_a_gpu():
    from gdnzoo.bench import tune
    p = tune.add_tune_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        tune.cmd_tune(p.parse_args(["--shapes"]))

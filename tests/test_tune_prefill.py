"""``gdnzoo tune --from`` on ``gdnzoo bench --mode prefill`` results: the prefill operation's row
of the default table (read at tokens per sequence, T/N).  The committed H200 runs rebuild the
committed H200 row; the selection rules on synthetic rows; writing touches that row alone."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
import yaml

from gdnzoo import registry
from gdnzoo.bench import report, tune

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "bench" / "results" / "h200" / "prefill_peers"
GPU = "NVIDIA H200"


def _row(backend, us, sd="fp32", geo=(4, 8), n=1, T=8192, mix=None, mode="dense",
         status="PASS", clock="kernel", flags=""):
    """One result row of a prefill run as report.read_results gives it."""
    row = {k: None for k in report.COLUMNS}
    row.update(backend=backend, median_us=us, state_dtype=sd, H=geo[0], HV=geo[1], K=128, V=128,
               B=n, T=T, mix=mix or f"{n}x{T // n}", mode=mode, status=status, clock=clock,
               flags=flags, bench="prefill")
    return row


def _write(d: Path, rows, gpu=GPU, commit="c0ffee") -> Path:
    env = dict(gpu=gpu, driver="d", cuda="13.0", date="2026-11-29T00:00:00+00:00",
               commit=commit, method="m", notes=[], versions={"torch": "2.11"})
    report.write_results(rows, env, d)
    return d / "results.json"


def _args(*argv):
    return tune.add_tune_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_the_committed_h200_runs_rebuild_the_committed_prefill_row():
    """The hand-written H200 prefill row is what the tuner derives from the runs its
    provenance cites (the peers' run at 4/8, fp32 and bf16 states, and 16/32 bf16)."""
    rows = [r for f in ("results.json", "results_16_32_bf16.json")
            for r in report.read_results(PEERS / f)[0]]
    derived = tune.make_prefill_row(GPU, rows)
    committed = registry.default_row(GPU, "prefill")
    assert derived["table"] == committed.table == {
        "fp32": [(1, None, "cuda-chunk")], "bf16": [(1, None, "cuda-chunk")]}
    means = derived["provenance"]["mean_multiple"]
    assert set(means["bf16"]) == {256, 1024, 8192, 32768}
    assert all(m["cuda-chunk"] == 1.0 and m["triton-chunk"] > 1.05
               for sd in means for m in means[sd].values())
    assert "4/8 K=128 V=128" in derived["provenance"]["how"]


def test_prefill_winners_follow_the_rules():
    """Per T/N the lowest mean multiple of each cell's fastest, over candidates timed in every
    cell of that T/N; entries that round the state, the bench's auto, failed, non-kernel and
    flattered rows are no candidates; adjacent T/N with one winner merge."""
    rows = [
        _row("cuda-chunk", 10.0, n=64, T=4096), _row("triton-chunk", 12.0, n=64, T=4096),
        # T/N 1024 at two geometries: the winners disagree, the mean multiple decides
        _row("cuda-chunk", 10.0, n=8, T=8192), _row("triton-chunk", 9.0, n=8, T=8192),
        _row("cuda-chunk", 20.0, geo=(16, 32), n=8, T=8192),
        _row("triton-chunk", 30.0, geo=(16, 32), n=8, T=8192),
        # T/N 8192: cuda-chunk timed in one cell of two, so triton-chunk is the choice
        _row("cuda-chunk", 5.0), _row("triton-chunk", 50.0),
        _row("triton-chunk", 60.0, geo=(16, 32)),
        # never candidates, however fast
        _row("fi-baseline", 1.0, n=8, T=8192), _row("triton-chunk-bf16", 1.0, n=8, T=8192),
        _row("fla-upstream", 1.0), _row("auto", 1.0), _row("fla-recurrent", 1.0, status="FAIL"),
        _row("fla-recurrent", 1.0, clock="graph"),
        _row("fla-recurrent", 1.0, n=64, T=4096, flags="warm write target"),
    ]
    table, means = tune.prefill_winners(rows)
    assert table == {"fp32": [(1, 8191, "cuda-chunk"), (8192, None, "triton-chunk")]}
    assert means["fp32"][1024] == {"cuda-chunk": round((10 / 9 + 1.0) / 2, 3),
                                   "triton-chunk": round((1.0 + 1.5) / 2, 3)}
    assert means["fp32"][8192] == {"triton-chunk": round((10.0 + 1.0) / 2, 3)}
    # the pool form's cells give table_pool; no dense cell: nothing to write
    pool = [dict(r, mode="pool") for r in rows[:2]]
    row = tune.make_prefill_row(GPU, rows + pool)
    assert row["table_pool"] == {"fp32": [(1, None, "cuda-chunk")]}
    assert "mean_multiple_pool" in row["provenance"]
    with pytest.raises(ValueError, match="no correct in-place"):
        tune.make_prefill_row(GPU, pool + [_row("fi-baseline", 1.0)])


def test_tune_writes_the_prefill_row_alone(tmp_path, capsys):
    """--write replaces this GPU's prefill row (appends one for a GPU without); the decode and
    commit operations' rows and every other prefill row are untouched; the file validates."""
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry.registry_path(), reg)
    before = registry.parse_registry(yaml.safe_load(reg.read_text()))
    rows = [_row("cuda-chunk", 30.0, n=8, T=8192), _row("triton-chunk", 20.0, n=8, T=8192),
            _row("cuda-chunk", 100.0), _row("triton-chunk", 120.0)]
    f = _write(tmp_path / "h200", rows)
    assert tune.cmd_tune(_args("--from", str(f), "--write", "--registry", str(reg))) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200 prefill fp32 in place: T/N 1..8191 triton-chunk, T/N 8192.. cuda-chunk" \
        in out and "(prefill)" in out
    after = registry.parse_registry(yaml.safe_load(reg.read_text()))
    row = next(d for d in after.op("prefill").defaults if d.gpu == GPU)
    assert row.table == {"fp32": [(1, 8191, "triton-chunk"), (8192, None, "cuda-chunk")]}
    assert row.provenance["results"] == "h200/results.json"
    for op in ("decode", "commit"):
        assert after.op(op).defaults == before.op(op).defaults
    # another GPU: appended beside the H200's row
    g = _write(tmp_path / "h100", rows[2:], gpu="NVIDIA H100 80GB HBM3")
    assert tune.cmd_tune(_args("--from", str(g), "--write", "--registry", str(reg))) == 0
    again = registry.parse_registry(yaml.safe_load(reg.read_text())).op("prefill").defaults
    assert [d.gpu for d in again] == [GPU, "NVIDIA H100 80GB HBM3"] and again[0] == row
    # printing instead of writing
    assert tune.cmd_tune(_args("--from", str(g))) == 0
    assert "operations.prefill.defaults" in capsys.readouterr().out


def test_tune_refuses_prefill_results_mixed_or_by_geometry(tmp_path):
    f = _write(tmp_path / "p", [_row("cuda-chunk", 1.0)])
    dense = {k: None for k in report.COLUMNS}
    dense.update(backend="cuda-v4", median_us=2.0, state_dtype="fp32", H=4, HV=8, K=128, V=128,
                 B=1, T=1, mode="inplace", status="PASS", clock="kernel", flags="", bench="dense")
    d = _write(tmp_path / "d", [dense])
    with pytest.raises(SystemExit, match="prefill runs alone"):
        tune.cmd_tune(_args("--from", f"{f},{d}"))
    with pytest.raises(SystemExit, match="no rows by geometry"):
        tune.cmd_tune(_args("--from", str(f), "--geometry-row"))
    peers_only = _write(tmp_path / "q", [_row("fi-baseline", 1.0)])
    with pytest.raises(SystemExit, match="no correct in-place"):
        tune.cmd_tune(_args("--from", str(peers_only)))

"""docs/serving.md's pool and chained tables are the committed H100 results files, rendered by
gdnzoo.bench.doc_tables, and the renderer reads a results file's rows as the bench wrote them
(the verify tables: tests/test_verify_table.py)."""
import json
from pathlib import Path

import pytest

from gdnzoo.bench import doc_tables

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench" / "results" / "h100-80gb-hbm3"
DOCS = (ROOT / "docs" / "serving.md").read_text()


def _table(out):
    return "\n".join(out[:out.index("")])


def test_docs_pool_table_is_the_results_file():
    out = doc_tables.pool_table([H100 / "pool_fineclock" / "run4_results.json"])
    assert len(out[:out.index("")]) == 2 + 13          # fp32 without FlashInfer's pool API
    assert _table(out) in DOCS


def test_docs_chained_table_is_the_results_files():
    out = doc_tables.chained_table([H100 / "chained" / f"results_{sd}.json" for sd in ("fp32", "bf16")])
    assert len(out[:out.index("")]) == 2 + 10
    assert _table(out) in DOCS


def _write(path, rows):
    cols = ["backend", "B", "T", "state_dtype", "mode", "clock", "status", "median_us", "x_floor"]
    path.write_text(json.dumps({"environment": {}, "columns": cols,
                                "rows": [[r.get(c) for c in cols] for r in rows]}))
    return path


def _row(backend, B, us, x=None, status="PASS", sd="fp32"):
    return dict(backend=backend, B=B, T=1, state_dtype=sd, mode="pool", clock="kernel",
                status=status, median_us=us, x_floor=x)


def test_pool_table_cells_bar_and_peers(tmp_path):
    rows = [_row("floor", 1, 2.0), _row("auto", 1, 2.232, 1.116), _row("vllm-packed", 1, 2.2, 1.1),
            _row("floor", 4, 3.0), _row("auto", 4, 3.1, 1.03), _row("vllm-packed", 4, 123.4, 41.1),
            _row("cuda-v4", 1, None, status="FAIL"), _row("cuda-v4", 4, 3.2, 1.07),
            _row("flashinfer-pool", 1, None, status="SKIP"),
            _row("flashinfer-pool", 4, None, status="SKIP")]
    out = doc_tables.pool_table([_write(tmp_path / "r.json", rows)])
    assert out[:6] == ["| state | entry | B=1 | B=4 |", "|---|---|---|---|",
                       "| fp32 | pool floor | 2.00 | 3.00 |",
                       "| fp32 | auto | 2.23 (1.12) | 3.10 (1.03) |",
                       "| fp32 | cuda-v4 | fail | 3.20 (1.07) |",
                       "| fp32 | vllm-packed | 2.20 (1.10) | 123 (41.10) |"]
    assert "FlashInfer pool API" not in "\n".join(out)        # never timed: no row
    # the bar is 10% plus one 32 ns tick: 2.232 = 1.1 * 2.0 + 0.032 is within, by nothing
    assert "auto within the pool floor bar: 2 of 2" in out
    assert out[-2:] == ["peers as fast as or faster than auto: 1", "  vllm-packed fp32 B=1"]


def test_the_command_line_prints_a_table(capsys, tmp_path):
    path = _write(tmp_path / "r.json", [_row("floor", 1, 2.0), _row("auto", 1, 2.5, 1.25)])
    assert doc_tables.main(["pool", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "| fp32 | auto | 2.50 (1.25) |" in printed and "  miss: fp32 B=1: 2.500" in printed
    assert doc_tables.main(["nope", str(path)]) == 2


@pytest.mark.parametrize("x, s", [(2.0, "2.00"), (99.994, "99.99"), (100.0, "100"), (188.4, "188")])
def test_microseconds_two_decimals_below_100(x, s):
    assert doc_tables.fmt_us(x) == s

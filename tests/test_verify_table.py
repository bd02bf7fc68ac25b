"""docs/serving.md's verify tables are the committed H100 results files, rendered by
gdnzoo.bench.doc_tables (so the published numbers cannot drift from the data)."""
from pathlib import Path

import pytest

from gdnzoo.bench.doc_tables import verify_tables

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "h100-80gb-hbm3" / "verify"


@pytest.fixture(scope="module")
def out():
    return verify_tables([RESULTS / "fp32_results.json", RESULTS / "bf16_results.json"])


def test_docs_tables_are_the_results_files(out):
    tables = out[:out.index("", out.index("| state | commit | B=1 | B=4 | B=16 | B=64 | B=256 |"))]
    assert len(tables) > 80
    docs = (ROOT / "docs" / "serving.md").read_text()
    assert "\n".join(tables) in docs


def test_bar_summary_counts_every_cuda_v4_cell(out):
    line = next(x for x in out if x.startswith("cuda-v4 within the floor bar:"))
    within, total = (int(v) for v in line.split(":")[1].split(" of "))
    misses = [x for x in out if x.startswith("  miss:")]
    assert total == 90 and within + len(misses) == total

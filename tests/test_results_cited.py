"""bench/results/ holds the committed runs that the registry, the launch tables, the README and
the docs cite, and nothing else: every `bench/results/...` path those files name exists (a
directory, a file, a `{a,b}` alternation or a `name.*` family), and no code (a diff, a patch,
CUDA or Python source, a shell script) lies under bench/results/; experiments live in lab/."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CODE = (".diff", ".patch", ".cu", ".cuh", ".py", ".sh")
# The launch tables' `results:` lists of three verify A/Bs also name the A/B scripts (code);
# those live at the same place under lab/notebook/, beside the A/B's notes.
NOTEBOOK = ROOT / "lab" / "notebook"

PATH = re.compile(r"bench/results/[A-Za-z0-9_.{},*/-]*")
ASSIGN = re.compile(r"^\s*(\w+)=(bench/results/[A-Za-z0-9_./-]*)\s*(?:#.*)?$", re.M)


def citing_files():
    return ([ROOT / "registry.yaml", ROOT / "README.md"]
            + sorted((ROOT / "backends" / "tables").glob("*.yaml"))
            + sorted((ROOT / "docs").glob("*.md")))


def _expand(p):
    """`a/{x,y}_r.json` -> [`a/x_r.json`, `a/y_r.json`] (one alternation at a time)."""
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    return [q for alt in m.group(1).split(",") for q in _expand(p[:m.start()] + alt + p[m.end():])]


def cited_paths(text):
    """Every `bench/results/...` path named in ``text``, and `$R/...` where a shell line of the
    text set ``R=bench/results/...``; placeholders (`<gpu>`) are not paths."""
    found = [m.group() for m in PATH.finditer(text) if text[m.end():m.end() + 1] != "<"]
    for name, value in ASSIGN.findall(text):
        found += [value + m for m in re.findall(rf"\${name}(/[A-Za-z0-9_.{{}},*/-]*)", text)]
    out = set()
    for p in found:
        p = p.rstrip(".,:")
        if p.count("}") > p.count("{"):         # a YAML flow mapping's brace closes the path
            p = p[:p.rindex("}")]
        out.update(q.rstrip(".,:") for q in _expand(p))
    return out


def _exists(p):
    if p.endswith(".*"):
        return any((ROOT / p[:-2]).parent.glob(Path(p).name))
    return (ROOT / p).exists()


def _all_citations():
    return {(str(f.relative_to(ROOT)), p) for f in citing_files() for p in cited_paths(f.read_text())}


def test_the_collector_reads_every_form():
    text = ("files `bench/results/g/verify/{fp32,bf16}_results.json`, results: bench/results/g/v/}\n"
            "R=bench/results/g    # a comment\ngdnzoo tune --from $R/a.json,$R/pool/b.json\n"
            "(bench/results/g/nv_results.*) and bench/results/<gpu>/ and bench/results/g/x.log.")
    assert cited_paths(text) == {
        "bench/results/g/verify/fp32_results.json", "bench/results/g/verify/bf16_results.json",
        "bench/results/g/v/", "bench/results/g", "bench/results/g/a.json",
        "bench/results/g/pool/b.json", "bench/results/g/nv_results.*", "bench/results/g/x.log"}


def test_there_are_citations_to_check():
    cited = _all_citations()
    assert len(cited) > 100
    assert {f for f, _ in cited} >= {"registry.yaml", "README.md", "backends/tables/h100.yaml",
                                     "docs/serving.md", "docs/measuring.md"}


def test_every_cited_results_path_exists():
    missing = []
    for f, p in sorted(_all_citations()):
        if p.endswith(CODE):
            here = NOTEBOOK / Path(p).relative_to("bench/results")
            if not here.is_file():
                missing.append(f"{f}: {p} (code: expected at {here.relative_to(ROOT)})")
        elif not _exists(p):
            missing.append(f"{f}: {p}")
    assert not missing, "cited but missing:\n" + "\n".join(missing)


def test_no_code_under_bench_results():
    code = [str(p.relative_to(ROOT)) for p in RESULTS.rglob("*") if p.suffix in CODE]
    assert not code, "code under bench/results (it belongs in lab/):\n" + "\n".join(code)


@pytest.mark.parametrize("gpu", sorted(p.name for p in RESULTS.iterdir() if p.is_dir()))
def test_every_results_folder_lists_its_files(gpu):
    """Each GPU folder's README.md names every file kept there (by its path in the folder)."""
    folder = RESULTS / gpu
    readme = (folder / "README.md").read_text()
    unlisted = [str(p.relative_to(folder)) for p in sorted(folder.rglob("*"))
                if p.is_file() and p.name != "README.md"
                and str(p.relative_to(folder)) not in readme]
    assert not unlisted, f"bench/results/{gpu}/README.md does not list:\n" + "\n".join(unlisted)

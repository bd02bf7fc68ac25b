"""The README's examples run as written: every ```bash and ```python block, in a fresh shell (no
TRITON_INTERPRET, no ALGO) in a scratch directory that sees the checkout's committed files, the
way a new user runs them from the checkout's root.  Not run, each with its reason: the two
scripts (the full bench; the test suite itself, which CI runs), lines that write committed files
(--write), and lines that need a backend unavailable here (a GPU), by name."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
NOT_RUN = {
    "bash scripts/bench.sh": "the full benchmark of every backend (its `gdnzoo bench` is run)",
    "bash scripts/test.sh": "the test suite itself (CI runs it: .ci/run)",
}
# Python blocks that are excerpts of someone else's code, by their first line.
EXCERPTS = {
    "from gdnzoo.integrations.vllm import packed_decode":
        "an engine's call site (the engine has the arguments); tests/test_integrations.py "
        "runs the adapters",
}


def blocks(lang):
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def named_backends(text):
    """Backends a command or statement names: --algo a,b / ALGO=a / algo="a" / get("a")."""
    found = re.findall(r"--algo[ =]([\w,-]+)|ALGO=([\w-]+)|algo=\"([\w-]+)\"|get\(\"([\w-]+)\"\)",
                       text)
    return {n for groups in found for g in groups if g for n in g.split(",") if n}


@pytest.fixture(scope="module")
def env():
    e = {k: v for k, v in os.environ.items()
         if k not in ("TRITON_INTERPRET", "ALGO", "GDNZOO_REGISTRY", "GDNZOO_CHECK_INDICES")}
    e["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), e.get("PATH", "")])
    return e


@pytest.fixture(scope="module")
def unavailable(env):
    """{backend: reason} of the backends a fresh shell here cannot run."""
    r = subprocess.run([sys.executable, "-c", "import gdnzoo, json; print(json.dumps("
                        "{b.name: b.reason for b in gdnzoo.list_backends() if not b.available}))"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def scratch(tmp_path):
    """A working directory where the checkout's committed results read as from its root."""
    (tmp_path / "bench").symlink_to(ROOT / "bench")
    return tmp_path


def why_not(line, unavailable):
    command = line.split("#")[0].strip()
    if command in NOT_RUN:
        return NOT_RUN[command]
    if "--write" in command:
        return "writes committed files (registry.yaml, backends/tables)"
    names = named_backends(command)
    if names and names <= set(unavailable) and not command.startswith("gdnzoo pack"):
        return "; ".join(f"{n}: {unavailable[n]}" for n in sorted(names))
    return None


def test_readme_has_examples():
    assert len(blocks("bash")) >= 3 and len(blocks("python")) >= 2


@pytest.mark.parametrize("i", range(len(blocks("bash"))))
def test_shell_block(i, env, unavailable, scratch):
    lines, skipped = [], {}
    for line in blocks("bash")[i].splitlines():
        reason = why_not(line, unavailable)
        if reason:
            skipped[line] = reason
        else:
            lines.append(line)
    if not any(ln.strip() and not ln.lstrip().startswith("#") for ln in lines):
        pytest.skip(f"nothing here runs without a GPU: {skipped}")
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    r = subprocess.run(["bash", "-c", script], cwd=scratch, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (f"README block {i} failed:\n{script}\n--- stdout\n"
                               f"{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")


def test_python_blocks(env, unavailable, scratch):
    """Every ```python block, in order, as one session (a later block may use an earlier one's
    names); left out: a block naming only backends unavailable here, and EXCERPTS."""
    code = [b for b in blocks("python") if not (named_backends(b) and
                                               named_backends(b) <= set(unavailable))
            and b.splitlines()[0].split("#")[0].strip() not in EXCERPTS]
    assert code, "every Python example needs a GPU"
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], cwd=scratch, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stderr[-3000:]}"


def test_tune_line_rebuilds_the_committed_row(env, scratch):
    """The README's tune commands, run on the files they name, give the H100 row that
    registry.yaml holds (every table, and the measured values they come from): the row and
    the results it cites agree.  The first command builds the row from the in-place,
    destination and multi-token runs; the second its table_pool from a pool run."""
    import textwrap
    import yaml
    lines = next(b for b in blocks("bash") if "gdnzoo tune --from" in b).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("R="))
    tunes = []                                  # each tune command, continuation lines joined
    for ln in lines[start + 1:]:
        code = ln.split("#")[0].rstrip()
        if tunes and tunes[-1].endswith("\\"):
            tunes[-1] = tunes[-1][:-1] + " " + code.strip()
        elif code.startswith("gdnzoo tune --from"):
            tunes.append(code)
    assert len(tunes) == 2 and all("--write" not in t for t in tunes), tunes
    reg = yaml.safe_load((ROOT / "registry.yaml").read_text())
    printed = []
    for t in tunes:
        r = subprocess.run(["bash", "-c", f"{lines[start]}\n{t}"], cwd=scratch, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        printed.append(yaml.safe_load(textwrap.dedent(r.stdout[r.stdout.index("  - gpu:"):]))[0])
    committed = next(row for row in reg["operations"]["decode"]["defaults"]
                     if row["gpu"] == printed[0]["gpu"])
    tables = [k for k in committed if k.startswith("table") and k != "table_pool"]
    assert tables and {k: printed[0].get(k) for k in tables} == {k: committed[k] for k in tables}
    assert printed[1]["table_pool"] == committed["table_pool"]

    def values(prov):
        return {k: v for k, v in prov.items() if k.startswith("values_us")}
    assert values(printed[0]["provenance"]) == values(committed["provenance"])
    assert printed[1]["provenance"]["pool"]["values_us"] == committed["provenance"]["pool"]["values_us"]
    assert printed[1]["provenance"]["pool"]["results"] == committed["provenance"]["pool"]["results"]

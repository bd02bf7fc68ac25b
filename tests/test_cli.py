"""The command line as a new user meets it: --version, a fast --help, bad options refused with
exit status 2 and the option named (never a traceback, never an ERROR table with status 0),
every documented subcommand working on CPU, results in the working directory."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gdnzoo
from gdnzoo.bench import console, mode_dense, report
from helpers import bench_plan, run_cli

_main = run_cli                  # (exit status, stdout, stderr) of gdnzoo ARGV


def test_version(capsys):
    code, out, _ = _main(["--version"], capsys)
    assert code == 0 and out.strip() == f"gdnzoo {gdnzoo.__version__}"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"],
                                  ["bench", "--help"], ["pack", "--help"]])
def test_help_imports_no_torch(argv):
    """The CLI's start imports no torch (which takes seconds): help and version answer at
    once, as does the help of a subcommand whose module is light."""
    code = ("import sys; from gdnzoo import cli\n"
            "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage: gdnzoo" in r.stdout or "gdnzoo " in r.stdout


RUN_BAD = [
    (["--batch", "-1"], "--batch", "positive integer"),
    (["--batch", "x"], "--batch", "positive integer"),
    (["--dim", "0"], "--dim", "positive integer"),
    (["--iters", "0"], "--iters", "positive integer"),
    (["--tokens", "0"], "--tokens", "positive integer"),
    (["--heads", "4,6"], "--heads", "multiple of H"),
    (["--heads", "4"], "--heads", "H,HV"),
    (["--heads", "0,4"], "--heads", ">= 1"),
    (["--state-dtype", "fp64"], "--state-dtype", "invalid choice"),
]


@pytest.mark.parametrize("extra,option,frag", RUN_BAD, ids=[" ".join(c[0]) for c in RUN_BAD])
def test_run_refuses_bad_options(extra, option, frag, capsys):
    code, _, err = _main(["run", *extra], capsys)
    assert code == 2 and option in err and frag in err and "Traceback" not in err


BENCH_BAD = [
    (["--state-dtype", "fp64"], "--state-dtype", "fp32, bf16"),
    (["--state-dtype", ","], "--state-dtype", "state dtypes"),
    (["--batch", "0"], "--batch", "positive integer"),
    (["--batch", "1,-4"], "--batch", "positive integer"),
    (["--heads", "4,6"], "--heads", "multiple of H"),
    (["--heads", "x"], "--heads", "H,HV"),
    (["--mode", "bogus"], "--mode", "dense, dest, pool, verify, chained"),
    (["--mode", "pool,dest"], "--mode", "alone"),
    (["--timing", "wall"], "--timing", "kernel, graph, host"),
    (["--iters", "0"], "--iters", "positive integer"),
    (["--dim", "0"], "--dim", "positive integer"),
    (["--tokens", "0"], "--tokens", "positive integer"),
    (["--time-budget", "-1"], "--time-budget", ">= 0"),
    (["--time-budget", "nan"], "--time-budget", ">= 0"),
    (["--algo", ","], "--algo", "backend names"),
    (["--algo", "nope"], "--algo", "unknown backend(s) nope"),
    (["--algo", "all,nope"], "--algo", "unknown backend(s) nope;"),
]


@pytest.mark.parametrize("extra,option,frag", BENCH_BAD, ids=[" ".join(c[0]) for c in BENCH_BAD])
def test_bench_refuses_bad_options(extra, option, frag, capsys, tmp_path):
    code, out, err = _main(["bench", "--algo", "pt-reference", "--out", str(tmp_path), *extra],
                           capsys)
    assert code == 2 and option in err and frag in err and "Traceback" not in err
    assert not list(tmp_path.iterdir()), "a refused run wrote results"


def test_run_on_cpu(capsys):
    code, out, _ = _main(["run", "--batch", "2", "--heads", "2,4", "--dim", "16", "--iters", "1",
                          "--dest", "--device", "cpu"], capsys)
    assert code == 0 and "PASS" in out and "dest-passing" in out


def test_list(capsys):
    code, out, _ = _main(["list"], capsys)
    assert code == 0
    for b in gdnzoo.list_backends():
        assert b.name in out


def test_bench_writes_into_the_working_directory(tmp_path, monkeypatch, capsys):
    """No --out: results go to ./gdnzoo-results/<gpu>/, never into the package or the
    checkout's committed results; every skip reason is printed (none cut off)."""
    monkeypatch.chdir(tmp_path)
    unavailable = [b for b in gdnzoo.list_backends("cpu", op="decode") if not b.available]
    names = ",".join(["pt-reference"] + [b.name for b in unavailable])
    code, out, _ = _main(["bench", "--algo", names, "--batch", "1", "--heads", "1,2", "--dim",
                          "16", "--iters", "3", "--no-plots", "--quiet", "--device", "cpu"],
                         capsys)
    assert code == 0
    results = tmp_path / "gdnzoo-results" / report.gpu_slug()
    assert (results / "results.json").is_file()
    assert report.default_out_dir() == str(Path("gdnzoo-results") / report.gpu_slug())
    lines = out.splitlines()
    for b in unavailable:                # on a SKIP line naming it, or a note of its own
        assert any(b.name in line and b.reason in line for line in lines), b.name


def test_console_prints_every_note():
    env = dict(gpu="cpu", driver=None, cuda=None, commit=None, versions={"torch": "x"})
    notes = [f"backend-{i}: skipped (reason {i} " + "x" * 200 + ")" for i in range(12)]
    plan = bench_plan("--algo", "pt-reference")
    plan.notes[:] = notes
    text = console.render([], env, plan)
    assert all(f"note: {n}" in text for n in notes)


def test_bench_exit_status_counts_errors(tmp_path, monkeypatch, capsys):
    """A cell that errors makes the run fail (status 1), as a failing cell does."""
    def boom(*a, **k):
        raise RuntimeError("broken on purpose")
    monkeypatch.setattr(mode_dense, "dense_entry", boom)
    code, out, _ = _main(["bench", "--algo", "pt-reference", "--batch", "1", "--heads", "1,2",
                          "--dim", "16", "--no-plots", "--quiet", "--out", str(tmp_path)], capsys)
    assert code == 1 and "ERROR" in out and "broken on purpose" in out


@pytest.mark.parametrize("name", [b.name for b in gdnzoo.list_backends(op="decode")])
def test_pack_every_listed_backend(name, tmp_path, capsys):
    """`gdnzoo pack --algo NAME` works for every backend `gdnzoo list` shows, available here
    or not (a Solution is sources)."""
    code, out, err = _main(["pack", "--algo", name, "--out", str(tmp_path)], capsys)
    assert code == 0, err
    sol = json.loads((tmp_path / "solution.json").read_text())
    assert sol["spec"]["entry_point"] == "kernel.py::run" and sol["sources"]


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "gdnzoo", "--version"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"gdnzoo {gdnzoo.__version__}"


def test_the_face_loads_torch_when_used():
    """`import gdnzoo` imports no torch (the CLI starts fast); its submodules and records load
    on first use, so `gdnzoo.inputs.make_inputs` works right after `import gdnzoo`."""
    code = ("import sys, gdnzoo\n"
            "assert 'torch' not in sys.modules\n"
            "x = gdnzoo.inputs.make_inputs(B=2, H=2, HV=4, K=16, V=8)\n"
            "out, st = gdnzoo.decode(*x.args(), algo='pt-reference')\n"
            "assert st is x.state and gdnzoo.Problem.__name__ == 'Problem'\n"
            "from gdnzoo import list_backends, Selection\n"
            "assert list_backends() and gdnzoo.select(*x.args()).__class__ is Selection\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_no_command_or_an_option_of_another_command_names_what_is_wrong(capsys):
    """`gdnzoo` alone names the missing COMMAND; an option the command does not take is
    refused with that command's usage, not the top level's; the top help names both
    operations and every bench mode."""
    code, _, err = _main([], capsys)
    assert code == 2 and "required: COMMAND" in err
    code, _, err = _main(["list", "--quiet"], capsys)
    assert code == 2 and "usage: gdnzoo list" in err and "unrecognized arguments: --quiet" in err
    code, out, _ = _main(["--help"], capsys)
    assert code == 0 and "prefill" in out and "engine-prefill" in out


def test_dir_lists_what_loads_on_first_use():
    assert {"decode", "prefill", "commit", "inputs", "select"} <= set(dir(gdnzoo))


MIX_MODE_BAD = [(mode, option, value) for mode in ("prefill", "engine-prefill")
                for option, value in (("--batch", "4"), ("--tokens", "2"))]


@pytest.mark.parametrize("mode,option,value", MIX_MODE_BAD,
                         ids=[f"{m} {o}" for m, o, _ in MIX_MODE_BAD])
def test_mix_modes_refuse_batch_and_tokens(mode, option, value, capsys, tmp_path):
    """A mode whose cells are sequence mixes takes its sequences and tokens from --mix: a
    --batch or --tokens given to it is a usage error naming the option, not ignored."""
    code, _, err = _main(["bench", "--mode", mode, "--algo", "pt-reference", "--mix", "1x16",
                          option, value, "--out", str(tmp_path)], capsys)
    assert code == 2 and f"{option}: --mode {mode}" in err and "--mix" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_run_dest_times_destination_passing(monkeypatch, capsys):
    """`gdnzoo run --dest` picks and times the destination-passing call it checked: each timed
    call gets a new_state distinct from the state, none runs in place."""
    calls, picks, real, pick = [], [], gdnzoo.decode, gdnzoo.select

    def decode(*a, **kw):
        calls.append(kw.get("new_state") is not None and kw["new_state"] is not a[3])
        return real(*a, **kw)

    def select(*a, **kw):
        picks.append(kw.get("new_state") is not None)
        return pick(*a, **kw)
    monkeypatch.setattr(gdnzoo, "decode", decode)
    monkeypatch.setattr(gdnzoo, "select", select)
    code, out, _ = _main(["run", "--dest", "--algo", "pt-reference", "--heads", "1,2", "--dim",
                          "16", "--iters", "2", "--device", "cpu"], capsys)
    assert code == 0 and "PASS" in out and "dest-passing calls" in out
    assert picks == [True] and calls and all(calls)
    calls.clear()
    code, out, _ = _main(["run", "--algo", "pt-reference", "--heads", "1,2", "--dim", "16",
                          "--iters", "2", "--device", "cpu"], capsys)
    assert code == 0 and "in-place calls" in out and calls and not any(calls)


@pytest.mark.parametrize("option,value", [("--atol", "nan"), ("--atol", "-1"), ("--rtol", "x")])
def test_check_refuses_a_bound_that_is_no_bound(option, value, capsys):
    """`check --atol nan` passed every element (no comparison with NaN is true) and a negative
    bound failed every one: refused as usage errors (exit 2) before any workload is built."""
    code, _, err = _main(["check", "--algo", "pt-reference", "--device", "cpu", option, value],
                         capsys)
    assert code == 2 and option in err and "expected a number >= 0" in err, err


def test_prefill_header_says_the_cells_head_size(capsys, tmp_path):
    """`--mode prefill --dim 64`: the cells stay K = V = 128 (a note says so), and so does the
    header (it read K=64 V=64 above cells of 128)."""
    code, out, _ = _main(["bench", "--mode", "prefill", "--algo", "pt-reference", "--mix", "1x16",
                          "--heads", "1,2", "--dim", "64", "--no-plots", "--out", str(tmp_path)],
                         capsys)
    assert code == 0 and "K=128 V=128" in out and "K=64" not in out, out
    assert "--dim 64: prefill cells are K = V = 128" in out, out


def test_engine_prefill_says_l2norm_has_no_effect(capsys, tmp_path):
    code, out, _ = _main(["bench", "--mode", "engine-prefill", "--algo", "pt-reference", "--mix",
                          "1x16", "--heads", "1,2", "--l2norm", "--no-plots", "--out",
                          str(tmp_path)], capsys)
    assert code == 0 and "--l2norm: no effect here" in out, out


@pytest.mark.parametrize("extra", [["--algo", "nope"], ["--dest"], ["--mode", "pool"],
                                   ["--iters", "5"], ["--shapes"]])
def test_tune_from_refuses_what_only_a_measurement_takes(extra, capsys, tmp_path):
    """`tune --from` builds the row from the files as they are: an option that only steers a
    measurement (or --shapes) is a usage error naming it, not silently dropped."""
    missing = str(tmp_path / "none.json")
    code, _, err = _main(["tune", "--from", missing, *extra], capsys)
    assert code == 2 and extra[0] in err and "Traceback" not in err, err

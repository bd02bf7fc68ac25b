"""`gdnzoo pack --op prefill`: a prefill backend as a flashinfer-bench Solution for the contest's
`gdn_prefill_qk4_v8_d128_k_last`, loaded as flashinfer-bench loads it and called
destination-passing at the contest geometry (CPU), and the local definition's reference.

The packed entry follows the definition where it differs from gdnzoo.prefill: a zero-length
sequence's new state is zero (gdnzoo carries the initial state over), i.e. gdnzoo's prefill with
``has_initial_state = (length > 0)``; the oracle here is that call of gdnzoo.prefill_reference.

triton-chunk runs here in the Triton interpreter (tests/conftest.py) at K = V = 128 on 17 tokens
(a few seconds a call); pt-compiled is left out (its first CPU compile of the chunk step takes
about 20 s and it adds nothing the pack does differently: same entry, another module).
"""
import argparse
import ast
import inspect
import json
import sys

import pytest
import torch

from gdnzoo import registry
from gdnzoo.backends import triton_chunk as tc
from gdnzoo.gate import compare
from gdnzoo.inputs import make_prefill_inputs
from gdnzoo.prefill_reference import reference_prefill
from helpers import run_cli

PREFILL_DEF = "gdn_prefill_qk4_v8_d128_k_last"
LENGTHS = (5, 0, 3, 9)          # 17 tokens, a zero-length sequence
ARGS = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens", "scale")


@pytest.fixture(scope="module")
def solutions():
    from gdnzoo.bench.pack import build_solution
    return {}, build_solution


def _solution(solutions, name):
    memo, build = solutions
    if name not in memo:
        memo[name] = build(name, op="prefill")
    return memo[name]


def _inputs(state=True, seed=5):
    return make_prefill_inputs(LENGTHS, H=4, HV=8, K=128, V=128, state=state, seed=seed,
                               index_dtype=torch.int64)


def _oracle(x, scale=None, compute_dtype=torch.float32):
    """(output bf16, new_state fp32) under the definition's rule, by gdnzoo's reference math."""
    T, N = x.q.shape[0], x.cu_seqlens.numel() - 1
    io = torch.bfloat16 if compute_dtype == torch.float32 else compute_dtype
    out = torch.empty(T, 8, 128, dtype=io)
    ns = torch.empty(N, 8, 128, 128, dtype=compute_dtype)
    nonempty = x.cu_seqlens[1:] != x.cu_seqlens[:-1]
    scale = x.scale if scale is None else (scale or 128 ** -0.5)      # 0: the default
    reference_prefill(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
                      scale, out, ns, compute_dtype=compute_dtype,
                      has_initial_state=None if x.state is None else nonempty)
    return out, ns


def _call(run, x, scale=None):
    """run() destination-passing with NaN-filled outputs; returns them."""
    T, N = x.q.shape[0], x.cu_seqlens.numel() - 1
    output = torch.full((T, 8, 128), float("nan"), dtype=torch.bfloat16)
    new_state = torch.full((N, 8, 128, 128), float("nan"), dtype=torch.float32)
    args = [getattr(x, n) for n in ARGS]
    if scale is not None:
        args[-1] = scale
    assert run(*args, output, new_state) is None
    return output, new_state


# ------------------------------------------------------------------ the Solution

def test_prefill_solution_schema(solutions):
    from gdnzoo.bench.pack import DEFINITIONS, validate_with_fib
    sol = json.loads(json.dumps(_solution(solutions, "pt-reference")))
    assert sol["definition"] == DEFINITIONS["prefill"] == PREFILL_DEF
    assert sol["name"].startswith("gdnzoo_prefill_pt_reference_")
    spec = sol["spec"]
    assert spec["entry_point"] == "kernel.py::run" and spec["destination_passing_style"] is True
    assert spec["language"] == "python"
    paths = [s["path"] for s in sol["sources"]]
    assert paths[0] == "kernel.py" and len(paths) == len(set(paths))
    assert "gdnzoo_vendored/prefill_contract.py" in paths
    for s in sol["sources"]:
        if s["path"].endswith(".py"):
            for node in ast.walk(ast.parse(s["content"])):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    assert not (node.module or "").startswith("gdnzoo"), s["path"]
    try:
        import flashinfer_bench.data  # noqa: F401
    except Exception:
        return
    assert validate_with_fib(sol).definition == PREFILL_DEF


@pytest.mark.parametrize("name", registry.names("prefill"))
def test_pack_every_prefill_backend(name, solutions, tmp_path):
    """Every prefill backend packs, and its entry imports without its optional packages."""
    from gdnzoo.bench.pack import load_entry
    sol = _solution(solutions, name)
    run = load_entry(sol, tmp_path)
    assert list(inspect.signature(run).parameters) == [*ARGS, "output", "new_state"]
    assert not run.__module__.startswith("gdnzoo.")


# ------------------------------------------------------------------ the packed entry, called

def _entry(solutions, name, tmp_path):
    from gdnzoo.bench.pack import load_entry
    if name == "triton-chunk":
        ok, why = registry.availability("triton-chunk", "cpu", "prefill")
        if ok:   # on a GPU machine the interpreter is off: the backend refuses CPU tensors
            ok, why = tc.serves(H=4, HV=8, K=128, V=128, io_dtype=torch.bfloat16, device="cpu")
        if not ok:
            pytest.skip(why)
    return load_entry(_solution(solutions, name), tmp_path)


@pytest.mark.parametrize("state", [True, False], ids=["state", "state-None"])
@pytest.mark.parametrize("name", ["pt-reference", "triton-chunk"])
def test_packed_prefill_matches_reference(name, state, solutions, tmp_path):
    run = _entry(solutions, name, tmp_path)
    x = _inputs(state)
    before = None if x.state is None else x.state.clone()
    reads = [x.q.clone(), x.k.clone(), x.v.clone(), x.a.clone(), x.b.clone(), x.cu_seqlens.clone()]
    scale = None if state else 0.0                 # 0: 1/sqrt(128), as the definition says
    output, new_state = _call(run, x, scale)
    if x.state is not None:
        assert torch.equal(x.state, before)        # destination passing: the input state is read
    assert all(torch.equal(t, r) for t, r in
               zip([x.q, x.k, x.v, x.a, x.b, x.cu_seqlens], reads))
    assert torch.equal(new_state[1], torch.zeros_like(new_state[1]))   # the empty sequence
    if name == "pt-reference":                      # the same math in the same order: equal
        ref_out, ref_state = _oracle(x, scale)
        assert torch.equal(output, ref_out) and torch.equal(new_state, ref_state)
    else:                                           # chunked: within the contest rule and tight
        ref_out, ref_state = _oracle(x, scale, torch.float64)
        assert compare(output, ref_out, dtype=torch.bfloat16).ok
        assert compare(new_state, ref_state, dtype=torch.float32).ok
        assert (output.double() - ref_out).abs().max() < 2e-3
        assert (new_state.double() - ref_state).abs().max() < 1e-4


def test_packed_prefill_zeroes_empty_rows_after_a_backend_without_has_initial_state(
        solutions, tmp_path):
    """A backend that cannot take has_initial_state (FlashInfer's, FLA's) gets the empty
    sequences' rows of new_state zeroed after its call; simulated on pt-reference."""
    run = _entry(solutions, "pt-reference", tmp_path)
    entry = sys.modules[run.__module__]
    mine = entry._supports
    entry._supports = lambda p: (False, "no has_initial_state") if p.initial == "mixed" else mine(p)
    entry._served.clear()
    try:
        x = _inputs(True, seed=8)
        output, new_state = _call(run, x)
        how = [h for h, _ in entry._served.values()]
    finally:
        entry._supports = mine
        entry._served.clear()
    assert how == ["mask"]
    ref_out, ref_state = _oracle(x)
    assert torch.equal(output, ref_out) and torch.equal(new_state, ref_state)


def test_packed_prefill_rejects_bad_inputs(solutions, tmp_path):
    run = _entry(solutions, "pt-reference", tmp_path)
    x = _inputs(True)
    T, N = x.q.shape[0], 4
    output = torch.empty(T, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="new_state"):
        run(*[getattr(x, n) for n in ARGS], output,
            torch.empty(N, 8, 128, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="new_state"):
        run(*[getattr(x, n) for n in ARGS], output, torch.empty(N + 1, 8, 128, 128))


# ------------------------------------------------------------------ the command

def test_cmd_pack_prefill(tmp_path, capsys, monkeypatch):
    from gdnzoo.bench.pack import add_pack_args, cmd_pack
    p = argparse.ArgumentParser()
    add_pack_args(p)
    assert p.parse_args(["--algo", "pt-reference"]).op == "decode"
    monkeypatch.chdir(tmp_path)
    assert cmd_pack(p.parse_args(["--op", "prefill", "--algo", "pt-reference"])) == 0
    sol = json.loads((tmp_path / "gdnzoo-pack-prefill-pt-reference" / "solution.json").read_text())
    assert sol["definition"] == PREFILL_DEF and sol["spec"]["entry_point"] == "kernel.py::run"
    assert PREFILL_DEF in capsys.readouterr().out
    for argv, says in ((["--op", "prefill", "--algo", "nope"], "unknown prefill backend 'nope'"),
                       (["--op", "prefill", "--algo", "cuda-v4"], "'cuda-v4' is a decode backend"),
                       (["--op", "commit", "--algo", "pt-reference"], "commit operation has no"),
                       (["--op", "bogus", "--algo", "pt-reference"], "unknown operation 'bogus'")):
        assert cmd_pack(p.parse_args([*argv, "--out", str(tmp_path / "x")])) == 2, argv
        err = capsys.readouterr().err
        assert says in err and "error:" in err, err
    assert not (tmp_path / "x").exists()


def test_cli_pack_prefill(tmp_path, capsys):
    code, out, err = run_cli(["pack", "--op", "prefill", "--algo", "triton-chunk", "--out",
                              str(tmp_path)], capsys)
    assert code == 0, err
    sol = json.loads((tmp_path / "solution.json").read_text())
    assert sol["definition"] == PREFILL_DEF and sol["spec"]["language"] == "triton"


# ------------------------------------------------------------------ the definition

def test_fib_prefill_definition_reference_matches_ours():
    from gdnzoo.bench.fib_definition import DEFINITIONS, prefill_definition_dict
    d = prefill_definition_dict()
    assert DEFINITIONS["prefill"][0] == d["name"] == PREFILL_DEF
    assert list(d["inputs"]) == list(ARGS) and list(d["outputs"]) == ["output", "new_state"]
    assert {a for a, v in d["axes"].items() if v["type"] == "var"} == \
        {"total_seq_len", "num_seqs", "len_cu_seqlens"}
    ns = {}
    exec(compile(d["reference"], "reference", "exec"), ns)
    for state in (True, False):
        x = _inputs(state, seed=13)
        o, s = ns["run"](*x.args())
        ref_out, ref_state = _oracle(x)
        assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
        assert compare(o, ref_out).ok and compare(s, ref_state, atol=1e-5, rtol=1e-5).ok
        assert torch.equal(s[1], torch.zeros_like(s[1]))
    # where the definition differs from gdnzoo.prefill: the empty sequence's state is not kept
    x = _inputs(True, seed=13)
    plain = torch.empty(4, 8, 128, 128)
    reference_prefill(*x.args(), torch.empty(17, 8, 128, dtype=torch.bfloat16), plain)
    assert torch.equal(plain[1], x.state[1]) and x.state[1].abs().max() > 0

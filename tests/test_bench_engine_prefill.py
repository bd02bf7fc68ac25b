"""``gdnzoo bench --mode engine-prefill`` on CPU: the plan, and every entry gated against the
float64 oracle with gdnzoo's dense pt-reference prefill standing in for FlashInfer's chunk
kernel (the engines' sequences around it as they are).  Timing needs a GPU."""
import pytest

from gdnzoo.bench import engine_prefill as ep
from gdnzoo.bench import mode_engine_prefill as mode
from gdnzoo.bench.report import read_results
from helpers import bench_plan, run_cli


def test_plan_cells_and_entries():
    plan = bench_plan("--mode", "engine-prefill", "--device", "cpu")
    assert plan.entries[:2] == ("engine", "auto") and (plan.H, plan.HV, plan.K) == (4, 8, 128)
    assert {g.label.split()[0] for g in plan.groups} == set(mode.ENGINES)
    # without a CUDA device: small mixes by default, checked, not timed
    assert len(plan.groups) == 2 * len(mode.CPU_MIXES) and plan.states == ("fp32",)
    assert not any(g.skip for g in plan.groups) and "checked against float64" in plan.notes[0]
    big = bench_plan("--mode", "engine-prefill", "--device", "cpu", "--mix", "8x1024,4x64+2pad")
    assert [bool(g.skip) for g in big.groups] == [True, False] * 2
    assert "at most 2048 tokens" in big.groups[0].skip
    assert mode.mix_lengths("3x5+2pad") == ([5, 5, 5], 2)
    assert bench_plan("--mode", "engine-prefill", "--algo", "all").entries == plan.entries
    plan = bench_plan("--mode", "engine-prefill", "--algo", "pt-reference", "--mix", "2x9",
                      "--heads", "2,4", "--dim", "32", "--state-dtype", "fp32,bf16")
    assert plan.entries == ("engine", "auto", "pt-reference") and plan.K == 32
    assert [g.label for g in plan.groups] == ["vllm 2x9 fp32", "vllm 2x9 bf16", "sglang 2x9 fp32",
                                              "sglang 2x9 bf16"]
    c = plan.groups[0].cells[0][0]
    assert (c.B, c.T, c.H, c.HV, c.mode, dict(c.keys)) == (2, 18, 2, 4, "vllm", {"mix": "2x9"})


def test_without_flashinfer_the_engine_entry_is_skipped_with_the_reason(tmp_path, capsys):
    code, out, _ = run_cli(["bench", "--mode", "engine-prefill", "--device", "cpu", "--algo",
                            "pt-reference", "--mix", "2x9", "--heads", "2,4", "--dim", "32",
                            "--quiet", "--out", str(tmp_path)], capsys)
    assert code == 0, out
    rows, _ = read_results(tmp_path / "results.json")
    eng = [r for r in rows if r["backend"] == "engine"]
    assert eng and all(r["status"] == "SKIP" and "FlashInfer" in r["note"] for r in eng)
    ours = [r for r in rows if r["backend"] in ("auto", "pt-reference")]
    assert ours and all(r["status"] == "PASS" for r in ours), ours


@pytest.mark.parametrize("mix", ["2x9", "ragged"])
def test_every_entry_passes_the_gate_with_a_stand_in_kernel(mix, tmp_path, capsys, monkeypatch):
    """The engines' sequences around a stand-in chunk kernel, and the adapters, each judged
    against the float64 oracle (output, named slots; the adapters also: the rest of the pool
    untouched, padded rows zero); a wrong engine result is caught."""
    monkeypatch.setattr(mode, "engine_kernel", lambda device: ep.stand_in("pt-reference"))
    monkeypatch.setitem(mode.MIXES, "ragged", ([17, 1, 40, 2], 2))
    argv = ["bench", "--mode", "engine-prefill", "--device", "cpu", "--algo", "pt-reference",
            "--mix", mix, "--heads", "2,4", "--dim", "32", "--state-dtype", "fp32,bf16",
            "--quiet", "--out", str(tmp_path)]
    code, out, _ = run_cli(argv, capsys)
    assert code == 0, out
    rows, _ = read_results(tmp_path / "results.json")
    assert {r["backend"] for r in rows} == {"engine", "auto", "pt-reference"}
    assert {r["mode"] for r in rows} == {"vllm", "sglang"}
    assert {r["auto"] for r in rows} == {"pt-reference"}     # who serves the adapters' calls
    bad = [r for r in rows if r["status"] != "PASS"]
    assert not bad, bad
    assert all(r["rel_err_state"] < 1e-2 for r in rows)

    def broken(device):                       # the kernel's final states off by a factor
        fi = ep.stand_in("pt-reference")

        def run(*a, **kw):
            o, s = fi(*a, **kw)
            return o, s * 1.5
        return run
    monkeypatch.setattr(mode, "engine_kernel", broken)
    code, out, _ = run_cli(argv, capsys)
    rows, _ = read_results(tmp_path / "results.json")
    assert {r["status"] for r in rows if r["backend"] == "engine"} == {"FAIL"}


def test_a_backend_without_pools_is_skipped_with_its_reason(tmp_path, capsys, monkeypatch):
    from gdnzoo import registry
    monkeypatch.setattr(mode, "engine_kernel", lambda device: ep.stand_in("pt-reference"))
    spec = registry.spec("pt-reference", "prefill")
    monkeypatch.setitem(spec.features, "pools", "no slot indices here")
    code, out, _ = run_cli(["bench", "--mode", "engine-prefill", "--device", "cpu", "--algo",
                            "pt-reference", "--mix", "2x9", "--heads", "2,4", "--dim", "32",
                            "--quiet", "--out", str(tmp_path)], capsys)
    rows, _ = read_results(tmp_path / "results.json")
    ref = [r for r in rows if r["backend"] == "pt-reference"]
    assert ref and all(r["status"] == "SKIP" and "no slot indices here" in r["note"]
                       for r in ref)

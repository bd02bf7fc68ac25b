"""``gdnzoo check --op prefill``: the contest's prefill workloads through every prefill backend,
judged by the gate against the fp32 per-token reference.  On CPU the mix is cut to a few short
sequences (the contest's 8k-token ones are for the GPU) and the geometry stays the contest's."""
import argparse

import pytest
import torch

import gdnzoo
from gdnzoo import inputs
from gdnzoo.backends import triton_chunk as tc
from gdnzoo.bench import check

SMALL_MIX = [[3, 0, 5], [1], [2, 2]]


@pytest.fixture
def small_mix(monkeypatch):
    monkeypatch.setattr(inputs, "CONTEST_PREFILL_MIX", SMALL_MIX)


def _parser():
    p = argparse.ArgumentParser()
    check.add_check_args(p)
    return p


def test_prefill_workloads_are_the_contest_definition(small_mix):
    wl = check.prefill_workloads(seed=0, device="cpu", no_state=2)
    assert [w[1] for w in wl] == ["3 ragged", "1x1", "2x2", "3 ragged, no state",
                                  "1x1, no state"]
    for _, label, x, ref_out, ref_state in wl:
        T, N = x.q.shape[0], x.cu_seqlens.numel() - 1
        assert x.q.shape == x.k.shape == (T, 4, 128) and x.v.shape == (T, 8, 128)
        assert x.q.dtype == x.v.dtype == torch.bfloat16 and x.cu_seqlens.dtype == torch.int64
        assert (x.state is None) == label.endswith("no state")
        if x.state is not None:
            assert x.state.shape == (N, 8, 128, 128) and x.state.dtype == torch.float32
        assert ref_out.shape == (T, 8, 128) and ref_state.shape == (N, 8, 128, 128)


# on a GPU machine the interpreter is off and triton-chunk refuses CPU tensors
CPU_SERVED = tc.serves(H=4, HV=8, K=128, V=128, io_dtype=torch.bfloat16, device="cpu")


@pytest.mark.skipif(not CPU_SERVED[0], reason=CPU_SERVED[1])
def test_check_prefill_passes_the_reference_and_triton_chunk(small_mix, capsys):
    rc = check.cmd_check(_parser().parse_args(
        ["--op", "prefill", "--algo", "pt-reference,triton-chunk,fi-baseline", "--device",
         "cpu"]))
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "PASS  pt-reference   6/6" in text and "PASS  triton-chunk   6/6" in text
    assert "SKIP  fi-baseline" in text


@pytest.mark.parametrize("defect", ["scale", "state", "mutate"])
def test_check_prefill_fails_a_wrong_backend(small_mix, monkeypatch, defect):
    real = gdnzoo.get("pt-reference", "prefill")

    def broken(q, k, v, state, *args, out=None, new_state=None, **kw):
        got = real(q, k, v, state, *args, out=out, new_state=new_state, **kw)
        if defect == "scale":
            out.mul_(3.0)
        elif defect == "state":
            new_state[0, 0, 0, :4] += 1.0
        else:
            v.add_(1.0)                          # an input changed by the call
        return got
    monkeypatch.setattr(gdnzoo, "get", lambda name, op="decode": broken)
    status, reason, rows = check.check_backend(
        "pt-reference", check.prefill_workloads(0, "cpu", no_state=0), "cpu", op="prefill")
    assert status == "FAIL" and reason.startswith("mix "), reason


def test_check_prefill_refuses_what_the_contest_does_not_define(capsys):
    p = _parser()
    assert check.cmd_check(p.parse_args(["--op", "prefill", "--state-dtype", "bf16",
                                         "--device", "cpu"])) == 2
    assert "fp32" in capsys.readouterr().err
    assert check.cmd_check(p.parse_args(["--op", "prefill", "--algo", "cuda-v4",
                                         "--device", "cpu"])) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_check_refuses_an_empty_algo_list(capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--algo", ","])
    assert e.value.code == 2
    assert "--algo: expected a comma list of backend names" in capsys.readouterr().err


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_check_skips_unavailable_backends_before_any_reference(op, monkeypatch, capsys):
    """Every backend named unavailable here: each said with its reason, exit status 1, and no
    workload or reference computed (minutes on a CPU for the prefill mix)."""
    def never(*a, **kw):
        raise AssertionError("a reference was computed")
    monkeypatch.setattr(check, "prefill_workloads", never)
    monkeypatch.setattr(inputs, "contest_workloads", never)
    monkeypatch.setattr(check, "_reference", never)
    unavailable = next(b.name for b in gdnzoo.list_backends("cpu", op=op) if not b.available)
    assert check.cmd_check(_parser().parse_args(["--op", op, "--algo", unavailable,
                                                 "--device", "cpu"])) == 1
    out, err = capsys.readouterr()
    assert unavailable in out and "SKIP" in out and "nothing was checked" in err

"""The speculative-verify benchmark (``gdnzoo bench --mode verify``) on CPU: its arguments, the
index bank and inputs, the correctness gate on every form (and wrong calls it must catch), the
verify floor's byte accounting and source, result files and console, and the CPU run's skips.
Timing needs a GPU; the GPU-only tests say so."""
import argparse
import json
import shutil
import subprocess

import pytest
import torch

from gdnzoo import cli
from gdnzoo.bench import floor, pool, report, sweep, verify

HAS_CUDA = torch.cuda.is_available()
SMALL = ("--heads", "1,2", "--dim", "16")


def _args(*extra):
    return sweep.add_bench_args(argparse.ArgumentParser()).parse_args(["--mode", "verify", *extra])


# ------------------------------------------------------------------------------ arguments

def test_plan_defaults_and_overrides():
    plan = verify.make_plan(_args())
    assert plan.batches == (1, 4, 16, 64, 256) and plan.tokens == (2, 4, 8)
    assert plan.states == ("fp32", "bf16") and plan.clocks == ("kernel", "graph")
    assert plan.entries[0] == "auto" and plan.entries[-3:] == verify.PEERS
    assert set(plan.backends) == set(verify.verify_backends())
    assert {"fla-recurrent", "cuda-v4"} <= set(plan.backends)
    assert not {"pt-reference", "pt-compiled", "fla-tma", "vllm-packed"} & set(plan.backends)
    assert (plan.H, plan.HV, plan.K, plan.V) == (4, 8, 128, 128) and plan.budget == verify.BUDGET_S
    plan = verify.make_plan(_args("--tokens", "3,16", "--batch", "2", "--state-dtype", "bf16",
                                  "--algo", "pt-reference", "--timing", "kernel"))
    assert plan.tokens == (3, 16) and plan.batches == (2,) and plan.states == ("bf16",)
    assert plan.entries == ("auto", "pt-reference", *verify.PEERS) and plan.clocks == ("kernel",)
    assert verify.make_plan(_args("--tokens", "5")).tokens == (5,)
    given = verify.make_plan(_args("--state-dtype", "fp32", "--batch", ",".join(
        map(str, sweep.DEFAULT_BATCHES)), "--time-budget", str(sweep.DEFAULT_BUDGET_S)))
    assert given.states == ("fp32",) and given.batches == sweep.DEFAULT_BATCHES  # as given
    assert given.budget == sweep.DEFAULT_BUDGET_S
    args = _args()
    assert not any(sweep.given(v) for v in (args.batch, args.tokens, args.state_dtype,
                                            args.time_budget))
    assert args.batch == list(sweep.DEFAULT_BATCHES) and args.tokens == 1   # the dense defaults


def test_token_counts_parse():
    assert sweep.token_counts("2") == 2 and sweep.token_counts("2,4,8") == (2, 4, 8)
    for bad in ("", "2,x", "0", "2,2", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            sweep.token_counts(bad)


@pytest.mark.parametrize("argv,match", [
    (("--tokens", "2,x"), "--tokens"), (("--tokens", "2,2"), "--tokens"),
    (("--tokens", "0"), "--tokens"), (("--tokens", "2,17"), "--tokens: a verify call checks"),
    (("--tokens", "1,4"), "--tokens: a verify call checks"),
    (("--tokens", "1"), "--tokens: a verify call checks"),
    (("--mode", "verify,pool"), "--mode"), (("--algo", "no-such"), "--algo: unknown"),
    (("--timing", "host"), "--timing: verify mode")])
def test_bad_arguments_exit_2_naming_the_argument(argv, match, capsys, tmp_path):
    mode = () if "--mode" in argv else ("--mode", "verify")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *mode, *argv, "--out", str(tmp_path)])
    assert e.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()            # nothing ran


@pytest.mark.parametrize("mode", ["inplace", "pool"])
def test_a_token_list_is_for_verify_mode_only(mode, capsys):
    args = sweep.add_bench_args(argparse.ArgumentParser()).parse_args(
        ["--mode", mode, "--tokens", "2,4"])
    assert sweep.cmd_bench(args) == 2
    assert "--tokens: a list of token counts is for --mode verify" in capsys.readouterr().err


# ------------------------------------------------------------------------------ the inputs

def test_pool_size_covers_every_cell():
    HV, V, K, l2 = 8, 128, 128, 50 << 20
    slot = HV * V * K * 4
    cells = [(B, T) for B in verify.BATCHES for T in verify.TOKENS]
    P = verify.pool_slots(cells, HV, V, K, 4, l2)
    assert P * pool.page_elems(HV, V, K) * 4 >= 2 << 30
    for B, T in cells:
        n = verify.rows_for(B, T, slot, l2)
        assert n * B * T * slot >= 4 * l2 and n >= 2
        assert (n + 1) * B * (T + 1) <= P - 1
    assert verify.rows_for(1, 2, slot, l2) == 200
    assert verify.pool_slots([(4, 2)], 2, 16, 16, 4, 0, min_bytes=0) == 3 * 4 * 3 + 1


def test_indices_are_fresh_distinct_and_aligned():
    B, T, n = 3, 4, 5
    acc = torch.tensor([1, 4, 2], dtype=torch.int32)
    ix = verify.Indices(P=200, B=B, T=T, n=n, accepted=acc, device="cpu", seed=3)
    every = torch.cat([torch.cat([r.slots, r.grid.flatten()]) for r in ix.rows + [ix.check]])
    assert len(set(every.tolist())) == every.numel() == (n + 1) * B * (T + 1)
    assert every.min() >= 1 and every.max() < 200                      # slot 0: the null slot
    for i, r in enumerate(ix.rows + [ix.check]):
        assert r.block == i and sorted(r.rows.tolist()) == list(range(i * B, i * B + B))
        assert r.read.tolist() == [r.grid[m, acc[m] - 1].item() for m in range(B)]
        assert r.grid.shape == (B, T) and r.grid.is_contiguous()
        for t in (r.slots, r.rows, r.grid, r.read):
            assert t.dtype == torch.int32 and (t.data_ptr() - ix.bank[0].data_ptr()) % 4 == 0
        for t, bank in zip((r.slots, r.rows, r.grid, r.read), ix.bank):
            assert (t.data_ptr() - bank.data_ptr()) % 256 == 0
    first = ix.rows[0]
    ix.advance()                                                        # the persistent tensors
    c = ix.index
    assert c.block == 0 and torch.equal(c.slots, first.slots) and torch.equal(c.grid, first.grid)
    assert torch.equal(c.rows, first.rows) and torch.equal(c.read, first.read)
    assert ix.next() is ix.rows[1] and ix.row(n + 2) is ix.rows[2]      # one counter, round robin
    with pytest.raises(ValueError, match="indices"):
        verify.Indices(P=50, B=B, T=T, n=n, accepted=acc, device="cpu")


def test_inputs_are_views_of_packed_tensors():
    B, T, H, HV, K, V = 2, 3, 2, 4, 16, 8
    x = verify.VerifyInputs(B, T, H, HV, K, V, "bf16", "cpu", seed=1)
    D = 2 * H * K + HV * V
    assert x.mixed.shape == (B * T, D) and x.mixed.is_contiguous()
    for t, off, shape in ((x.q, 0, (B, T, H, K)), (x.k, H * K, (B, T, H, K)),
                          (x.v, 2 * H * K, (B, T, HV, V))):
        assert t.shape == shape and t.stride()[:2] == (T * D, D) and t.stride(-1) == 1
        assert t.data_ptr() - x.mixed.data_ptr() == off * x.mixed.element_size()
    assert x.a.shape == x.b.shape == (B, T, HV) and x.a.stride() == (T * 2 * HV, 2 * HV, 1)
    assert x.out.shape == (B, T, HV, V)
    q, k, v, a, b = x.dense()
    assert all(t.is_contiguous() for t in (q, k, v, a, b)) and torch.equal(q, x.q)
    assert x.dense()[0] is q                                            # made once


# ------------------------------------------------------------------------------ the gate

def _ctx(B=2, T=3, sd="fp32", seed=0):
    plan = verify.make_plan(_args(*SMALL))
    from gdnzoo.inputs import DTYPES
    P = verify.pool_slots([(B, T)], plan.HV, plan.V, plan.K, DTYPES[sd].itemsize, 0, min_bytes=0)
    sp = pool.StatePool(P + 3, plan.HV, plan.V, plan.K, DTYPES[sd], "cpu", seed)
    return verify.make_ctx(B, T, sd, sp, plan, 0, "cpu", seed), plan


@pytest.mark.parametrize("sd", ["fp32", "bf16"])
@pytest.mark.parametrize("form", verify.FORMS)
def test_reference_entries_pass_the_check(sd, form):
    ctx, _ = _ctx(sd=sd, seed=1)
    storage = ctx.pool.buf.clone()
    for name in ("auto", "pt-reference"):
        e = verify.entry_call(name, form, ctx)
        chk = verify.check_entry(e, ctx, form)
        assert chk["ok"], (name, chk["reason"])
        assert chk["rel_err_out"] < 1e-2 and chk["n_bad"] == 0
        assert torch.equal(ctx.pool.buf, storage)                       # restored after the check
    assert verify.entry_call("auto", form, ctx).note.startswith("auto -> pt-reference")


def _wrong(ctx, form, how):
    """A call that gets one thing wrong."""
    good = verify.entry_call("pt-reference", form, ctx).call
    upd = verify.entry_call("pt-reference", "states+update", ctx).call

    def call(ix):
        if how == "zeros":
            ctx.x.out.zero_()
            return ctx.x.out
        if how == "writes final":                                       # under update_state=False
            return upd(ix)
        if how == "shifted slots":                                      # token t's state to t+1
            return good(ix._replace(grid=ix.grid.roll(1, dims=1).contiguous()))
        if how == "other rows":
            return good(ix._replace(rows=ix.rows.flip(0).contiguous()))
        out = good(ix)
        if how == "page gap":
            ctx.pool.buf[ctx.pool.slot] += 1                             # slot 0's page gap
        if how == "scribbles":
            ctx.x.mixed[0, 0] += 1
        return out
    return verify.Entry(call, "")


@pytest.mark.parametrize("form,how,match", [
    ("states", "zeros", "out:"), ("states", "writes final", "changed although update_state"),
    ("states", "other rows", "new_state:"), ("states+update", "page gap", "outside the call's"),
    ("slots", "shifted slots", "new_state:"), ("slots", "scribbles", "mixed_qkv"),
    ("states+update", "zeros", "out:")])
def test_the_check_catches_wrong_calls(form, how, match):
    ctx, _ = _ctx(B=3, T=2, seed=2)
    storage, inter = ctx.pool.buf.clone(), ctx.inter.clone()
    chk = verify.check_entry(_wrong(ctx, form, how), ctx, form)
    assert not chk["ok"] and match in chk["reason"], chk["reason"]
    assert torch.equal(ctx.pool.buf, storage) and torch.equal(ctx.inter, inter)  # restored


def test_commit_check_passes_commit_and_catches_a_wrong_step():
    import gdnzoo
    ctx, _ = _ctx(B=3, T=4, seed=3)
    storage = ctx.pool.buf.clone()
    chk = verify.check_commit(verify.commit_call(ctx), ctx)
    assert chk["ok"], chk["reason"]
    assert torch.equal(ctx.pool.buf, storage)

    def off_by_one(ix):
        gdnzoo.commit(ctx.inter, ix.rows, (ctx.steps + 1) % ctx.T, ctx.pool.state, ix.slots)
    chk = verify.check_commit(off_by_one, ctx)
    assert not chk["ok"] and "committed slots differ" in chk["reason"]


def test_entries_say_why_they_cannot_run_here():
    import re
    from gdnzoo import registry
    ctx, _ = _ctx(sd="bf16")
    for name, form, match in (
            ("vllm-spec", "states", "slots form only"),
            ("not-a-backend", "states", "not registered"),
            ("flashinfer-mtp", "states", "fp32 pool only"),
            ("flashinfer-pretranspose", "slots", "form only")):
        with pytest.raises(verify.Skip, match=match):
            verify.entry_call(name, form, ctx)
    for name, form in (("fla-tma", "states"), ("vllm-packed", "slots"), ("cuda-v4", "slots")):
        ok, why = registry.can_serve(name, verify.problem(ctx, form))   # the registry's reason
        assert not ok                                 # K=V=16 or no GPU or no verify, each
        with pytest.raises(verify.Skip, match=re.escape(why)):
            verify.entry_call(name, form, ctx)
    if not HAS_CUDA:
        for name, form in (("vllm-spec", "slots"), ("flashinfer-pretranspose", "states")):
            with pytest.raises(verify.Skip, match="CUDA devices only"):
                verify.entry_call(name, form, ctx)


# ------------------------------------------------------------------------------ the floor

def test_floor_byte_accounting():
    HV, V, K = 2, 16, 16
    slot = HV * V * K
    buf = torch.zeros(20 * 528)
    idx, idx2 = torch.arange(1, 4, dtype=torch.int32), torch.arange(1, 13, dtype=torch.int32)
    rows, cnt = torch.arange(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32)
    inter = torch.zeros(3, 4, HV, V, K)
    blk = slot * 4
    for form, args, n_stores in (("states", dict(index=idx, inter=inter, rows=rows), 4),
                                 ("states+update", dict(index=idx, inter=inter, rows=rows), 5),
                                 ("slots", dict(index=idx2.view(3, 4), counts=cnt), 4),
                                 ("commit", dict(index=idx, inter=inter, rows=rows,
                                                 counts=cnt), 1)):
        t = floor.VerifyTarget(form, buf, 528, slot, 3, 4, prepare=None, **args)
        assert t.stores == floor.verify_stores(form, 4) == n_stores
        assert t.bytes_moved == 3 * (1 + n_stores) * blk                # one read, the stores
        assert (t.page4, t.n4) == (528 * 4 // 16, blk // 16)
        assert verify.bytes_moved("floor", form, 3, 4, 1, HV, K, V, 4) == t.bytes_moved
    assert floor.VerifyTarget("slots", buf, 528, slot, 3, 4, idx2.view(3, 4), None,
                              counts=cnt).ld == 4
    t = floor.VerifyTarget("states", buf, 528, slot, 3, 4, idx, None, inter=inter, rows=rows)
    assert (t.row4, t.step4) == (4 * blk // 16, blk // 16)
    io = 2 * 3 * 4 * (2 * 1 * K + 2 * HV * V + 2 * HV) + 2 * HV * 4   # q, k, v, a, b, out
    assert verify.bytes_moved("auto", "states", 3, 4, 1, HV, K, V, 4) == 3 * 5 * blk + io
    assert verify.bytes_moved("commit", "commit", 3, 4, 1, HV, K, V, 4) == 3 * 2 * blk


def _target_args(form):
    idx = torch.arange(1, 4, dtype=torch.int32)
    return dict(index=idx.view(3, 1).expand(3, 2).contiguous() if form == "slots" else idx,
                inter=torch.zeros(3, 2, 2, 16, 16), rows=idx - 1, counts=torch.ones_like(idx))


@pytest.mark.parametrize("form,change,match", [
    ("bogus", {}, "form must be"), ("states", dict(T=17), "T must be"),
    ("states", dict(index=torch.arange(1, 4)), "index must be an int32 \\[3\\]"),
    ("slots", dict(index=torch.arange(1, 4, dtype=torch.int32)), "index must be an int32 \\[3, 2"),
    ("states", dict(inter=torch.zeros(3, 1, 2, 16, 16)), "inter must be"),
    ("commit", dict(rows=None), "rows must be"), ("slots", dict(counts=None), "counts must be")])
def test_floor_target_refuses_bad_arguments(form, change, match):
    kw = dict(_target_args(form), T=2)
    kw.update(change)
    T = kw.pop("T")
    with pytest.raises(ValueError, match=match):
        floor.VerifyTarget(form, torch.zeros(20 * 528), 528, 512, 3, T, prepare=None, **kw)


def test_verify_floor_skips_without_cupy(monkeypatch):
    monkeypatch.setattr(floor, "cupy_available", lambda: (False, "cupy not importable (test)"))
    idx = torch.arange(1, 4, dtype=torch.int32)
    t = floor.VerifyTarget("states", torch.zeros(20 * 528), 528, 512, 3, 2, idx, None,
                           inter=torch.zeros(3, 2, 2, 16, 16), rows=idx - 1)
    f = floor.verify_floor_times(t)
    assert f["samples"] is None and "cupy not importable (test)" in f["config"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: cannot compile")
def test_verify_floor_source_compiles(tmp_path):
    """Every form's kernel compiles for sm_90 (one launch shape each; CuPy compiles all)."""
    inst = "".join(f"template __global__ void stream_verify<{f}, 4, 256>(float4*, float4*, "
                   f"const int*, const int*, const int*, long long, int, long long, long long, "
                   f"long long, long long, float, float);\n" for f in range(4))
    src = tmp_path / "verify_floor.cu"
    src.write_text(floor._SRC + floor._VERIFY_SRC + inst)
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--cubin", "-o", "/dev/null",
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [f for f in floor.VERIFY_FORMS] == ["states", "states+update", "slots", verify.COMMIT]


@pytest.mark.skipif(not HAS_CUDA, reason="the verify floor runs on a CUDA device (CuPy)")
@pytest.mark.parametrize("form", floor.VERIFY_FORMS)
def test_verify_floor_stores_where_the_form_stores(form):
    """With alpha=1, beta=0 the floor copies: every place the form stores must then hold the
    block it read, and nothing else may change."""
    ok, why = floor.cupy_available()
    if not ok:
        pytest.skip(why)
    B, T, HV, V, K = 3, 4, 2, 16, 16
    sp = pool.StatePool(64, HV, V, K, torch.float32, "cuda", seed=0)
    ix = verify.Indices(sp.P, B, T, 2, torch.tensor([2, 1, 4], dtype=torch.int32), "cuda")
    ix.advance()
    c = ix.index
    inter = torch.randn(3 * B, T, HV, V, K, device="cuda")
    steps = torch.tensor([0, 3, 1], dtype=torch.int32, device="cuda")
    accepted = torch.tensor([2, 1, 4], dtype=torch.int32, device="cuda")
    t = floor.VerifyTarget(form, sp.buf, sp.page, sp.slot, B, T,
                           c.grid if form == "slots" else c.slots, None,
                           inter=None if form == "slots" else inter,
                           rows=None if form == "slots" else c.rows,
                           counts={"slots": accepted, "commit": steps}.get(form))
    before, inter0 = sp.state.clone(), inter.clone()
    floor._verify_launcher(t, (4, 128, 2))(0)
    torch.cuda.synchronize()
    r, s = c.rows.long(), c.slots.long()
    if form == "slots":
        src = before[c.read.long()]
        assert torch.equal(sp.state[c.grid.long()], src[:, None].expand(B, T, HV, V, K))
    elif form == "commit":
        assert torch.equal(sp.state[s], inter0[r, steps.long()])
    else:
        assert torch.equal(inter[r], before[s][:, None].expand(B, T, HV, V, K))
        assert torch.equal(sp.state, before)


# ------------------------------------------------------------------------------ results

def _raw(plan, name, form, B, T, sd, us, status="PASS", note="", clock="kernel"):
    return dict(cell=verify._cell(name, form, (B, T, sd), plan), clock=clock, status=status,
                note=note, flags="", samples=[us * f for f in (0.98, 1.0, 1.03)] if us else [],
                kernels_per_call=1 if us else "")


def test_results_files_round_trip_and_console(tmp_path):
    plan = verify.make_plan(_args("--batch", "1,16", "--tokens", "2,4"))
    raw = []
    for sd in ("fp32", "bf16"):
        for T in (2, 4):
            for B in (1, 16):
                f = B * T
                raw += [_raw(plan, "floor", "states", B, T, sd, 1.0 * f),
                        _raw(plan, "floor", "slots", B, T, sd, 2.0 * f),
                        _raw(plan, "auto", "states", B, T, sd, 1.5 * f),
                        _raw(plan, "auto", "states", B, T, sd, 1.7 * f, clock="graph"),
                        _raw(plan, "auto", "slots", B, T, sd, 2.5 * f),
                        _raw(plan, "cuda-v4", "slots", B, T, sd, None, "FAIL", "out: 3 bad"),
                        _raw(plan, "vllm-spec", "slots", B, T, sd, None, "SKIP",
                             "vllm not importable")]
            raw += [_raw(plan, "floor", "commit", B, 4, sd, 0.8) for B in (1, 16)]
            raw += [_raw(plan, "commit", "commit", B, 4, sd, 1.6) for B in (1, 16)]
    table = verify.build_table(raw, {"copy": {"gbps": 3000.0}})
    env = dict(gpu="NVIDIA H100 80GB HBM3", driver="d", cuda="13.0", commit="c",
               method=verify.METHOD, versions={"torch": "2.11"},
               kernel_clock="cupti-python activity records")
    files = pool.write_results(table, env, tmp_path)
    back, env2 = report.read_results(tmp_path / "results.json")
    assert len(back) == len(table) and env2["method"] == verify.METHOD
    assert json.loads((tmp_path / "results.json").read_text())["columns"] == pool.columns()
    auto = [r for r in back if r["backend"] == "auto" and r["clock"] == "kernel"]
    assert {r["mode"] for r in auto} == {"states", "slots"} and all(r["l2norm"] for r in auto)
    assert {round(r["x_floor"], 3) for r in auto if r["mode"] == "states"} == {1.5}
    assert {round(r["x_floor"], 3) for r in auto if r["mode"] == "slots"} == {1.25}
    assert {round(r["x_floor"], 3) for r in back if r["backend"] == "commit"} == {2.0}
    a = next(r for r in back if r["backend"] == "auto" and r["B"] == 16 and r["T"] == 4
             and r["mode"] == "slots" and r["state_dtype"] == "bf16")
    assert a["bytes_moved"] == verify.bytes_moved("auto", "slots", 16, 4, 4, 8, 128, 128, 2)
    assert a["achieved_gbps"] == pytest.approx(a["bytes_moved"] / a["median_us"] / 1e3)
    text = verify.console(table, env, ["fp32 pool: 6913 slots"], files, plan)
    assert "fp32 state, T=2, kernel clock, us / x the same-run floor of the form" in text
    assert "bf16 state, T=4, graph clock" in text and "commit (intermediate_states T_max=4)" in text
    line = next(s for s in text.splitlines() if s.startswith("auto [states] ") and "1.50x" in s)
    assert "3.00/1.50x" in line and "48.00/1.50x" in line                 # fp32 T=2: B=1, B=16
    assert any(s.startswith("floor [slots]") for s in text.splitlines())
    assert "FAIL cuda-v4 (fp32 B=1): out: 3 bad" in text
    assert "SKIP vllm-spec: vllm not importable" in text
    assert "note: fp32 pool: 6913 slots" in text and "wrote:" in text


@pytest.mark.skipif(HAS_CUDA, reason="checks the run without a GPU")
def test_cpu_run_checks_what_it_can_and_says_why_not(tmp_path, capsys):
    args = _args(*SMALL, "--batch", "1,8", "--tokens", "2,3", "--state-dtype", "bf16",
                 "--out", str(tmp_path), "--quiet")
    assert sweep.cmd_bench(args) == 0
    text = capsys.readouterr().out
    assert ("checked against the reference, not timed (not on a CUDA device): auto [slots]"
            in text)
    assert "commit [commit]" in text and "SKIP floor: not on a CUDA device" in text
    assert "only B <= 4 is checked on the CPU" in text
    rows, env = report.read_results(tmp_path / "results.json")
    plan = verify.make_plan(args)
    per_cell = {T: len([r for n, f in verify._cell_names(plan, T == 3)
                        for r in verify._rows_of(n, f, (1, T, "bf16"), plan, "", "")])
                for T in (2, 3)}
    assert len(rows) == 2 * (per_cell[2] + per_cell[3])                 # B x T cells
    b1 = [r for r in rows if r["B"] == 1]
    assert {r["status"] for r in b1 if r["backend"] in ("auto", "commit")} == {"PASS"}
    assert all("not timed" in r["note"] for r in b1 if r["status"] == "PASS")
    assert all(r["status"] == "SKIP" for r in rows if r["B"] == 8 or r["backend"] == "floor")
    assert all(r["median_us"] != r["median_us"] for r in rows)          # nothing timed: NaN
    assert "no CUDA device" in env["notes"][0]
    assert {r["mode"] for r in rows} == {"states", "states+update", "slots", "commit"}

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
from gdnzoo.bench import args as bench_args, console, entries, floor, pipeline, report
from gdnzoo.bench import mode_pool as pool
from gdnzoo.bench import mode_verify as verify
from gdnzoo.inputs import page_elems
from helpers import bench_args as _bench_args, bench_files, run_cli

HAS_CUDA = torch.cuda.is_available()
SMALL = ("--heads", "1,2", "--dim", "16")


def _args(*extra):
    return _bench_args("--mode", "verify", "--device", "cpu", *extra)


def _plan(*extra):
    return pipeline.make_plan(_args(*extra))


# ------------------------------------------------------------------------------ arguments

def test_plan_defaults_and_overrides():
    plan = _plan()
    assert plan.batches == (1, 4, 16, 64, 256) and plan.tokens == (2, 4, 8)
    assert plan.states == ("fp32", "bf16") and plan.clocks == ("kernel", "graph")
    assert plan.entries[0] == "auto" and plan.entries[-3:] == verify.PEERS
    assert set(plan.backends) == set(entries.backends(verify=True, native=True))
    assert {"fla-recurrent", "cuda-v4"} <= set(plan.backends)
    assert not {"pt-reference", "pt-compiled", "fla-tma", "vllm-packed"} & set(plan.backends)
    assert (plan.H, plan.HV, plan.K, plan.V) == (4, 8, 128, 128) and plan.budget == verify.BUDGET_S
    plan = _plan("--tokens", "3,16", "--batch", "2", "--state-dtype", "bf16",
                 "--algo", "pt-reference", "--timing", "kernel")
    assert plan.tokens == (3, 16) and plan.batches == (2,) and plan.states == ("bf16",)
    assert plan.entries == ("auto", "pt-reference", *verify.PEERS) and plan.clocks == ("kernel",)
    assert _plan("--tokens", "5").tokens == (5,)
    given = _plan("--state-dtype", "fp32", "--batch", ",".join(
        map(str, bench_args.DEFAULT_BATCHES)), "--time-budget", str(bench_args.DEFAULT_BUDGET_S))
    assert given.states == ("fp32",) and given.batches == bench_args.DEFAULT_BATCHES  # as given
    assert given.budget == bench_args.DEFAULT_BUDGET_S
    args = _args()
    assert not any(bench_args.given(v) for v in (args.batch, args.tokens, args.state_dtype,
                                                 args.time_budget))
    assert args.batch == list(bench_args.DEFAULT_BATCHES) and args.tokens == 1   # dense defaults


def test_token_counts_parse():
    assert bench_args.token_counts("2") == 2 and bench_args.token_counts("2,4,8") == (2, 4, 8)
    for bad in ("", "2,x", "0", "2,2", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_args.token_counts(bad)


@pytest.mark.parametrize("argv,match", [
    (("--tokens", "2,x"), "--tokens"), (("--tokens", "2,2"), "--tokens"),
    (("--tokens", "0"), "--tokens"), (("--tokens", "2,17"), "--tokens: a verify call checks"),
    (("--tokens", "1,4"), "--tokens: a verify call checks"),
    (("--tokens", "1"), "--tokens: a verify call checks"),
    (("--mode", "verify,pool"), "--mode"), (("--algo", "no-such"), "--algo: unknown"),
    (("--timing", "host"), "--timing: --mode verify times")])
def test_bad_arguments_exit_2_naming_the_argument(argv, match, capsys, tmp_path):
    mode = () if "--mode" in argv else ("--mode", "verify")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *mode, *argv, "--out", str(tmp_path)])
    assert e.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()            # nothing ran


@pytest.mark.parametrize("mode", ["inplace", "pool", "chained"])
def test_a_token_list_is_for_verify_mode_only(mode, capsys):
    code, _, err = run_cli(["bench", "--mode", mode, "--tokens", "2,4"], capsys)
    assert code == 2 and "--tokens: a list of token counts is for --mode verify" in err


# ------------------------------------------------------------------------------ the inputs

def test_pool_size_covers_every_cell():
    HV, V, K, l2 = 8, 128, 128, 50 << 20
    slot = HV * V * K * 4
    cells = [(B, T) for B in verify.BATCHES for T in verify.TOKENS]

    def width(B, T):
        return B * (T + 1)
    P = pool.pool_slots(cells, HV, V, K, 4, l2, width=width)
    assert P * page_elems(HV, V, K) * 4 >= 2 << 30
    for B, T in cells:
        n = pool.rows_for(B, slot, l2, T)
        assert n * B * T * slot >= 4 * l2 and n >= 2
        assert (n + 1) * B * (T + 1) <= P - 1
    assert pool.rows_for(1, slot, l2, 2) == 200
    assert pool.pool_slots([(4, 2)], 2, 16, 16, 4, 0, min_bytes=0, width=width) == 3 * 4 * 3 + 1


def test_indices_are_fresh_distinct_and_aligned():
    B, T, n = 3, 4, 5
    acc = torch.tensor([1, 4, 2], dtype=torch.int32)
    ix = verify.verify_bank(P=200, B=B, T=T, n=n, accepted=acc, device="cpu", seed=3)
    every = torch.cat([torch.cat([r.slots, r.grid.flatten()]) for r in ix.rows + [ix.check]])
    assert len(set(every.tolist())) == every.numel() == (n + 1) * B * (T + 1)
    assert every.min() >= 1 and every.max() < 200                      # slot 0: the null slot
    for i, r in enumerate(ix.rows + [ix.check]):
        assert r.block == i and sorted(r.rows.tolist()) == list(range(i * B, i * B + B))
        assert r.read.tolist() == [r.grid[m, acc[m] - 1].item() for m in range(B)]
        assert r.grid.shape == (B, T) and r.grid.is_contiguous()
        for name in ("slots", "rows", "grid", "read"):
            t = getattr(r, name)
            assert t.dtype == torch.int32
            assert (t.data_ptr() - ix.bank[name].data_ptr()) % 256 == 0
    first = ix.rows[0]
    ix.advance()                                                        # the persistent tensors
    c = ix.index
    assert c.block == 0 and torch.equal(c.slots, first.slots) and torch.equal(c.grid, first.grid)
    assert torch.equal(c.rows, first.rows) and torch.equal(c.read, first.read)
    assert ix.next() is ix.rows[1] and ix.row(n + 2) is ix.rows[2]      # one counter, round robin
    with pytest.raises(ValueError, match="indices"):
        verify.verify_bank(P=50, B=B, T=T, n=n, accepted=acc, device="cpu")


def test_inputs_are_views_of_packed_tensors():
    B, T, H, HV, K, V = 2, 3, 2, 4, 16, 8
    x, out = pool.cell_inputs(B, T, "bf16", dict(H=H, HV=HV, K=K, V=V), "cpu", seed=1)
    D = 2 * H * K + HV * V
    assert x.mixed.shape == (B * T, D) and x.mixed.is_contiguous()
    for t, off, shape in ((x.q, 0, (B, T, H, K)), (x.k, H * K, (B, T, H, K)),
                          (x.v, 2 * H * K, (B, T, HV, V))):
        assert t.shape == shape and t.stride()[:2] == (T * D, D) and t.stride(-1) == 1
        assert t.data_ptr() - x.mixed.data_ptr() == off * x.mixed.element_size()
    assert x.a.shape == x.b.shape == (B, T, HV) and x.a.stride() == (T * 2 * HV, 2 * HV, 1)
    assert out.shape == (B, T, HV, V)
    q, k, v, a, b = x.dense()
    assert all(t.is_contiguous() for t in (q, k, v, a, b)) and torch.equal(q, x.q)


# ------------------------------------------------------------------------------ the gate

def _ctx(B=2, T=3, sd="fp32", seed=0):
    plan = _plan(*SMALL)
    from gdnzoo.inputs import DTYPES
    P = pool.pool_slots([(B, T)], plan.HV, plan.V, plan.K, DTYPES[sd].itemsize, 0, min_bytes=0,
                        width=lambda B, T: B * (T + 1))
    sp = pool.state_pool(P + 3, plan.HV, plan.V, plan.K, sd, "cpu", seed)
    g = dict(H=plan.H, HV=plan.HV, K=plan.K, V=plan.V)
    return verify.verify_ctx(B, T, sd, sp, g, 0, "cpu", seed), plan


@pytest.mark.parametrize("sd", ["fp32", "bf16"])
@pytest.mark.parametrize("form", verify.FORMS)
def test_reference_entries_pass_the_check(sd, form):
    ctx, _ = _ctx(sd=sd, seed=1)
    storage = ctx.pool.buf.clone()
    for name in ("auto", "pt-reference"):
        e = verify.verify_call(name, form, ctx)
        chk = verify.check_form(e, ctx, form)
        assert chk["ok"], (name, chk["reason"])
        assert chk["rel_err_out"] < 1e-2 and chk["n_bad"] == 0
        assert torch.equal(ctx.pool.buf, storage)                       # restored after the check
    assert verify.verify_call("auto", form, ctx).note.startswith("auto -> pt-reference")


def _wrong(ctx, form, how):
    """A call that gets one thing wrong."""
    good = verify.verify_call("pt-reference", form, ctx).call
    upd = verify.verify_call("pt-reference", "states+update", ctx).call

    def call(ix):
        if how == "zeros":
            ctx.out.zero_()
            return ctx.out
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
    return verify.Call(call, "")


@pytest.mark.parametrize("form,how,match", [
    ("states", "zeros", "out:"), ("states", "writes final", "changed although update_state"),
    ("states", "other rows", "new_state:"), ("states+update", "page gap", "outside the call's"),
    ("slots", "shifted slots", "new_state:"), ("slots", "scribbles", "mixed_qkv"),
    ("states+update", "zeros", "out:")])
def test_the_check_catches_wrong_calls(form, how, match):
    ctx, _ = _ctx(B=3, T=2, seed=2)
    storage, inter = ctx.pool.buf.clone(), ctx.inter.clone()
    chk = verify.check_form(_wrong(ctx, form, how), ctx, form)
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
        with pytest.raises(entries.Skip, match=match):
            verify.verify_call(name, form, ctx)
    for name, form in (("fla-tma", "states"), ("vllm-packed", "slots"), ("cuda-v4", "slots")):
        ok, why = registry.can_serve(name, ctx.problem(form))   # the registry's reason
        assert not ok                                 # K=V=16 or no GPU or no verify, each
        with pytest.raises(entries.Skip, match=re.escape(why)):
            verify.verify_call(name, form, ctx)
    if not HAS_CUDA:
        for name, form in (("vllm-spec", "slots"), ("flashinfer-pretranspose", "states")):
            with pytest.raises(entries.Skip, match="CUDA devices only"):
                verify.verify_call(name, form, ctx)


# ------------------------------------------------------------------------------ the floor

def _bytes(name, form, B, T, H, HV, K, V, elem):
    c = pipeline.Cell("verify", name, B, T, H, HV, K, V, "fp32" if elem == 4 else "bf16", form)
    return pipeline.get_mode("verify").bytes_moved(c)


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
        assert _bytes("floor", form, 3, 4, 1, HV, K, V, 4) == t.bytes_moved
    assert floor.VerifyTarget("slots", buf, 528, slot, 3, 4, idx2.view(3, 4), None,
                              counts=cnt).ld == 4
    t = floor.VerifyTarget("states", buf, 528, slot, 3, 4, idx, None, inter=inter, rows=rows)
    assert (t.row4, t.step4) == (4 * blk // 16, blk // 16)
    io = 2 * 3 * 4 * (2 * 1 * K + 2 * HV * V + 2 * HV) + 2 * HV * 4   # q, k, v, a, b, out
    assert _bytes("auto", "states", 3, 4, 1, HV, K, V, 4) == 3 * 5 * blk + io
    assert _bytes("commit", "commit", 3, 4, 1, HV, K, V, 4) == 3 * 2 * blk


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
    f = floor.indexed_floor_times(t)
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
    sp = pool.state_pool(64, HV, V, K, "fp32", "cuda", seed=0)
    ix = verify.verify_bank(sp.P, B, T, 2, torch.tensor([2, 1, 4], dtype=torch.int32), "cuda")
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
    floor._indexed_launcher(t, (4, 128, 2))(0)
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
    return dict(cell=plan.cell(name, form, B, sd, T=T), clock=clock, status=status,
                note=note, flags="", samples=[us * f for f in (0.98, 1.0, 1.03)] if us else [],
                kernels_per_call=1 if us else "")


def test_results_files_round_trip_and_console(tmp_path):
    plan = _plan("--batch", "1,16", "--tokens", "2,4")
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
    table, env, files, back, cols = bench_files(raw, plan, tmp_path, {"copy": {"gbps": 3000.0}})
    assert len(back) == len(table) and env["method"] == plan.mode.method
    assert json.loads((tmp_path / "results.json").read_text())["columns"] == cols
    assert {r["bench"] for r in back} == {"verify"}
    auto = [r for r in back if r["backend"] == "auto" and r["clock"] == "kernel"]
    assert {r["mode"] for r in auto} == {"states", "slots"} and all(r["l2norm"] for r in auto)
    assert {round(r["x_floor"], 3) for r in auto if r["mode"] == "states"} == {1.5}
    assert {round(r["x_floor"], 3) for r in auto if r["mode"] == "slots"} == {1.25}
    assert {round(r["x_floor"], 3) for r in back if r["backend"] == "commit"} == {2.0}
    a = next(r for r in back if r["backend"] == "auto" and r["B"] == 16 and r["T"] == 4
             and r["mode"] == "slots" and r["state_dtype"] == "bf16")
    assert a["bytes_moved"] == _bytes("auto", "slots", 16, 4, 4, 8, 128, 128, 2)
    assert a["achieved_gbps"] == pytest.approx(a["bytes_moved"] / a["median_us"] / 1e3)
    plan.notes.append("fp32 pool: 6913 slots")
    text = console.render(table, env, plan, files)
    lines = text.splitlines()
    head = lines.index("fp32 state, T=2, states, kernel clock, us / x the same-run floor of the "
                       "form:")
    assert lines[head + 1].split() == ["B", "floor", "auto", "auto", "auto/best"]
    assert lines[head + 2].split()[:3] == ["1", "2.00", "3.00/1.50x"]           # fp32 T=2 B=1
    assert lines[head + 3].split()[:3] == ["16", "32.00", "48.00/1.50x"]        # B=16
    assert "bf16 state, T=4, states, graph clock (CUDA graph of N calls), us per call:" in lines
    assert "bf16 state, commit (intermediate_states T_max=4), kernel clock, us / x the same-run " \
           "copy floor:" in lines
    slots = lines.index("fp32 state, T=4, slots, kernel clock, us / x the same-run floor of the "
                        "form:")
    assert lines[slots + 1].split()[:4] == ["B", "floor", "auto", "cuda-v4"]
    assert "FAIL cuda-v4 (fp32 B=1): out: 3 bad" in text
    assert "SKIP vllm-spec: vllm not importable" in text
    assert "note: fp32 pool: 6913 slots" in text and "wrote:" in text


@pytest.mark.skipif(HAS_CUDA, reason="checks the run without a GPU")
def test_cpu_run_checks_what_it_can_and_says_why_not(tmp_path, capsys):
    argv = [*SMALL, "--batch", "1,8", "--tokens", "2,3", "--state-dtype", "bf16", "--out",
            str(tmp_path), "--quiet"]
    code, text, _ = run_cli(["bench", "--mode", "verify", *argv], capsys)
    assert code == 0
    assert ("checked against the reference, not timed (not on a CUDA device): auto [slots]"
            in text)
    assert "commit [commit]" in text and "SKIP floor: not on a CUDA device" in text
    assert "only B <= 4 is checked on the CPU" in text
    rows, env = report.read_results(tmp_path / "results.json")
    plan = _plan(*argv)
    per_cell = {g.key[1]: sum(len(k) for _, k in g.cells) for g in plan.groups}
    assert len(rows) == 2 * (per_cell[2] + per_cell[3])                 # B x T cells
    b1 = [r for r in rows if r["B"] == 1]
    assert {r["status"] for r in b1 if r["backend"] in ("auto", "commit")} == {"PASS"}
    assert all("not timed" in r["note"] for r in b1 if r["status"] == "PASS")
    assert all(r["status"] == "SKIP" for r in rows if r["B"] == 8 or r["backend"] == "floor")
    assert all(r["median_us"] != r["median_us"] for r in rows)          # nothing timed: NaN
    assert "no CUDA device" in env["notes"][0]
    assert {r["mode"] for r in rows} == {"states", "states+update", "slots", "commit"}


def _verify_run(d, cells, gpu="NVIDIA H100 80GB HBM3"):
    """A verify results.json of (backend, B, T, form, state dtype, median us) cells."""
    rows = [dict(backend=be, B=B, T=T, H=4, HV=8, K=128, V=128, state_dtype=sd, mode=form,
                 l2norm=True, clock="kernel", status="PASS", median_us=us, bench="verify")
            for be, B, T, form, sd, us in cells]
    env = dict(gpu=gpu, commit="v0001", date="2026-02-05T00:00:00+00:00", versions={"torch": "2.11"})
    report.write_results(rows, env, d)
    return d / "results.json"


def test_tune_from_verify_results_adds_table_verify(tmp_path):
    # Per B, the registered verify backend with the lowest mean multiple of each (T, form)
    # cell's fastest wins: at B=1 fla-recurrent is 10% faster at T=8 but 20% slower at T=2
    # (cuda-v4's mean is lower); at B=64 it wins both.  Peers, auto, commit and a backend
    # missing a cell have no say; the other tables of the row are kept.
    from gdnzoo.bench import tune
    from gdnzoo.registry import parse_registry, registry_path
    import yaml
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry_path(), reg)
    f = _verify_run(tmp_path / "v", [
        ("cuda-v4", 1, 2, "states", "fp32", 2.0), ("fla-recurrent", 1, 2, "states", "fp32", 2.4),
        ("cuda-v4", 1, 8, "states", "fp32", 3.3), ("fla-recurrent", 1, 8, "states", "fp32", 3.0),
        ("flashinfer-mtp", 1, 2, "states", "fp32", 1.0), ("auto", 1, 8, "states", "fp32", 1.0),
        ("commit", 1, 8, "commit", "fp32", 0.5),
        ("cuda-v4", 64, 2, "slots", "fp32", 30.0), ("fla-recurrent", 64, 2, "slots", "fp32", 29.0),
        ("cuda-v4", 64, 8, "slots", "fp32", 90.0), ("fla-recurrent", 64, 8, "slots", "fp32", 80.0),
        ("cuda-v1", 64, 8, "slots", "fp32", 10.0),
        ("cuda-v4", 4, 4, "states", "bf16", 3.0)])
    p = tune.add_tune_args(argparse.ArgumentParser())
    before = parse_registry(yaml.safe_load(reg.read_text()))
    assert tune.cmd_tune(p.parse_args(["--from", str(f), "--write", "--registry", str(reg)])) == 0
    after = parse_registry(yaml.safe_load(reg.read_text()))
    pick = {d.gpu: d for d in after.op("decode").defaults}["NVIDIA H100 80GB HBM3"]
    old = {d.gpu: d for d in before.op("decode").defaults}["NVIDIA H100 80GB HBM3"]
    assert pick.table_verify == {"fp32": [(1, 63, "cuda-v4"), (64, None, "fla-recurrent")],
                                 "bf16": [(1, None, "cuda-v4")]}
    assert (pick.table, pick.table_pool) == (old.table, old.table_pool)
    v = pick.provenance["verify"]
    assert v["commit"] == "v0001" and v["mean_multiple"]["fp32"][1] == {"cuda-v4": 1.05,
                                                                        "fla-recurrent": 1.1}

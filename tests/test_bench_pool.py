"""The serving benchmark (``gdnzoo bench --mode pool``) on CPU: its plan, the pool-convention
inputs, the correctness check, result files, the console table, the pool floor's launch shapes,
the CPU run's skips, and the pool rows of ``gdnzoo tune``.  Timing needs a GPU."""
import argparse
import json
import shutil

import pytest
import torch
import yaml

from gdnzoo.bench import args as bench_args, clocks, console, entries, floor, pipeline, report
from gdnzoo.bench import mode_pool as pool
from gdnzoo.bench import shapes, tune
from gdnzoo.inputs import page_elems
from helpers import bench_args as _bench_args, bench_files, bench_plan, run_cli

MIB = 1 << 20


def _args(*extra):
    return _bench_args("--mode", "pool", "--device", "cpu", *extra)


def _plan(*extra):
    return pipeline.make_plan(_args(*extra))


# ------------------------------------------------------------------------------ the plan

def test_plan_defaults_and_overrides():
    plan = _plan()
    assert plan.batches == pool.POOL_BATCHES and plan.states == ("fp32", "bf16")
    assert plan.entries[:2] == ("floor", "auto") and plan.entries[-3:] == pool.PEERS
    assert set(plan.backends) == set(entries.backends(pools=True, native=True))
    assert {"fla-recurrent", "cuda-v4"} <= set(plan.backends)
    assert not {"pt-reference", "pt-compiled", "cuda-v1"} & set(plan.backends)
    assert plan.clocks == ("kernel", "graph") and (plan.H, plan.HV, plan.K) == (4, 8, 128)
    assert plan.budget == pool.BUDGET_S
    plan = _plan("--batch", "2,3", "--state-dtype", "bf16", "--algo", "cuda-v4,pt-reference",
                 "--timing", "kernel", "--time-budget", "0")
    assert plan.batches == (2, 3) and plan.states == ("bf16",) and plan.clocks == ("kernel",)
    assert plan.budget == 0
    assert plan.backends == ("cuda-v4", "pt-reference")
    # a value equal to the dense bench's default is still a value given: fp32 alone, those
    # batches, that budget
    plan = _plan("--state-dtype", "fp32", "--batch", ",".join(
        map(str, bench_args.DEFAULT_BATCHES)), "--time-budget", str(bench_args.DEFAULT_BUDGET_S))
    assert plan.states == ("fp32",) and plan.batches == tuple(bench_args.DEFAULT_BATCHES)
    assert plan.budget == bench_args.DEFAULT_BUDGET_S != pool.BUDGET_S
    assert [g.label for g in plan.groups][:3] == ["fp32 B=1", "fp32 B=4", "fp32 B=8"]
    c, clocks_ = plan.groups[0].cells[1]
    assert (c.backend, c.mode, c.bench, c.l2norm, clocks_) == ("auto", "pool", "pool", True,
                                                                 ("kernel", "graph"))


@pytest.mark.parametrize("extra", [("--mode", "pool,inplace"), ("--tokens", "2"),
                                   ("--algo", "no-such"), ("--timing", "host"),
                                   ("--state-dtype", "fp16"), ("--batch", "0")])
def test_plan_refuses_bad_arguments(extra, capsys):
    with pytest.raises(SystemExit) as e:          # argparse or the plan: status 2, naming it
        _plan(*extra)
    assert e.value.code == 2 and extra[0] in capsys.readouterr().err


@pytest.mark.parametrize("extra,match", [(("--tokens", "2"), "--tokens: the serving benchmark"),
                                         (("--algo", "no-such"), "--algo: unknown"),
                                         (("--timing", "host"), "--timing: --mode pool times")])
def test_plan_says_which_argument(extra, match, capsys):
    with pytest.raises(SystemExit):
        _plan(*extra)
    assert match in capsys.readouterr().err


# ------------------------------------------------------------------------------ the inputs

def test_auto_column_names_the_pool_tables_choice():
    """The ``auto`` column of a pool or verify run names what the automatic choice picks for
    the run's own calls (a pool, a verify on a pool): the default table's ``table_pool`` /
    ``table_verify``, not the dense table (which the pool mode named from b9811d0 on: the
    H200's fp32 pool at 16/32 B=64 read cuda-v4 while auto ran fla-recurrent)."""
    import dataclasses

    from gdnzoo import registry, tables
    row = registry.default_row("NVIDIA H200")
    for mode, key in (("pool", "table_pool"), ("verify", "table_verify")):
        plan = pipeline.make_plan(_bench_args("--mode", mode, "--device", "cpu"))
        c = next(c for g in plan.groups for c, _ in g.cells if c.backend != "floor")
        p = dataclasses.replace(pipeline.get_mode(mode).problem(c, plan), device="cuda")
        assert p.pool and tables.table_kind(row, p)[0] == key, mode
    plan = _plan()
    c = plan.cell("auto", "pool", 256, "fp32")
    p = dataclasses.replace(pipeline.get_mode("pool").problem(c, plan), device="cuda",
                            H=16, HV=32, B=64)
    assert tables.table_choice(row, p) == "fla-recurrent" != tables.table_choice(
        row, dataclasses.replace(p, pool=False))


def test_pool_size_and_page_stride():
    HV, V, K = 8, 128, 128
    slot = HV * V * K
    assert page_elems(HV, V, K) == slot + slot // 32 == 135168            # vLLM's page at HV=8
    l2 = 50 * MIB
    P = pool.pool_slots([(B, 1) for B in pool.POOL_BATCHES], HV, V, K, 4, l2)
    page_bytes = page_elems(HV, V, K) * 4
    assert P * page_bytes >= 2 << 30 and (P - 1) * page_bytes < 2 << 30  # 2 GiB, no more
    for B in pool.POOL_BATCHES:
        rows = pool.rows_for(B, slot * 4, l2)
        assert rows * B * slot * 4 >= 4 * l2 and rows * B + B <= P - 1
    assert pool.rows_for(1, slot * 4, l2) == 400
    big = pool.pool_slots([(4096, 1)], HV, V, K, 4, l2)                   # grows to fit the rows
    assert big >= 2 * 4096 + 4096 + 1 > P
    assert pool.pool_slots([(1, 1)], HV, V, K, 2, 1 << 30) * page_elems(HV, V, K) * 2 >= 4 << 30


def test_state_pool_layout():
    sp = pool.state_pool(7, 2, 16, 16, "bf16", "cpu", seed=1)
    assert sp.page == 512 + 16 and sp.slot == 512
    assert sp.state.shape == (7, 2, 16, 16) and sp.state.stride() == (528, 256, 16, 1)
    assert sp.state.data_ptr() == sp.buf.data_ptr() and sp.buf.numel() == 7 * 528
    assert 0.03 < float(sp.buf.float().std()) < 0.07 and sp.nbytes == 7 * 528 * 2


def test_slots_are_fresh_distinct_and_aligned():
    s = pool.slot_bank(P=60, B=5, rows=8, device="cpu", seed=2)
    rows = [s.next().slots for _ in range(8)]
    every = torch.cat(rows + [s.check.slots]).tolist()
    assert len(set(every)) == len(every) == 45                  # no slot twice, check row apart
    assert min(every) >= 1 and max(every) < 60                  # slot 0 is the null slot
    assert all(r.dtype == torch.int32 and r.shape == (5,) and r.is_contiguous() for r in rows)
    base = s.bank["slots"].data_ptr()
    assert all((r.data_ptr() - base) % 256 == 0 for r in rows + [s.check.slots])
    assert s.next() is s.rows[0] and s.row(9) is s.rows[1]      # round robin, one counter
    s.advance()                                                 # the calls' own index tensor
    assert s.index.slots.tolist() == rows[1].tolist() and s.index.slots.is_contiguous()
    assert s.next() is s.rows[2]
    again = pool.slot_bank(P=60, B=5, rows=8, device="cpu", seed=2)
    assert again.bank["slots"].tolist() == s.bank["slots"].tolist()
    with pytest.raises(ValueError, match="slots"):
        pool.slot_bank(P=40, B=5, rows=8, device="cpu")


def test_serving_inputs_are_views_of_packed_tensors():
    B, H, HV, K, V = 3, 2, 4, 16, 8
    x, out = pool.cell_inputs(B, 1, "fp32", dict(H=H, HV=HV, K=K, V=V), "cpu", seed=0)
    D = 2 * H * K + HV * V
    assert x.mixed.shape == (B, D) and x.mixed.dtype == torch.bfloat16 and x.mixed.is_contiguous()
    e = x.mixed.element_size()
    for t, off, shape in ((x.q, 0, (B, 1, H, K)), (x.k, H * K, (B, 1, H, K)),
                          (x.v, 2 * H * K, (B, 1, HV, V))):
        assert t.shape == shape and t.stride(0) == D and t.stride(-1) == 1
        assert t.untyped_storage().data_ptr() == x.mixed.untyped_storage().data_ptr()
        assert t.data_ptr() - x.mixed.data_ptr() == off * e
    assert x.ab.shape == (B, 2 * HV)
    assert x.a2.shape == x.b2.shape == (B, HV) and x.a2.stride() == x.b2.stride() == (2 * HV, 1)
    assert x.b2.data_ptr() - x.ab.data_ptr() == HV * x.ab.element_size()
    assert x.a.shape == x.b.shape == (B, 1, HV) and x.a.data_ptr() == x.ab.data_ptr()
    assert out.shape == (B, 1, HV, V)


# ------------------------------------------------------------------------------ checking

def _ctx(B=2, sd="fp32", seed=0):
    g = dict(H=1, HV=2, K=16, V=16)
    sp = pool.state_pool(3 * B + 4, g["HV"], g["V"], g["K"], sd, "cpu", seed=seed)
    x, out = pool.cell_inputs(B, 1, sd, g, "cpu", seed)
    return pool.PoolCtx(B, sd, sp, x, pool.slot_bank(sp.P, B, 2, "cpu", seed), out)


@pytest.mark.parametrize("sd", ["fp32", "bf16"])
def test_check_passes_the_reference_and_fails_wrong_calls(sd):
    ctx = _ctx(sd=sd)
    storage = ctx.pool.buf.clone()
    call, note = pool.pool_call("pt-reference", ctx)
    chk = pool.check_slots(call, ctx)
    assert chk["ok"], chk["reason"]
    assert chk["rel_err_out"] < 1e-2 and chk["max_abs_err_state"] < 1e-2
    assert torch.equal(ctx.pool.buf, storage)              # the check slots restored
    assert pool.check_slots(call, ctx)["ok"]                # so a second check agrees

    def stray(ix):                                          # right answer, one page gap written
        call(ix)
        ctx.pool.buf[ctx.pool.slot] += 1
    chk = pool.check_slots(stray, ctx)
    assert not chk["ok"] and "outside the slots" in chk["reason"]
    ctx.pool.buf.copy_(storage)

    def zeros(ix):
        ctx.out.zero_()
    assert not pool.check_slots(zeros, ctx)["ok"]

    def no_state_update(ix):                                      # right out, state untouched
        saved = ctx.pool.state.index_select(0, ix.slots.long())
        call(ix)
        ctx.pool.state.index_copy_(0, ix.slots.long(), saved)
    chk = pool.check_slots(no_state_update, ctx)
    assert not chk["ok"] and "new_state" in chk["reason"]

    def scribbles(ix):
        call(ix)
        ctx.x.mixed[0, 0] += 1
    chk = pool.check_slots(scribbles, ctx)
    assert not chk["ok"] and "mixed_qkv" in chk["reason"]


def test_entries_say_why_they_cannot_run_here():
    ctx = _ctx()
    # the CPU cell on a GPU machine (TRITON_INTERPRET unset there): fla-tma's first reason is
    # the interpreter's; without a GPU (the interpreter on) its head dims or pools
    for name, match in (("cuda-v1", "no CUDA device"),
                        ("fla-tma", "head dims|state pools|through the Triton interpreter"),
                        ("not-a-backend", "not registered")):
        with pytest.raises(entries.Skip, match=match):
            pool.pool_call(name, ctx)
    call, note = pool.pool_call("auto", ctx)
    assert note.startswith("auto -> pt-reference")
    assert pool.check_slots(call, ctx)["ok"]


@pytest.mark.parametrize("name", ["adapter-vllm", "adapter-sglang"])
def test_adapters_pass_the_check(name):
    try:
        call, note = pool.pool_call(name, _ctx())
    except entries.Skip as e:
        pytest.skip(str(e))
    ctx = _ctx()
    call, _ = pool.pool_call(name, ctx)
    chk = pool.check_slots(call, ctx)
    assert chk["ok"], chk["reason"]


# ------------------------------------------------------------------------------ results

def _raw(plan, name, B, sd, us, clock="kernel", status="PASS", n=1, note=""):
    return dict(cell=plan.cell(name, "pool", B, sd), clock=clock, status=status, note=note,
                flags="", samples=[us * f for f in (0.98, 1.0, 1.03)] if us else [],
                kernels_per_call=n if us else "")


def _synthetic(plan):
    raw = []
    for sd, s in (("fp32", 1.0), ("bf16", 0.6)):
        for B, f in ((1, 2.0), (16, 7.5)):
            raw += [_raw(plan, "floor", B, sd, f * s), _raw(plan, "auto", B, sd, f * s * 1.2),
                    _raw(plan, "auto", B, sd, f * s * 1.5, clock="graph"),
                    _raw(plan, "cuda-v4", B, sd, f * s * 1.1),
                    _raw(plan, "adapter-vllm", B, sd, f * s * 1.2, n=1 if B == 1 else 2),
                    _raw(plan, "fla-recurrent", B, sd, None, status="FAIL", note="out: 3 bad"),
                    _raw(plan, "flashinfer-pool", B, sd, None, status="SKIP",
                         note="FlashInfer's pool API is timed with bf16 state only")]
    return raw


def test_results_files_round_trip_and_console(tmp_path):
    plan = _plan("--batch", "1,16")
    raw = _synthetic(plan)
    pool.flag_adapters(raw)
    table, env, files, back, cols = bench_files(raw, plan, tmp_path, {"copy": {"gbps": 3000.0}})
    assert len(back) == len(table)
    assert json.loads((tmp_path / "results.json").read_text())["columns"] == cols
    assert cols == report.COLUMNS + ["kernels_per_call"]
    auto = [r for r in back if r["backend"] == "auto" and r["clock"] == "kernel"]
    assert all(r["mode"] == "pool" and r["l2norm"] is True and r["T"] == 1 for r in auto)
    assert [round(r["x_floor"], 3) for r in auto] == [1.2, 1.2, 1.2, 1.2]
    assert (tmp_path / "results.csv").read_text().splitlines()[0].endswith("kernels_per_call")
    flagged = [r for r in back if r["flags"]]
    assert [(r["backend"], r["B"]) for r in flagged] == [("adapter-vllm", 16)] * 2
    plan.notes.append("fp32 pool: 3971 slots")
    text = console.render(table, env, plan, files)
    assert "fp32 state, kernel clock, us / x the same-run pool floor" in text
    assert "2.40/1.20x" in text and "2.20/1.10x" in text                   # auto, cuda-v4 at B=1
    line = next(x for x in text.splitlines() if x.split()[:2] == ["1", "2.00"])
    assert line.split()[-1] == "1.09x"                                      # auto / cuda-v4
    assert "fp32 records per call: floor 1, auto 1, cuda-v4 1, adapter-vllm 1/2" in text
    assert "graph clock" in text and "3.00" in text
    assert "flag adapter-vllm fp32 B=16: records 2 != decode's 1" in text
    assert "FAIL fla-recurrent (fp32 B=1): out: 3 bad" in text
    assert "SKIP flashinfer-pool: FlashInfer's pool API is timed with bf16 state only" in text
    assert "note: fp32 pool: 3971 slots" in text and "wrote:" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without a GPU")
def test_cpu_run_skips_everything_and_says_why(tmp_path, capsys):
    code, text, _ = run_cli(["bench", "--mode", "pool", "--out", str(tmp_path), "--quiet",
                             "--batch", "1,4"], capsys)
    assert code == 0
    assert "SKIP floor, auto," in text and "no CUDA device" in text
    assert "nothing was measured" in text
    rows, env = report.read_results(tmp_path / "results.json")
    plan = _plan("--batch", "1,4")
    assert len(rows) == 2 * 2 * (len(plan.entries) + 2)    # B x dtype x entries, 2 graph rows
    assert all(r["status"] == "SKIP" and "no CUDA device" in r["note"] for r in rows)
    assert "no CUDA device" in env["notes"][0]


# ------------------------------------------------------------------------------ clocks, floor

def test_busy_and_count_sums_a_calls_records():
    windows = [(0, 10), (100, 110)]
    launch_of = {1: 5, 2: 6, 3: 105}
    gpu = [(20, 30, 1), (40, 50, 2), (120, 125, 3)]            # ns; a gap inside call 0
    assert clocks._spans(windows, launch_of, gpu)[0] == [pytest.approx(0.030),
                                                         pytest.approx(0.005)]
    got = clocks._spans(windows, launch_of, gpu, clocks.busy_and_count)[0]
    assert got == [(pytest.approx(0.020), 2), (pytest.approx(0.005), 1)]
    # kernels side by side (the prefill's prep beside its chain) count once, not twice
    assert clocks.busy_and_count([(0, 300), (2, 290), (400, 410)]) == (pytest.approx(0.310), 3)
    assert clocks.busy_and_count([(0, 10), (5, 20), (20, 30), (25, 26)]) == \
        (pytest.approx(0.030), 4)


def test_prepare_runs_outside_the_timed_window():
    """The index refresh before each call launches work of its own: none of it is measured."""
    import time
    from test_bench import _FakeCupti
    fake = _FakeCupti(1.0, kernel_ns=50_000)
    prepared = []

    def prepare(i):
        prepared.append(i)
        fake.launch(i)                                          # an API call and a 50 us kernel

    t, _ = clocks._kernel_times_cupti(fake.launch, 6, 3, cupti=fake, sync=lambda: time.sleep(2e-4),
                                      reduce=clocks.busy_and_count, prepare=prepare)
    assert prepared == [3, 4, 5, 6, 7, 8]
    assert all(n == 1 and us == pytest.approx(50.0) for us, n in t)


def test_pool_floor_launch_shapes_and_target():
    n4, sms = 32768, 132                                       # an fp32 slot at HV=8
    one = floor.configs(n4, sms)
    assert one == floor.configs(n4, sms, seqs=1)               # the dense floor's shapes
    many = floor.configs(n4, sms, seqs=512)
    assert all(g >= 1 for _, _, g in many)
    for v, b, g in many:                     # exact per slot, or SM slots shared by 512 slots
        exact = -(-n4 // (b * v))
        assert g in {exact} | {max(1, min(exact, sms * w * max(1, 2048 // b) // 512))
                               for w in (1, 2, 4)}
    assert {g for v, b, g in many if (v, b) == (1, 128)} == {256, 4, 8, 16}
    buf = torch.zeros(4 * 528, dtype=torch.float32)
    idx = torch.tensor([1, 2, 3], dtype=torch.int32)
    t = floor.PoolTarget(buf, 528, 512, 3, idx, None)
    assert (t.page4, t.n4, t.bytes_moved) == (132, 128, 2 * 3 * 512 * 4)
    for args, match in (((buf, 529, 512, 3, idx), "multiples of 16"),
                        ((buf, 528, 512, 0, idx[:0]), "B must be"),
                        ((buf.view(4, 528), 528, 512, 3, idx), "flat contiguous"),
                        ((buf, 528, 512, 3, idx.long()), "int32"),
                        ((buf, 528, 512, 2, idx), "int32")):
        with pytest.raises(ValueError, match=match):
            floor.PoolTarget(*args, None)


def test_pool_floor_skips_without_cupy(monkeypatch):
    monkeypatch.setattr(floor, "cupy_available", lambda: (False, "cupy not importable (test)"))
    t = floor.PoolTarget(torch.zeros(4 * 528), 528, 512, 3, torch.zeros(3, dtype=torch.int32),
                         None)
    f = floor.indexed_floor_times(t)
    assert f["samples"] is None and "cupy not importable (test)" in f["config"]


# ------------------------------------------------------------------------------ tune

def _pool_run(d, cells, commit="p0015"):
    plan = _plan()
    raw = [_raw(plan, name, B, sd, us) for name, B, sd, us in cells]
    table = report.build_table(raw, {}, plan)
    env = dict(gpu="NVIDIA H100 80GB HBM3", driver="d", cuda="13.0", commit=commit,
               date="2026-02-03T00:00:00+00:00", method="m", versions={"torch": "2.11"})
    report.write_results(table, env, d, report.columns(plan.mode))
    return d / "results.json"


def test_flashinfer_peers_skip_without_the_cute_dsl(monkeypatch):
    # FlashInfer imports without its CuTe DSL and then fails inside the call ("'NoneType' object
    # is not callable", seen on the H100 with FlashInfer on the path and nvidia-cutlass-dsl not):
    # the bench peer is SKIP with the reason; a failed FlashInfer import and a GPU below SM90
    # are SKIP too; with both imports the entry point is returned.
    import types

    fake = types.SimpleNamespace(gated_delta_rule_mtp=len)
    mods = {"flashinfer.gdn_decode": fake}

    def import_module(name):
        if name not in mods:
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
        return mods[name]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(entries.importlib, "import_module", import_module)
    with pytest.raises(entries.Skip, match=r"need the CuTe DSL \(nvidia-cutlass-dsl\), which does "
                                        r"not import \(ModuleNotFoundError: No module named 'cutl"):
        entries.flashinfer_gdn("gated_delta_rule_mtp")
    mods["cutlass.cute"] = types.SimpleNamespace()
    from gdnzoo.backends import _peer_checks
    monkeypatch.setattr(_peer_checks, "cute_dsl_missing_libs", lambda: "no _cutlass_ir.cu13")
    with pytest.raises(entries.Skip, match="cannot compile: no _cutlass_ir.cu13"):
        entries.flashinfer_gdn("gated_delta_rule_mtp")
    monkeypatch.setattr(_peer_checks, "cute_dsl_missing_libs", lambda: "")
    assert entries.flashinfer_gdn("gated_delta_rule_mtp") is len
    del mods["flashinfer.gdn_decode"]
    with pytest.raises(entries.Skip, match="gated_delta_rule_mtp not importable .ModuleNotFound"):
        entries.flashinfer_gdn("gated_delta_rule_mtp")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    with pytest.raises(entries.Skip, match="SM90"):
        entries.flashinfer_gdn("gated_delta_rule_mtp")


def test_tune_from_pool_results_adds_table_pool(tmp_path, capsys):
    from gdnzoo.registry import parse_registry, registry_path
    f = _pool_run(tmp_path / "pool", [
        ("floor", 1, "fp32", 1.9), ("auto", 1, "fp32", 1.0), ("adapter-vllm", 1, "fp32", 1.0),
        ("cuda-v4", 1, "fp32", 2.2), ("fla-recurrent", 1, "fp32", 2.4),
        ("vllm-packed", 1, "fp32", 2.3),
        ("cuda-v4", 64, "fp32", 26.0), ("fla-recurrent", 64, "fp32", 25.0),
        ("flashinfer-pool", 1, "bf16", 1.5), ("cuda-v4", 1, "bf16", 2.0)])
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry_path(), reg)
    before = parse_registry(yaml.safe_load(reg.read_text()))
    p = tune.add_tune_args(argparse.ArgumentParser())
    assert tune.cmd_tune(p.parse_args(["--from", str(f), "--write", "--registry", str(reg)])) == 0
    after = parse_registry(yaml.safe_load(reg.read_text()))
    row = [d for d in after.op("decode").defaults if d.gpu == "NVIDIA H100 80GB HBM3"][0]
    old = [d for d in before.op("decode").defaults if d.gpu == "NVIDIA H100 80GB HBM3"][0]
    assert row.table_pool == {"fp32": [(1, 63, "cuda-v4"), (64, None, "fla-recurrent")],
                              "bf16": [(1, None, "cuda-v4")]}    # peers, adapters, auto: no say
    assert (row.table, row.table_dest, row.table_tokens) == (old.table, old.table_dest,
                                                             old.table_tokens)
    prov = row.provenance
    assert prov["pool"]["results"] == "pool/results.json" and prov["pool"]["commit"] == "p0015"
    assert prov["pool"]["values_us"]["fp32"][1] == {"cuda-v4": 2.2, "vllm-packed": 2.3,
                                                    "fla-recurrent": 2.4}
    assert ({k: v for k, v in prov.items() if k != "pool"}
            == {k: v for k, v in old.provenance.items() if k != "pool"})
    assert ([d.gpu for d in after.op("decode").defaults]
            == [d.gpu for d in before.op("decode").defaults])
    assert "state pool" in capsys.readouterr().out
    # a later in-place re-tune keeps the row's table_pool
    dense = tmp_path / "dense"
    dplan = bench_plan("--algo", "cuda-v4")
    rows = report.build_table([dict(cell=dplan.cell("cuda-v4", "inplace", 1, "fp32"),
                                    clock="kernel", status="PASS", note="",
                                    samples=[2.0, 2.1])], {}, dplan)
    report.write_results(rows, dict(gpu="NVIDIA H100 80GB HBM3", commit="d1", date="2026-02-04",
                                    versions={}), dense)
    assert tune.cmd_tune(p.parse_args(["--from", str(dense / "results.json"), "--write",
                                       "--registry", str(reg)])) == 0
    row2 = [d for d in parse_registry(yaml.safe_load(reg.read_text())).op("decode").defaults
            if d.gpu == "NVIDIA H100 80GB HBM3"][0]
    assert row2.table == {"fp32": [(1, None, "cuda-v4")]} and row2.table_pool == row.table_pool
    assert row2.provenance["pool"] == prov["pool"]


def test_tune_from_pool_results_needs_a_row_and_a_candidate(tmp_path):
    from gdnzoo.registry import registry_path
    reg = tmp_path / "registry.yaml"
    shutil.copy(registry_path(), reg)
    p = tune.add_tune_args(argparse.ArgumentParser())
    only_peers = _pool_run(tmp_path / "a", [("floor", 1, "fp32", 1.9), ("auto", 1, "fp32", 2.0)])
    with pytest.raises(SystemExit, match="no correct kernel-clock results"):
        tune.cmd_tune(p.parse_args(["--from", str(only_peers), "--registry", str(reg)]))
    other = tmp_path / "b" / "results.json"
    f = _pool_run(tmp_path / "b", [("cuda-v4", 1, "fp32", 2.0)])
    doc = json.loads(f.read_text())
    doc["environment"]["gpu"] = "NVIDIA TEST-GPU"
    other.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="no row for NVIDIA TEST-GPU"):
        tune.cmd_tune(p.parse_args(["--from", str(other), "--registry", str(reg)]))


def test_shape_rows_of_a_pool_search_have_mode_pool():
    from gdnzoo import tables
    from gdnzoo.registry import backend_module
    args = argparse.Namespace(mode="pool", tokens=1, rows_from_tokens=None)
    cfg = backend_module("cuda-v4").CONFIG.normalize((2, 2, 16, 3))
    made, cited = shapes.new_rows(tables.launch_tables(), "NVIDIA H100 80GB HBM3",
                                  {("cuda-v4", "fp32"): {1: (cfg, 2.0, 1.9, True)}}, args, "tune-x")
    assert made and {r.mode for r in made} == {"pool"} and {r.tokens for r in made} == {1}
    assert made[0].lo == 1 and made[-1].hi is None and made[0].source == "tune-x"
    assert all(r.source != "tune-x" for r in made[1:])           # the rest kept, with their source


def test_floor_search_keeps_the_fastest_finalist(monkeypatch):
    """The floor's shape search re-times its fastest shapes with more calls and keeps the one
    fastest there, not the first round's leader (a lucky few calls)."""
    from gdnzoo.bench import clocks, floor
    first = {"a": 1.0, "b": 1.1, "c": 1.2, "d": 5.0}     # median µs, first round
    second = {"a": 2.0, "b": 1.5, "c": 1.9}              # the finalists again
    rounds = []

    def fake(launches, reps, prepare=None):
        names = [f() for f in launches]
        rounds.append((names, reps))
        table = first if len(rounds) == 1 else second
        return [[table[n]] * reps for n in names], "fake"

    monkeypatch.setattr(clocks, "interleaved_kernel_times", fake)
    assert floor.pick_fastest(list("abcd"), lambda c: (lambda: c), 8) == "b"
    assert rounds == [(list("abcd"), 8), (list("abc"), 32)]
    rounds.clear()
    assert floor.pick_fastest(["d"], lambda c: (lambda: c), 8) == "d"   # one shape: one round
    assert len(rounds) == 1

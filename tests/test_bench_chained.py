"""The chained mode (``gdnzoo bench --mode chained``, alias ``--timing chained``): its arguments, the layers' slots and
views, the producer, the correctness check, the table and bars on synthetic numbers, and the run
without a GPU (CPU); on a GPU, the chained floor's values at each PDL level, a chain's decode
results against the same calls made eagerly, and a tiny run of the whole mode."""
import json
import math

import pytest
import torch

from conftest import DEVICE
from gdnzoo import cli
from gdnzoo.bench import clocks, console, entries, floor, pipeline, report
from gdnzoo.bench import mode_chained as chained
from gdnzoo.bench import mode_pool as pool
from gdnzoo.inputs import page_elems
from helpers import bench_args, run_cli

MIB = 1 << 20
GEOM = dict(H=1, HV=2, K=16, V=16)


def _args(*extra):
    return bench_args("--mode", "chained", "--device", "cpu", *extra)


def _plan(*extra):
    return pipeline.make_plan(_args(*extra))


_main = run_cli                  # (exit status, stdout, stderr) of gdnzoo ARGV


# ------------------------------------------------------------------------------ arguments

def test_parser_takes_chained_alone_and_layers():
    a = cli.build_parser("bench").parse_args(["bench", "--timing", "chained", "--layers", "4"])
    assert a.timing == ["chained"] and a.layers == 4
    plan = pipeline.make_plan(a)
    assert plan.mode.name == "chained" and plan.layers == 4 and plan.clocks == chained.CLOCKS
    a = cli.build_parser("bench").parse_args(["bench"])
    assert a.mode == ["dense"] and a.layers is None                  # the dense default


@pytest.mark.parametrize("argv,frag", [
    (["--timing", "chained,kernel"], "runs alone"),
    (["--timing", "chained,bogus"], "--timing"),
    (["--timing", "chained", "--layers", "0"], "--layers"),
    (["--timing", "chained", "--tokens", "2"], "--tokens"),
    (["--timing", "chained", "--mode", "dest"], "--mode"),
    (["--timing", "chained", "--algo", "no-such"], "--algo"),
    (["--mode", "chained", "--timing", "host"], "--timing"),
    (["--timing", "host", "--layers", "4"], "--layers: only with --mode chained"),
])
def test_bad_arguments_exit_2_naming_them(argv, frag, capsys, tmp_path):
    code, _, err = _main(["bench", *argv, "--device", "cpu", "--out", str(tmp_path)], capsys)
    assert code == 2 and frag in err and "Traceback" not in err


def test_plan_defaults_and_overrides():
    plan = _plan()
    assert plan.batches == chained.BATCHES and plan.states == ("fp32", "bf16")
    assert plan.layers == chained.LAYERS == 64
    assert (plan.H, plan.HV, plan.K, plan.V) == (4, 8, 128, 128)
    assert set(plan.backends) == set(entries.backends(pdl=True)) >= {"fla-recurrent", "cuda-v4"}
    assert plan.entries[:3] == tuple(("floor", lv) for lv in chained.LEVELS)
    assert plan.entries[-2:] == (("vllm-packed", "off"), ("flashinfer-pool", "off"))
    assert all((n, lv) in plan.entries for n in plan.backends for lv in chained.LEVELS)
    assert plan.budget == chained.BUDGET_S
    plan = _plan("--batch", "2,3", "--state-dtype", "bf16", "--layers", "8",
                 "--algo", "cuda-v4,vllm-packed", "--time-budget", "0")
    assert plan.batches == (2, 3) and plan.states == ("bf16",) and plan.layers == 8
    assert plan.backends == ("cuda-v4",) and plan.budget == 0    # a peer is a peer, once
    assert plan.entries.count(("vllm-packed", "off")) == 1


# ------------------------------------------------------------------------------ the layers

def test_layer_slots_are_cold_and_hold_the_standalone_rotation():
    HV, V, K, l2 = 8, 128, 128, 50 * MIB
    for elem in (4, 2):
        slot, page = HV * V * K * elem, page_elems(HV, V, K) * elem
        for B in chained.BATCHES:
            P, rows = chained.layer_slots(B, 64, HV, V, K, elem, l2)
            assert rows * 64 * B * slot >= 4 * l2 and rows * B <= P - 1
            assert 64 * P * page >= 2 << 30
            assert 64 * P - 1 >= pool.rows_for(B, slot, l2) * B + B       # standalone + check
    assert chained.layer_slots(1, 64, HV, V, K, 4, l2) == (63, 7)
    assert chained.layer_slots(256, 64, HV, V, K, 4, l2) == (257, 1)     # 8.3 GiB, no more


def test_chain_slots_are_distinct_per_layer_and_rotate():
    s = chained.chain_bank(P=40, L=3, B=5, rows=4, device="cpu", seed=1)
    bank = s.bank["slots"]
    for layer in range(3):
        every = bank[:, layer, :5].flatten().tolist()
        assert len(set(every)) == 20 and min(every) >= 1 and max(every) < 40
    index = s.index.slots
    assert all(index[i].shape == (5,) and index[i].is_contiguous()
               and index[i].dtype == torch.int32
               and (index[i].data_ptr() - index.data_ptr()) % 256 == 0 for i in range(3))
    ptr = index[1].data_ptr()
    for turn in range(6):
        s.advance()
        assert torch.equal(s.index.slots, bank[turn % 4, :, :5])
        assert s.index.slots[1].data_ptr() == ptr
    s.first()
    assert torch.equal(s.index.slots[2], s.rows[0].slots[2])
    with pytest.raises(ValueError, match="chain slots"):
        chained.chain_bank(P=20, L=2, B=5, rows=4, device="cpu")


def _chain(B=2, L=3, sd="fp32", seed=0, device="cpu"):
    return chained.Chain(B, sd, L, *GEOM.values(), device, l2=0, seed=seed, min_bytes=0)


def test_chain_views_pools_and_storage():
    ch = _chain(B=3, L=2)
    H, HV, K, V = GEOM.values()
    D, HK, e = 2 * H * K + HV * V, H * K, 2
    s = ch.storage
    for i in range(2):
        y = ch.ys[i]
        q, k, v = ch.packed[i]
        assert ch.mixed[i].shape == (3, D) and ch.mixed[i].data_ptr() == y.data_ptr()
        for t, off in ((q, 0), (k, HK), (v, 2 * HK)):
            assert t.stride(0) == D and t.data_ptr() - y.data_ptr() == off * e
        q, k, v = ch.flat[i]
        assert all(t.is_contiguous() for t in (q, k, v))
        assert [t.data_ptr() - y.data_ptr() for t in (q, k, v)] == [0, 3 * HK * e, 6 * HK * e]
        p = ch.pools[i]
        assert p.shape == (ch.P, HV, V, K) and p.stride(0) == s.page
        assert p.data_ptr() == ch.bufs[i].data_ptr() == s.buf.data_ptr() + i * ch.P * s.page * 4
        assert ch.bufs[i].numel() == ch.P * s.page
    assert s.P == 2 * ch.P and ch.alone.bank["slots"].max() < s.P


def test_producer_is_silu():
    x = (torch.randn(1500) * 2).to(torch.bfloat16).to(DEVICE)     # the interpreter without a GPU
    y = torch.full_like(x, float("nan"))
    chained.produce(x, y)
    ref = torch.nn.functional.silu(x.float())
    assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="producer"):
        chained.produce(x, y[:10])


# ------------------------------------------------------------------------------ checking

def test_check_passes_the_reference_and_catches_early_reads():
    ch = _chain(device=DEVICE)
    run = chained.runner("pt-reference", "off", ch, None)
    chk = chained.check_chain(ch, run, chained.chain_call(ch, run))
    assert chk["ok"], chk["reason"]
    assert chk["rel_err_out"] < 1e-2 and chk["n_bad"] == 0

    def early():                       # each decode before its producer: reads NaN
        for i in range(ch.L):
            run.layer[i]()
            ch.produce(i)
    chk = chained.check_chain(ch, run, early)
    assert not chk["ok"] and chk["reason"].startswith("layer 0:") and "layer 2:" in chk["reason"]

    def last_layer_skipped():
        for i in range(ch.L):
            ch.produce(i)
            if i < ch.L - 1:
                run.layer[i]()
    chk = chained.check_chain(ch, run, last_layer_skipped)
    assert not chk["ok"] and "layer 0" not in chk["reason"] and "layer 2:" in chk["reason"]


def test_check_of_a_floor_wants_its_slots_unchanged():
    ch = _chain(device=DEVICE)
    keep = chained.Runner([lambda: None] * ch.L, None, None, "")
    produce = chained.Runner([lambda: None] * ch.L, None, None, "")
    assert chained.check_chain(ch, keep, chained.chain_call(ch, produce))["ok"]

    def touch():
        ch.pools[ch.L - 1].index_fill_(0, ch.check_rows(ch.L - 1).long(), 1.0)
    chk = chained.check_chain(ch, keep, touch)
    assert not chk["ok"] and "the floor changed" in chk["reason"]


def test_a_refused_pdl_level_is_a_skip_with_the_reason():
    ch = _chain()
    with pytest.raises(entries.Skip, match="pdl"):
        chained.runner("pt-reference", "wait", ch, None)
    with pytest.raises(entries.Skip, match="not measured"):
        chained.runner("floor", "off", ch, None)


# ------------------------------------------------------------------------------ the table

def _raw(name, level, clock, B, us, sd="fp32", status="PASS"):
    return dict(cell=_plan().cell(name, level, B, sd), clock=clock, status=status,
                note="", flags="", layers=64, samples=[us * 0.99, us, us * 1.01], auto="cuda-v4")


SYNTH = [("floor", "off", "chained", 1, 3.0), ("floor", "wait", "chained", 1, 1.7),
         ("floor", "early", "chained", 1, 1.6), ("floor", "off", "standalone", 1, 1.9),
         ("cuda-v4", "off", "chained", 1, 3.2), ("cuda-v4", "wait", "chained", 1, 1.9),
         ("cuda-v4", "early", "chained", 1, 1.8), ("cuda-v4", "off", "standalone", 1, 2.0),
         ("vllm-packed", "off", "chained", 1, 5.5),
         ("floor", "off", "chained", 64, 27.0), ("floor", "wait", "chained", 64, 25.2),
         ("cuda-v4", "off", "chained", 64, 27.5), ("cuda-v4", "wait", "chained", 64, 27.6),
         ("cuda-v4", "off", "standalone", 64, 26.0), ("cuda-v4", "wait", "standalone", 64, 26.5)]


def _table():
    raw = [_raw(*r) for r in SYNTH] + [_raw("cuda-v4", "early", "chained", 64, 0.0,
                                            status="FAIL")]
    return raw, report.build_table(raw, None, _plan("--algo", "cuda-v4"))


def test_bars_and_ratios_on_synthetic_numbers():
    _, table = _table()
    at = {(r["backend"], r["mode"], r["clock"], r["B"]): r for r in table}
    r = at[("cuda-v4", "off", "chained", 1)]
    assert r["x_floor"] == pytest.approx(3.2 / 3.0) and r["bar_floor"] == "PASS"
    assert r["bar_off"] == "" and r["bar_standalone"] == ""             # B < 64
    r = at[("cuda-v4", "wait", "chained", 1)]                           # 1.9 <= 1.1 * 1.7 + .032
    assert r["x_floor"] == pytest.approx(1.9 / 1.7) and r["bar_floor"] == "PASS"
    assert r["bar_off"] == "PASS"
    assert at[("cuda-v4", "early", "chained", 1)]["bar_floor"] == "MISS"  # 1.8 > 1.792
    assert at[("cuda-v4", "off", "standalone", 1)]["x_floor"] == pytest.approx(2.0 / 1.9)
    assert at[("vllm-packed", "off", "chained", 1)]["x_floor"] == pytest.approx(5.5 / 3.0)
    assert at[("vllm-packed", "off", "chained", 1)]["bar_floor"] == ""  # bars: ours only
    assert math.isnan(at[("floor", "wait", "chained", 1)]["x_floor"])
    r = at[("cuda-v4", "off", "chained", 64)]                           # 27.5 > 1.05 * 26.0
    assert r["bar_floor"] == "PASS" and r["bar_standalone"] == "MISS"
    r = at[("cuda-v4", "wait", "chained", 64)]                          # 27.6 > 27.5 + .032
    assert r["bar_off"] == "MISS" and r["bar_standalone"] == "PASS"     # 27.6 <= 1.05 * 26.5
    assert r["bar_floor"] == "PASS"                                     # 27.6 <= 1.1 * 25.2 + .032
    r = at[("cuda-v4", "early", "chained", 64)]
    assert r["status"] == "FAIL" and r["bar_floor"] == r["bar_off"] == ""


def test_console_and_files(tmp_path):
    raw, table = _table()
    plan = _plan("--batch", "1,64", "--state-dtype", "fp32", "--algo", "cuda-v4")
    plan.notes.append("a note")
    env = dict(gpu="GPU", driver="1", cuda="13", commit="abc", versions={"torch": "2"})
    text = console.render(table, env, plan, ["f.csv"])
    lines = text.splitlines()

    def at(level, clock):
        what = ("us per layer / x the chained floor at this level" if clock == "chained"
                else "us per call (kernel clock) / x the pool floor")
        return lines.index(f"fp32 state, PDL {level}, {clock}: {what}")
    head = at("off", "chained")
    assert lines[head + 1].split()[:4] == ["B", "floor", "cuda-v4", "vllm-packed"]
    assert lines[head + 2].split()[:4] == ["1", "3.00", "3.20/1.07x", "5.50/1.83x"]
    assert lines[head + 2].split()[-1] == "1.00x"                   # auto: cuda-v4, the best
    assert lines[at("wait", "chained") + 3].split()[:3] == ["64", "25.20", "27.60/1.10x"]
    assert lines[at("off", "standalone") + 1].split()[:3] == ["B", "floor", "cuda-v4"]
    assert "FAIL" in lines[at("early", "chained") + 3]
    bar = [line.split() for line in lines if line.strip().startswith("64  cuda-v4[wait]")]
    assert bar == [["64", "cuda-v4[wait]", "27.60", "25.20", "27.50", "26.50", "PASS", "MISS",
                    "PASS"]]
    assert "note: a note" in lines and lines[-1] == "wrote: f.csv"
    files = report.write_results(table, dict(env, method=plan.mode.method), tmp_path,
                                 report.columns(plan.mode))
    rows, env2 = report.read_results(files[1])
    assert len(rows) == len(table) and env2["gpu"] == "GPU"
    got = {(r["backend"], r["mode"], r["clock"], r["B"]): r for r in rows}
    assert got[("cuda-v4", "wait", "chained", 64)]["bar_off"] == "MISS"
    assert got[("cuda-v4", "wait", "chained", 64)]["layers"] == 64
    assert "bar_standalone" in (tmp_path / "results.csv").read_text().splitlines()[0]


def test_without_a_gpu_everything_is_skipped_with_the_reason(capsys, tmp_path):
    code, out, _ = _main(["bench", "--timing", "chained", "--device", "cpu", "--batch", "1,4",
                          "--out", str(tmp_path)], capsys)
    assert code == 0
    skip = [line for line in out.splitlines() if line.startswith("SKIP ")]
    assert len(skip) == 1 and "nothing was measured" in skip[0]
    assert "floor" in skip[0] and "cuda-v4" in skip[0] and "flashinfer-pool" in skip[0]
    doc = json.loads((tmp_path / "results.json").read_text())
    status = doc["columns"].index("status")
    assert doc["rows"] and {r[status] for r in doc["rows"]} == {"SKIP"}
    plan = _plan("--batch", "1,4")
    per_cell = 1 + sum(len(chained.clocks_of(n)) for n, _ in plan.entries)
    assert len(doc["rows"]) == per_cell * 2 * 2                      # B x state dtypes


# ------------------------------------------------------------------------------ on a GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _gpu_chain(B, sd="fp32", L=4):
    return chained.Chain(B, sd, L, 4, 8, 128, 128, "cuda", clocks.l2_bytes(), seed=3,
                         min_bytes=64 * MIB)


def _levels():
    return (0, 1, 2) if torch.cuda.get_device_capability() >= (9, 0) else (0,)


@gpu
@pytest.mark.parametrize("B", [1, 16])
@pytest.mark.parametrize("shape", [(2, 256, None), (1, 128, 3)])      # exact grid; 3 blocks loop
def test_chained_floor_reads_and_writes_what_it_claims(B, shape):
    ok, why = floor.cupy_available()
    if not ok:
        pytest.skip(why)
    ch = _gpu_chain(B)
    s = ch.storage
    n4 = s.slot * 4 // 16
    vpt, blk, per = shape
    shape = (vpt, blk, per or -(-n4 // (vpt * blk)))
    alpha, beta, gamma = 2.0, 0.5, 0.25
    for level in _levels():
        for graphed in (False, True):
            launches = [floor.chained_launcher(
                floor.PoolTarget(ch.bufs[i], s.page, s.slot, B, ch.index[i], None), shape,
                level, ch.mixed[i], alpha, beta, gamma) for i in range(ch.L)]

            def issue():
                for i in range(ch.L):
                    ch.produce(i)
                    launches[i]()
            ch.slots.first()
            issue()                                       # warm (and loaded) before a capture
            g = clocks.capture(issue) if graphed else None
            before = s.buf.clone()
            ch.ys.fill_(float("nan"))
            g.replay() if graphed else issue()
            torch.cuda.synchronize()
            want = before.clone()
            for i in range(ch.L):
                m = ch.mixed[i][:, 0].double()            # what the producer wrote
                for n, slot in enumerate(ch.check_rows(i).tolist()):
                    at = (i * ch.P + slot) * s.page
                    old = before[at:at + s.slot].double()
                    want[at:at + s.slot] = (old * alpha + (beta + gamma * m[n])).float()
            assert torch.isfinite(ch.ys.float()).all()
            torch.testing.assert_close(s.buf, want, rtol=1e-6, atol=1e-6,
                                       msg=f"level {level}, graph {graphed}")
            del g


@gpu
@pytest.mark.parametrize("sd", ["fp32", "bf16"])
def test_chain_decode_equals_eager_decode(sd):
    ch = _gpu_chain(16, sd)
    s = ch.storage
    ran = 0
    for name in ("cuda-v4", "fla-recurrent", "vllm-packed"):
        for level in (chained.LEVELS if name != "vllm-packed" else ("off",)):
            try:
                run = chained.runner(name, level, ch, None)
            except entries.Skip:
                continue
            issue = chained.chain_call(ch, run)
            ch.slots.first()
            issue()
            g = clocks.capture(issue)
            start = s.buf.clone()
            issue()
            torch.cuda.synchronize()
            eager_buf, eager_out = s.buf.clone(), ch.outs.clone()
            s.buf.copy_(start)
            ch.outs.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(ch.outs, eager_out), f"{name}[{level}] out"
            assert torch.equal(s.buf, eager_buf), f"{name}[{level}] state"
            assert not torch.equal(eager_buf, start)
            chk = chained.check_chain(ch, run, g.replay)
            assert chk["ok"], f"{name}[{level}]: {chk['reason']}"
            ran += 1
            del g
    assert ran >= 2


@gpu
def test_tiny_chained_run(capsys, tmp_path):
    code, out, err = _main(["bench", "--timing", "chained", "--layers", "4", "--batch", "1,16",
                            "--state-dtype", "fp32,bf16", "--time-budget", "0",
                            "--out", str(tmp_path)], capsys)
    assert code == 0, out[-3000:]
    rows, _ = report.read_results(tmp_path / "results.json")
    assert not [r for r in rows if r["status"] in ("FAIL", "ERROR")]
    got = {(r["backend"], r["mode"], r["clock"], r["B"], r["state_dtype"]): r for r in rows}
    levels = [chained.LEVELS[lv] for lv in _levels()]
    for B in (1, 16):
        for sd in ("fp32", "bf16"):
            for level in levels:
                for name in ("floor", "cuda-v4"):
                    r = got[(name, level, "chained", B, sd)]
                    assert r["status"] == "PASS" and r["layers"] == 4, r
                    assert math.isfinite(r["median_us"]) and r["median_us"] > 0
            r = got[("cuda-v4", "off", "standalone", B, sd)]
            assert r["status"] == "PASS" and r["median_us"] > 0
            assert math.isfinite(got[("cuda-v4", "off", "chained", B, sd)]["x_floor"])
    assert "PDL off, chained:" in out and "bars (ours)" in out

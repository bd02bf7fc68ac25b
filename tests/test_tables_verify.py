"""Launch rows of speculative verify (``mode: verify`` in backends/tables/*.yaml) and the shape
search that measures them (``gdnzoo tune --shapes --mode verify``): the lookup's rank (a verify
call takes verify rows first, a plain call never does, no verify rows: what it took before), the
written form, the backends' plumbing, the tuner's arguments and rows, and its verify cell on the
CPU (checked through the Triton interpreter).  Timing needs a GPU; the GPU-only tests say so."""
import argparse

import pytest
import torch
import yaml

from gdnzoo import registry, tables
from gdnzoo.bench import mode_pool as serving
from gdnzoo.bench import mode_verify as verify
from gdnzoo.bench import shapes
from gdnzoo.inputs import DTYPES, make_problem
from helpers import record, run_cli
from test_tables import FIELDS, GEOM, H100, _file, _row, _tables

HAS_CUDA = torch.cuda.is_available()


def _pick(lt, B, T=1, inplace=True, pool=False, verify=False, state="fp32", gpu="NVIDIA X100",
          **geom):
    return lt.row("k", FIELDS, gpu, state, inplace, T, B, {**GEOM, **geom}, pool, verify)[0][0]


X100 = [_row(1, None, "ip"), _row(1, None, "dest", mode="dest"),
        _row(1, None, "pool", mode="pool"), _row(1, None, "t2", mode="any", tokens=2),
        _row(1, None, "v2", mode="verify", tokens=2),
        _row(1, 4, "v4-small", mode="verify", tokens=4),
        _row(5, None, "v4-big", mode="verify", tokens=4),
        _row(1, None, "t8", mode="any", tokens=8),
        _row(1, None, "ip-bf16", state="bf16"),
        _row(1, None, "pool-bf16", state="bf16", mode="pool"),
        _row(1, None, "t2-bf16", state="bf16", mode="any", tokens=2)]


# ------------------------------------------------------------------------ the lookup

def test_a_verify_call_takes_verify_rows_first(tmp_path):
    lt = _tables(tmp_path, x100=_file(X100))
    for inplace in (True, False):
        for pool in (False, True):
            assert _pick(lt, 1, T=2, inplace=inplace, pool=pool, verify=True) == "v2"
    assert _pick(lt, 9, T=3, verify=True) == "v2"                  # tokens 2 serve T = 2, 3
    assert _pick(lt, 4, T=4, verify=True) == "v4-small"
    assert _pick(lt, 5, T=8, pool=True, verify=True) == "v4-big"    # over any tokens 8 and pool
    assert _pick(lt, 1, T=4, verify=True, HV=32) == "v4-small"      # batch ranges at HV=8:
    assert _pick(lt, 2, T=4, verify=True, HV=32) == "v4-big"        # B=2 has the heads of B=8
    assert _pick(lt, 1, T=1, verify=True) == "ip"                   # tokens <= T still holds
    assert _pick(lt, 1, T=1, pool=True, verify=True) == "pool"


def test_a_plain_call_never_takes_verify_rows(tmp_path):
    lt = _tables(tmp_path, x100=_file(X100))
    assert _pick(lt, 1, T=2) == "t2" and _pick(lt, 5, T=4) == "t2" and _pick(lt, 5, T=8) == "t8"
    assert _pick(lt, 1, T=1, inplace=False) == "dest" and _pick(lt, 1, T=4, pool=True) == "pool"


def test_without_verify_rows_a_verify_call_takes_what_it_took_before(tmp_path):
    lt = _tables(tmp_path, x100=_file(X100))
    plains = set()
    for T in (1, 2, 4, 8):
        for inplace in (True, False):
            for pool in (False, True):
                plain = _pick(lt, 3, T, inplace, pool, state="bf16")
                assert _pick(lt, 3, T, inplace, pool, True, state="bf16") == plain
                plains.add(plain)
    assert plains == {"ip-bf16", "pool-bf16", "t2-bf16", "generic"}     # generic: dest, T=1
    assert _pick(lt, 1, T=2, verify=True, gpu="NVIDIA Y9") == "generic"   # no file: default


def test_verify_rows_keep_the_file_chain_and_geometry(tmp_path):
    lt = _tables(tmp_path,
                 base=_file([_row(1, None, "base-v", mode="verify", tokens=2),
                             _row(1, None, "base-ip")], match="X100", fallback=None),
                 x100s=_file([_row(1, None, "own-t2", mode="any", tokens=2),
                              _row(1, None, "hv64-v", mode="verify", tokens=2,
                                   geometry={"HV": 64})], match="X100S", fallback="base"))
    # a verify call: the first file of the chain with a verify set for it, before this file's
    # decode rows; every other call: the first file with any set for it
    assert _pick(lt, 1, T=2, verify=True, gpu="NVIDIA X100S") == "base-v"
    assert _pick(lt, 1, T=2, gpu="NVIDIA X100S") == "own-t2"
    assert _pick(lt, 1, T=2, verify=True, gpu="NVIDIA X100S", HV=64, H=16) == "hv64-v"
    assert _pick(lt, 1, T=1, verify=True, gpu="NVIDIA X100S") == "base-ip"   # no set serves T=1
    assert _pick(lt, 1, T=2, verify=True, gpu="NVIDIA X100") == "base-v"
    assert _pick(lt, 1, T=2, gpu="NVIDIA X100") == "base-ip"
    with pytest.raises(tables.TableError, match=r"no launch rows for k \(fp32, dest, pool, "
                                                r"verify, T=2\)"):
        _tables(tmp_path / "b", default=_file([], match=None, fallback=None)).row(
            "k", FIELDS, "NVIDIA X100", "fp32", False, 2, 1, GEOM, True, True)


def test_render_round_trip_with_verify_rows(tmp_path):
    lt = _tables(tmp_path, x100=_file(X100))
    f = lt.files["x100"]
    text = tables.render_launch_file(f)
    back = tables.parse_launch_file(yaml.safe_load(text), f.path)
    key = lambda r: (r.key(), r.lo)                                          # noqa: E731
    assert sorted(back.rows, key=key) == sorted(f.rows, key=key)
    assert tables.render_launch_file(back) == text
    order = [(r.tokens, r.mode) for r in back.rows if r.state == "fp32"]
    assert order == [(1, "inplace"), (1, "dest"), (1, "pool"), (2, "any"), (2, "verify"),
                     (4, "verify"), (4, "verify"), (8, "any")]
    assert "mode: verify, tokens: 4, batch: [5, null]" in text
    bad = _file([_row(1, None, "a", mode="sideways")])
    with pytest.raises(tables.TableError, match="'verify'"):                # the modes named
        _tables(tmp_path / "c", x100=bad)


# ------------------------------------------------------------------------ the backends' lookup

def _problem(sd, T, verify_form, pool=True):
    return make_problem(B=2, T=T, state_dtype=DTYPES[sd], pool=pool, verify=verify_form)


@pytest.mark.parametrize("name", ["cuda-v4", "fla-recurrent"])
def test_the_tunable_backends_look_up_verify_rows(tmp_path, monkeypatch, name):
    """launch_config(problem) passes the Problem's verify to the lookup: verify rows for a
    verify Problem, never for a plain one."""
    mod = registry.backend_module(name)
    shipped = tables.LaunchTables.load()
    row = shipped.row(name, mod.CONFIG, H100, "fp32", True, 2, 2, GEOM)[1]   # the plain T=2 row
    other = dict(row.config)
    first = mod.CONFIG.names[0]
    other[first] = 4 if other.get(first) != 4 else 2
    h100 = yaml.safe_load(shipped.files["h100"].path.read_text())
    h100["rows"] = [r for r in h100["rows"] if r["mode"] != "verify"]     # only the one below
    h100["rows"].append(dict(backend=name, state="fp32", mode="verify", tokens=2, batch=[1, None],
                             config=other, source=row.source))
    lt = _tables(tmp_path, h100=h100,
                 default=yaml.safe_load(shipped.files["default"].path.read_text()))
    monkeypatch.setattr(tables, "launch_tables", lambda: lt)
    got = mod.launch_config(_problem("fp32", 2, "states"), H100)
    assert mod.CONFIG.normalize(got)[0] == other[first]
    for form in ("states+update", "slots"):
        assert mod.CONFIG.normalize(mod.launch_config(_problem("fp32", 4, form), H100))[0] \
            == other[first]
    plain = mod.launch_config(_problem("fp32", 2, "", pool=False), H100)
    assert mod.CONFIG.normalize(plain)[0] == mod.CONFIG.normalize(row.config)[0]
    bf16 = mod.launch_config(_problem("bf16", 2, "states"), H100)     # no bf16 verify rows
    assert bf16 == mod.launch_config(_problem("bf16", 2, ""), H100)


class _Looked(Exception):
    pass


@pytest.mark.skipif(not HAS_CUDA, reason="binds a CUDA launcher: needs a CUDA device")
def test_launchers_look_up_verify_rows_for_verify_calls(monkeypatch):
    """cuda-v4's Bound and fla-recurrent's launch ask the tables with verify=True for a verify
    call and verify=False for a plain one (the lookup is stopped right there)."""
    from gdnzoo.inputs import make_inputs
    from gdnzoo.verify import Verify
    x = make_inputs(B=2, T=2, **GEOM, state_dtype=torch.float32, device="cuda", seed=0)
    inter = torch.empty(2, 2, 8, 128, 128, device="cuda")
    out = torch.empty(2, 2, 8, 128, dtype=x.v.dtype, device="cuda")
    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, x.state, True)
    for name in ("cuda-v4", "fla-recurrent"):
        mod = registry.backend_module(name)
        seen = []

        def spy(gpu, sd, B, H, HV, K, V, inplace=True, T=1, pool=False, verify=False):
            seen.append(verify)
            raise _Looked

        monkeypatch.setattr(mod, "table_config", spy)
        if name == "cuda-v4":
            monkeypatch.setattr(mod, "_binds", {})
            calls = (lambda: mod.bind(record(*args)), lambda: mod.bind(
                record(*args, None, Verify(inter, None, False, False, None))))
        else:
            calls = (lambda: mod.launch(*args), lambda: mod.launch(
                *args, verify=Verify(inter, None, False, False, None)))
        for call in calls:
            with pytest.raises(_Looked):
                call()
        assert seen == [False, True], name


# ------------------------------------------------------------------------ the tuner

@pytest.mark.parametrize("argv,frag", [
    (["--mode", "verify"], "--tokens: a verify search (--mode verify) needs T draft tokens in "
                           "2..16; got 1"),
    (["--mode", "verify", "--tokens", "17"], "got 17"),
    (["--mode", "pool", "--tokens", "2"], "--tokens: a pool search measures the decode step"),
])
def test_tune_shapes_argument_errors(capsys, argv, frag):
    code, _, err = run_cli(["tune", "--shapes", *argv], capsys)
    assert code == 2 and frag in err and "gdnzoo tune --shapes: error" in err


def test_tune_shapes_verify_arguments_pass_the_check():
    p = shapes.add_shapes_args(argparse.ArgumentParser())
    for T in ("2", "8", "16"):
        shapes.check_args(p.parse_args(["--mode", "verify", "--tokens", T]))
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "verify-slots"])


def test_a_verify_search_tunes_only_backends_that_serve_verify(monkeypatch):
    from gdnzoo.bench import tune
    monkeypatch.setattr(shapes.torch.cuda, "is_available", lambda: True)    # up to the GPU
    p = tune.add_tune_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit, match=r"not tunable in verify mode: fla-tma; tunable: "
                                         r"[a-z0-9-, ]*cuda-v4"):
        tune.cmd_tune(p.parse_args(["--shapes", "--mode", "verify", "--tokens", "2",
                                    "--algo", "cuda-v4,fla-tma"]))


def test_shape_rows_of_a_verify_search_have_mode_verify():
    """Rows of a verify search are ``mode: verify, tokens: T``, merged into the set a verify
    call took before (the shipped verify rows, else the in-place T=2 rows); written, they serve
    verify calls only."""
    args = argparse.Namespace(mode="verify", tokens=2, rows_from_tokens=None)
    mod = registry.backend_module("cuda-v4")
    lt = tables.LaunchTables.load()
    before = lt.row("cuda-v4", mod.CONFIG, H100, "fp32", True, 2, 64, GEOM)[0]
    cfg = mod.CONFIG.normalize((2, 2, 16, 3))
    assert cfg != before
    made, cited = shapes.new_rows(lt, H100, {("cuda-v4", "fp32"): {64: (cfg, 9.0, 8.0, True)}},
                                  args, "tune-v")
    assert made and {(r.mode, r.tokens, r.state) for r in made} == {("verify", 2, "fp32")}
    assert made[0].lo == 1 and made[-1].hi is None
    assert [r.source for r in made].count("tune-v") == 1 and set(cited) <= set(
        lt.files["h100"].sources)
    f = tables.replace_rows(lt.files["h100"], made, {"tune-v": {"how": "a verify tune"}, **cited})
    order = {b: registry.backend_module(b).CONFIG.names for b in {r.backend for r in f.rows}}
    back = tables.parse_launch_file(yaml.safe_load(tables.render_launch_file(f, order)), f.path)
    new = tables.LaunchTables({**lt.files, "h100": back})
    for B, want in ((64, cfg), (1, lt.row("cuda-v4", mod.CONFIG, H100, "fp32", True, 2, 1,
                                          GEOM, True, True)[0])):
        assert new.row("cuda-v4", mod.CONFIG, H100, "fp32", True, 2, B, GEOM, True,
                       True)[0] == want
    assert new.row("cuda-v4", mod.CONFIG, H100, "fp32", True, 2, 64, GEOM)[0] == before
    assert new.row("cuda-v4", mod.CONFIG, H100, "fp32", True, 2, 64, GEOM, True)[0] == before


def test_a_second_tune_of_a_day_gets_its_own_source():
    """A tune's source id is fresh in the table file: a kept row still citing an earlier tune of
    the same day and T must not hand the new rows that tune's description."""
    taken = {"tune-2026-11-24-verify-t4": {}, "tune-2026-11-24-verify-t4-2": {}}
    assert shapes.fresh_source_id("tune-2026-11-24-verify-t8", taken) == "tune-2026-11-24-verify-t8"
    assert shapes.fresh_source_id("tune-2026-11-24-verify-t4", taken) == \
        "tune-2026-11-24-verify-t4-3"


# ------------------------------------------------------------------------ the verify cell

def _cpu_cell(sd, B=1, T=2):
    elem = DTYPES[sd].itemsize
    P = serving.pool_slots([(B, T)], 8, 128, 128, elem, 0, min_bytes=0,
                           width=lambda B, T: B * (T + 1))
    sp = serving.state_pool(P, 8, 128, 128, sd, "cpu", seed=1)
    return verify.VerifyCell(sd, sp, B, T, shapes.GEOMETRY)


@pytest.mark.skipif(HAS_CUDA, reason="the CPU form of the cell (the GPU test times it)")
@pytest.mark.parametrize("sd", ["fp32", "bf16"])
def test_verify_cell_checks_candidates_on_the_cpu(sd):
    """The cell's Problem is the states form on a pool; a correct candidate passes
    bench/mode_verify.py's check and then runs on fresh rows; wrong ones are refused."""
    cell = _cpu_cell(sd)
    p = cell.problem
    assert (p.verify, p.pool, p.T, p.B, p.inplace, p.use_qk_l2norm) == ("states", True, 2, 1,
                                                                          True, True)
    mod = registry.backend_module("fla-recurrent")
    assert mod.candidates(p)
    run = registry.runner("fla-recurrent")
    config = (128, 8, 1)
    launch = cell.checked(run, config)
    ctx = cell.ctx
    storage = ctx.pool.buf.clone()
    cell.prepare()
    launch(0)
    assert torch.equal(ctx.pool.buf, storage)                       # update_state=False
    ix = ctx.bank.index
    assert not torch.equal(ix.slots, ctx.bank.check.slots)         # a fresh row, not the check's
    assert torch.isfinite(ctx.inter.index_select(0, ix.rows.long())).all()

    def wrong_out(call, *, config=None):
        run(call, config=config)
        call.out.mul_(2)

    def updates(call, *, config=None):
        run(call._replace(verify=call.verify._replace(update=True)), config=config)

    with pytest.raises(AssertionError, match="out"):
        cell.checked(wrong_out, config)
    with pytest.raises(AssertionError, match="pool: changed although update_state=False"):
        cell.checked(updates, config)


@pytest.mark.skipif(HAS_CUDA, reason="the CPU form of the cell (the GPU test times it)")
def test_verify_cell_in_each_form_on_the_cpu():
    """A verify row serves every form, so the search's confirm runs its picks in each: the cell
    in another form shares its inputs, bank and pool, takes that form's Problem, passes a
    correct candidate and refuses one that gets that form's stores wrong."""
    cell = _cpu_cell("fp32", B=2, T=3)
    run = registry.runner("fla-recurrent")
    config = (128, 8, 1)
    assert cell.CONFIRM_FORMS == verify.FORMS and cell.FORM == "states"
    for form in verify.FORMS:
        other = cell.in_form(form)
        assert other.ctx is cell.ctx and other.FORM == form and cell.FORM == "states"
        assert (other.problem.verify, other.problem.T, other.problem.B) == (form, 3, 2)
        launch = other.checked(run, config)
        other.prepare()
        launch(0)
        assert torch.isfinite(cell.ctx.out).all()

    def no_update(call, *, config=None):
        run(call._replace(verify=call.verify._replace(update=False)), config=config)

    def last_token_only(call, *, config=None):    # every token reads and stores the last slot
        g = call.pool.read
        last = g[:, -1:].expand_as(g).contiguous()
        run(call._replace(pool=call.pool._replace(read=last, write=last)), config=config)
    with pytest.raises(AssertionError, match="new_state: .* elements off"):
        cell.in_form("states+update").checked(no_update, config)
    with pytest.raises(AssertionError, match="new_state: .* elements off"):
        cell.in_form("slots").checked(last_token_only, config)
    with pytest.raises(ValueError, match="form: one of states, states\\+update, slots"):
        cell.in_form("slot")


def test_confirm_runs_a_verify_cells_picks_in_every_form(monkeypatch):
    """The confirm times the picks in the cell's form, then checks and times them in each other
    form beside that form's floor; a shape failing a form's check is left out of that form and
    reads infinitely far from its floor there."""
    class Cell:
        CONFIRM_FORMS = ("states", "states+update", "slots")

        def __init__(self, form="states"):
            self.FORM, self.prepare = form, None

        def in_form(self, form):
            return Cell(form)

        def floor_launcher(self):
            return {"launch": ("floor", self.FORM), "config": ""}

        def checked(self, run, c):
            if self.FORM == "slots" and c == "bad-in-slots":
                raise AssertionError("out: 3 of 96 elements off")
            return (c, self.FORM)
    floors = {"states": 2.0, "states+update": 3.0, "slots": 4.0}
    us = {("win", "states"): 2.2, ("win", "states+update"): 4.2, ("win", "slots"): 4.4,
          ("row", "states"): 2.1, ("row", "states+update"): 3.3, ("row", "slots"): 4.2,
          ("bad-in-slots", "states"): 2.1, ("bad-in-slots", "states+update"): 3.1}

    def timed(cands, reps, rounds=1, prepare=None):
        return {(b, c): floors[f] if b == "floor" else us[(c, f)]
                for b, c, (_, f) in cands}, "fake clock"
    monkeypatch.setattr(shapes, "time_candidates", timed)
    monkeypatch.setattr(shapes.entries, "raw", lambda b: None)
    monkeypatch.setattr(shapes.torch.cuda, "synchronize", lambda: None)   # after a failed check
    logged = []
    args = argparse.Namespace(confirm_iters=1, confirm_rounds=1)
    picks = [("floor", "floor", ("floor", "states"))] + [
        ("k", c, (c, "states")) for c in ("win", "row", "bad-in-slots")]
    by_form = shapes.confirm(Cell(), picks, args, logged.append)
    assert list(by_form) == ["states", "states+update", "slots"]
    assert by_form["states+update"][("k", "win")] == 4.2
    assert ("k", "bad-in-slots") not in by_form["slots"]
    assert logged and "slots: k bad-in-slots: AssertionError: out" in logged[0]
    worst = shapes.worst_multiples(by_form)
    assert worst[("k", "win")] == pytest.approx((1.4, "states+update"))
    assert worst[("k", "row")] == pytest.approx((1.1, "states+update"))
    assert worst[("k", "bad-in-slots")] == (float("inf"), "slots")


@pytest.mark.skipif(HAS_CUDA, reason="the CPU form of the cell (the GPU test times it)")
def test_a_verify_search_cell_end_to_end_on_the_cpu(monkeypatch):
    """search_cell on a CPU verify cell (fla-recurrent through Triton's interpreter, one
    candidate, clock and floor faked): every stage checks, the confirm runs in the three forms,
    its rows name their form, the log reads each shape's worst form, and the winner that reads
    faster in every form replaces the committed row."""
    cell = _cpu_cell("fp32")
    mod = registry.backend_module("fla-recurrent")
    row = mod.CONFIG.normalize(mod.launch_config(cell.problem, H100))
    win = mod.CONFIG.normalize((16, 2, 1, 4, 1))
    assert win != row
    fast = {win: 1.1, row: 1.5}

    def timed(cands, reps, rounds=1, prepare=None):
        return {(b, c): 1.0 if b == "floor" else fast.get(c, 2.0) for b, c, _ in cands}, "fake"
    monkeypatch.setattr(mod, "candidates", lambda p: [win])
    monkeypatch.setattr(cell, "floor_launcher", lambda: {"launch": lambda i: None, "config": ""})
    monkeypatch.setattr(shapes, "time_candidates", timed)
    monkeypatch.setattr(shapes.torch.cuda, "get_device_name", lambda: H100)
    args = argparse.Namespace(reps=1, confirm_iters=1, confirm_rounds=1, margin=0.01)
    logged, rows = [], []
    out = shapes.search_cell(cell, ["fla-recurrent"], args, logged.append, rows)
    assert out == {"fla-recurrent": (win, 1.1, 1.0, True)}
    stages = {r["stage"] for r in rows}
    assert {"confirm", "confirm states+update", "confirm slots", "committed",
            "committed states+update", "committed slots"} <= stages
    line = logged[-1]
    assert "worst 1.100" in line and "worst 1.500" in line and ": change" in line, line


def test_confirm_verdict_reads_the_worst_form_for_verify_rows():
    """A verify row changes only where the winner's worst multiple of a form's floor is the
    margin below the committed row's (2026-11-30: a bf16 T=4 B=16 winner 8% faster without the
    update read 1.38x its floor with it, the committed row 1.19x); a winner that failed a form
    is never written; other searches keep the searched form's rule."""
    verdict = shapes.confirm_verdict
    assert verdict(6.91, 7.81, (1.38, "states+update"), (1.19, "states+update"), False, 0.01,
                   True) == "keep"
    assert verdict(6.91, 7.81, (1.10, "states"), (1.24, "states"), False, 0.01, True) == "change"
    assert verdict(6.91, 7.81, (1.10, "s"), (1.105, "s"), False, 0.01, True) == "keep"
    assert verdict(1.0, 2.0, (float("inf"), "slots"), (float("inf"), "slots"), False, 0.01,
                   True) == "keep"
    assert verdict(1.0, 2.0, (1.0, "s"), (float("inf"), "slots"), False, 0.01, True) == "change"
    assert verdict(6.91, 7.81, None, None, False, 0.01, False) == "change"
    assert verdict(7.80, 7.81, None, None, False, 0.01, False) == "keep"
    assert verdict(7.80, 7.80, None, None, True, 0.01, False) == "same"


@pytest.mark.skipif(not HAS_CUDA, reason="the serving-size pool and the verify floor: a CUDA "
                                         "device")
def test_verify_cell_on_the_gpu():
    """A verify search's cells (make_cells): every cuda-v4 candidate of a small B is checked and
    runs on fresh rows, and the verify floor's launcher is found; in the confirm's other forms
    a candidate and the committed row are checked and run, and each form's floor is found."""
    args = argparse.Namespace(mode="verify", tokens=2, batch=[1, 4])
    cells = list(shapes.make_cells(args, "fp32", {}))
    assert [(c.B, c.T, c.problem.verify) for c in cells] == [(1, 2, "states"), (4, 2, "states")]
    cell = cells[0]
    mod = registry.backend_module("cuda-v4")
    cands = [mod.CONFIG.normalize(c) for c in mod.candidates(cell.problem)]
    run = registry.runner("cuda-v4")
    for c in cands[:: max(1, len(cands) // 16)]:
        launch = cell.checked(run, c)
        cell.prepare()
        launch(0)
    torch.cuda.synchronize()
    fl = cell.floor_launcher()
    assert fl["launch"] is not None, fl["config"]
    fl["launch"](0)
    torch.cuda.synchronize()
    for form in ("states+update", "slots"):           # the confirm's other forms
        other = cell.in_form(form)
        for c in (cands[0], mod.CONFIG.normalize(mod.launch_config(other.problem,
                                                                   torch.cuda.get_device_name()))):
            launch = other.checked(run, c)
            other.prepare()
            launch(0)
        fl = other.floor_launcher()
        assert fl["launch"] is not None, (form, fl["config"])
        fl["launch"](0)
        torch.cuda.synchronize()

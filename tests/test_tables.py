"""The per-GPU launch tables (gdnzoo.tables, backends/tables/*.yaml): schema, lookup, fallback,
the name rule, what the tuner writes, and that every shipped row is a shape the tuner can
measure (CPU)."""
import copy
import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from gdnzoo import registry, tables
from gdnzoo.contract import Problem

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
FIELDS = tables.ConfigFields(a=tables.REQUIRED, b=0)
GEOM = dict(H=4, HV=8, K=128, V=128)


def _file(rows, match="X100", fallback="default", sources=None):
    return dict(gpu=f"NVIDIA {match}", match=match, fallback=fallback, measured_at=dict(GEOM),
                sources=sources or {"s": {"how": "test"}}, rows=rows)


def _row(lo, hi, a, state="fp32", mode="inplace", tokens=1, backend="k", **kw):
    return dict(backend=backend, state=state, mode=mode, tokens=tokens, batch=[lo, hi],
                config=dict(a=a), source="s", **kw)


def _tables(tmp_path, **files):
    d = tmp_path / "tables"
    d.mkdir(parents=True, exist_ok=True)
    files.setdefault("default", _file([_row(1, None, "generic", mode="any"),
                                       _row(1, None, "generic", mode="any", state="bf16")],
                                      match=None, fallback=None))
    for name, data in files.items():
        (d / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tables.LaunchTables.load(d)


def _pick(lt, gpu, B, T=1, inplace=True, state="fp32", **geom):
    return lt.row("k", FIELDS, gpu, state, inplace, T, B, {**GEOM, **geom})[0][0]


# ------------------------------------------------------------------------ the shipped files

def test_shipped_files_load_and_every_row_fits_its_backend():
    lt = tables.LaunchTables.load()
    assert {"default", "h100", "h200"} <= set(lt.files)
    tunable = registry.tunables()
    assert {"cuda-v4", "fla-recurrent", "fla-tma"} <= set(tunable)
    for f in lt.files.values():
        for r in f.rows:
            assert r.backend in tunable, (f.slug, r.backend)
        for name in tunable:
            lt.check_configs(name, registry.backend_module(name).CONFIG)
    assert lt.file_for(H100).slug == "h100" and lt.file_for("NVIDIA GH200 144G HBM3e").slug == "h200"
    assert lt.file_for("NVIDIA B200").slug == "default" and lt.file_for(None).slug == "default"


def test_shipped_files_are_what_the_writer_writes():
    """Every committed file is in the tuner's canonical form: rendering it gives its text."""
    lt = tables.LaunchTables.load()
    for f in lt.files.values():
        order = {b: registry.backend_module(b).CONFIG.names for b in {r.backend for r in f.rows}}
        assert tables.render_launch_file(f, order) == f.path.read_text(), f.slug


def test_every_shipped_row_is_a_shape_the_search_measures():
    """A GPU's rows came from the shape search: each is among its backend's candidates (cuda-v4:
    its shape and staging, the cache hint, gate precision and FMA chains varying in stage 2; at
    T > 1 a staged candidate runs in registers, so a multi-token row may have a staged shape and
    none stages; a verify row is among the verify search's shapes, or a multi-token row it
    kept, a tensor-core verify row by its fallback's shape).  The default file's generic rows
    were not measured."""
    lt = tables.LaunchTables.load()
    for name in registry.tunables():
        mod = registry.backend_module(name)
        for sd, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            p = Problem(B=1, T=1, H=4, HV=8, K=128, V=128, state_dtype=dt,
                        io_dtype=torch.bfloat16, device="cuda", cc=(9, 0))
            cands = [mod.CONFIG.normalize(c) for c in mod.candidates(p)]
            rows = [(mod.CONFIG.normalize(r.config), r.tokens, r.mode) for f in lt.files.values()
                    for r in f.rows if f.match and r.backend == name and r.state == sd]
            assert rows
            for c, tokens, mode in rows:
                if mode == "verify" and name == "cuda-v4":
                    # a verify search's winner, or a row it kept from the set it started from;
                    # a tensor-core verify row (one fixed shape) names cuda_v4.cu's fields for
                    # the calls that kernel does not serve, whose shape must be one of those
                    c = c[:11] + ("decode",)
                    vp = dataclasses.replace(p, T=tokens, verify="states")
                    searched = {x[:3] + x[6:] for x in map(mod.CONFIG.normalize,
                                                            mod.candidates(vp))}
                    assert c[:3] + c[6:] in searched or (
                        tuple(c[:3]) in {x[:3] for x in cands} and c[6] == 0 and c[8] == 0), c
                elif name != "cuda-v4":
                    assert tuple(c) in cands, (name, c)
                elif tokens == 1:
                    assert tuple(c[:3] + c[6:7]) in {x[:3] + x[6:7] for x in cands}, c
                else:
                    assert tuple(c[:3]) in {x[:3] for x in cands} and c[6] == 0, c


def test_refine_keeps_the_best_shapes():
    from gdnzoo.backends import cuda_v4, fla_recurrent
    ranked = [(1, 2, 16, 0, 1, 0, 0, 0), (1, 2, 16, 3, 1, 0, 0, 0), (2, 2, 16, 0, 1, 0, 1, 0),
              (4, 1, 8, 2, 1, 0, 0, 0, 1), (8, 1, 8, 2, 1, 0, 0, 2, 0, 1, 1),
              (1, 1, 4, 0, 1, 0, 0, 0)]
    got = cuda_v4.refine(ranked)
    assert {c[:3] + c[6:11] for c in got} == {(1, 2, 16, 0, 0, 0, 0, 0), (2, 2, 16, 1, 0, 0, 0, 0),
                                              (4, 1, 8, 0, 0, 1, 0, 0), (8, 1, 8, 0, 2, 0, 1, 1)}
    assert {c[11] for c in got} == {"decode"}
    tc = cuda_v4.refine([(8, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1, "tc-verify")] + ranked)
    assert {c[:3] + c[6:] for c in tc if c[11] == "tc-verify"} == {
        (8, 1, 16, 0, 2, 0, 3, 1, "tc-verify")}
    assert {c[3] for c in got if c[6]} == {0, 2} and {c[4] for c in got} == {0, 1}
    assert fla_recurrent.refine([(4, 1, 1, 8, 1), (8, 1, 1), (2, 1, 1, 8), (1, 1, 1)]) == \
        [(4, 1, 1, 8, 1), (8, 1, 1, None, 0), (2, 1, 1, 8, 0)]


# ------------------------------------------------------------------------ lookup

def test_mode_tokens_and_batch_ranges(tmp_path):
    lt = _tables(tmp_path, x100=_file([
        _row(1, 1, "ip-1"), _row(2, None, "ip-2"),
        _row(1, None, "dest", mode="dest"),
        _row(1, None, "t2", mode="any", tokens=2),
        _row(1, 4, "t3-small", mode="any", tokens=3), _row(5, None, "t3-big", mode="any", tokens=3),
        _row(1, None, "t3-dest", mode="dest", tokens=3)]))
    assert _pick(lt, "NVIDIA X100", 1) == "ip-1" and _pick(lt, "nvidia x100 sxm", 2) == "ip-2"
    assert _pick(lt, "NVIDIA X100", 1, inplace=False) == "dest"
    assert _pick(lt, "NVIDIA X100", 9, T=2, inplace=False) == "t2"      # a larger tokens wins
    assert _pick(lt, "NVIDIA X100", 4, T=7) == "t3-small"
    assert _pick(lt, "NVIDIA X100", 5, T=3) == "t3-big"
    assert _pick(lt, "NVIDIA X100", 5, T=3, inplace=False) == "t3-dest"  # own mode over any
    # batch ranges are at the measured HV=8: at HV=32, B=1 has the heads of B=4
    assert _pick(lt, "NVIDIA X100", 1, T=3, HV=32) == "t3-small"
    assert _pick(lt, "NVIDIA X100", 2, T=3, HV=32) == "t3-big"
    assert _pick(lt, "NVIDIA X100", 1, state="bf16") == "generic"       # no bf16 rows: fallback
    assert _pick(lt, "NVIDIA Y9", 1) == "generic"                       # no file: default


def test_geometry_rows_serve_only_their_geometry(tmp_path):
    lt = _tables(tmp_path, x100=_file([
        _row(1, None, "any-geometry"),
        _row(1, 2, "hv64-small", geometry={"HV": 64}), _row(3, None, "hv64-big", geometry={"HV": 64})]))
    assert _pick(lt, "NVIDIA X100", 1) == "any-geometry"
    assert _pick(lt, "NVIDIA X100", 2, HV=64, H=16) == "hv64-small"     # its own HV: B 1..2
    assert _pick(lt, "NVIDIA X100", 3, HV=64, H=16) == "hv64-big"


def test_fallback_chain_and_name_rule(tmp_path):
    base = _file([_row(1, None, "x100")], match="X100", fallback=None)
    lt = _tables(tmp_path, x100=base,
                 x100s=_file([_row(1, None, "x100s", state="bf16")], match="X100S", fallback="x100"),
                 default=_file([], match=None, fallback="x100"))
    assert _pick(lt, "NVIDIA X100S", 1, state="bf16") == "x100s"        # the longer match wins
    assert _pick(lt, "NVIDIA X100S", 1) == "x100"                       # fp32: its fallback
    assert _pick(lt, "NVIDIA Z7", 1) == "x100"                          # default -> x100
    with pytest.raises(tables.TableError, match="no launch rows"):
        _pick(lt, "NVIDIA Z7", 1, state="bf16")


@pytest.mark.parametrize("mutate,frag", [
    (lambda f: f["rows"].pop(0), "start at 1"),
    (lambda f: f["rows"][0].update(batch=[1, 2]), "leave no gap"),
    (lambda f: f["rows"][-1].update(batch=[2, 9]), "must be open"),
    (lambda f: f["rows"][0].update(mode="sideways"), "mode one of"),
    (lambda f: f["rows"][0].update(source="nowhere"), "source 'nowhere'"),
    (lambda f: f["rows"][0].update(tokens=0), "tokens must be"),
    (lambda f: f["rows"][0].update(geometry={"W": 3}), "geometry"),
    (lambda f: f["rows"][0].pop("config"), "missing keys ['config']"),
    (lambda f: f.update(measured_at={"H": 4}), "measured_at"),
    (lambda f: f.update(fallback="nope"), "fallback 'nope'"),
    (lambda f: f.update(extra=1), "unknown keys ['extra']"),
])
def test_malformed_files_name_the_place(tmp_path, mutate, frag):
    f = _file([_row(1, 1, "a"), _row(2, None, "b")])
    mutate(f)
    with pytest.raises(tables.TableError, match=frag.replace("[", r"\[").replace("]", r"\]")):
        _tables(tmp_path, x100=f)


def test_fallback_loops_and_config_fields_are_refused(tmp_path):
    with pytest.raises(tables.TableError, match="loops"):
        _tables(tmp_path, x100=_file([_row(1, None, "a")], fallback="x100"))
    lt = _tables(tmp_path / "b", x100=_file([_row(1, None, "a")]))
    bad = copy.deepcopy(lt)
    bad.files["x100"].rows[0] = tables.LaunchRow("k", "fp32", "inplace", 1, 1, None, {"c": 1}, "s")
    with pytest.raises(tables.TableError, match=r"x100.yaml rows\[0\].*unknown fields \['c'\]"):
        bad.row("k", FIELDS, "NVIDIA X100", "fp32", True, 1, 1, GEOM)
    with pytest.raises(tables.TableError, match=r"missing fields \['a'\]"):
        FIELDS.normalize({"b": 2})
    assert FIELDS.normalize((5,)) == (5, 0) and FIELDS.as_dict((5, 0)) == {"a": 5}


def test_merge_measured():
    m = tables.merge_measured
    assert m([], {1: "a", 4: "b", 8: "b", 16: "c", 512: "d"}) == [
        (1, 1, "a"), (2, 8, "b"), (9, 16, "c"), (17, None, "d")]
    old = [(1, 1, "a"), (2, 4, "b"), (5, 64, "c"), (65, None, "d")]
    assert m(old, {1: "a", 4: "b", 8: "x", 64: "c"}) == [
        (1, 1, "a"), (2, 4, "b"), (5, 8, "x"), (9, 64, "c"), (65, None, "d")]
    assert m(old, {16: "q"}) == [(1, 1, "a"), (2, 4, "b"), (5, 16, "q"), (17, 64, "c"),
                                 (65, None, "d")]
    assert m(old, {128: "z"}) == [(1, 1, "a"), (2, 4, "b"), (5, 64, "c"), (65, None, "z")]
    assert m(old, {}) == old


def test_render_round_trip(tmp_path):
    lt = _tables(tmp_path, x100=_file([_row(1, 3, "a"), _row(4, None, "b"),
                                       _row(1, None, "g", geometry={"HV": 16})]))
    f = lt.files["x100"]
    text = tables.render_launch_file(f)
    back = tables.parse_launch_file(yaml.safe_load(text), f.path)
    assert back.rows == sorted(f.rows, key=lambda r: (r.geometry, r.lo))
    assert back.sources == f.sources and back.match == f.match
    new = tables.replace_rows(f, [tables.LaunchRow("k", "fp32", "inplace", 1, 1, None, {"a": "c"},
                                                   "t")], {"t": {"how": "a tune"}})
    assert sorted(r.config["a"] for r in new.rows) == ["c", "g"] and set(new.sources) == {"s", "t"}


def test_for_gpu_matches_the_longest_contained_name():
    table = {"H100": 1, "H100 PCIe": 2, "H200": 3}
    assert tables.for_gpu(table, "NVIDIA H100 80GB HBM3") == 1
    assert tables.for_gpu(table, "NVIDIA H100 PCIe") == 2            # the longer key wins
    assert tables.for_gpu(table, "nvidia h200") == 3                 # case-insensitive
    assert tables.for_gpu(table, "NVIDIA B200", "none") == "none"    # no key: the default
    assert tables.for_gpu(table, None) is None and tables.for_gpu(table, "") is None
    assert registry.default_row("NVIDIA H200").gpu == "NVIDIA H200"
    assert registry.default_row(None) is None
    assert tables.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"


def test_the_tables_are_found_beside_the_backends():
    assert (tables.tables_dir() / "h100.yaml").is_file()
    assert tables.tables_dir().parent == Path(registry.backend_module("cuda-v4").__file__).parent


def test_fla_recurrent_fits_its_rows_to_a_k_first_state():
    """A K-first state's launch is one warp whose tile reads 64 bytes of V a K row (16 fp32, 32
    bf16 elements), 128 for fp32 at 2048 head-rows or more, at most 128 state elements a thread
    and never more rows than V; it keeps the k-last row's DENSE, and a k-last state keeps the
    table's row."""
    from gdnzoo.backends import fla_recurrent as fr
    from gdnzoo.inputs import make_problem
    assert fr.kfirst_config("fp32", 128, 128, 128, (4, 4, 1, 16, 1)) == (16, 1, 1, 32, 1)
    assert fr.kfirst_config("fp32", 2048, 128, 128, (4, 4, 1, 16, 0)) == (32, 1, 1, 32, 0)
    assert fr.kfirst_config("bf16", 128, 128, 128, (4, 1, 1, 16, 1)) == (32, 1, 1, 16, 1)
    assert fr.kfirst_config("bf16", 8192, 128, 128, (4, 1, 1, 16, 1))[0] == 32
    assert fr.kfirst_config("fp32", 2048, 256, 256, (4, 1, 1, None, 0))[0] == 16  # 128 a thread
    assert fr.kfirst_config("bf16", 8, 64, 8, (4, 1, 1, None, 0))[0] == 8        # V < the tile
    h200 = "NVIDIA H200"
    # FLA's entry point returns a fresh state: destination passing, whose H200 row at 128
    # (sequence, head) pairs takes 4 rows a program
    p = make_problem(B=4, H=16, HV=32, inplace=False)
    row = fr.launch_config(p, h200)
    assert row[0] == 4
    kf = fr.launch_config(dataclasses.replace(p, k_first=True), h200)
    assert kf == (16, 1, 1, 32, row[4])

"""``gdnzoo tune``: the tuner.  It writes both per-GPU tables.

* ``gdnzoo tune [--from RESULTS.json,...] [--write]``: this GPU's row of the default table (which
  backend serves each batch size), from a bench it runs or from the results.json files of
  earlier ``gdnzoo bench`` runs (no GPU needed), into ``registry.yaml``'s ``defaults:`` list:
  only the lines of this GPU's entry change, comments included; provenance names the files and
  the date, versions and commit each run recorded.  Rows of ``--mode pool``, ``--mode verify``
  and ``--state-layout k-first`` runs give the row's ``table_pool``, ``table_verify`` and K-first
  tables (:func:`with_mode_table`, :func:`with_kfirst_tables`); with no in-place rows beside
  them, they are added to this GPU's existing row, and a stage without rows of its own keeps
  the row's tables of it.
* ``gdnzoo tune --from PREFILL_RESULTS.json,... [--write]``: this GPU's row of the prefill
  operation's default table (:func:`make_prefill_row`).
* ``gdnzoo tune --shapes [--write]``: the launch rows of the tunable backends on this GPU
  (:mod:`gdnzoo.bench.shapes`), into ``backends/tables/<gpu>.yaml``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import re
from pathlib import Path

import yaml

from gdnzoo import gate, registry
from gdnzoo.bench import args as bench_args, entries, report, shapes
from gdnzoo.bench.report import finite
from gdnzoo.operation import DECODE, PREFILL
from gdnzoo.tables import GEOMETRY_KEYS

EXCLUDE_FLAGS = ("warm write target",)     # flattered measurements never win a table slot


def add_tune_args(p):
    p.add_argument("--shapes", action="store_true",
                   help="the launch-shape search of the tunable backends (backends/tables/<gpu>.yaml) "
                        "instead of the default-table row")
    p.add_argument("--out", default=None, help="results directory (default gdnzoo-results/<gpu>/tune, "
                                                "with --shapes .../shapes)")
    p.add_argument("--write", "--write-registry", dest="write", action="store_true",
                   help="write the result (this GPU's row of registry.yaml; with --shapes its "
                        "launch rows) instead of printing it")
    p.add_argument("--registry", default=None, help="registry.yaml to update (default: the loaded one)")
    p.add_argument("--batch", type=bench_args.positive_ints,
                   default=list(bench_args.DEFAULT_BATCHES))
    p.add_argument("--algo", type=bench_args.names, default=None,
                   help="comma list of candidate backends (default all; "
                        "with --shapes every tunable one)")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--time-budget", type=float, default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--dest", action="store_true",
                   help="also measure destination passing and write its own table (table_dest)")
    p.add_argument("--from", dest="from_files", action="append", default=None,
                   metavar="RESULTS_JSON",
                   help="build the row from existing `gdnzoo bench` results.json file(s) instead "
                        "of measuring (repeat or comma-separate to merge runs, e.g. one per "
                        "state dtype); no GPU needed")
    p.add_argument("--geometry-row", action="store_true",
                   help="write a row that serves only the runs' geometry (H, HV), beside this "
                        "GPU's general row (which other geometries read by (sequence, head) "
                        "pairs); a later tune of that geometry replaces it")
    shapes.add_shapes_args(p)
    return p


def fastest(rows, state_dtype, mode="inplace", clock="kernel", top=3, T=1, bench=None):
    """{B: [(backend, median_us), ...]} fastest first, over correct, honestly timed rows (of
    the bench mode ``bench`` when given)."""
    by_b = {}
    for r in rows:
        m = r.get("median_us")
        if (r["state_dtype"] != state_dtype or r["mode"] != mode or r["clock"] != clock
                or (bench is not None and r.get("bench") != bench)
                or int(r.get("T") or 1) != T
                or r["status"] != "PASS" or r["backend"] == "floor" or not finite(m)
                or any(f in (r.get("flags") or "") for f in EXCLUDE_FLAGS)):
            continue
        by_b.setdefault(r["B"], []).append((r["backend"], float(m)))
    return {B: sorted(v, key=lambda t: t[1])[:top] for B, v in sorted(by_b.items())}


def merge_ranges(choice):
    """{B: backend} -> [(lo, hi, backend)]: adjacent measured sizes with one winner form a range.

    The first range starts at 1, a range ends just before the next winner's first measured size,
    and the last is open (hi None)."""
    out = []
    for B in sorted(choice):
        if out and out[-1][2] != choice[B]:
            out[-1] = (out[-1][0], B - 1, out[-1][2])
        if not out or out[-1][2] != choice[B]:
            out.append((B if out else 1, None, choice[B]))
    return out


def state_layout(env) -> str:
    """The state layout a run timed: its environment's ``state_layout`` (runs before that key:
    the note ``--state-layout k-first`` left)."""
    return env.get("state_layout") or ("k-first" if any(
        str(n).startswith("--state-layout k-first") for n in env.get("notes") or []) else "k-last")


def load_runs(paths, base=None):
    """(gpu, rows, dict(results_file, commit, versions, date)) merged from several results.json
    files of one GPU.  A (backend, B, dtype, mode, clock) measured in more than one file is an
    error: two runs would silently disagree."""
    files = [Path(x) for p in paths for x in str(p).split(",") if x.strip()]
    if not files:
        bench_args.usage_error("--from: no results file given", "gdnzoo tune")
    rows, envs, seen = [], [], {}
    for f in files:
        if not f.is_file():
            bench_args.usage_error(f"--from: {f}: no such file", "gdnzoo tune")
        rs, env = report.read_results(f)
        envs.append(env)
        for r in rs:
            if r.get("backend") == "floor":
                continue
            r["layout"] = state_layout(env)          # K-first rows make the K-first tables
            k = tuple(r.get(c) for c in ("backend", "B", "T", "H", "HV", "K", "V", "state_dtype",
                                         "mode", "l2norm", "clock", "layout"))
            if r.get("status") == "PASS":
                if k in seen:
                    raise SystemExit(f"tune --from: {k[0]} B={k[1]} {k[7]} {k[8]} {k[10]} is in "
                                     f"both {seen[k]} and {f}")
                seen[k] = f
            rows.append(r)
    gpus = sorted({str(e.get("gpu")) for e in envs})
    if len(gpus) != 1 or gpus[0] in ("None", "cpu"):
        raise SystemExit(f"tune --from: the files must come from one GPU run, got {gpus}")

    def rel(f):
        f = f.resolve()
        with contextlib.suppress(ValueError):
            f = f.relative_to(Path(base).resolve()) if base else f
        return str(f)

    def one(xs):
        xs = [x for i, x in enumerate(xs) if x not in xs[:i]]
        return xs[0] if len(xs) == 1 else xs
    versions = {}
    for e in envs:
        for k, v in (e.get("versions") or {}).items():
            if v and versions.setdefault(k, v) != v:
                versions[k] = f"{versions[k]} / {v}"
    prov = dict(results_file=one([rel(f) for f in files]),
                commit=one([e.get("commit") for e in envs]), versions=versions,
                date=max(str(e.get("date") or "")[:10] for e in envs) or None)
    return gpus[0], rows, prov


def geometry(results) -> dict:
    """{H, HV, K, V} the timed rows of ``results`` share: a row of the default table is
    measured at one geometry (other heads read it by (sequence, head) pairs)."""
    at = {tuple(r[k] for k in GEOMETRY_KEYS) for r in results
          if r.get("status") == "PASS" and r.get("backend") != "floor"}
    if len(at) != 1:
        raise ValueError(f"tune: the results must be at one geometry (H, HV, K, V), got "
                         f"{sorted(at)}")
    return dict(zip(GEOMETRY_KEYS, map(int, at.pop())))


def make_row(gpu, results, *, results_file=None, commit=None, versions=None, date=None,
             geometry_row=False):
    """The ``defaults:`` entry for this GPU from dense-mode rows (kernel clock): ``table`` from the
    in-place rows at T=1 and, where the rows include them, ``table_dest`` from destination
    passing at T=1 and ``table_tokens`` from in-place rows at one T > 1."""
    tables, values = {}, {}
    Ts = sorted({int(r.get("T") or 1) for r in results} - {1})
    if len(Ts) > 1:
        raise ValueError(f"tune: results at several T > 1 ({Ts}): give one for table_tokens")
    for mode, T in (("inplace", 1), ("dest", 1), *(("tokens", t) for t in Ts)):
        t, v = winners(results, "inplace" if mode == "tokens" else mode, T=T)
        if t:
            tables[mode], values[mode] = t, v
    if "inplace" not in tables:
        raise ValueError("tune: no correct in-place kernel-clock results to choose from")
    at = geometry(results)
    how = ("gdnzoo tune: CUPTI kernel-clock medians, cold L2 (rotated state sets), geometry "
           + " ".join(f"{k}={v}" for k, v in at.items())
           + ", T=1, in place; fastest correct backend per measured batch size")
    if "dest" in tables:
        how += ("; table_dest: the same with destination passing (a distinct new_state, "
                "rotated cold too)")
    if "tokens" in tables:
        how += f"; table_tokens: the same at T={Ts[0]} tokens per call, in place, serving T >= 2"
    prov = dict(how=how, measured=date or datetime.date.today().isoformat(),
                versions={k: v for k, v in (versions or {}).items() if v},
                commit=commit, results=results_file, values_us=values["inplace"])
    row = dict(gpu=gpu, provenance=prov, measured_at=at, table=tables["inplace"])
    if geometry_row:
        row["geometry"] = {k: at[k] for k in ("H", "HV")}      # a row by geometry: its heads
    for mode in ("dest", "tokens"):
        if mode in tables:
            prov[f"values_us_{mode}"] = values[mode]
            row[f"table_{mode}"] = tables[mode]
    return row


POOL_HOW = ("gdnzoo bench --mode pool: CUPTI kernel-clock medians (per call the sum of every "
            "kernel it launched), a page-strided state pool of >= 2 GiB, fresh random distinct "
            "slots every call, q/k/v views of a packed mixed_qkv, use_qk_l2norm=True, T=1, in "
            "place; fastest correct registered pool backend per measured batch size")
VERIFY_HOW = ("gdnzoo bench --mode verify: CUPTI kernel-clock medians per (T, form) cell; per batch "
              "size the registered verify backend with the lowest mean multiple of each cell's "
              "fastest (mean_multiple: those means)")


def winners(rows, mode, scale=1, **kw) -> tuple:
    """({state dtype: [(lo, hi, backend)]}, {state dtype: {B: {backend: us}}}): per state dtype
    the fastest backends of ``rows`` in ``mode`` (:func:`fastest`), as table ranges (each
    measured B standing at B * ``scale``) and the measured values behind them."""
    table, values = {}, {}
    for sd in ("fp32", "bf16"):
        f = fastest(rows, sd, mode, **kw)
        if f:
            table[sd] = merge_ranges({B * scale: v[0][0] for B, v in f.items()})
            values[sd] = {B: {n: round(us, 2) for n, us in v} for B, v in f.items()}
    return table, values


def pool_winners(results):
    """:func:`winners` of the rows of a ``gdnzoo bench --mode pool`` run: its registered
    backends that serve pools (the bench's ``auto``, peers and adapters are no candidates)."""
    able = set(entries.backends(pools=True))
    return winners([r for r in results if r["backend"] in able], "pool", bench="pool")


def mean_multiples(cells) -> dict:
    """{backend: the mean over ``cells`` ([{backend: us}]) of its time over the cell's fastest},
    for the backends timed in every cell, in the order they are first seen."""
    every = [b for b in dict.fromkeys(b for t in cells for b in t) if all(b in t for t in cells)]
    return {b: sum(t[b] / min(t.values()) for t in cells) / len(cells) for b in every}


def verify_winners(results, top=3):
    """({state dtype: [(lo, hi, backend)]}, {state dtype: {B: {backend: mean multiple}}}) of the
    rows of a ``gdnzoo bench --mode verify`` run.  A verify table is keyed by batch size alone,
    so per (state dtype, B) each registered verify backend's kernel-clock median in every (T,
    form) cell of the run (``commit`` excluded: no backend choice) is divided by the cell's
    fastest, and the backend with the lowest mean multiple wins; a backend missing a cell the
    others have is no candidate there."""
    able = set(entries.backends(verify=True))
    cells = {}
    for r in results:
        m = r.get("median_us")
        if (r.get("bench") == "verify" and r["backend"] in able and r["mode"] != "commit"
                and r["clock"] == "kernel" and r["status"] == "PASS" and finite(m)):
            cells.setdefault(r["state_dtype"], {}).setdefault(r["B"], {}).setdefault(
                (r["T"], r["mode"]), {})[r["backend"]] = float(m)
    return lowest_mean_multiple({sd: {B: list(c.values()) for B, c in by_b.items()}
                                 for sd, by_b in cells.items()}, top)


def lowest_mean_multiple(groups, top=None) -> tuple:
    """({state dtype: [(lo, hi, backend)]}, {state dtype: {key: {backend: mean multiple}}}):
    per state dtype and key of ``groups`` ({state dtype: {key: [{backend: us} per cell]}}) the
    backend with the lowest of :func:`mean_multiples`; the values kept: the ``top`` lowest
    (None: every backend's, by name), rounded."""
    table, values = {}, {}
    for sd in ("fp32", "bf16"):
        means = {}
        for key, cells in sorted(groups.get(sd, {}).items()):
            if m := mean_multiples(cells):
                ranked = sorted(m.items(), key=lambda t: t[1])[:top] if top else sorted(m.items())
                means[key] = {b: round(x, 3) for b, x in ranked}
        if means:
            table[sd] = merge_ranges({k: min(v, key=v.get) for k, v in means.items()})
            values[sd] = means
    return table, values


PREFILL_HOW = ("gdnzoo bench --mode prefill: CUPTI kernel-clock medians (the time a call's "
               "records cover), "
               "in place; per tokens per sequence (T/N, what the prefill table is read at) the "
               "registered backend held to the call's own state bound (not the entries that "
               "round the state to bf16) with the lowest mean multiple of each cell's fastest "
               "(mean_multiple: those means), over the cells that time it in every cell of that "
               "T/N")


def prefill_winners(results, form="dense"):
    """({state dtype: [(lo, hi, backend)]}, {state dtype: {T/N: {backend: mean multiple}}}) of
    the ``form`` ("dense" or "pool") rows of ``gdnzoo bench --mode prefill`` runs: per state
    dtype and tokens per sequence, the candidate (a registered prefill backend judged with the
    state's own bound) with the lowest mean of its kernel time over each cell's fastest
    candidate, among those timed in every cell of that T/N (cells of several geometries and
    mixes may share one)."""
    able = {n for n in entries.backends("prefill") if gate.state_tol_of(n, "prefill") is None}
    cells = {}
    for r in results:
        m = r.get("median_us")
        if (r.get("bench") != "prefill" or r["mode"] != form or r["clock"] != "kernel"
                or r["status"] != "PASS" or r["backend"] not in able or not finite(m)
                or any(f in (r.get("flags") or "") for f in EXCLUDE_FLAGS)):
            continue
        cell = tuple(r.get(k) for k in ("state_dtype", "H", "HV", "K", "V", "B", "T", "mix"))
        cells.setdefault(cell, {})[r["backend"]] = float(m)
    groups = {}
    for cell, times in cells.items():
        tn = max(1, int(cell[6]) // max(1, int(cell[5])))          # T/N
        groups.setdefault(cell[0], {}).setdefault(tn, []).append(times)
    return lowest_mean_multiple(groups)


def make_prefill_row(gpu, results, *, results_file=None, commit=None, versions=None, date=None):
    """The prefill operation's ``defaults:`` entry for this GPU from ``gdnzoo bench --mode
    prefill`` rows: ``table`` from the dense in-place cells, ``table_pool`` from the pool
    form's where the runs have them (:func:`prefill_winners`)."""
    table, values = prefill_winners(results, "dense")
    if not table:
        raise ValueError("tune: no correct in-place kernel-clock prefill results of a backend "
                         "held to the state's own bound to choose from")
    geos = sorted({f"{r['H']}/{r['HV']} K={r['K']} V={r['V']}" for r in results
                   if r.get("bench") == "prefill" and r["status"] == "PASS"})
    prov = dict(how=f"{PREFILL_HOW}; geometries {', '.join(geos)}",
                measured=date or datetime.date.today().isoformat(),
                versions={k: v for k, v in (versions or {}).items() if v}, commit=commit,
                results=results_file, mean_multiple=values)
    row = dict(gpu=gpu, provenance=prov, table=table)
    pool, pool_values = prefill_winners(results, "pool")
    if pool:
        row["table_pool"] = pool
        prov["mean_multiple_pool"] = pool_values
    return row


KFIRST_HOW = ("gdnzoo tune: CUPTI kernel-clock medians of a gdnzoo bench --state-layout k-first run, "
              "cold L2 (rotated state sets), T=1; table_kfirst: fastest correct backend per "
              "measured batch size in place, table_kfirst_dest: with destination passing")


def kfirst_tables(rows, at) -> tuple:
    """({table key: {state dtype: [(lo, hi, backend)]}}, {values key: {state dtype: {B:
    {backend: us}}}}, a note on the geometry) of the K-first rows of ``gdnzoo bench
    --state-layout k-first`` runs: per state dtype the fastest backend at each measured batch
    size, in place (``table_kfirst``) and with destination passing (``table_kfirst_dest``).
    The row's tables are read at ``at`` (its ``measured_at``), so a batch size B measured at
    HV value heads stands at B * HV / at["HV"] (as many (sequence, head) pairs); HV must be a
    multiple of at["HV"], K and V the same."""
    run = geometry(rows)
    if (run["K"], run["V"]) != (at["K"], at["V"]) or run["HV"] % at["HV"]:
        raise ValueError(f"tune: the K-first results are at {run}; the row's tables are read at "
                         f"{at}: K and V must match and HV be a multiple of {at['HV']}")
    f = run["HV"] // at["HV"]
    tables, values = {}, {}
    for key, mode, vkey in (("table_kfirst", "inplace", "values_us"),
                            ("table_kfirst_dest", "dest", "values_us_dest")):
        t, v = winners(rows, mode, scale=f)
        if t:
            tables[key], values[vkey] = t, v
    note = (f"measured at H={run['H']} HV={run['HV']}" + (
        f", batch sizes read by (sequence, head) pairs at HV={at['HV']} (x{f})" if f > 1 else ""))
    return tables, values, note


def with_kfirst_tables(row, old, rows, prov):
    """``row`` with its ``table_kfirst`` and ``table_kfirst_dest`` from the K-first rows among
    ``rows`` (:func:`kfirst_tables`; provenance under ``provenance.kfirst``), else the ones
    ``old`` (this GPU's row before) had."""
    tables, values, how = {}, {}, KFIRST_HOW
    if rows:
        tables, values, note = kfirst_tables(rows, row.setdefault("measured_at", geometry(rows)))
        if "table_kfirst" not in tables:
            raise ValueError("tune: no correct in-place kernel-clock results of the K-first run "
                             "to choose from")
        how = f"{KFIRST_HOW}; {note}"
    return staged(row, old, "kfirst", ("table_kfirst", "table_kfirst_dest"), tables, how, prov,
                  values)


def staged(row, old, name, keys, tables, how, prov, values):
    """``row`` with the tables of one tune stage (``keys``): ``tables`` ({key: table}, the
    stage's other keys dropped) and their provenance under ``provenance.<name>`` (``how``, the
    runs' date, versions, commit, results and ``values``); with no ``tables``, the ones ``old``
    (this GPU's row before) had, and its provenance."""
    if tables:
        for key in keys:
            row.pop(key, None)
        row.update(tables)
        row["provenance"][name] = {
            "how": how, "measured": prov["date"],
            "versions": {k: v for k, v in prov["versions"].items() if v},
            "commit": prov["commit"], "results": prov["results_file"], **values}
    elif old:
        row.update({k: old[k] for k in keys if old.get(k)})
        if name in old["provenance"]:
            row["provenance"][name] = old["provenance"][name]
    return row


# table key -> (provenance how, chooser over a run's rows, key of the values behind the choice)
MODE_TABLES = {"table_pool": (POOL_HOW, pool_winners, "values_us"),
               "table_verify": (VERIFY_HOW, verify_winners, "mean_multiple")}


def existing_row(path, gpu, geometry=None):
    """This GPU's decode ``defaults:`` item of the registry file at ``path`` (its general row,
    or its row at ``geometry``) as :func:`make_row` builds one (tables as (lo, hi, backend)), or
    None."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    for key in row_path(DECODE):
        data = data.get(key) or {} if isinstance(data, dict) else {}
    for d in data or []:
        if str(d.get("gpu")) == gpu and d.get("geometry") == geometry:
            return dict(gpu=gpu, provenance=dict(d["provenance"]),
                        **{k: dict(d[k]) for k in ("measured_at", "geometry") if d.get(k)},
                        **{k: {sd: [(r["batch"][0], r["batch"][1], r["backend"]) for r in rs]
                               for sd, rs in d[k].items()} for k in DECODE.tables if d.get(k)})
    return None


def with_mode_table(row, old, results, prov, key):
    """``row`` with its ``table_pool`` or ``table_verify`` (``key``): from the pool or verify
    rows among ``results`` (provenance under ``provenance.pool`` / ``.verify``), else the one
    ``old`` (this GPU's row before) had."""
    name = key.removeprefix("table_")
    how, choose, values_key = MODE_TABLES[key]
    table, values = choose(results)
    if table:
        at = geometry([r for r in results if r.get("bench") == name])
        if row.setdefault("measured_at", at) != at:
            raise ValueError(f"tune: the {name} results are at {at}, the row's tables at "
                             f"{row['measured_at']}")
    return staged(row, old, name, (key,), {key: table} if table else {}, how, prov,
                  {values_key: values})


def render_row(row, indent=2, op=DECODE):
    """YAML text of one ``defaults:`` list item of operation ``op``, in the style of
    registry.yaml."""
    pad = " " * indent
    prov = yaml.safe_dump(row["provenance"], sort_keys=False, default_flow_style=None, width=110)
    lines = [f"{pad}- gpu: {yaml.safe_dump(row['gpu'], default_style=None).splitlines()[0]}",
             f"{pad}  provenance:"]
    lines += [f"{pad}    {ln}" for ln in prov.rstrip("\n").splitlines()]
    lines += [f"{pad}  {key}: {{" + ", ".join(f"{k}: {v}" for k, v in row[key].items()) + "}"
              for key in ("measured_at", "geometry") if row.get(key)]
    for key in (k for k in op.tables if k in row):
        lines.append(f"{pad}  {key}:")
        for sd, ranges in row[key].items():
            lines.append(f"{pad}    {sd}:")
            for lo, hi, be in ranges:
                lines.append(f"{pad}      - {{batch: [{lo}, {'null' if hi is None else hi}], backend: {be}}}")
    return "\n".join(lines) + "\n"


_ITEM = re.compile(r"^(\s*)- gpu:\s*(.*?)\s*$")


def row_path(op) -> tuple:
    """Where registry.yaml keeps operation ``op``'s default-table rows."""
    return ("operations", op.name, "defaults")


def _key_block(lines, lo, hi, key, indent):
    """(line of ``key:`` at ``indent`` spaces within lines[lo:hi], line its block ends at), or
    None."""
    at = next((i for i in range(lo, hi) if re.match(rf"^ {{{indent}}}{re.escape(key)}\s*:",
                                                    lines[i])), None)
    if at is None:
        return None
    end = next((i for i in range(at + 1, hi) if lines[i].strip()
                and not lines[i].lstrip().startswith("#")
                and len(lines[i]) - len(lines[i].lstrip()) <= indent), hi)
    while end > at + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1                                       # comments above the next key stay there
    return at, end


def replace_row(text, row, op=DECODE):
    """registry.yaml text with this GPU's item of operation ``op``'s ``defaults:`` list
    replaced (or appended); the rest untouched."""
    path = row_path(op)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lo, hi = 0, len(lines)
    for depth, key in enumerate(path[:-1]):
        block = _key_block(lines, lo, hi, key, 2 * depth)
        if block is None:
            raise ValueError(f"registry: no {'.'.join(path[:depth + 1])} to hold the row")
        lo, hi = block[0] + 1, block[1]
    block = _key_block(lines, lo, hi, path[-1], 2 * (len(path) - 1))
    if block is None:
        return "".join(lines[:hi] + [f"{'  ' * (len(path) - 1)}{path[-1]}:\n",
                                     render_row(row, 2 * len(path), op)] + lines[hi:])
    d, end = block
    if re.match(r"^\s*defaults\s*:\s*\[\s*\]", lines[d]):
        lines[d] = f"{'  ' * (len(path) - 1)}{path[-1]}:\n"
    items = [i for i in range(d + 1, end) if _ITEM.match(lines[i])]
    indent = len(_ITEM.match(lines[items[0]]).group(1)) if items else 2 * len(path)
    new = render_row(row, indent, op).splitlines(keepends=True)
    for n, i in enumerate(items):
        stop = items[n + 1] if n + 1 < len(items) else end
        item = yaml.safe_load("".join(lines[i:stop]))[0]
        if str(item.get("gpu")) != row["gpu"] or item.get("geometry") != row.get("geometry"):
            continue
        while stop > i + 1 and (not lines[stop - 1].strip() or lines[stop - 1].lstrip().startswith("#")):
            stop -= 1
        return "".join(lines[:i] + new + lines[stop:])
    return "".join(lines[:end] + new + lines[end:])


def write_registry(path, row, op=DECODE):
    """Replace this GPU's row of operation ``op`` in the file at ``path``, after checking the
    result still validates."""
    path = Path(path)
    text = replace_row(path.read_text(), row, op)
    registry.parse_registry(yaml.safe_load(text), path)
    path.write_text(text)
    return text


def _emit(args, row, gpu, op=DECODE):
    if args.write:
        path = args.registry or str(registry.registry_path())
        write_registry(path, row, op)
        registry.reset_caches()
        print(f"\nwrote the {gpu} row of {path} ({op.name})")
    else:
        print(f"\n# this GPU's row for registry.yaml `operations.{op.name}.defaults:` (use "
              f"--write to write it)")
        print(render_row(row, 2, op), end="")
    return 0


def tune_prefill(args, gpu, rows, prov) -> int:
    """``tune --from`` on ``gdnzoo bench --mode prefill`` results: the prefill operation's row
    (:func:`make_prefill_row`); other modes' rows beside them are refused (tune them apart)."""
    other = sorted({r.get("bench") for r in rows if r.get("bench") != "prefill"})
    if other:
        raise SystemExit(f"tune --from: prefill results beside {other} results: tune the "
                         f"prefill row from prefill runs alone")
    if any(r["layout"] != "k-last" for r in rows):
        raise SystemExit("tune --from: a prefill run on a K-first state (--state-layout "
                         "k-first): the prefill table is measured on a k-last one")
    if args.geometry_row:
        raise SystemExit("tune --from: --geometry-row: the prefill table is read at tokens per "
                         "sequence whatever the heads, so it has no rows by geometry")
    try:
        row = make_prefill_row(gpu, rows, **prov)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    for key, form in zip(PREFILL.tables, ("in place", "state pool")):
        for sd, ranges in row.get(key, {}).items():
            print(f"{gpu} prefill {sd} {form}: "
                  + ", ".join(f"T/N {lo}..{hi or ''} {be}" for lo, hi, be in ranges))
    return _emit(args, row, gpu, PREFILL)


# options (their dests) that steer a measurement; a row built from results (--from) takes none
MEASURING = ("batch", "algo", "iters", "time_budget", "dest", "state_dtype", "mode", "tokens",
             "rows_from_tokens", "reps", "confirm_iters", "confirm_rounds", "margin")


def _given_measuring(args) -> list:
    """The MEASURING options ``args`` holds at other than their defaults, as --options."""
    p = add_tune_args(argparse.ArgumentParser(add_help=False))
    return ["--" + d.replace("_", "-") for d in MEASURING
            if getattr(args, d, p.get_default(d)) != p.get_default(d)]


def cmd_tune(args) -> int:
    if getattr(args, "from_files", None):
        if args.shapes:
            bench_args.usage_error("--from builds the default-table row from results; --shapes "
                                   "measures launch shapes: one or the other", "gdnzoo tune")
        ignored = _given_measuring(args)
        if ignored:
            bench_args.usage_error(f"{', '.join(ignored)}: only when tune measures; --from builds "
                                   f"the row from the results files as they are", "gdnzoo tune")
        path = args.registry or registry.registry_path()
        gpu, rows, prov = load_runs(args.from_files, Path(path).resolve().parent)
        if any(r.get("bench") == "prefill" for r in rows):
            return tune_prefill(args, gpu, rows, prov)
        geo = ({k: v for k, v in geometry(rows).items() if k in ("H", "HV")}
               if args.geometry_row else None)
        old = existing_row(path, gpu, geo)
        kfirst = [r for r in rows if r["layout"] == "k-first"]
        dense = [r for r in rows
                 if r.get("bench") in ("dense", "dest") and r["layout"] != "k-first"]
        row = make_row(gpu, dense, **prov, geometry_row=args.geometry_row) if dense else old
        if row is None:
            raise SystemExit(f"tune --from: pool, verify or K-first results only, and {path} has "
                             f"no row for {gpu}{'' if geo is None else f' at {geo}'} to add their "
                             f"tables to (tune the in-place table first)")
        if not dense and not kfirst and not any(MODE_TABLES[k][1](rows)[0] for k in MODE_TABLES):
            raise SystemExit("tune --from: no correct kernel-clock results of a registered pool "
                             "or verify backend to choose from")
        try:
            for key in MODE_TABLES:
                row = with_mode_table(row, old, rows, prov, key)
            row = with_kfirst_tables(row, old, kfirst, prov)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        for key, mode in zip(DECODE.tables, ("in place", "destination passing", "T >= 2 tokens",
                                          "state pool", "speculative verify", "K-first state",
                                          "K-first state, destination passing")):
            for sd, ranges in row.get(key, {}).items():
                print(f"{gpu} {sd} {mode}: "
                      + ", ".join(f"B {lo}..{hi or ''} {be}" for lo, hi, be in ranges))
        return _emit(args, row, gpu)
    if args.shapes:                  # launch shapes are measured without PDL, as bench times
        note = bench_args.drop_env_pdl("gdnzoo tune --shapes")
        if note:
            print(f"note: {note}")
        return shapes.cmd_shapes(args)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("gdnzoo tune: needs a CUDA device (the table is per GPU)")
    from gdnzoo.bench import pipeline
    argv = ["--mode", "dense,dest" if args.dest else "dense", "--timing", "kernel",
            "--state-dtype", "fp32,bf16", "--batch", ",".join(map(str, args.batch)),
            "--iters", str(args.iters), "--time-budget", str(args.time_budget or 0),
            "--device", "cuda", *["--algo", args.algo] * bool(args.algo), *["--quiet"] * args.quiet]
    plan = pipeline.make_plan(bench_args.add_bench_args(argparse.ArgumentParser()).parse_args(argv))
    raw, ref = pipeline.measure(plan)
    out = Path(args.out or Path(report.default_out_dir()) / "tune")
    rows, env = pipeline.results(plan, raw, ref, bench_args.check_out(out))
    res = (out / "results.json").resolve()
    with contextlib.suppress(ValueError):
        res = res.relative_to(Path(registry.registry_path()).resolve().parent)
    row = make_row(env["gpu"], rows, results_file=str(res), commit=env["commit"],
                   versions=env["versions"], date=env["date"][:10],
                   geometry_row=args.geometry_row)
    return _emit(args, row, env["gpu"])

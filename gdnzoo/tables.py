"""Per-GPU tables, with one GPU-name rule: which backend serves a call (the default table in
``registry.yaml``) and which launch shape a tunable backend uses (``backends/tables/*.yaml``).

**The GPU-name rule** (:func:`for_gpu`): a table keyed by GPU names or parts of one ("H100")
serves every GPU whose name contains the key, case-insensitively; the longest such key wins.

**Launch tables.** One YAML file per GPU, written by ``gdnzoo tune --shapes`` and validated at
load.  Each row is keyed by what it depends on and names where it came from::

    gpu: NVIDIA H100 80GB HBM3          # the GPU the rows were measured on
    match: H100                         # serves every GPU whose name contains this
    fallback: default                   # where a backend, state dtype, mode or T has no rows here
    measured_at: {H: 4, HV: 8, K: 128, V: 128}
    sources:                            # provenance, cited by the rows
      v4-inplace: {how: ..., date: ..., results: [...]}
    rows:
      - {backend: cuda-v4, state: fp32, mode: inplace, tokens: 1, batch: [1, 1],
         config: {warps: 2, row_groups: 2, lanes_per_row: 16, hint: 3}, source: v4-inplace}

* ``mode``: ``inplace`` or ``dest`` (destination passing), ``pool`` (a state pool read through
  slot indices, :mod:`gdnzoo.pool`), ``verify`` (a speculative verify, :mod:`gdnzoo.verify`,
  which stores T states per sequence), or ``any``.  A verify call takes a ``verify`` set from
  the first file of the GPU's chain that has one (a fallback GPU's verify rows before this
  GPU's decode rows: on the H200, its own multi-token rows read up to 2.5x the verify floor at
  B = 1, bench/results/h200/verify/), else what the same call without verify takes; a pool
  call takes a ``pool`` set where the file has one, else the set of its own in-place or
  destination mode.  Only verify calls take ``verify`` sets, only pool calls ``pool`` sets.
* ``tokens``: the least T the row serves; a row set serves T from there up to the next larger
  ``tokens`` of the same backend and state dtype (rows tuned at T=4 with ``tokens: 3`` serve
  T = 3 and more).  Among the sets that serve a call (a verify or pool set first, as above), the
  largest ``tokens`` wins, then a set of the call's own mode over ``any``, then a set with a
  ``geometry`` over one without.
* ``batch: [lo, hi]`` (``hi`` null: no limit) at the file's ``measured_at`` HV: a row serves a
  call with B*HV in ((lo - 1)*HV_m, hi*HV_m], so that another geometry gets the rows of the
  same number of (sequence, head) pairs.  The ranges of a set start at 1 and leave no gap.
* ``geometry`` (optional, a subset of H, HV, K, V): the row set serves only that geometry.
* ``config``: the backend's launch fields by name (its ``CONFIG`` :class:`ConfigFields`);
  fields at their default may be left out.

A lookup walks the GPU's file, then its ``fallback`` chain; a GPU that no file matches starts
at ``default.yaml``.  The backends fit a row to the call's K and V themselves.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# Package data this module reads, relative to the gdnzoo package (what `gdnzoo pack` vendors).
PACKAGE_DATA = ("backends/tables/*.yaml",)
STATES = ("fp32", "bf16")
MODES = ("inplace", "dest", "pool", "any", "verify")
GEOMETRY_KEYS = ("H", "HV", "K", "V")
DEFAULT_FILE = "default"
REQUIRED = object()          # a ConfigFields default: the field must be given


class TableError(ValueError):
    """A table file is malformed, or has no row for a lookup; the message says where."""


# ---------------------------------------------------------------------------- the name rule

def for_gpu(table: dict, gpu_name: str | None, default=None):
    """The value of ``table`` whose key is contained in ``gpu_name``, case-insensitively, the
    longest such key winning; ``default`` where no key is (an empty name matches nothing)."""
    low, best = (gpu_name or "").lower(), None
    for name in table:
        if name and name.lower() in low and (best is None or len(name) > len(best)):
            best = name
    return default if best is None else table[best]


def gpu_slug(name: str) -> str:
    """A file-name form of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    s = re.sub(r"^nvidia\s+", "", (name or "").strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "unknown"


# ---------------------------------------------------------------------------- the default table

@dataclass(frozen=True)
class DefaultRow:
    """One GPU's row of an operation's default table: by table key (the operation's
    ``tables``: ``table`` measured in place, decode's ``table_dest``, ``table_tokens``,
    ``table_pool``, ``table_verify`` ...) -> state dtype name -> [(lo, hi|None, backend)], the
    ranges in the problem's ``batch`` (decode: B).

    ``measured_at`` (optional, a subset of H, HV, K, V with HV): the geometry its tables were
    measured at.  A call with other value heads then reads them at as many (sequence, head)
    pairs, as the launch tables do: a range [lo, hi] serves B*HV in ((lo - 1)*HV_m, hi*HV_m]
    (:func:`table_choice`).  ``geometry`` (optional, a subset of H, HV, K, V): the row serves
    only calls of that geometry, before the GPU's general row (:func:`lookup`)."""
    gpu: str
    provenance: dict
    tables: dict
    measured_at: dict | None = None
    geometry: dict | None = None

    def serves(self, problem) -> bool:
        """The row may serve ``problem``: it has no geometry, or the call has it."""
        return self.geometry is None or all(getattr(problem, k, None) == v
                                            for k, v in self.geometry.items())

    def label(self) -> str:
        g = self.geometry
        return self.gpu + ("" if g is None else " at " + " ".join(f"{k}={v}" for k, v in g.items()))

    def __getattr__(self, name):           # row.table_pool: the table of that key ({}: none)
        if name.startswith("table"):
            return self.__dict__["tables"].get(name, {})
        raise AttributeError(name)


def _batch_range(r, where, error):
    try:
        lo, hi = r
    except (TypeError, ValueError):
        raise error(f"{where}: batch must be [lo, hi], got {r!r}") from None
    if not isinstance(lo, int) or lo < 1 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
        raise error(f"{where}: bad batch range {[lo, hi]}")
    return lo, hi


def _parse_choices(data, where, backends, error) -> dict:
    table = {}
    if data is not None and not isinstance(data, dict):
        raise error(f"{where}: expected a mapping of state dtype to batch ranges")
    for sd, ranges in (data or {}).items():
        if sd not in STATES:
            raise error(f"{where}: state dtype {sd!r} not in {list(STATES)}")
        parsed = []
        for r in ranges or ():
            if not isinstance(r, dict) or not {"batch", "backend"} <= set(r):
                raise error(f"{where} {sd}: each range needs batch: [lo, hi] and backend, got {r!r}")
            if r["backend"] not in backends:
                raise error(f"{where} {sd}: unknown backend {r['backend']!r}")
            parsed.append((*_batch_range(r["batch"], f"{where} {sd}", error), r["backend"]))
        table[sd] = parsed
    return table


def parse_default_rows(rows, backends, error=TableError, op=None,
                       where="registry.yaml") -> list[DefaultRow]:
    """An operation's ``defaults:`` list (``op``: its :class:`gdnzoo.operation.Operation`,
    default decode), validated against its registered ``backends``."""
    from gdnzoo.operation import DECODE
    keys = (op or DECODE).tables
    out = []
    for i, row in enumerate(rows or []):
        w = f"{where} defaults[{i}] ({row.get('gpu', '?') if isinstance(row, dict) else '?'})"
        if not isinstance(row, dict) or not {"gpu", "provenance", "table"} <= set(row):
            raise error(f"{w}: expected gpu, provenance and table")
        extra = set(row) - {"gpu", "provenance", "measured_at", "geometry", *keys}
        if extra:
            raise error(f"{w}: unknown keys {sorted(extra)} (tables: {', '.join(keys)})")
        if not isinstance(row["provenance"], dict) or "how" not in row["provenance"]:
            raise error(f"{w}: provenance must be a mapping with at least 'how'")
        m, g = row.get("measured_at"), row.get("geometry")
        if m is not None and not (_geometry(m) and "HV" in m):
            raise error(f"{w}: measured_at must give HV (and any of H, K, V) as positive ints, "
                        f"got {m!r}")
        if g is not None and not _geometry(g):
            raise error(f"{w}: geometry must give some of H, HV, K, V as positive ints, got {g!r}")
        if any(r.gpu == str(row["gpu"]) and r.geometry == g for r in out):
            raise error(f"{w}: a second row for {row['gpu']} at geometry {g}")
        tabs = {k: _parse_choices(row.get(k), f"{w} {k}", backends, error) for k in keys
                if k in row}
        out.append(DefaultRow(gpu=str(row["gpu"]), provenance=row["provenance"], tables=tabs,
                              measured_at=m, geometry=g))
    return out


def _geometry(d) -> bool:
    return (isinstance(d, dict) and bool(d) and set(d) <= set(GEOMETRY_KEYS)
            and all(type(v) is int and v > 0 for v in d.values()))


def default_rows(rows, gpu_name: str | None) -> list[DefaultRow]:
    """This GPU's rows of the default table (the name rule), its rows by geometry first."""
    by = {}
    for row in rows:
        by.setdefault(row.gpu, []).append(row)
    return sorted(for_gpu(by, gpu_name, []), key=lambda r: r.geometry is None)


def default_row(rows, gpu_name: str | None) -> DefaultRow | None:
    """This GPU's general row of the default table (no geometry), or None."""
    return next((r for r in default_rows(rows, gpu_name) if r.geometry is None), None)


def lookup(rows, problem):
    """(row, key, how it reads) of the table that serves ``problem`` among one GPU's ``rows``
    (:func:`default_rows`), or None: the first of the problem's ``default_tables()``, then
    ``table``, that a row serving its geometry has for its state dtype; at each key a row by
    geometry before the general row (a pool call at a geometry whose row has no pool table
    takes the general row's, read by pairs)."""
    mine = [r for r in rows if r.serves(problem)]
    for key, how in (*problem.default_tables(), ("table", "")):
        for r in mine:
            if problem.state_name in r.tables.get(key, {}):
                return r, key, how
    return None


def table_kind(row: DefaultRow, problem) -> tuple[str, str]:
    """(key, how it reads) of the row's table that serves ``problem``: the first of its
    ``default_tables()`` (decode: a dense T = 1 call on a K-first state, with destination
    passing first, then verify, then pool, then T >= 2 tokens, then destination passing) that
    the row has for its state dtype; else ``table``."""
    for key, how in problem.default_tables():
        if problem.state_name in row.tables.get(key, {}):
            return key, how
    return "table", ""


def read_point(row: DefaultRow, problem) -> tuple[int, int]:
    """(n, m): the call reads the row's ranges at n / m.  (problem.batch, 1) unless the row
    gives the value heads it was measured at and the problem scales by heads
    (``problem.table_heads``, decode: HV): then (batch * HV, HV_m), as many (sequence, head)
    pairs as B sequences of the measured geometry."""
    hv = problem.table_heads
    if row.measured_at is None or hv is None:
        return problem.batch, 1
    return problem.batch * hv, row.measured_at["HV"]


def table_choice(row: DefaultRow, problem, key: str | None = None):
    """The row's backend at ``problem``'s :func:`read_point` from its table ``key`` (default:
    the one :func:`table_kind` names), or None: the range [lo, hi] with (lo - 1)*m < n <= hi*m."""
    n, m = read_point(row, problem)
    key = key or table_kind(row, problem)[0]
    for lo, hi, be in row.tables.get(key, {}).get(problem.state_name, []):
        if (lo - 1) * m < n and (hi is None or n <= hi * m):
            return be
    return None


# ---------------------------------------------------------------------------- launch configs

class ConfigFields:
    """The named launch fields of a tunable backend, in order, with defaults (``REQUIRED``: no
    default).  Rows and explicit configs are normalized to a tuple in this order."""

    def __init__(self, **fields):
        self.names = tuple(fields)
        self.defaults = fields

    def normalize(self, config, where="config") -> tuple:
        """A dict (by name) or a sequence (in field order, trailing fields defaulted) -> tuple."""
        if isinstance(config, dict):
            extra = [k for k in config if k not in self.defaults]
            if extra:
                raise TableError(f"{where}: unknown fields {extra}; fields: {list(self.names)}")
            values = [config.get(n, self.defaults[n]) for n in self.names]
        else:
            config = tuple(config)
            if len(config) > len(self.names):
                raise TableError(f"{where}: {len(config)} values for {len(self.names)} fields "
                                 f"{list(self.names)}")
            values = [*config, *(self.defaults[n] for n in self.names[len(config):])]
        missing = [n for n, v in zip(self.names, values) if v is REQUIRED]
        if missing:
            raise TableError(f"{where}: missing fields {missing}")
        return tuple(values)

    def as_dict(self, config) -> dict:
        """By name, fields at their default left out (how the tables write a row)."""
        values = self.normalize(config)
        return {n: v for n, v in zip(self.names, values) if v != self.defaults[n]
                or self.defaults[n] is REQUIRED}


@dataclass(frozen=True)
class LaunchRow:
    backend: str
    state: str
    mode: str
    tokens: int
    lo: int
    hi: int | None
    config: dict          # as written; LaunchTables.row() normalizes with the backend's fields
    source: str
    geometry: tuple = ()  # ((key, value), ...) the set serves only this geometry
    hv: int = 8           # the HV its batch range is measured at

    def key(self):
        return (self.backend, self.state, self.mode, self.tokens, self.geometry)

    def heads_range(self):
        """The B*HV range this row serves: ((lo - 1) * hv, hi * hv]."""
        return (self.lo - 1) * self.hv, (None if self.hi is None else self.hi * self.hv)


@dataclass
class LaunchFile:
    slug: str
    path: Path
    gpu: str
    match: str | None
    fallback: str | None
    measured_at: dict
    sources: dict
    rows: list

    def row_sets(self, backend, state):
        """{key: [rows by batch]} of one backend and state dtype."""
        sets = {}
        for r in self.rows:
            if r.backend == backend and r.state == state:
                sets.setdefault(r.key(), []).append(r)
        return sets


def tables_dir() -> Path:
    """backends/tables of this install (the checkout's ``backends/`` in an editable one)."""
    spec = importlib.util.find_spec(f"{__package__}.backends")
    if spec is None or not spec.submodule_search_locations:
        raise TableError(f"cannot locate the {__package__}.backends package")
    return Path(list(spec.submodule_search_locations)[0]) / "tables"


_TOP = {"gpu": str, "match": (str, type(None)), "fallback": (str, type(None)),
        "measured_at": dict, "sources": dict, "rows": list}
_ROW = ("backend", "state", "mode", "tokens", "batch", "config", "source")


def parse_launch_file(data, path) -> LaunchFile:
    """Validate one file's structure (not the config fields: see LaunchTables.row)."""
    path = Path(path)
    where = path.name
    if not isinstance(data, dict):
        raise TableError(f"{where}: expected a mapping")
    missing = [k for k in _TOP if k not in data]
    extra = [k for k in data if k not in _TOP]
    if missing or extra:
        raise TableError(f"{where}: missing keys {missing}, unknown keys {extra}")
    for k, typ in _TOP.items():
        if not isinstance(data[k], typ):
            raise TableError(f"{where}: {k} has type {type(data[k]).__name__}")
    m = data["measured_at"]
    if sorted(m) != sorted(GEOMETRY_KEYS) or not all(isinstance(v, int) and v > 0 for v in m.values()):
        raise TableError(f"{where}: measured_at must give H, HV, K, V as positive ints, got {m}")
    for sid, src in data["sources"].items():
        if not isinstance(src, dict) or not isinstance(src.get("how"), str):
            raise TableError(f"{where}: source {sid!r} needs at least a 'how' text")
    rows = []
    for i, r in enumerate(data["rows"]):
        w = f"{where} rows[{i}]"
        if not isinstance(r, dict):
            raise TableError(f"{w}: expected a mapping")
        missing = [k for k in _ROW if k not in r]
        extra = [k for k in r if k not in _ROW and k != "geometry"]
        if missing or extra:
            raise TableError(f"{w}: missing keys {missing}, unknown keys {extra}")
        w = f"{w} ({r['backend']} {r['state']} {r['mode']} tokens {r['tokens']})"
        if r["state"] not in STATES or r["mode"] not in MODES:
            raise TableError(f"{w}: state must be one of {list(STATES)}, mode one of {list(MODES)}")
        if not isinstance(r["tokens"], int) or r["tokens"] < 1:
            raise TableError(f"{w}: tokens must be an int >= 1")
        if r["source"] not in data["sources"]:
            raise TableError(f"{w}: source {r['source']!r} is not in sources")
        if not isinstance(r["config"], dict) or not r["config"]:
            raise TableError(f"{w}: config must be a mapping of launch fields")
        geom = r.get("geometry") or {}
        if not isinstance(geom, dict) or set(geom) - set(GEOMETRY_KEYS):
            raise TableError(f"{w}: geometry must be a mapping with keys among {list(GEOMETRY_KEYS)}")
        lo, hi = _batch_range(r["batch"], w, TableError)
        rows.append(LaunchRow(r["backend"], r["state"], r["mode"], r["tokens"], lo, hi,
                              dict(r["config"]), r["source"], tuple(sorted(geom.items())),
                              int(geom.get("HV", m["HV"]))))
    f = LaunchFile(path.stem, path, data["gpu"], data["match"], data["fallback"], m,
                   data["sources"], rows)
    for key, rs in _sets(rows).items():
        want = 1
        for r in rs:
            if r.lo != want:
                raise TableError(f"{where}: {' '.join(map(str, key[:4]))}: batch ranges must start "
                                 f"at 1 and leave no gap, got [{r.lo}, {r.hi}] after "
                                 f"{want - 1 if want > 1 else 'nothing'}")
            want = math.inf if r.hi is None else r.hi + 1
        if rs[-1].hi is not None:
            raise TableError(f"{where}: {' '.join(map(str, key[:4]))}: the last batch range must be "
                             f"open (hi: null)")
    return f


def _sets(rows):
    sets = {}
    for r in rows:
        sets.setdefault(r.key(), []).append(r)
    for rs in sets.values():
        rs.sort(key=lambda r: r.lo)
    return sets


class LaunchTables:
    """Every launch-table file of a directory, with the lookup of :meth:`row`."""

    def __init__(self, files: dict):
        self.files = files
        if DEFAULT_FILE not in files:
            raise TableError(f"no {DEFAULT_FILE}.yaml among the launch tables")
        for f in files.values():
            if f.fallback is not None and f.fallback not in files:
                raise TableError(f"{f.path.name}: fallback {f.fallback!r} is not a table file")
            seen, g = set(), f
            while g is not None:
                if g.slug in seen:
                    raise TableError(f"{f.path.name}: the fallback chain loops at {g.slug}")
                seen.add(g.slug)
                g = files.get(g.fallback)
        self._validated = set()

    @classmethod
    def load(cls, directory=None) -> "LaunchTables":
        d = Path(directory) if directory else tables_dir()
        files = {}
        for p in sorted(d.glob("*.yaml")):
            try:
                data = yaml.safe_load(p.read_text())
            except yaml.YAMLError as e:
                raise TableError(f"{p}: not valid YAML: {e}") from None
            files[p.stem] = parse_launch_file(data, p)
        return cls(files)

    def file_for(self, gpu_name: str | None) -> LaunchFile:
        """The file whose ``match`` the GPU's name contains (the name rule), else default."""
        return for_gpu({f.match: f for f in self.files.values() if f.match}, gpu_name,
                       self.files[DEFAULT_FILE])

    def chain(self, gpu_name: str | None):
        f = self.file_for(gpu_name)
        while f is not None:
            yield f
            f = self.files.get(f.fallback)

    def check_configs(self, backend: str, fields: ConfigFields):
        """Normalize every row of ``backend`` with its fields once (errors name the row)."""
        if backend in self._validated:
            return
        for f in self.files.values():
            for i, r in enumerate(f.rows):
                if r.backend == backend:
                    fields.normalize(r.config, f"{f.path.name} rows[{i}] ({backend} config)")
        self._validated.add(backend)

    def serving(self, backend, gpu_name, state, inplace, T, geometry, pool=False, verify=False):
        """(file, rows by batch) of the row set that serves these calls on this GPU: for a
        verify call the first file of its chain with a ``verify`` set for it, else (and for
        every other call) the first file with any set for it; there a ``verify`` set for a
        verify call, then a ``pool`` set for a pool call, then the set with the largest
        ``tokens``, then of the call's own mode over ``any``, then with a geometry over
        without."""
        mode = "inplace" if inplace else "dest"
        modes = (mode, "any") + ("pool",) * bool(pool) + ("verify",) * bool(verify)
        first = None
        for f in self.chain(gpu_name):
            best = None
            for key, rs in f.row_sets(backend, state).items():
                _, _, m, tokens, geom = key
                if tokens > T or m not in modes or any(geometry[k] != v for k, v in geom):
                    continue
                rank = (m == "verify", m == "pool", tokens, m != "any", bool(geom))
                if best is None or rank > best[0]:
                    best = (rank, sorted(rs, key=lambda r: r.lo))
            if best is None:
                continue
            if not verify or best[0][0]:          # a verify call looks on for a verify set
                return f, best[1]
            first = first or (f, best[1])
        if first is not None:
            return first
        call = ", ".join([mode] + ["pool"] * bool(pool) + ["verify"] * bool(verify))
        raise TableError(f"no launch rows for {backend} ({state}, {call}, T={T}) for GPU "
                         f"{gpu_name!r} in any table file or its fallbacks")

    def row(self, backend, fields, gpu_name, state, inplace, T, B, geometry, pool=False,
            verify=False) -> tuple:
        """The launch config (normalized tuple) and the row serving this call.

        ``geometry``: dict(H=, HV=, K=, V=) of the call; B*HV picks the batch range.
        """
        self.check_configs(backend, fields)
        f, rows = self.serving(backend, gpu_name, state, inplace, T, geometry, pool, verify)
        heads = B * geometry["HV"]
        for r in rows:
            lo, hi = r.heads_range()
            if heads > lo and (hi is None or heads <= hi):
                return fields.normalize(r.config), r
        raise TableError(f"{f.path.name}: {backend} {state} has no row for B*HV={heads}")

    def every_gpu(self):
        """A GPU name each file serves (its match; None for default)."""
        return [f.match for f in self.files.values()]


@functools.lru_cache(maxsize=None)
def launch_tables() -> LaunchTables:
    """The installed launch tables (cached; ``reset()`` forgets them)."""
    return LaunchTables.load()


def reset():
    launch_tables.cache_clear()


def launch_config(backend, fields, gpu_name, state, inplace, T, B, H, HV, K, V,
                  pool=False, verify=False) -> tuple:
    """The normalized launch config of ``backend`` for this call on this GPU (``pool``: a state
    pool call, ``verify``: a speculative verify)."""
    return launch_tables().row(backend, fields, gpu_name, state, inplace, T, B,
                               dict(H=H, HV=HV, K=K, V=V), pool, verify)[0]


# ---------------------------------------------------------------------------- writing

HEADER = """\
# Launch rows of the tunable backends on one GPU: written by `gdnzoo tune --shapes`, validated
# at load by gdnzoo/tables.py, whose docstring gives the schema.  Edit by re-running the tuner.
"""


def render_launch_file(f: LaunchFile, field_order=None) -> str:
    """The YAML text of a launch-table file: header, keys, sources, then one row per line
    ordered by backend, state, mode, tokens and batch.  ``field_order``: backend -> names."""
    def flow(x):
        text = yaml.safe_dump(x, default_flow_style=True, width=10**6, sort_keys=False)
        return text.replace("\n...\n", "").strip()           # a scalar's document end

    lines = [HEADER.rstrip("\n"), f"gpu: {flow(f.gpu)}", f"match: {flow(f.match)}",
             f"fallback: {flow(f.fallback)}", f"measured_at: {flow(f.measured_at)}", "sources:"]
    for sid, src in f.sources.items():
        lines.append(f"  {sid}:")
        body = yaml.safe_dump(src, sort_keys=False, default_flow_style=False, width=100)
        lines += [f"    {ln}" for ln in body.rstrip("\n").splitlines()]
    lines.append("rows:")
    mode_order = {m: i for i, m in enumerate(MODES)}
    for r in sorted(f.rows, key=lambda r: (r.backend, STATES.index(r.state), r.tokens,
                                           mode_order[r.mode], r.geometry, r.lo)):
        order = (field_order or {}).get(r.backend)
        cfg = {n: r.config[n] for n in order if n in r.config} if order else r.config
        row = dict(backend=r.backend, state=r.state, mode=r.mode, tokens=r.tokens)
        if r.geometry:
            row["geometry"] = dict(r.geometry)
        row.update(batch=[r.lo, r.hi], config=cfg, source=r.source)
        lines.append(f"  - {flow(row)}")
    return "\n".join(lines) + "\n"


def replace_rows(f: LaunchFile, new_rows, sources: dict) -> LaunchFile:
    """``f`` with every row set that ``new_rows`` has replaced by those rows (other sets kept)
    and ``sources`` added."""
    keys = {r.key() for r in new_rows}
    rows = [r for r in f.rows if r.key() not in keys] + list(new_rows)
    used = {r.source for r in rows}
    srcs = {k: v for k, v in {**f.sources, **sources}.items() if k in used}
    return LaunchFile(f.slug, f.path, f.gpu, f.match, f.fallback, f.measured_at, srcs, rows)


def merge_measured(existing, chosen: dict) -> list:
    """The batch ranges of a row set after a tune: ``existing`` [(lo, hi, value)] (the set's
    rows, or [] for a new set), ``chosen`` {measured B: value}.

    A measured B decides the range from just above the previous boundary (a measured B or an
    existing row's end) up to B; the range past the largest boundary goes to the largest
    measured B when that B lies past every existing row's end, else stays as it was; every other
    range keeps its value.  Adjacent ranges of one value merge.  Returns [(lo, hi, value)]
    starting at 1 with the last ``hi`` None.
    """
    finite = {hi for _, hi, _ in existing if hi is not None}
    ends = sorted(finite | set(chosen))

    def old(B):
        return next((v for lo, hi, v in existing if lo <= B and (hi is None or B <= hi)), None)

    pieces, lo = [], 1
    for b in ends:
        pieces.append((lo, b, chosen[b] if b in chosen else old(b)))
        lo = b + 1
    top = max(chosen, default=None)
    past = chosen[top] if top is not None and top > max(finite, default=0) else old(lo)
    pieces.append((lo, None, past))
    out = []
    for lo, hi, v in pieces:
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], hi, v)
        else:
            out.append((lo, hi, v))
    return out

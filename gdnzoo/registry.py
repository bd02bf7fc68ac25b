"""The backend registry: loads and validates ``registry.yaml``, answers availability, applies the
selection precedence (``algo=`` > ``ALGO`` env > per-GPU default table > fallback order).

Nothing here imports an optional package or touches the GPU at import time; backend modules
are imported the first time someone asks whether they are available.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gdnzoo.contract import Problem

_BACKEND_KEYS = {"name": str, "entry": str, "language": str, "requires": list, "devices": list,
                 "min_cc": (str, type(None)), "state_dtypes": list, "max_T": (int, type(None)),
                 "head_dims": (list, type(None)), "notes": str}
_LANGUAGES = {"python", "triton", "cuda", "cute-dsl"}
_DEVICES = {"cpu", "cuda"}
_STATE = {"fp32", "bf16"}


class RegistryError(ValueError):
    """registry.yaml is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class BackendSpec:
    name: str
    entry: str
    language: str
    requires: tuple
    devices: tuple
    min_cc: tuple | None
    state_dtypes: tuple
    max_T: int | None
    head_dims: tuple | None
    notes: str

    @property
    def module_name(self) -> str:
        return self.entry.split(":")[0]

    @property
    def func_name(self) -> str:
        return self.entry.split(":")[1]


# A GPU row's tables, by key in registry.yaml: measured in place at T=1, with destination
# passing, with several tokens per call (the last two optional).
TABLE_KEYS = ("table", "table_dest", "table_tokens")


@dataclass(frozen=True)
class DefaultRow:
    gpu: str
    provenance: dict
    table: dict          # state dtype name -> list of (lo, hi|None, backend)
    table_dest: dict = field(default_factory=dict)   # the same, destination passing; optional
    table_tokens: dict = field(default_factory=dict)  # the same, T >= 2 tokens per call; optional


@dataclass
class Registry:
    backends: dict                       # name -> BackendSpec, in file order
    defaults: list                       # DefaultRow
    fallback: dict                       # device -> [names]
    path: Path = field(default=None)

    @property
    def names(self):
        return list(self.backends)


@dataclass(frozen=True)
class BackendInfo:
    """One row of :func:`list_backends`."""
    name: str
    available: bool
    reason: str
    language: str
    devices: tuple
    min_cc: str | None
    state_dtypes: tuple
    max_T: int | None
    head_dims: tuple | None
    notes: str


@dataclass(frozen=True)
class Selection:
    """Which backend serves a call, and why."""
    name: str
    source: str        # "algo" | "ALGO env" | "default table <gpu>" | "fallback"
    reason: str


def registry_path() -> Path:
    """registry.yaml: beside the installed package, else at the source checkout's root."""
    here = Path(__file__).resolve().parent
    for cand in (here / "registry.yaml", here.parent / "registry.yaml"):
        if cand.is_file():
            return cand
    raise RegistryError(f"registry.yaml not found beside {here} nor in {here.parent}")


def _parse_cc(s, where):
    if s is None:
        return None
    try:
        major, minor = str(s).split(".")
        return (int(major), int(minor))
    except ValueError:
        raise RegistryError(f"{where}: min_cc must look like '9.0', got {s!r}") from None


def _parse_table(data, where, backends) -> dict:
    """A default table (``table:``, ``table_dest:`` or ``table_tokens:``): state dtype ->
    [(lo, hi|None, backend)]."""
    table = {}
    if data is not None and not isinstance(data, dict):
        raise RegistryError(f"{where}: expected a mapping of state dtype to batch ranges")
    for sd, ranges in (data or {}).items():
        if sd not in _STATE:
            raise RegistryError(f"{where}: state dtype {sd!r} not in {sorted(_STATE)}")
        parsed = []
        for r in ranges or ():
            try:
                lo, hi = r["batch"]
                be = r["backend"]
            except (KeyError, TypeError, ValueError):
                raise RegistryError(f"{where} {sd}: each range needs batch: [lo, hi] and "
                                    f"backend, got {r!r}") from None
            if be not in backends:
                raise RegistryError(f"{where} {sd}: unknown backend {be!r}")
            if not isinstance(lo, int) or lo < 1 or (hi is not None and (not isinstance(hi, int) or hi < lo)):
                raise RegistryError(f"{where} {sd}: bad batch range {[lo, hi]}")
            parsed.append((lo, hi, be))
        table[sd] = parsed
    return table


def parse_registry(data, path=None) -> Registry:
    """Validate the parsed YAML; raise RegistryError naming the entry and field at fault."""
    if not isinstance(data, dict) or "backends" not in data:
        raise RegistryError(f"{path}: expected a mapping with a 'backends' list")
    backends = {}
    for i, ent in enumerate(data["backends"] or []):
        where = f"registry.yaml backends[{i}]"
        if not isinstance(ent, dict):
            raise RegistryError(f"{where}: expected a mapping, got {type(ent).__name__}")
        where = f"registry.yaml backend {ent.get('name', f'#{i}')!r}"
        missing = [k for k in _BACKEND_KEYS if k not in ent]
        extra = [k for k in ent if k not in _BACKEND_KEYS]
        if missing or extra:
            raise RegistryError(f"{where}: missing fields {missing}, unknown fields {extra}")
        for k, typ in _BACKEND_KEYS.items():
            if not isinstance(ent[k], typ):
                raise RegistryError(f"{where}: field {k!r} has type {type(ent[k]).__name__}")
        if ent["name"] in backends:
            raise RegistryError(f"{where}: duplicate name")
        if ent["entry"].count(":") != 1:
            raise RegistryError(f"{where}: entry must be 'module:function', got {ent['entry']!r}")
        if ent["language"] not in _LANGUAGES:
            raise RegistryError(f"{where}: language {ent['language']!r} not in {sorted(_LANGUAGES)}")
        if not ent["devices"] or set(ent["devices"]) - _DEVICES:
            raise RegistryError(f"{where}: devices {ent['devices']} must be a non-empty subset of "
                                f"{sorted(_DEVICES)}")
        if not ent["state_dtypes"] or set(ent["state_dtypes"]) - _STATE:
            raise RegistryError(f"{where}: state_dtypes {ent['state_dtypes']} must be a non-empty "
                                f"subset of {sorted(_STATE)}")
        if ent["max_T"] is not None and ent["max_T"] < 1:
            raise RegistryError(f"{where}: max_T must be >= 1 or null")
        backends[ent["name"]] = BackendSpec(
            name=ent["name"], entry=ent["entry"], language=ent["language"],
            requires=tuple(ent["requires"]), devices=tuple(ent["devices"]),
            min_cc=_parse_cc(ent["min_cc"], where), state_dtypes=tuple(ent["state_dtypes"]),
            max_T=ent["max_T"], head_dims=None if ent["head_dims"] is None else tuple(ent["head_dims"]),
            notes=ent["notes"])
    defaults = []
    for i, row in enumerate(data.get("defaults") or []):
        where = f"registry.yaml defaults[{i}] ({row.get('gpu', '?') if isinstance(row, dict) else '?'})"
        if not isinstance(row, dict) or not {"gpu", "provenance", "table"} <= set(row):
            raise RegistryError(f"{where}: expected gpu, provenance and table")
        if not isinstance(row["provenance"], dict) or "how" not in row["provenance"]:
            raise RegistryError(f"{where}: provenance must be a mapping with at least 'how'")
        tables = {key: _parse_table(row.get(key), f"{where} {key}", backends)
                  for key in TABLE_KEYS}
        defaults.append(DefaultRow(gpu=str(row["gpu"]), provenance=row["provenance"], **tables))
    fallback = data.get("fallback") or {}
    for dev, names in fallback.items():
        for n in names:
            if n not in backends:
                raise RegistryError(f"registry.yaml fallback[{dev}]: unknown backend {n!r}")
    return Registry(backends=backends, defaults=defaults, fallback=fallback, path=path)


def reset_caches():
    """Forget the loaded registry and every cached availability answer (tests, `tune`)."""
    for f in (load_registry, availability, runner, _cuda_info):
        getattr(f, "cache_clear", lambda: None)()
    import gdnzoo
    gdnzoo._FAST.clear()


@functools.lru_cache(maxsize=None)
def load_registry(path: str | None = None) -> Registry:
    p = Path(path) if path else registry_path()
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise RegistryError(f"{p}: not valid YAML: {e}") from None
    return parse_registry(data, p)


# ---------------------------------------------------------------- availability

@functools.lru_cache(maxsize=None)
def _cuda_info():
    import torch
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(), torch.cuda.get_device_capability()


def default_device() -> str:
    return "cuda" if _cuda_info() else "cpu"


def backend_module(name: str):
    """The imported backend module (imports its optional packages only when its code needs them)."""
    spec = _spec(name)
    return importlib.import_module(spec.module_name)


def _spec(name: str) -> BackendSpec:
    reg = load_registry()
    if name not in reg.backends:
        raise ValueError(f"algo: unknown backend {name!r}; valid names: {', '.join(reg.names)}")
    return reg.backends[name]


@functools.lru_cache(maxsize=None)
def availability(name: str, device: str | None = None) -> tuple[bool, str]:
    """(available, reason) of a backend on this machine for ``device`` (default: cuda if present)."""
    spec = _spec(name)
    device = device or default_device()
    if device not in spec.devices:
        why = "no CUDA device on this machine" if device == "cpu" else f"does not run on {device}"
        return False, f"{why} (runs on: {', '.join(spec.devices)})"
    if device == "cuda":
        info = _cuda_info()
        if info is None:
            return False, "no CUDA device on this machine"
        if spec.min_cc and info[1] < spec.min_cc:
            return False, (f"needs compute capability >= {spec.min_cc[0]}.{spec.min_cc[1]}, "
                           f"this GPU ({info[0]}) is {info[1][0]}.{info[1][1]}")
    missing = [r for r in spec.requires if importlib.util.find_spec(r) is None]
    if missing:
        return False, f"optional package(s) not installed: {', '.join(missing)}"
    try:
        mod = backend_module(name)
        ok, reason = mod.available()
    except Exception as e:  # a broken optional install must not break `gdnzoo list`
        return False, f"failed to load {spec.module_name}: {type(e).__name__}: {e}"
    return bool(ok), reason


def can_serve(name: str, p: Problem) -> tuple[bool, str]:
    """Whether backend ``name`` can compute this problem, with the reason when not."""
    ok, why = availability(name, p.device)
    if not ok:
        return False, why
    spec = _spec(name)
    if p.cc is not None and spec.min_cc and p.cc < spec.min_cc:
        return False, f"needs compute capability >= {spec.min_cc}, device has {p.cc}"
    if p.state_name not in spec.state_dtypes:
        return False, f"state dtype {p.state_name} not supported (supports {', '.join(spec.state_dtypes)})"
    if spec.max_T is not None and p.T > spec.max_T:
        return False, f"T={p.T} tokens per call exceeds its maximum {spec.max_T}"
    if spec.head_dims is not None and (p.K not in spec.head_dims or p.V not in spec.head_dims):
        return False, f"head dims K={p.K}, V={p.V} not in supported {list(spec.head_dims)}"
    ok, why = backend_module(name).supports(p)
    return bool(ok), why


def list_backends(device: str | None = None) -> list[BackendInfo]:
    reg = load_registry()
    out = []
    for s in reg.backends.values():
        ok, why = availability(s.name, device)
        out.append(BackendInfo(name=s.name, available=ok, reason=why, language=s.language,
                               devices=s.devices,
                               min_cc=None if s.min_cc is None else f"{s.min_cc[0]}.{s.min_cc[1]}",
                               state_dtypes=s.state_dtypes, max_T=s.max_T,
                               head_dims=s.head_dims, notes=s.notes))
    return out


@functools.lru_cache(maxsize=None)
def runner(name: str):
    """The raw backend launcher ``run(q,k,v,state,A_log,a,dt_bias,b,scale,out,new_state,l2)``.

    It skips validation: use it only on inputs that :func:`gdnzoo.contract.validate` accepted.
    """
    spec = _spec(name)
    return getattr(backend_module(name), spec.func_name)


def launcher(name: str, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
             use_qk_l2norm):
    """The backend's ``bind(...)`` result when it has one (a launcher specialised to these
    shapes, strides, dtypes, scale and mode), else its plain ``run``."""
    bind = getattr(backend_module(name), "bind", None)
    if bind is None:
        return runner(name)
    return bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm)


# ---------------------------------------------------------------- selection

def for_gpu(table: dict, gpu_name: str | None, default=None):
    """The value of ``table`` (keyed by GPU names or parts of one, e.g. "H100") whose key is
    contained in ``gpu_name``, case-insensitively, the longest such key winning; the key
    "default" never matches; ``default`` where no key does.  The one rule by which the default
    table's rows and the backends' per-GPU launch tables are found."""
    low, best = (gpu_name or "").lower(), None
    for name in table:
        if name != "default" and name.lower() in low and (best is None or len(name) > len(best)):
            best = name
    return default if best is None else table[best]


def default_row(gpu_name: str | None):
    """The per-GPU default-table row whose gpu name is contained in this GPU's name."""
    return for_gpu({row.gpu: row for row in load_registry().defaults}, gpu_name)


def table_kind(row: DefaultRow, state_name: str, inplace: bool = True, T: int = 1) -> str:
    """Which of the row's tables serves: ``table_tokens`` for T >= 2 tokens per call, else
    ``table_dest`` for destination passing, where the row has one for this state dtype; else
    ``table`` (measured in place, T=1)."""
    if T > 1 and state_name in row.table_tokens:
        return "table_tokens"
    if not inplace and state_name in row.table_dest:
        return "table_dest"
    return "table"


def _in_ranges(table: dict, state_name: str, B: int):
    for lo, hi, be in table.get(state_name, []):
        if lo <= B and (hi is None or B <= hi):
            return be
    return None


def table_choice(row: DefaultRow, state_name: str, B: int, inplace: bool = True, T: int = 1):
    """The row's backend for B from the table :func:`table_kind` names."""
    return _in_ranges(getattr(row, table_kind(row, state_name, inplace, T)), state_name, B)


def _explicit(name: str, source: str, p: Problem) -> Selection:
    reg = load_registry()
    if name not in reg.backends:
        raise ValueError(f"{source}: unknown backend {name!r}; valid names: {', '.join(reg.names)}")
    ok, why = can_serve(name, p)
    if not ok:
        usable = [n for n in reg.names if availability(n, p.device)[0]]
        raise ValueError(f"{source}: backend {name!r} cannot serve {p.describe()}: {why}. "
                         f"Available here: {', '.join(usable) or 'none'}; "
                         f"all names: {', '.join(reg.names)}")
    return Selection(name, source, "requested explicitly")


def select(p: Problem, algo: str | None = None) -> Selection:
    """Precedence: ``algo=`` > ``ALGO`` env > per-GPU default table > fallback order."""
    if algo:
        return _explicit(algo, "algo", p)
    env = os.environ.get("ALGO")
    if env:
        return _explicit(env, "ALGO env", p)
    reg = load_registry()
    notes = []
    if p.device == "cuda":
        gpu = _cuda_info()[0]
        row = default_row(gpu)
        if row is None:
            notes.append(f"no default-table row for {gpu}")
        else:
            kind = table_kind(row, p.state_name, p.inplace, p.T)
            be = _in_ranges(getattr(row, kind), p.state_name, p.B)
            how = {"table_dest": " with destination passing",
                   "table_tokens": f" with {p.T} tokens per call"}.get(kind, "")
            if be is None:
                notes.append(f"row {row.gpu} has no {p.state_name} range covering B={p.B}")
            else:
                ok, why = can_serve(be, p)
                if ok:
                    return Selection(be, f"default table {row.gpu}",
                                     f"fastest measured for {p.state_name} state at B={p.B}"
                                     f"{how} "
                                     f"({row.provenance.get('how', '')})")
                notes.append(f"table choice {be} cannot serve: {why}")
    for name in reg.fallback.get(p.device, reg.names):
        ok, why = can_serve(name, p)
        if ok:
            return Selection(name, "fallback", "; ".join(notes + ["first usable in fallback order"]))
        notes.append(f"{name}: {why}")
    raise ValueError(f"algo: no backend can serve {p.describe()}: " + "; ".join(notes))

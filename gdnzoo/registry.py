"""The backend registry: loads and validates ``registry.yaml``, answers availability, applies the
selection precedence (``algo=`` > ``ALGO`` env > per-GPU default table > fallback order).

Nothing here imports an optional package or touches the GPU at import time; backend modules
are imported the first time someone asks whether they are available.  ``GDNZOO_REGISTRY``
names another registry file (for backends that live outside this package).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gdnzoo import operation, tables

REGISTRY_ENV = "GDNZOO_REGISTRY"
# Fields of a backend entry: type, and the default of an optional field (REQ: required).  An
# operation adds one optional field per feature it has (operation.Operation.features: true, or
# why not).
REQ = object()
_BACKEND_KEYS = {"name": (str, REQ), "entry": ((str, type(None)), None),
                 "language": (str, REQ), "requires": (list, []), "devices": (list, REQ),
                 "min_cc": ((str, type(None)), None), "state_dtypes": (list, REQ),
                 "max_T": ((int, type(None)), None), "head_dims": ((list, type(None)), None),
                 "notes": (str, REQ), "rounds_state": ((str, type(None)), None)}
_FEATURE_KEY = ((bool, str), False)
_LANGUAGES = {"python", "triton", "cuda", "cute-dsl"}
_DEVICES = {"cpu", "cuda"}


class RegistryError(ValueError):
    """registry.yaml is malformed; the message names the entry and the field."""


def default_entry(name: str) -> str:
    """The entry point of an in-tree backend: its module is named after its public name
    (``fla-recurrent`` -> ``gdnzoo.backends.fla_recurrent:run``)."""
    return f"gdnzoo.backends.{name.replace('-', '_')}:run"


@dataclass(frozen=True)
class BackendSpec:
    name: str
    op: str
    entry: str
    language: str
    requires: tuple
    devices: tuple
    min_cc: tuple | None
    state_dtypes: tuple
    max_T: int | None
    head_dims: tuple | None
    notes: str
    features: dict = field(default_factory=dict)   # feature field -> True, or why not
    rounds_state: str | None = None     # why its states carry bf16 rounding on any state dtype

    @property
    def module_name(self) -> str:
        return self.entry.split(":")[0]

    @property
    def func_name(self) -> str:
        return self.entry.split(":")[1]

    def __getattr__(self, name):           # an operation's feature field, by its name
        features = self.__dict__.get("features", {})
        if name in features:
            return features[name]
        raise AttributeError(name)


@dataclass
class OpRegistry:
    """One operation's part of the registry: its backends, default table and fallback order."""
    op: str
    backends: dict                       # name -> BackendSpec, in file order
    defaults: list                       # tables.DefaultRow
    fallback: dict                       # device -> [names]

    @property
    def names(self):
        return list(self.backends)


@dataclass
class Registry:
    ops: dict                            # operation name -> OpRegistry
    path: Path = field(default=None)

    def op(self, name: str = "decode") -> OpRegistry:
        try:
            return self.ops[name]
        except KeyError:
            raise ValueError(f"op: no backends registered for operation {name!r}; registered: "
                             f"{', '.join(self.ops)}") from None


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
    op: str = "decode"
    features: dict = field(default_factory=dict)   # feature field -> True, or why not


@dataclass(frozen=True)
class Selection:
    """Which backend serves a call, and why."""
    name: str
    source: str        # "algo" | "ALGO env" | "default table <gpu>" | "fallback"
    reason: str
    problem: object = None     # the problem it serves, where not the one asked about (a PDL
    #                            request that no backend serves here runs without PDL)


def registry_path() -> Path:
    """``$GDNZOO_REGISTRY``, else registry.yaml beside the installed package, else at the
    source checkout's root."""
    return _registry_path(os.environ.get(REGISTRY_ENV) or None)


@functools.lru_cache(maxsize=16)
def _registry_path(env: str | None) -> Path:
    """:func:`registry_path` for one value of the variable, found once (a call whose
    signature is new selects its backend through the registry: four lookups, ~35 us each
    of file-system calls before this cache)."""
    if env:
        if not Path(env).is_file():
            raise RegistryError(f"{REGISTRY_ENV}={env}: no such file")
        return Path(env)
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


def _parse_backend(i, ent, op) -> BackendSpec:
    where = f"registry.yaml {op.name} backends[{i}]"
    if not isinstance(ent, dict):
        raise RegistryError(f"{where}: expected a mapping, got {type(ent).__name__}")
    where = f"registry.yaml {op.name} backend {ent.get('name', f'#{i}')!r}"
    keys = dict(_BACKEND_KEYS, **{f: _FEATURE_KEY for f, _, _ in op.features})
    missing = [k for k, (_, d) in keys.items() if d is REQ and k not in ent]
    extra = [k for k in ent if k not in keys]
    if missing or extra:
        raise RegistryError(f"{where}: missing fields {missing}, unknown fields {extra}")
    e = {k: ent.get(k, d) for k, (_, d) in keys.items()}
    for k, (typ, _) in keys.items():
        if not isinstance(e[k], typ):
            raise RegistryError(f"{where}: field {k!r} has type {type(e[k]).__name__}")
    entry = e["entry"] or default_entry(e["name"])
    if entry.count(":") != 1:
        raise RegistryError(f"{where}: entry must be 'module:function', got {entry!r}")
    if e["language"] not in _LANGUAGES:
        raise RegistryError(f"{where}: language {e['language']!r} not in {sorted(_LANGUAGES)}")
    if not e["devices"] or set(e["devices"]) - _DEVICES:
        raise RegistryError(f"{where}: devices {e['devices']} must be a non-empty subset of "
                            f"{sorted(_DEVICES)}")
    if not e["state_dtypes"] or set(e["state_dtypes"]) - set(tables.STATES):
        raise RegistryError(f"{where}: state_dtypes {e['state_dtypes']} must be a non-empty "
                            f"subset of {list(tables.STATES)}")
    if e["max_T"] is not None and e["max_T"] < 1:
        raise RegistryError(f"{where}: max_T must be >= 1 or null")
    return BackendSpec(
        name=e["name"], op=op.name, entry=entry, language=e["language"],
        requires=tuple(e["requires"]), devices=tuple(e["devices"]),
        min_cc=_parse_cc(e["min_cc"], where), state_dtypes=tuple(e["state_dtypes"]),
        max_T=e["max_T"], head_dims=None if e["head_dims"] is None else tuple(e["head_dims"]),
        notes=e["notes"], features={f: e[f] for f, _, _ in op.features},
        rounds_state=e["rounds_state"])


def _parse_op(name, data) -> OpRegistry:
    where = f"registry.yaml operations.{name}"
    try:
        op = operation.get(name)
    except ValueError as e:
        raise RegistryError(f"{where}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("backends"), list):
        raise RegistryError(f"{where}: expected a mapping with a 'backends' list")
    extra = set(data) - {"backends", "defaults", "fallback"}
    if extra:
        raise RegistryError(f"{where}: unknown keys {sorted(extra)}")
    backends = {}
    for i, ent in enumerate(data["backends"]):
        spec = _parse_backend(i, ent, op)
        if spec.name in backends:
            raise RegistryError(f"{where} backend {spec.name!r}: duplicate name")
        backends[spec.name] = spec
    defaults = tables.parse_default_rows(data.get("defaults"), backends, RegistryError, op,
                                         where)
    fallback = data.get("fallback") or {}
    if not isinstance(fallback, dict):
        raise RegistryError(f"{where}: fallback must map a device to backend names")
    for dev, names in fallback.items():
        for n in names:
            if n not in backends:
                raise RegistryError(f"{where} fallback[{dev}]: unknown backend {n!r}")
    return OpRegistry(op=name, backends=backends, defaults=defaults, fallback=fallback)


def parse_registry(data, path=None) -> Registry:
    """Validate the parsed YAML; raise RegistryError naming the entry and field at fault."""
    if not isinstance(data, dict) or not isinstance(data.get("operations"), dict):
        raise RegistryError(f"{path}: expected a mapping with an 'operations' mapping "
                            f"(operation name -> backends, defaults, fallback)")
    extra = set(data) - {"operations"}
    if extra:
        raise RegistryError(f"{path}: unknown top-level keys {sorted(extra)}")
    ops = {name: _parse_op(name, d) for name, d in data["operations"].items()}
    return Registry(ops=ops, path=path)


_RESET_HOOKS = []


def on_reset(fn):
    """Have :func:`reset_caches` call ``fn()`` too (the layers above this one register their
    memos here, so that nothing below the public face imports it)."""
    _RESET_HOOKS.append(fn)
    return fn


def reset_caches():
    """Forget the loaded registry and launch tables, every cached availability answer and the
    memos of the layers above (tests, `tune`)."""
    for f in (_load, availability, runner, _cuda_info):
        getattr(f, "cache_clear", lambda: None)()        # tests may have replaced one
    tables.reset()
    for hook in _RESET_HOOKS:
        hook()


@functools.lru_cache(maxsize=None)
def _load(path: str) -> Registry:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise RegistryError(f"{p}: not valid YAML: {e}") from None
    return parse_registry(data, p)


def load_registry(path: str | None = None) -> Registry:
    return _load(str(path or registry_path()))



# ---------------------------------------------------------------- availability

@functools.lru_cache(maxsize=None)
def _cuda_info():
    import torch
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(), torch.cuda.get_device_capability()


def default_device() -> str:
    return "cuda" if _cuda_info() else "cpu"


def gpu_name() -> str | None:
    """This machine's GPU name as torch reports it, or None."""
    info = _cuda_info()
    return info[0] if info else None


def names(op: str = "decode") -> list:
    """The backends registered for ``op``, in registry order."""
    return load_registry().op(op).names


def spec(name: str, op: str = "decode") -> BackendSpec:
    """The registry entry of backend ``name`` for ``op``; ValueError listing the valid names."""
    reg = load_registry().op(op)
    if name not in reg.backends:
        raise ValueError(f"algo: unknown backend {name!r} for {op}; valid names: "
                         f"{', '.join(reg.names)}")
    return reg.backends[name]


def backend_module(name: str, op: str = "decode"):
    """The imported backend module (imports its optional packages only when its code needs them)."""
    return importlib.import_module(spec(name, op).module_name)


# How availability's reason starts when a backend's module failed to import or to answer: a
# broken backend, which bench and check report as ERROR (`gdnzoo list` only shows it).
LOAD_FAILED = "failed to load"


@functools.lru_cache(maxsize=None)
def availability(name: str, device: str | None = None, op: str = "decode") -> tuple[bool, str]:
    """(available, reason) of a backend on this machine for ``device`` (default: cuda if present)."""
    s = spec(name, op)
    device = device or default_device()
    if device not in s.devices:
        why = "no CUDA device on this machine" if device == "cpu" else f"does not run on {device}"
        return False, f"{why} (runs on: {', '.join(s.devices)})"
    if device == "cuda":
        info = _cuda_info()
        if info is None:
            return False, "no CUDA device on this machine"
        if s.min_cc and info[1] < s.min_cc:
            return False, (f"needs compute capability >= {s.min_cc[0]}.{s.min_cc[1]}, "
                           f"this GPU ({info[0]}) is {info[1][0]}.{info[1][1]}")
    missing = [r for r in s.requires if importlib.util.find_spec(r) is None]
    if missing:
        return False, f"optional package(s) not installed: {', '.join(missing)}"
    try:
        mod = backend_module(name, op)
        ok, reason = mod.available(device)
    except Exception as e:  # a broken optional install must not break `gdnzoo list`
        return False, f"{LOAD_FAILED} {s.module_name}: {type(e).__name__}: {e}"
    return bool(ok), reason


def can_serve(name: str, p) -> tuple[bool, str]:
    """Whether backend ``name`` can compute the problem ``p`` (of the operation ``p.op``), with
    the reason when not."""
    ok, why = availability(name, p.device, p.op)
    if not ok:
        return False, why
    s = spec(name, p.op)
    if p.cc is not None and s.min_cc and p.cc < s.min_cc:
        return False, f"needs compute capability >= {s.min_cc}, device has {p.cc}"
    if p.state_name not in s.state_dtypes:
        return False, f"state dtype {p.state_name} not supported (supports {', '.join(s.state_dtypes)})"
    if s.max_T is not None and p.T > s.max_T:
        return False, f"T={p.T} tokens per call exceeds its maximum {s.max_T}"
    if s.head_dims is not None and (p.K not in s.head_dims or p.V not in s.head_dims):
        return False, f"head dims K={p.K}, V={p.V} not in supported {list(s.head_dims)}"
    for field_, attr, what in operation.get(p.op).features:
        value = getattr(p, attr)
        if value and s.features[field_] is not True:
            return False, (f"cannot {what.format(value)}: "
                           + (s.features[field_] or f"its registry entry does not declare "
                                                    f"{field_}"))
    ok, why = backend_module(name, p.op).supports(p)
    return bool(ok), why


def list_backends(device: str | None = None, op: str | None = None) -> list[BackendInfo]:
    """Every registered backend (of ``op``; None: of every operation) with its availability
    here, the reason when not, and what it declares (``features``: true, or why not)."""
    reg = load_registry()
    out = []
    for o in ([op] if op else list(reg.ops)):
        for s in reg.op(o).backends.values():
            ok, why = availability(s.name, device, o)
            out.append(BackendInfo(
                name=s.name, available=ok, reason=why, language=s.language, devices=s.devices,
                min_cc=None if s.min_cc is None else f"{s.min_cc[0]}.{s.min_cc[1]}",
                state_dtypes=s.state_dtypes, max_T=s.max_T, head_dims=s.head_dims,
                notes=s.notes, op=o, features=dict(s.features)))
    return out


TUNABLE = ("CONFIG", "launch_config", "candidates", "refine")


def tunables(op: str = "decode") -> list[str]:
    """The registered backends of ``op`` with launch tables (the tunable protocol of
    gdnzoo.backends: ``CONFIG``, ``launch_config``, ``candidates``, ``refine``), in registry
    order."""
    out = []
    for name in names(op):
        try:
            mod = backend_module(name, op)
        except Exception:
            continue
        if all(hasattr(mod, a) for a in TUNABLE):
            out.append(name)
    return out


@functools.lru_cache(maxsize=None)
def runner(name: str, op: str = "decode"):
    """The backend's entry point ``run(call, *, config=None)`` for ``op``'s call records.

    It skips validation: give it only records made from validated calls (the dispatcher's, or
    :func:`gdnzoo.call.record`'s).
    """
    return getattr(backend_module(name, op), spec(name, op).func_name)


def launcher(name: str, call):
    """The backend's ``bind(call)`` when it has one (a launcher specialised to this call's
    signature: shapes, strides, dtypes, scale and mode), else its plain ``run``."""
    bind = getattr(backend_module(name, call.op), "bind", None)
    return runner(name, call.op) if bind is None else bind(call)


# ---------------------------------------------------------------- selection

# POSIX CPython: os.environ's own dict, of bytes keys and values.
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _env_reader(name: str, doc: str):
    """A reader of environment variable ``name`` (None when unset or empty), the one place it
    is read.  Read from os.environ's underlying dict where that is one of bytes (POSIX CPython;
    0.04 us instead of 0.6-1.4): decode reads these on every call."""
    key = os.fsencode(name)

    def read() -> str | None:
        if _ENV_DATA is not None:
            try:
                value = _ENV_DATA.get(key)
                return os.fsdecode(value) if value else None
            except TypeError:
                pass
        return os.environ.get(name) or None
    read.__name__, read.__doc__ = f"env_{name.lower()}", doc
    return read


env_algo = _env_reader("ALGO", "The ``ALGO`` environment variable (None when unset or empty), "
                       "read on every call that names no algo.")
env_pdl = _env_reader("GDNZOO_PDL", "The ``GDNZOO_PDL`` environment variable (None when unset "
                      "or empty), read on every call that passes no ``pdl``.")


def default_row(gpu_name: str | None, op: str = "decode"):
    """This GPU's general row of ``op``'s default table (the name rule of
    :func:`gdnzoo.tables.for_gpu`; its rows by geometry: :func:`gdnzoo.tables.default_rows`)."""
    return tables.default_row(load_registry().op(op).defaults, gpu_name)


def _explicit(name: str, source: str, p) -> Selection:
    reg = load_registry().op(p.op)
    if name not in reg.backends:
        raise ValueError(f"{source}: unknown backend {name!r} for {p.op}; valid names: "
                         f"{', '.join(reg.names)}")
    ok, why = can_serve(name, p)
    if not ok:
        usable = [n for n in reg.names if availability(n, p.device, p.op)[0]]
        raise ValueError(f"{source}: backend {name!r} cannot serve {p.describe()}: {why}. "
                         f"Available here: {', '.join(usable) or 'none'}; "
                         f"all names: {', '.join(reg.names)}")
    return Selection(name, source, "requested explicitly")


def check_algo(algo, op: str = "decode"):
    """``algo`` is None (automatic choice) or a non-empty backend name; raise naming it."""
    if algo is not None and (not isinstance(algo, str) or not algo):
        got = repr(algo) if isinstance(algo, str) else type(algo).__name__
        raise (ValueError if isinstance(algo, str) else TypeError)(
            f"algo: expected a backend name or None (automatic choice), got {got}; valid "
            f"names: {', '.join(names(op))}")


def select(p, algo: str | None = None) -> Selection:
    """Which backend serves the problem ``p`` (of the operation ``p.op``).  Precedence:
    ``algo=`` > ``ALGO`` env (where it names one of this operation's backends) > per-GPU
    default table > fallback order.  A PDL request (``p.pdl``) that no backend serves here is
    dropped by the automatic choice (running without PDL is always correct), which says so; an
    explicit algo that cannot launch with PDL raises."""
    try:
        return _select(p, algo)
    except _Unserved as e:
        if not getattr(p, "pdl", ""):
            raise ValueError(str(e)) from None
        plain = dataclasses.replace(p, pdl="")
        try:
            sel = _select(plain, algo)
        except _Unserved:
            raise ValueError(str(e)) from None
        return dataclasses.replace(sel, problem=plain, reason=(
            f"{sel.reason}; pdl={p.pdl!r} requested, but no backend launches with PDL for "
            f"{p.describe()}: launched without it"))


class _Unserved(ValueError):
    """No backend can serve a problem automatically."""


def _select(p, algo):
    check_algo(algo, p.op)
    if algo is not None:
        return _explicit(algo, "algo", p)
    reg = load_registry().op(p.op)
    notes = []
    env = env_algo()
    if env:
        # ALGO names a backend of any operation; an operation without one of that name
        # chooses as if it were unset (ALGO=cuda-v4 leaves prefill's choice alone)
        if env in reg.backends or not any(env in o.backends
                                          for o in load_registry().ops.values()):
            return _explicit(env, "ALGO env", p)
        notes.append(f"ALGO={env} names no {p.op} backend")
    if p.device == "cuda":
        gpu = gpu_name()
        rows = tables.default_rows(load_registry().op(p.op).defaults, gpu)
        hit = tables.lookup(rows, p)
        if not rows:
            notes.append(f"no {p.op} default-table row for {gpu}")
        elif hit is None:
            notes.append(f"row {rows[-1].gpu} has no {p.state_name} table")
        else:
            row, key, how = hit
            be = tables.table_choice(row, p, key)
            at = f"{p.batch_name}={p.batch}"
            n, m = tables.read_point(row, p)
            if n != p.batch * m:
                at += f" ({n} (sequence, head) pairs: read at B={n / m:g} of HV={m})"
            if be is None:
                notes.append(f"row {row.label()} has no {p.state_name} range covering {at}")
            else:
                ok, why = can_serve(be, p)
                if ok:
                    return Selection(be, f"default table {row.label()}",
                                     f"fastest measured for {p.state_name} state at {at}"
                                     f"{how} ({row.provenance.get('how', '')})")
                notes.append(f"table choice {be} cannot serve: {why}")
    for name in reg.fallback.get(p.device, reg.names):
        ok, why = can_serve(name, p)
        if ok:
            return Selection(name, "fallback", "; ".join(notes + ["first usable in fallback order"]))
        notes.append(f"{name}: {why}")
    raise _Unserved(f"algo: no backend can serve {p.describe()}: " + "; ".join(notes))

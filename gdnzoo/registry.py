"""The backend registry: loads and validates ``registry.yaml``, answers availability, applies the
selection precedence (``algo=`` > ``ALGO`` env > per-GPU default table > fallback order).

Nothing here imports an optional package or touches the GPU at import time; backend modules
are imported the first time someone asks whether they are available.  ``GDNZOO_REGISTRY``
names another registry file (for backends that live outside this package).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gdnzoo import tables
from gdnzoo.contract import Problem

REGISTRY_ENV = "GDNZOO_REGISTRY"
# Fields of a backend entry: type, and the default of an optional field (REQ: required).
REQ = object()
_BACKEND_KEYS = {"name": (str, REQ), "entry": ((str, type(None)), None),
                 "language": (str, REQ), "requires": (list, []), "devices": (list, REQ),
                 "min_cc": ((str, type(None)), None), "state_dtypes": (list, REQ),
                 "max_T": ((int, type(None)), None), "head_dims": ((list, type(None)), None),
                 "pools": ((bool, str), False), "verify": ((bool, str), False),
                 "pdl": ((bool, str), False), "notes": (str, REQ)}
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
    entry: str
    language: str
    requires: tuple
    devices: tuple
    min_cc: tuple | None
    state_dtypes: tuple
    max_T: int | None
    head_dims: tuple | None
    notes: str
    pools: bool | str = False     # True: takes state pools; else why not (False: not declared)
    verify: bool | str = False    # True: serves speculative verify (gdnzoo.verify); else why not
    pdl: bool | str = False       # True: launches with programmatic dependent launch; else why not

    @property
    def module_name(self) -> str:
        return self.entry.split(":")[0]

    @property
    def func_name(self) -> str:
        return self.entry.split(":")[1]


@dataclass
class Registry:
    backends: dict                       # name -> BackendSpec, in file order
    defaults: list                       # tables.DefaultRow
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
    """``$GDNZOO_REGISTRY``, else registry.yaml beside the installed package, else at the
    source checkout's root."""
    env = os.environ.get(REGISTRY_ENV)
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


def _parse_backend(i, ent) -> BackendSpec:
    where = f"registry.yaml backends[{i}]"
    if not isinstance(ent, dict):
        raise RegistryError(f"{where}: expected a mapping, got {type(ent).__name__}")
    where = f"registry.yaml backend {ent.get('name', f'#{i}')!r}"
    missing = [k for k, (_, d) in _BACKEND_KEYS.items() if d is REQ and k not in ent]
    extra = [k for k in ent if k not in _BACKEND_KEYS]
    if missing or extra:
        raise RegistryError(f"{where}: missing fields {missing}, unknown fields {extra}")
    e = {k: ent.get(k, d) for k, (_, d) in _BACKEND_KEYS.items()}
    for k, (typ, _) in _BACKEND_KEYS.items():
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
        name=e["name"], entry=entry, language=e["language"], requires=tuple(e["requires"]),
        devices=tuple(e["devices"]), min_cc=_parse_cc(e["min_cc"], where),
        state_dtypes=tuple(e["state_dtypes"]), max_T=e["max_T"],
        head_dims=None if e["head_dims"] is None else tuple(e["head_dims"]), notes=e["notes"],
        pools=e["pools"], verify=e["verify"], pdl=e["pdl"])


def parse_registry(data, path=None) -> Registry:
    """Validate the parsed YAML; raise RegistryError naming the entry and field at fault."""
    if not isinstance(data, dict) or "backends" not in data:
        raise RegistryError(f"{path}: expected a mapping with a 'backends' list")
    backends = {}
    for i, ent in enumerate(data["backends"] or []):
        spec = _parse_backend(i, ent)
        if spec.name in backends:
            raise RegistryError(f"registry.yaml backend {spec.name!r}: duplicate name")
        backends[spec.name] = spec
    defaults = tables.parse_default_rows(data.get("defaults"), backends, RegistryError)
    fallback = data.get("fallback") or {}
    for dev, names in fallback.items():
        for n in names:
            if n not in backends:
                raise RegistryError(f"registry.yaml fallback[{dev}]: unknown backend {n!r}")
    return Registry(backends=backends, defaults=defaults, fallback=fallback, path=path)


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


def backend_module(name: str):
    """The imported backend module (imports its optional packages only when its code needs them)."""
    return importlib.import_module(_spec(name).module_name)


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
    if p.pool and spec.pools is not True:
        return False, ("cannot serve state pools (state_indices): "
                       + (spec.pools or "its registry entry does not declare pools"))
    if p.verify and spec.verify is not True:
        return False, ("cannot serve speculative verify (intermediate_states, "
                       "update_state=False, per-token state_indices): "
                       + (spec.verify or "its registry entry does not declare verify"))
    if p.pdl and spec.pdl is not True:
        return False, (f"cannot launch with programmatic dependent launch (pdl={p.pdl!r}): "
                       + (spec.pdl or "its registry entry does not declare pdl"))
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


TUNABLE = ("CONFIG", "launch_config", "candidates", "refine")


def tunables() -> list[str]:
    """The registered backends with launch tables (the tunable protocol of gdnzoo.backends:
    ``CONFIG``, ``launch_config``, ``candidates``, ``refine``), in registry order."""
    out = []
    for name in load_registry().names:
        try:
            mod = backend_module(name)
        except Exception:
            continue
        if all(hasattr(mod, a) for a in TUNABLE):
            out.append(name)
    return out


@functools.lru_cache(maxsize=None)
def runner(name: str):
    """The raw backend launcher ``run(q,k,v,state,A_log,a,dt_bias,b,scale,out,new_state,l2)``.

    It skips validation: use it only on inputs that :func:`gdnzoo.contract.validate` accepted.
    """
    return getattr(backend_module(name), _spec(name).func_name)


def launcher(name: str, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
             use_qk_l2norm, pool=None, verify=None, pdl=0):
    """The backend's ``bind(...)`` result when it has one (a launcher specialised to these
    shapes, strides, dtypes, scale and mode), else its plain ``run``.  ``pdl``: the level of
    programmatic dependent launch (:data:`gdnzoo.contract.PDL_LEVELS`), passed as ``pdl=``
    only when not 0 (only backends whose entry declares ``pdl: true`` get one)."""
    bind = getattr(backend_module(name), "bind", None)
    if pdl:
        if bind is None:
            return functools.partial(runner(name), pdl=pdl)
        return bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                    pool, verify, pdl=pdl)
    if bind is None:
        return runner(name)
    if verify is not None:
        return bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
                    pool, verify)
    if pool is None:
        return bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm)
    return bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, pool)


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
                       "read on every decode call that names no algo.")
env_pdl = _env_reader("GDNZOO_PDL", "The ``GDNZOO_PDL`` environment variable (None when unset "
                      "or empty), read on every decode call that passes no ``pdl``.")


def default_row(gpu_name: str | None):
    """This GPU's row of the default table (the name rule of :func:`gdnzoo.tables.for_gpu`)."""
    return tables.default_row(load_registry().defaults, gpu_name)


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


def check_algo(algo):
    """``algo`` is None (automatic choice) or a non-empty backend name; raise naming it."""
    if algo is not None and (not isinstance(algo, str) or not algo):
        names = ", ".join(load_registry().names)
        got = repr(algo) if isinstance(algo, str) else type(algo).__name__
        raise (ValueError if isinstance(algo, str) else TypeError)(
            f"algo: expected a backend name or None (automatic choice), got {got}; valid "
            f"names: {names}")


def select(p: Problem, algo: str | None = None) -> Selection:
    """Precedence: ``algo=`` > ``ALGO`` env > per-GPU default table > fallback order."""
    check_algo(algo)
    if algo is not None:
        return _explicit(algo, "algo", p)
    env = env_algo()
    if env:
        return _explicit(env, "ALGO env", p)
    reg = load_registry()
    notes = []
    if p.device == "cuda":
        gpu = gpu_name()
        row = default_row(gpu)
        if row is None:
            notes.append(f"no default-table row for {gpu}")
        else:
            v = bool(p.verify)
            kind = tables.table_kind(row, p.state_name, p.inplace, p.T, p.pool, v)
            be = tables.table_choice(row, p.state_name, p.B, p.inplace, p.T, p.pool, v)
            how = {"table_verify": " in a speculative verify", "table_pool": " in a state pool",
                   "table_dest": " with destination passing",
                   "table_tokens": f" with {p.T} tokens per call"}.get(kind, "")
            if be is None:
                notes.append(f"row {row.gpu} has no {p.state_name} range covering B={p.B}")
            else:
                ok, why = can_serve(be, p)
                if ok:
                    return Selection(be, f"default table {row.gpu}",
                                     f"fastest measured for {p.state_name} state at B={p.B}"
                                     f"{how} ({row.provenance.get('how', '')})")
                notes.append(f"table choice {be} cannot serve: {why}")
    for name in reg.fallback.get(p.device, reg.names):
        ok, why = can_serve(name, p)
        if ok:
            return Selection(name, "fallback", "; ".join(notes + ["first usable in fallback order"]))
        notes.append(f"{name}: {why}")
    raise ValueError(f"algo: no backend can serve {p.describe()}: " + "; ".join(notes))

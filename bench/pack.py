"""``gdnzoo pack``: export a backend as a flashinfer-bench Solution for the contest definition.

The Solution is self-contained: the backend's module and every ``gdnzoo`` module it imports
(transitively), plus the data files they name (e.g. ``.cu`` sources, and what those
``#include "..."``), are vendored into the Solution's ``sources`` under ``gdnzoo_vendored/``, with
their ``gdnzoo.*`` imports rewritten to relative ones.  So the packed code is exactly what ran in
the zoo, readable in the JSON, and it needs no gdnzoo install -- only the backend's own optional
packages (triton, cupy, flashinfer...).  Vendoring was chosen over importing an installed gdnzoo
because a Solution is judged by its sources.

flashinfer-bench loads a python/triton Solution by writing ``sources`` into a package directory
and importing the entry file as a module of that package (``PythonBuilder``), then calls
``run(q, k, v, state, A_log, a, dt_bias, b, scale, output, new_state)`` with outputs from
``torch.empty`` (destination-passing style).  The entry ``kernel.py`` validates the inputs with
the vendored ``contract.validate``, checks once per problem what the registry would check
(devices, min compute capability, state dtypes, max T, head dims, then the backend's
``supports``), and calls the backend with ``use_qk_l2norm=False`` (the contest has no l2norm).
A CUDA-via-CuPy or CuTe-DSL backend is declared ``language: python`` (flashinfer-bench's
``cuda`` language means sources it compiles itself).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path

from gdnzoo.bench.vendor import VENDOR, PackError, vendor

DEFINITION = "gdn_decode_qk4_v8_d128_k_last"
ENTRY_FILE = "kernel.py"
_FIB_LANGUAGE = {"python": "python", "triton": "triton", "cuda": "python", "cute-dsl": "python"}


def add_pack_args(p):
    p.add_argument("--algo", required=True, help="backend name to export")
    p.add_argument("--out", default=None, help="output directory (default ./gdnzoo-pack-<algo>)")
    p.add_argument("--author", default="gdnzoo")


# ------------------------------------------------------------------ solution

_ENTRY = '''"""gdnzoo backend {name!r} packed as a flashinfer-bench Solution for {definition}.

Vendored sources under {vendor}/; entry point run() is destination-passing.
"""
from .{vendor}.contract import record, validate
from .{vendor}.operation import DECODE
from .{vendor}.{impl_rel} import {func} as _backend_run
from .{vendor}.{impl_rel} import available as _available, supports as _supports

ALGO = {name!r}
LIMITS = {limits!r}
_served = set()


def _check(p):
    if p in _served:
        return
    ok, why = _available()
    if not ok:
        raise RuntimeError(f"{{ALGO}} is not available here: {{why}}")
    if p.device not in LIMITS["devices"]:
        raise ValueError(f"{{ALGO}} runs on {{LIMITS['devices']}}, inputs are on {{p.device}}")
    if p.cc is not None and LIMITS["min_cc"] and tuple(p.cc) < tuple(LIMITS["min_cc"]):
        raise ValueError(f"{{ALGO}} needs compute capability >= {{LIMITS['min_cc']}}, got {{p.cc}}")
    if p.state_name not in LIMITS["state_dtypes"]:
        raise ValueError(f"{{ALGO}}: state dtype {{p.state_name}} not in {{LIMITS['state_dtypes']}}")
    if LIMITS["max_T"] is not None and p.T > LIMITS["max_T"]:
        raise ValueError(f"{{ALGO}}: T={{p.T}} exceeds {{LIMITS['max_T']}}")
    if LIMITS["head_dims"] is not None and (p.K not in LIMITS["head_dims"] or p.V not in LIMITS["head_dims"]):
        raise ValueError(f"{{ALGO}}: head dims K={{p.K}} V={{p.V}} not in {{LIMITS['head_dims']}}")
    ok, why = _supports(p)
    if not ok:
        raise ValueError(f"{{ALGO}} cannot serve {{p.describe()}}: {{why}}")
    _served.add(p)


def run(q, k, v, state, A_log, a, dt_bias, b, scale, output, new_state):
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=output, new_state=new_state)
    _check(p)
    named = {{arg.name: arg.default for arg in DECODE.args}}      # decode's defaults, by name
    named.update(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, scale=s,
                 out=output, new_state=new_state, use_qk_l2norm=False, algo=ALGO)
    _backend_run(record(tuple(named[n] for n in DECODE.names), p, s, ALGO))
'''


def _spec(name: str):
    from gdnzoo import registry
    from gdnzoo.bench import entries
    if name not in entries.backends():
        raise ValueError(f"--algo: unknown backend {name!r}; valid names: "
                         f"{', '.join(entries.backends())}")
    return registry.spec(name)


def build_solution(name: str, author: str = "gdnzoo", definition: str = DEFINITION) -> dict:
    """The Solution for backend ``name`` as a JSON-ready dict (flashinfer-bench 0.1.2 schema)."""
    spec = _spec(name)
    modname, func = spec.module_name, spec.func_name
    if not modname.startswith("gdnzoo."):
        raise PackError(f"{name}: entry module {modname} is outside gdnzoo; cannot vendor it")
    files = vendor(modname)
    files.update(vendor("gdnzoo.contract"))
    limits = dict(devices=list(spec.devices), min_cc=list(spec.min_cc) if spec.min_cc else None,
                  state_dtypes=list(spec.state_dtypes), max_T=spec.max_T,
                  head_dims=list(spec.head_dims) if spec.head_dims else None)
    impl_rel = modname[len("gdnzoo."):]
    files[ENTRY_FILE] = _ENTRY.format(name=name, definition=definition, vendor=VENDOR,
                                      impl_rel=impl_rel, func=func, limits=limits)
    sources = [dict(path=p, content=files[p]) for p in sorted(files, key=lambda p: (p != ENTRY_FILE, p))]
    digest = hashlib.sha1("".join(s["path"] + s["content"] for s in sources).encode()).hexdigest()[:8]
    return dict(
        name=f"gdnzoo_{name.replace('-', '_')}_{digest}",
        definition=definition,
        author=author,
        spec=dict(language=_FIB_LANGUAGE[spec.language], target_hardware=list(spec.devices),
                  entry_point=f"{ENTRY_FILE}::run", dependencies=list(spec.requires),
                  destination_passing_style=True),
        sources=sources,
        description=f"gdnzoo backend {name}: {spec.notes}. Vendored sources, packed by `gdnzoo pack`.",
    )


def validate_with_fib(sol: dict):
    """Validate against flashinfer-bench's own pydantic schema when it is installed; else None."""
    try:
        from flashinfer_bench.data import Solution
    except Exception:
        return None
    return Solution.model_validate(sol)


def load_entry(sol: dict, workdir) -> callable:
    """Import the packed entry point the way flashinfer-bench's PythonBuilder does (for tests)."""
    workdir = Path(workdir)
    pkg = "gdnzoo_pack_" + hashlib.sha1(json.dumps(sol, sort_keys=True).encode()).hexdigest()[:10]
    root = workdir / pkg
    for s in sol["sources"]:
        dst = root / s["path"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(s["content"])
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    entry_file, sym = sol["spec"]["entry_point"].split("::")
    mod = importlib.import_module(pkg + "." + ".".join(Path(entry_file).with_suffix("").parts))
    return getattr(mod, sym)


def write_solution(sol: dict, out_dir) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "solution.json"
    path.write_text(json.dumps(sol, indent=2) + "\n")
    return path


def cmd_pack(args) -> int:
    try:
        sol = build_solution(args.algo, author=getattr(args, "author", "gdnzoo") or "gdnzoo")
    except (ValueError, PackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    checked = validate_with_fib(sol)
    path = write_solution(sol, args.out or f"gdnzoo-pack-{args.algo}")
    print(f"wrote {path}: Solution {sol['name']!r} for {sol['definition']}, "
          f"{len(sol['sources'])} source files, entry {sol['spec']['entry_point']} "
          f"(language {sol['spec']['language']}, destination-passing)")
    print("validated with flashinfer_bench.data.Solution" if checked is not None else
          "flashinfer-bench not installed here: schema not validated by it")
    return 0

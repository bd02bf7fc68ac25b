"""``gdnzoo pack``: export a backend as a flashinfer-bench Solution for a contest definition:
``--op decode`` (default) for ``gdn_decode_qk4_v8_d128_k_last``, ``--op prefill`` for
``gdn_prefill_qk4_v8_d128_k_last``.

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
``torch.empty`` (destination-passing style); for prefill ``run(q, k, v, state, A_log, a,
dt_bias, b, cu_seqlens, scale, output, new_state)``, ``state`` possibly None (zeros).  The entry
``kernel.py`` validates the inputs with the vendored contract's ``validate`` (``contract`` or
``prefill_contract``), checks once per problem what the registry would check (devices, min
compute capability, state dtypes, max T, head dims, then the backend's ``supports``), and calls
the backend with ``use_qk_l2norm=False`` (the contest has no l2norm).

One rule of the prefill definition differs from :func:`gdnzoo.prefill`: its reference leaves
the new state of a zero-length sequence at zero, where gdnzoo carries the initial state over.
The prefill entry follows the definition: with a state given, it passes ``has_initial_state =
(length > 0)`` (computed on the device, no sync) when the backend serves that, else it zeroes
those rows of ``new_state`` after the call.
A CUDA-via-CuPy or CuTe-DSL backend is declared ``language: python`` (flashinfer-bench's
``cuda`` language means sources it compiles itself).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path

from gdnzoo import operation, registry
from gdnzoo.bench import entries
from gdnzoo.bench.vendor import VENDOR, PackError, vendor

DEFINITION = "gdn_decode_qk4_v8_d128_k_last"
DEFINITIONS = {"decode": DEFINITION, "prefill": "gdn_prefill_qk4_v8_d128_k_last"}
ENTRY_FILE = "kernel.py"
_FIB_LANGUAGE = {"python": "python", "triton": "triton", "cuda": "python", "cute-dsl": "python"}


def add_pack_args(p):
    p.add_argument("--algo", required=True, help="backend name to export")
    p.add_argument("--op", default="decode", metavar="{decode,prefill}",
                   help="the operation whose backend is exported: decode (default; definition "
                        f"{DEFINITIONS['decode']}) or prefill ({DEFINITIONS['prefill']})")
    p.add_argument("--out", default=None, help="output directory (default ./gdnzoo-pack-<algo>; "
                                               "prefill: ./gdnzoo-pack-prefill-<algo>)")
    p.add_argument("--author", default="gdnzoo")


# ------------------------------------------------------------------ solution

_HEAD = '''"""gdnzoo backend {name!r} packed as a flashinfer-bench Solution for {definition}.

Vendored sources under {vendor}/; entry point run() is destination-passing.
"""
from .{vendor}.{contract} import record, validate
from .{vendor}.operation import {OP}
from .{vendor}.{impl_rel} import {func} as _backend_run
from .{vendor}.{impl_rel} import available as _available, supports as _supports
'''

_CHECK = '''
ALGO = {name!r}
LIMITS = {limits!r}
_served = {served}


def _check(p):
    if p in _served:
        return{early}
    if p.device not in LIMITS["devices"]:
        raise ValueError(f"{{ALGO}} runs on {{LIMITS['devices']}}, inputs are on {{p.device}}")
    ok, why = _available(p.device)
    if not ok:
        raise RuntimeError(f"{{ALGO}} is not available here: {{why}}")
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
'''

_RUN = dict(decode='''    _served.add(p)


def run(q, k, v, state, A_log, a, dt_bias, b, scale, output, new_state):
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, scale, out=output, new_state=new_state)
    _check(p)
    named = {arg.name: arg.default for arg in DECODE.args}      # decode's defaults, by name
    named.update(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, scale=s,
                 out=output, new_state=new_state, use_qk_l2norm=False, algo=ALGO)
    _backend_run(record(tuple(named[n] for n in DECODE.names), p, s, ALGO))
''', prefill='''    _served[p] = _route(p)
    return _served[p]


def _route(p):
    # The definition leaves a zero-length sequence's new state at zero (gdnzoo's prefill would
    # carry its initial state over).  ("zeros", p): no state given, every sequence starts from
    # zeros; ("initial", p with has_initial_state): the backend serves has_initial_state =
    # (length > 0); else ("mask", p): those rows of new_state are zeroed after the call.
    if p.initial == "zeros":
        return "zeros", p
    mixed = replace(p, initial="mixed")
    if _supports(mixed)[0]:
        return "initial", mixed
    return "mask", p


def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, output, new_state):
    p, s = validate(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, out=output,
                    new_state=new_state)
    how, p = _served.get(p) or _check(p)
    named = {arg.name: arg.default for arg in PREFILL.args}     # prefill's defaults, by name
    named.update(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                 cu_seqlens=cu_seqlens, scale=s, out=output, new_state=new_state,
                 use_qk_l2norm=False, algo=ALGO)
    if how == "initial":
        named["has_initial_state"] = cu_seqlens[1:] != cu_seqlens[:-1]
    rec = record(tuple(named[n] for n in PREFILL.names), p, s, ALGO)
    _backend_run(rec)
    if how == "mask":
        empty = cu_seqlens[1:] == cu_seqlens[:-1]
        rec.new_state.masked_fill_(empty[:, None, None, None], 0.0)
''')

def check_op(op: str) -> str:
    """``op`` if it has a contest definition to pack for; ValueError saying why not."""
    if op in DEFINITIONS:
        return op
    if op in operation.OPERATIONS:
        raise ValueError(f"--op {op}: the {op} operation has no flashinfer-bench contest "
                         f"definition to pack for; --op takes {' or '.join(DEFINITIONS)}")
    raise ValueError(f"--op: unknown operation {op!r}; --op takes {' or '.join(DEFINITIONS)}")


def entry_source(name: str, op: str, spec, definition: str) -> str:
    """The text of the packed entry file ``kernel.py`` for backend ``name`` of ``op``."""
    limits = dict(devices=list(spec.devices), min_cc=list(spec.min_cc) if spec.min_cc else None,
                  state_dtypes=list(spec.state_dtypes), max_T=spec.max_T,
                  head_dims=list(spec.head_dims) if spec.head_dims else None)
    head = _HEAD.format(name=name, definition=definition, vendor=VENDOR,
                        contract=operation.get(op).contract, OP=op.upper(),
                        impl_rel=spec.module_name[len("gdnzoo."):], func=spec.func_name)
    if op == "prefill":
        head = head.replace("\nfrom .", "\nfrom dataclasses import replace\n\nfrom .", 1)
    return (head + _CHECK.format(name=name, limits=limits,
                                 served="set()" if op == "decode" else "{}",
                                 early="" if op == "decode" else " _served[p]") + _RUN[op])


def build_solution(name: str, author: str = "gdnzoo", definition: str | None = None,
                   op: str = "decode") -> dict:
    """The Solution for backend ``name`` of operation ``op`` (decode, prefill) as a JSON-ready
    dict (flashinfer-bench 0.1.2 schema), for ``definition`` (default: the op's contest one)."""
    op = check_op(op)
    definition = definition or DEFINITIONS[op]
    valid = entries.backends(op)
    if name not in valid:
        others = [o for o in DEFINITIONS if o != op and name in entries.backends(o)]
        what = (f"{name!r} is a {others[0]} backend, not a {op} one" if others else
                f"unknown {op} backend {name!r}")
        raise ValueError(f"--algo: {what}; valid names for --op {op}: {', '.join(valid)}")
    spec = registry.spec(name, op)
    modname = spec.module_name
    if not modname.startswith("gdnzoo."):
        raise PackError(f"{name}: entry module {modname} is outside gdnzoo; cannot vendor it")
    files = vendor(modname)
    files.update(vendor(f"gdnzoo.{operation.get(op).contract}"))
    files[ENTRY_FILE] = entry_source(name, op, spec, definition)
    sources = [dict(path=p, content=files[p]) for p in sorted(files, key=lambda p: (p != ENTRY_FILE, p))]
    digest = hashlib.sha1("".join(s["path"] + s["content"] for s in sources).encode()).hexdigest()[:8]
    tag = "" if op == "decode" else f"{op}_"
    return dict(
        name=f"gdnzoo_{tag}{name.replace('-', '_')}_{digest}",
        definition=definition,
        author=author,
        spec=dict(language=_FIB_LANGUAGE[spec.language], target_hardware=list(spec.devices),
                  entry_point=f"{ENTRY_FILE}::run", dependencies=list(spec.requires),
                  destination_passing_style=True),
        sources=sources,
        description=f"gdnzoo {tag.replace('_', ' ')}backend {name}: {spec.notes}. Vendored "
                    f"sources, packed by `gdnzoo pack`.",
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


def cmd_pack(args) -> int:
    """``gdnzoo pack``: exit 2 on a bad option (nothing written: the folder of ``--out`` is made
    and probed only once the Solution is built)."""
    from gdnzoo.bench.args import check_out
    try:
        op = check_op(args.op or "decode")
        sol = build_solution(args.algo, author=args.author or "gdnzoo", op=op)
    except (ValueError, PackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = check_out(args.out or f"gdnzoo-pack-{'' if op == 'decode' else op + '-'}{args.algo}",
                    "gdnzoo pack")
    checked = validate_with_fib(sol)
    path = out / "solution.json"
    path.write_text(json.dumps(sol, indent=2) + "\n")
    print(f"wrote {path}: Solution {sol['name']!r} for {sol['definition']}, "
          f"{len(sol['sources'])} source files, entry {sol['spec']['entry_point']} "
          f"(language {sol['spec']['language']}, destination-passing)")
    print("validated with flashinfer_bench.data.Solution" if checked is not None else
          "flashinfer-bench not installed here: schema not validated by it")
    return 0

"""What the bench and the tuner call: the one lookup of registered backends, the one raw
launch, and what the modes share (the automatic choice, FlashInfer's peers, K-first states).

Every backend list goes through :func:`backends` (keyed by operation) and every raw launch of a
backend, bypassing dispatch (the kernel and graph clocks, the tuner's explicit-config launches,
NVBench), through :func:`launch`: the call record a backend receives is made in that one place
(:func:`record`).
"""
from __future__ import annotations

import importlib

from gdnzoo import registry


class Skip(Exception):
    """An entry that cannot run in this cell (the message says why)."""


def backends(op: str = "decode", *, pools=None, verify=None, pdl=None, native: bool = False,
             language: str | None = None, tunable: bool = False) -> list:
    """Registered backends of operation ``op``, in registry order; ``pools``, ``verify``,
    ``pdl``: True keeps those whose registry entry says so (False: those that do not);
    ``native``: leave out the torch (``language: python``) ones; ``language``: that language's
    only; ``tunable``: those with launch tables (gdnzoo.registry.tunables)."""

    def keep(s, feature, want):
        return want is None or (getattr(s, feature, False) is True) == want
    tuned = registry.tunables(op) if tunable else None
    return [n for n, s in registry.load_registry().op(op).backends.items()
            if keep(s, "pools", pools) and keep(s, "verify", verify) and keep(s, "pdl", pdl)
            and not (native and s.language == "python") and language in (None, s.language)
            and (tuned is None or n in tuned)]


def named(algo, default, op: str = "decode", command: str = "gdnzoo bench") -> list:
    """``--algo``: None or "all" gives ``default()``; else the comma list's names (``all``
    among them adds ``default()``), each registered, else a usage error of ``command`` (exit
    status 2) naming the unknown ones."""
    from gdnzoo.bench.args import usage_error, words
    if algo in (None, "all"):
        return list(default())
    every = backends(op)
    if not words(algo):
        usage_error(f"--algo: expected a comma list of backend names or 'all', got {algo!r}",
                    command)
    picked, unknown = [], []
    for n in words(algo):
        if n == "all":
            picked += default()
        elif n in every:
            picked.append(n)
        else:
            unknown.append(n)
    if unknown:
        usage_error(f"--algo: unknown backend(s) {', '.join(unknown)}; valid: "
                    f"{', '.join(every)}, all", command)
    return list(dict.fromkeys(picked))


def raw(name: str, op: str = "decode"):
    """Backend ``name``'s entry point ``run(call, *, config=None)`` (for :func:`launch`)."""
    return registry.runner(name, op)


def record(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           pool=None, verify=None, pdl=0, algo="bench", state_layout="k-last"):
    """The decode call record a backend receives (``gdnzoo.dispatch.record``: validated, nothing
    memoized) for arguments in the positional launch form (``pool``: a
    :class:`gdnzoo.pool.Pool`, ``verify``: a :class:`gdnzoo.verify.Verify`, ``pdl``: 0, 1 or 2;
    ``new_state`` is ``state`` in place; ``state_layout`` as decode's)."""
    from gdnzoo import dispatch
    from gdnzoo.operation import DECODE
    named = {arg.name: arg.default for arg in DECODE.args}     # decode's defaults, by name
    named.update(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, scale=scale,
                 out=out, new_state=None if new_state is state else new_state,
                 use_qk_l2norm=use_qk_l2norm, algo=None, state_layout=state_layout,
                 pdl={0: None, 1: "wait", 2: "early"}.get(pdl, pdl))
    if pool is not None:
        named.update(state_indices=pool.read,
                     new_state_indices=None if pool.write is pool.read else pool.write,
                     null_slot=None if pool.null_slot < 0 else pool.null_slot)
    if verify is not None:
        named.update(intermediate_states=verify.states, intermediate_indices=verify.indices,
                     update_state=verify.update or verify.per_token,
                     num_accepted_tokens=verify.accepted)
    return dispatch.record(DECODE, tuple(named[n] for n in DECODE.names), algo)


def launch(run, x, state, out, new_state, l2, *, config=None, **kw):
    """One raw call of backend entry point ``run`` (:func:`raw`) on the inputs ``x`` (anything
    with q, k, v, A_log, a, dt_bias, b, scale) with ``state``, ``out``, ``new_state``
    (``state`` itself in place): :func:`record`'s record (``kw``: its ``pool``, ``verify``,
    ``pdl``, ``algo``), then ``run(record, config=config)``."""
    return run(record(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out,
                      new_state, l2, **kw), config=config)


def skip_status(why: str) -> str:
    """SKIP, or ERROR where the reason is a backend module that failed to load (a broken
    install or a new backend's bug, not a machine without its GPU or package)."""
    return "ERROR" if why.startswith(registry.LOAD_FAILED) else "SKIP"


def serve(name, problem):
    """Skip unless ``name`` is registered and can serve ``problem`` (the registry's reason)."""
    if name not in backends(problem.op):
        raise Skip("not registered in registry.yaml")
    ok, why = registry.can_serve(name, problem)
    if not ok:
        raise Skip(why)


def choice(problem) -> str:
    """The backend the automatic choice picks for ``problem`` ("" when none can serve it)."""
    try:
        return registry.select(problem).name
    except ValueError:
        return ""


def on_gpu(device, who):
    if str(device) != "cuda" and getattr(device, "type", None) != "cuda":
        raise Skip(f"{who}: CUDA devices only")


def flashinfer_gdn(api):
    """FlashInfer's ``flashinfer.gdn_decode.<api>`` (every bench peer of FlashInfer); Skip with
    the reason where it cannot run: below SM90, not importable, or without the CuTe DSL its GDN
    kernels are written in (FlashInfer itself imports without it, and a call then fails inside
    it with "'NoneType' object is not callable") or its compiler library (the check fi-baseline's
    availability makes: a call fails with "No CTK flavor installed")."""
    import torch
    if torch.cuda.get_device_capability() < (9, 0):
        raise Skip("FlashInfer's GDN kernels need SM90+")
    try:
        fn = getattr(importlib.import_module("flashinfer.gdn_decode"), api)
    except Exception as e:
        raise Skip(f"flashinfer.gdn_decode.{api} not importable ({type(e).__name__}: "
                   f"{e})") from None
    try:
        importlib.import_module("cutlass.cute")
    except Exception as e:
        raise Skip("FlashInfer's GDN kernels need the CuTe DSL (nvidia-cutlass-dsl), which does "
                   f"not import ({type(e).__name__}: {e})") from None
    from gdnzoo.backends import _peer_checks
    broken = _peer_checks.cute_dsl_missing_libs()     # imports, then cannot compile
    if broken:
        raise Skip(f"FlashInfer's GDN kernels cannot compile: {broken}")
    return fn


def in_layout(state, layout: str):
    """A k-last state (or pool) stored in ``layout``: itself, or a K-first contiguous copy."""
    return state.transpose(-1, -2).contiguous() if layout == "k-first" else state


def k_first_call(fn):
    """``fn`` (decode's or prefill's signature) as a call on a k-last state that runs it on a
    K-first copy (``state_layout="k-first"``) and writes the result back where a k-last call
    would, and the K-first input back into ``state`` (so the gate sees a destination-passing
    call that changed its input): what the gate holds to the k-last reference."""
    import torch

    def call(q, k, v, state, *rest, out, new_state, **kw):
        st = in_layout(state, "k-first")
        ns = None if new_state is None else torch.full_like(st, float("nan"))
        o, n = fn(q, k, v, st, *rest, out=out, new_state=ns, state_layout="k-first", **kw)
        if new_state is None:
            state.copy_(n.transpose(-1, -2))
            return o, state
        new_state.copy_(n.transpose(-1, -2))
        state.copy_(st.transpose(-1, -2))
        return o, new_state
    return call

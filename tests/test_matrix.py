"""One matrix: every registered backend against the float64 reference, output and state.

Backends join by being registered.  A backend that cannot run here, or cannot serve a case,
is skipped with its reason; the last test asserts that every available backend actually ran.
On a CUDA machine the full matrix runs; on CPU a smaller cycle over the same factors (Triton
kernels run through the interpreter there).
"""
import functools
import itertools

import pytest
import torch

import gdnzoo
from gdnzoo import registry
from gdnzoo.inputs import make_inputs
from helpers import assert_matches
from gdnzoo.reference import reference_outputs
from conftest import DEVICE

GEOMS = [(4, 8), (8, 16), (16, 32), (16, 64)]
STATE = [torch.float32, torch.bfloat16]
# Backends that compile per input signature get the cycle only (seconds per compile).
CYCLE_ONLY = {"pt-compiled"}


def _cycle(B):
    """Every combination of (state dtype, l2norm, T, mode), geometries round-robin."""
    combos = itertools.product(STATE, (False, True), (1, 2), ("inplace", "dest"))
    return [dict(geom=GEOMS[i % len(GEOMS)], sd=sd, l2=l2, T=T, mode=m, B=B, seed=100 + i)
            for i, (sd, l2, T, m) in enumerate(combos)]


def _cases():
    if DEVICE == "cpu":
        return [dict(c, tier="cycle") for c in _cycle(B=2)]
    full = [dict(geom=g, sd=sd, l2=l2, T=T, mode=m, B=B, seed=i, tier="full")
            for i, (g, sd, l2, T, m, B) in enumerate(itertools.product(
                GEOMS, STATE, (False, True), (1, 2, 4), ("inplace", "dest"), (1, 33)))]
    large = [dict(geom=(4, 8), sd=sd, l2=False, T=1, mode=m, B=B, seed=900 + i, tier="full")
             for i, (sd, m, B) in enumerate(itertools.product(STATE, ("inplace", "dest"), (128, 512)))]
    return [dict(c, tier="cycle") for c in _cycle(B=3)] + full + large


CASES = _cases()


def _id(c):
    sd = "fp32" if c["sd"] == torch.float32 else "bf16"
    return (f"{c['tier']}-h{c['geom'][0]}x{c['geom'][1]}-B{c['B']}-T{c['T']}-{sd}"
            f"{'-l2' if c['l2'] else ''}-{c['mode']}")


@functools.lru_cache(maxsize=8)
def _reference(i):
    c = CASES[i]
    H, HV = c["geom"]
    x = make_inputs(B=c["B"], T=c["T"], H=H, HV=HV, K=128, V=128, state_dtype=c["sd"],
                    device=DEVICE, seed=c["seed"])
    return x, reference_outputs(x, c["l2"])


RAN = set()


@pytest.mark.parametrize("i", range(len(CASES)), ids=[_id(c) for c in CASES])
@pytest.mark.parametrize("backend", registry.load_registry().names)
def test_backend_matches_reference(backend, i):
    c = CASES[i]
    ok, why = registry.availability(backend, DEVICE)
    if not ok:
        pytest.skip(f"{backend} unavailable: {why}")
    if backend in CYCLE_ONLY and c["tier"] != "cycle":
        pytest.skip(f"{backend} compiles per signature: runs the cycle cases only")
    x0, (ref_out, ref_state) = _reference(i)
    x = x0.clone()
    sel_problem, _ = gdnzoo.contract.validate(*x.args(), use_qk_l2norm=c["l2"])
    if c["mode"] == "dest":
        sel_problem = sel_problem.__class__(**{**sel_problem.__dict__, "inplace": False})
    ok, why = registry.can_serve(backend, sel_problem)
    if not ok:
        pytest.skip(f"{backend} cannot serve {_id(c)}: {why}")

    out = torch.full(ref_out.shape, float("nan"), dtype=x.v.dtype, device=DEVICE)
    new_state = torch.full_like(x.state, float("nan")) if c["mode"] == "dest" else None
    r_out, r_state = gdnzoo.decode(*x.args(), out=out, new_state=new_state,
                                   use_qk_l2norm=c["l2"], algo=backend)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert r_out is out
    assert r_state is (new_state if c["mode"] == "dest" else x.state)
    assert_matches(r_out, r_state, ref_out, ref_state, c["sd"], f"{backend} {_id(c)}")
    for name in ("q", "k", "v", "A_log", "a", "dt_bias", "b"):
        assert torch.equal(getattr(x, name), getattr(x0, name)), f"{backend} modified input {name}"
    if c["mode"] == "dest":
        assert torch.equal(x.state, x0.state), f"{backend} modified state in dest-passing mode"
    RAN.add(backend)


def test_every_available_backend_ran():
    avail = [b.name for b in gdnzoo.list_backends(DEVICE) if b.available]
    missing = [n for n in avail if n not in RAN]
    assert not missing, f"available backends that never ran a matrix case: {missing}"

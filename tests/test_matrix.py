"""One matrix: every registered backend against the float64 reference, output and state.

Backends join by being registered.  A backend that cannot run here, or cannot serve a case,
is skipped with its reason; the last test asserts that every available backend actually ran.
On a CUDA machine the full matrix runs; on CPU a smaller cycle over the same factors (Triton
kernels run through the interpreter there).
"""
import dataclasses
import functools
import itertools

import pytest
import torch

import gdnzoo
from gdnzoo import registry
from gdnzoo.inputs import make_inputs
from helpers import assert_gated
from gdnzoo.reference import reference_outputs
from conftest import DEVICE, SELECTED_MATRIX_BACKENDS

GEOMS = [(4, 8), (8, 16), (16, 32), (16, 64)]
STATE = [torch.float32, torch.bfloat16]
# Backends that compile per input signature get the cycle only (seconds per compile).
CYCLE_ONLY = {"pt-compiled"}


def _cycle(Bs):
    """Every combination of (state dtype, l2norm, T, mode), geometries and batch sizes ``Bs``
    round-robin."""
    combos = itertools.product(STATE, (False, True), (1, 2), ("inplace", "dest"))
    return [dict(geom=GEOMS[i % len(GEOMS)], sd=sd, l2=l2, T=T, mode=m, B=Bs[i % len(Bs)],
                 seed=100 + i) for i, (sd, l2, T, m) in enumerate(combos)]


def _cases():
    if DEVICE == "cpu":
        # B = 1 and 2 in turn: one sequence is a shape of its own to a compiler (pt-compiled's
        # inductor miscompiled B = 1, T = 2 in place on CPU, torch 2.13)
        return [dict(c, tier="cycle") for c in _cycle((1, 2))]
    full = [dict(geom=g, sd=sd, l2=l2, T=T, mode=m, B=B, seed=i, tier="full")
            for i, (g, sd, l2, T, m, B) in enumerate(itertools.product(
                GEOMS, STATE, (False, True), (1, 2, 4), ("inplace", "dest"), (1, 33)))]
    large = [dict(geom=(4, 8), sd=sd, l2=False, T=1, mode=m, B=B, seed=900 + i, tier="full")
             for i, (sd, m, B) in enumerate(itertools.product(STATE, ("inplace", "dest"), (128, 512)))]
    # the longest dense decode step the FLA entry points take (gdnzoo.integrations.fla's
    # DECODE_MAX_T), at a real geometry
    many = [dict(geom=(16, 32), sd=sd, l2=True, T=128, mode="dest", B=2, seed=950 + i,
                 tier="full") for i, sd in enumerate(STATE)]
    return [dict(c, tier="cycle") for c in _cycle((3,))] + full + large + many


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
@pytest.mark.parametrize("backend", registry.names())
def test_backend_matches_reference(backend, i):
    c = CASES[i]
    ok, why = registry.availability(backend, DEVICE)
    if not ok:
        pytest.skip(f"{backend} unavailable: {why}")
    if backend in CYCLE_ONLY and c["tier"] != "cycle":
        pytest.skip(f"{backend} compiles per signature: runs the cycle cases only")
    x0, ref = _reference(i)
    p, _ = gdnzoo.contract.validate(*x0.args(), use_qk_l2norm=c["l2"])
    ok, why = registry.can_serve(backend, dataclasses.replace(p, inplace=c["mode"] != "dest"))
    if not ok:
        pytest.skip(f"{backend} cannot serve {_id(c)}: {why}")

    def call(*args, out, new_state, use_qk_l2norm):
        r_out, r_state = gdnzoo.decode(*args, out=out, new_state=new_state,
                                       use_qk_l2norm=use_qk_l2norm, algo=backend)
        assert r_out is out and r_state is (args[3] if new_state is None else new_state), \
            "decode returned other tensors"
        return r_out, r_state

    # The gate: NaN-prefilled outputs, both rules on output and state, no input modified,
    # state untouched with destination passing.
    assert_gated(call, x0.clone(), f"{backend} {_id(c)}", dest=c["mode"] == "dest",
                 use_qk_l2norm=c["l2"], ref=ref)
    RAN.add(backend)


def _runs_a_case(backend) -> bool:
    """Whether one of ``backend``'s matrix cases runs (and passes) in this process: the first
    that is not skipped."""
    for i in range(len(CASES)):
        try:
            test_backend_matches_reference(backend, i)
            return True
        except pytest.skip.Exception:
            continue
    return False


def test_every_available_backend_ran():
    """Every available backend whose cases this run selected ran at least one (a run split by
    -k checks the backends it selected).  Under pytest-xdist this worker may have run none of a
    backend's cases: it then runs them here until one is not skipped."""
    avail = [b.name for b in gdnzoo.list_backends(DEVICE, op="decode") if b.available]
    x = make_inputs(B=1, device=DEVICE)
    dense, _ = gdnzoo.contract.validate(*x.args())
    # A backend that serves pools only (vllm-packed, the peer) has no dense case to run.
    missing = [n for n in avail if n in SELECTED_MATRIX_BACKENDS and n not in RAN
               and registry.can_serve(n, dense)[0] and not _runs_a_case(n)]
    assert not missing, f"available backends whose matrix cases all skipped: {missing}"

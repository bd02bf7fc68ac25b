"""Warm calls launch from the data pointers decode read for its overlap check (a launcher's
``with_pointers``): each of several calls with one signature but fresh tensors must compute on
its own tensors, in place, with destination passing, and with out allocated by decode."""
import pytest
import torch

import gdnzoo
from gdnzoo import registry
from gdnzoo.inputs import make_inputs
from gdnzoo.reference import reference_outputs
from conftest import DEVICE
from helpers import assert_matches

NAMES = [n for n in registry.names() if n != "vllm-packed"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ("inplace", "dest", "out-none"))
def test_each_warm_call_uses_its_own_tensors(name, mode):
    B = 2 if DEVICE == "cpu" else 5
    x0 = make_inputs(B=B, HV=8, device=DEVICE, seed=0)
    p, _ = gdnzoo.contract.validate(*x0.args())
    ok, why = registry.can_serve(name, p)
    if not ok:
        pytest.skip(f"{name}: {why}")
    for seed in range(4):                      # the first call binds, later ones are warm
        x = make_inputs(B=B, HV=8, device=DEVICE, seed=seed)
        ref_out, ref_state = reference_outputs(x)
        kw = {}
        if mode != "out-none":
            kw["out"] = torch.full(ref_out.shape, float("nan"), dtype=x.v.dtype, device=DEVICE)
        if mode == "dest":
            kw["new_state"] = torch.full_like(x.state, float("nan"))
        before = x.state.clone()
        out, new_state = gdnzoo.decode(*x.args(), algo=name, **kw)
        if mode == "dest":
            assert new_state is kw["new_state"] and torch.equal(x.state, before)
        else:
            assert new_state is x.state
        assert_matches(out, new_state, ref_out, ref_state, x.state.dtype,
                       f"{name} {mode} call {seed}")

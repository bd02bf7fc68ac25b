"""gdnzoo.prefill captured in a CUDA graph and replayed with new data (new q, k, v, gates and
states, and new cu_seqlens values of the same shape: other lengths, a zero-length sequence
moved) gives, bit for bit, what an eager call on that data gives: for every prefill backend
whose call never syncs with the host.  The others read cu_seqlens on the host in every call,
which no graph can hold (HOST_READERS, with the reason)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import gdnzoo
from gdnzoo import registry
from gdnzoo.inputs import make_prefill_inputs

HAS_CUDA = torch.cuda.is_available()
HOST_READERS = {
    "pt-reference": "loops over the sequences of cu_seqlens on the host",
    "pt-compiled": "loops over the sequences of cu_seqlens on the host",
    "fla-upstream": "FLA's chunk reads cu_seqlens on the host in every call",
}
LENGTHS = ([130, 0, 64, 200], [64, 200, 130, 0])    # the same T and N, other boundaries
# The pool form: each replay's read/write slots of a pool of 6, padding (-1) included.
SLOTS = ([5, -1, 0, 2], [1, 3, -1, 4], [5, -1, 0, 2])


def _inputs(seed, lengths, pool=False):
    """The inputs; with ``pool`` their state is a pool of 6 slots (SLOTS name the sequences')."""
    x = make_prefill_inputs(lengths, H=2, HV=4, K=128, V=128, device="cuda", seed=seed)
    if pool:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = dataclasses.replace(x, state=0.05 * torch.randn(
            (6,) + tuple(x.state.shape[1:]), device="cuda", generator=gen))
    return x


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("form", ["inplace", "dest", "pdl", "pool"])
@pytest.mark.parametrize("backend", registry.names("prefill"))
def test_prefill_graph_replays_with_new_data_and_new_cu_seqlens(backend, form):
    """In place, destination passing, with PDL (in place) where the backend declares it (the
    launches become programmatic edges of the graph), and in place in a pool whose slots change
    from replay to replay (padding included)."""
    if backend in HOST_READERS:
        pytest.skip(f"{backend} cannot be captured: {HOST_READERS[backend]}")
    ok, why = registry.availability(backend, "cuda", "prefill")
    if not ok:
        pytest.skip(f"{backend} unavailable here: {why}")
    spec = registry.spec(backend, "prefill")
    pdl, pools = spec.features.get("pdl"), spec.features.get("pools")
    if form == "pool" and pools is not True:
        pytest.skip(f"{backend} cannot serve pools: {pools}")
    if form == "pdl" and (pdl is not True or torch.cuda.get_device_capability() < (9, 0)):
        pytest.skip(f"{backend}: no PDL here ({pdl if pdl is not True else 'cc < 9.0'})")
    dest, pool = form == "dest", form == "pool"
    bufs = _inputs(1, LENGTHS[0], pool)
    slots = torch.tensor(SLOTS[0], dtype=torch.int32, device="cuda")
    out = torch.empty_like(bufs.v)
    new_state = torch.empty_like(bufs.state) if dest else None

    def call(x, out, new_state, idx):
        return gdnzoo.prefill(*x.args(), out=out, new_state=new_state, use_qk_l2norm=True,
                              algo=backend, pdl="wait" if form == "pdl" else None,
                              state_indices=idx if pool else None)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(bufs, out, new_state, slots.clone())    # compiles and caches outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(bufs, out, new_state, slots)
    for seed, lengths, new_slots in ((2, LENGTHS[1], SLOTS[1]), (3, LENGTHS[0], SLOTS[2])):
        y = _inputs(seed, lengths, pool)
        for name in ("q", "k", "v", "A_log", "a", "dt_bias", "b", "state", "cu_seqlens"):
            getattr(bufs, name).copy_(getattr(y, name))
        slots.copy_(torch.tensor(new_slots, dtype=torch.int32))
        out.fill_(float("nan"))
        if dest:
            new_state.fill_(float("nan"))
        graph.replay()
        want_state = torch.full_like(y.state, float("nan")) if dest else y.state.clone()
        want = torch.full_like(out, float("nan"))
        call(y if dest else dataclasses.replace(y, state=want_state), want,
             want_state if dest else None, slots.clone())
        torch.cuda.synchronize()
        got_state = new_state if dest else bufs.state
        assert torch.equal(out, want), f"{backend}: replay with {lengths}: outputs differ"
        assert torch.equal(got_state, want_state), f"{backend}: replay with {lengths}: states"

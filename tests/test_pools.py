"""State pools through gdnzoo.decode, for every backend that claims them (registry ``pools:
true``), against the float64 reference: out, the written slots, and the whole pool storage
(page gaps included) bit-identical everywhere else.  Backends that do not claim pools must
refuse them with their reason, leaving the pool untouched.
"""
import itertools

import pytest
import torch

import gdnzoo
from gdnzoo import gate, registry
from gdnzoo.reference import reference_outputs
from conftest import DEVICE

# vllm-packed (the peer) serves only vLLM's packed layout and padding: tests/test_integrations.py.
CLAIMING = [n for n, s in registry.load_registry().op().backends.items()
            if s.pools is True and n != "vllm-packed"]
REFUSING = [n for n, s in registry.load_registry().op().backends.items() if s.pools is not True]
# Backends that compile per signature, or run in the Triton interpreter on CPU, get fewer cases.
SLOW = {"pt-compiled"} | ({"fla-recurrent", "fla-tma", "vllm-packed"} if DEVICE == "cpu" else set())


def _cases():
    combos = itertools.product((torch.float32, torch.bfloat16), (1, 3), (None, "neg", "null"),
                               ("same", "separate", "other"))
    out = []
    for i, (sd, T, pad, write) in enumerate(combos):
        geom = [(4, 8), (2, 8), (4, 4)][i % 3]
        out.append(dict(sd=sd, T=T, pad=pad, write=write, H=geom[0], HV=geom[1],
                        l2=bool(i % 2), idx=(torch.int32, torch.int64)[i // 2 % 2],
                        B=(3 if DEVICE == "cpu" else (1, 5, 64)[i % 3]), seed=i))
    return out


CASES = _cases()


def _id(c):
    return (f"{'fp32' if c['sd'] == torch.float32 else 'bf16'}-T{c['T']}-B{c['B']}-"
            f"h{c['H']}x{c['HV']}-{c['pad'] or 'nopad'}-{c['write']}-"
            f"{'i64' if c['idx'] == torch.int64 else 'i32'}{'-l2' if c['l2'] else ''}")


def _usable(name, case):
    ok, why = registry.availability(name, DEVICE)
    if not ok:
        pytest.skip(f"{name} unavailable here: {why}")
    p, _ = gdnzoo.contract.validate(*case.x.args(), use_qk_l2norm=False, **case.kwargs())
    ok, why = registry.can_serve(name, p)
    if not ok:
        pytest.skip(f"{name} cannot serve this case: {why}")


def written_slots(case):
    """{write slot: sequence} of the sequences whose state must be written."""
    P = case.x.state.shape[0]
    PN = P if case.dest is None else case.dest.shape[0]
    pool = case.pool()
    r, w = pool.read.tolist(), pool.write.tolist()
    pad = lambda s, n: s < 0 or s >= n or s == pool.null_slot     # noqa: E731
    return {w[n]: n for n in range(len(r)) if not pad(r[n], P) and not pad(w[n], PN)}


def check_pool_call(name, case, l2, what):
    """Run decode through ``name`` on NaN-filled out; assert out, written slots and the
    untouched rest of every pool storage."""
    x = case.x
    target, target_buf = (x.state, case.buf) if case.dest is None else (case.dest, case.dest_buf)
    ref_out, ref_pool = reference_outputs(x, use_qk_l2norm=l2, pool=case.pool(),
                                          new_pool=case.dest)
    src_before, target_before = case.buf.clone(), target_buf.clone()
    inputs_before = [t.clone() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)]
    out = torch.full(ref_out.shape, float("nan"), dtype=x.v.dtype, device=x.q.device)
    gdnzoo.decode(*x.args(), out=out, use_qk_l2norm=l2, algo=name, **case.kwargs())
    if x.q.is_cuda:
        torch.cuda.synchronize()
    slots = written_slots(case)
    rows = sorted(slots)
    got = target[rows] if rows else target[:0]
    j = gate.judge(out, got, ref_out, ref_pool[rows] if rows else ref_pool[:0],
                   state_dtype=target.dtype)
    assert j.ok, f"{what}: {j.reason}"
    pool = case.pool()
    P = x.state.shape[0]
    for n, s in enumerate(pool.read.tolist()):
        if s < 0 or s >= P or s == pool.null_slot:
            assert torch.equal(out[n], torch.zeros_like(out[n])), f"{what}: padded row {n}"
    # Everything outside the written slots' blocks is bit-identical, page gaps included.
    keep = torch.ones_like(target_buf, dtype=torch.bool)
    page = target.stride(0)
    block = target.shape[1] * target.shape[2] * target.shape[3]
    for s in rows:
        keep[s * page:s * page + block] = False
    assert torch.equal(target_buf[keep], target_before[keep]), f"{what}: pool written outside"
    if case.dest is not None:
        assert torch.equal(case.buf, src_before), f"{what}: source pool modified"
    for t, before in zip((x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias), inputs_before):
        assert torch.equal(t, before), f"{what}: an input was modified"


@pytest.mark.parametrize("name", CLAIMING)
@pytest.mark.parametrize("c", CASES, ids=_id)
def test_pool_matrix(name, c, pool_case):
    if name in SLOW and c["seed"] % 6:
        pytest.skip(f"{name}: every sixth case only (compiles per signature or runs in the "
                    f"Triton interpreter here)")
    case = pool_case(B=c["B"], T=c["T"], H=c["H"], HV=c["HV"], state_dtype=c["sd"],
                     seed=c["seed"], pad=c["pad"], separate_write=c["write"] == "separate",
                     other_pool=c["write"] == "other", index_dtype=c["idx"])
    _usable(name, case)
    check_pool_call(name, case, c["l2"], f"{name} {_id(c)}")


@pytest.mark.parametrize("name", CLAIMING)
def test_index_past_pool_is_padding(name, pool_case):
    case = pool_case(B=3, seed=7, out_of_range=True)
    _usable(name, case)
    check_pool_call(name, case, False, f"{name} index >= P")


@pytest.mark.parametrize("name", REFUSING)
def test_refusing_backends_say_why(name, pool_case):
    case = pool_case(B=2, seed=3)
    before = case.buf.clone()
    with pytest.raises(ValueError, match="cannot serve"):
        gdnzoo.decode(*case.x.args(), algo=name, **case.kwargs())
    assert torch.equal(case.buf, before)


def test_automatic_choice_serves_pools(pool_case):
    case = pool_case(B=2, seed=5, pad="neg")
    sel = gdnzoo.select(*case.x.args(), **case.kwargs())
    assert registry.load_registry().op().backends[sel.name].pools is True
    check_pool_call(sel.name, case, True, f"automatic ({sel.name})")


def test_host_index_check(monkeypatch, pool_case):
    """GDNZOO_CHECK_INDICES=1: an index >= P and a shared write slot raise, naming them; off,
    the same calls run (>= P is padding)."""
    case = pool_case(B=3, seed=11, out_of_range=True)
    monkeypatch.setenv("GDNZOO_CHECK_INDICES", "1")
    before = case.buf.clone()
    with pytest.raises(ValueError, match=r"state_indices\[2\]"):
        gdnzoo.decode(*case.x.args(), algo="pt-reference", **case.kwargs())
    assert torch.equal(case.buf, before)
    dup = pool_case(B=3, seed=12, separate_write=True)
    dup.new_idx[2] = dup.new_idx[0]
    with pytest.raises(ValueError, match=r"new_state_indices\[2\].*sequence 0"):
        gdnzoo.decode(*dup.x.args(), algo="pt-reference", **dup.kwargs())
    monkeypatch.setenv("GDNZOO_CHECK_INDICES", "0")
    gdnzoo.decode(*case.x.args(), algo="pt-reference", **case.kwargs())

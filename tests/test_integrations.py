"""The engine adapters (gdnzoo.integrations.vllm / .sglang) and the vllm-packed peer.

Inputs are laid out as the engines pass them: q, k, v packed in the rows of one ``mixed_qkv``
(row stride larger than a row, nonzero storage offset), a and b strided views of one [B, 2*HV]
tensor, the state a page-strided pool with random values in the page gaps.  Every call is checked
against the float64 reference: ``out``, the written slots, zeros for padded sequences and the whole
pool storage bit-identical outside the written slots.  vLLM pads with index <= 0 (slot 0 is its
null block), SGLang with index < 0 (slot 0 is a real slot).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect

import pytest
import torch

import gdnzoo
from gdnzoo import gate, integrations, registry
from gdnzoo.inputs import Inputs, distinct_slots, make_inputs, make_problem, packed, paged_pool
from gdnzoo.integrations import sglang as sglang_adapter, vllm as vllm_adapter
from gdnzoo.pool import Pool
from gdnzoo.reference import reference_outputs
from conftest import DEVICE
from helpers import record

ADAPTERS = {"vllm": vllm_adapter, "sglang": sglang_adapter}


@dataclasses.dataclass
class Packed:
    """One engine call's arguments, and the same call as gdnzoo Inputs for the reference."""
    mixed_qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    scale: float
    pool: torch.Tensor           # [P, HV, V, K], page-strided view of buf
    buf: torch.Tensor            # the pool's whole storage, page gaps included
    rows: torch.Tensor           # mixed_qkv's whole storage
    ab: torch.Tensor             # a's and b's storage
    idx: torch.Tensor
    engine: str
    x: Inputs                    # q/k/v sliced from mixed_qkv by hand, a/b [B, 1, HV]

    def args(self, out, l2):
        return (self.mixed_qkv, self.a, self.b, self.A_log, self.dt_bias, self.scale, self.pool,
                out, self.idx, l2)

    @property
    def null_slot(self):
        return 0 if self.engine == "vllm" else -1

    def padded(self, n):
        s = int(self.idx[n])
        return s < 0 or s == self.null_slot or s >= self.pool.shape[0]

    def written(self):
        return sorted(int(self.idx[n]) for n in range(len(self.idx)) if not self.padded(n))


def make_packed(engine, B=3, H=2, HV=4, K=32, V=64, state_dtype=torch.float32, seed=0,
                zero_slot=True, device=DEVICE):
    """Sequence 1 pads (vLLM: slot 0; SGLang: -1).  With ``zero_slot`` and B > 2, sequence 2
    is the other convention's case (vLLM: -1, padding; SGLang: slot 0, a real slot)."""
    x0 = make_inputs(B=B, T=1, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    pk = packed(x0, lead=8, trail=16, gen=gen)          # a row of 24 elements more than q|k|v
    P = 2 * B + 3
    pool = paged_pool(P, HV, V, K, dtype=state_dtype, device=device, gen=gen)
    idx = distinct_slots(P, B, gen)
    if B > 1:
        idx[1] = 0 if engine == "vllm" else -1
    if B > 2 and zero_slot:
        idx[2] = -1 if engine == "vllm" else 0
    pk = pk.to(device)
    x = Inputs(*pk.args(pool.state))
    return Packed(pk.mixed, pk.a2, pk.b2, pk.A_log, pk.dt_bias, pk.scale, pool.state, pool.buf,
                  pk.rows, pk.ab, idx.to(torch.int32).to(device), engine, x)


def nan_out(c):
    B, HV, V = c.mixed_qkv.shape[0], c.A_log.shape[0], c.pool.shape[2]
    return torch.full((B, 1, HV, V), float("nan"), dtype=c.mixed_qkv.dtype,
                      device=c.mixed_qkv.device)


def unwritten(c):
    """[len(buf)] bool: the pool storage outside the written slots' blocks (page gaps too)."""
    keep = torch.ones_like(c.buf, dtype=torch.bool)
    page, block = c.pool.stride(0), c.pool[0].numel()
    for s in c.written():
        keep[s * page:s * page + block] = False
    return keep


def check_adapter_call(c, algo, l2, what):
    """One adapter call on NaN-filled out against the float64 reference; asserts out, written
    slots, zero padded rows, the rest of the pool storage and the inputs untouched."""
    ref_out, ref_pool = reference_outputs(c.x, use_qk_l2norm=l2,
                                          pool=Pool(c.idx, c.idx, c.null_slot))
    buf_before, rows_before, ab_before = c.buf.clone(), c.rows.clone(), c.ab.clone()
    out = nan_out(c)
    r_out, r_state = ADAPTERS[c.engine].packed_decode(*c.args(out, l2), algo=algo)
    assert r_out is out and r_state is c.pool, f"{what}: returned other tensors"
    slots = c.written()
    j = gate.judge(out, c.pool[slots], ref_out, ref_pool[slots], state_dtype=c.pool.dtype)
    assert j.ok, f"{what}: {j.reason}"
    for n in range(out.shape[0]):
        if c.padded(n):
            assert torch.equal(out[n], torch.zeros_like(out[n])), f"{what}: padded row {n}"
    keep = unwritten(c)
    assert torch.equal(c.buf[keep], buf_before[keep]), f"{what}: pool written outside its slots"
    assert torch.equal(c.rows, rows_before) and torch.equal(c.ab, ab_before), \
        f"{what}: an input was modified"


def _pools_ready(name):
    """(usable, why not) for a backend on this device with a pool."""
    ok, why = registry.availability(name, DEVICE)
    if not ok:
        return False, f"{name} unavailable here: {why}"
    run = registry.backend_module(name).run
    if "pool" not in inspect.signature(run).parameters:
        return False, f"{name}'s pool support is not in this tree yet"
    return True, ""


# ------------------------------------------------------------------ views, no copies

def test_views_share_mixed_qkv_storage():
    c = make_packed("vllm", H=2, HV=4, K=32, V=64)
    out = nan_out(c)
    q, k, v, a, b = integrations.packed_views(c.mixed_qkv, c.a, c.b, c.A_log, c.pool, out)
    es, HK = c.mixed_qkv.element_size(), 2 * 32
    base = c.mixed_qkv.data_ptr()
    for t, at in ((q, 0), (k, HK), (v, 2 * HK)):
        assert t.untyped_storage().data_ptr() == c.rows.untyped_storage().data_ptr()
        assert t.data_ptr() == base + at * es
    for t, src in ((a, c.a), (b, c.b)):
        assert t.data_ptr() == src.data_ptr() and tuple(t.shape) == (3, 1, 4)
        assert t.untyped_storage().data_ptr() == c.ab.untyped_storage().data_ptr()
    for mine, by_hand in ((q, c.x.q), (k, c.x.k), (v, c.x.v)):
        assert mine.shape == by_hand.shape and torch.equal(mine, by_hand)


def test_views_run_no_copy_op():
    """Splitting is views only: the profiler sees no op but as_strided / unsqueeze."""
    c = make_packed("sglang")
    out = nan_out(c)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        integrations.packed_views(c.mixed_qkv, c.a, c.b, c.A_log, c.pool, out)
    names = {e.name for e in prof.events()}
    assert names and names <= {"aten::as_strided", "aten::unsqueeze"}, names


@pytest.mark.parametrize("bad,frag", [
    ("width", "mixed_qkv: last dim"), ("rank", "mixed_qkv: expected"),
    ("stride", "mixed_qkv: expected the last dim contiguous"), ("heads", "does not divide"),
    ("A_log", "A_log"), ("state", "initial_state"), ("a", "a: expected"), ("out", "out: expected")])
@pytest.mark.parametrize("engine", ADAPTERS)
def test_inconsistent_shapes_name_the_argument(engine, bad, frag):
    c = make_packed(engine, device="cpu")
    out = nan_out(c)
    args = list(c.args(out, False))
    W = c.mixed_qkv.shape[1]
    if bad == "width":
        args[0] = c.rows[:, 8:8 + W - 1]
    elif bad == "rank":
        args[0] = c.mixed_qkv[None]
    elif bad == "stride":
        args[0] = torch.zeros(3, 2 * W, dtype=c.mixed_qkv.dtype)[:, ::2]
    elif bad == "heads":      # H = 3 q/k heads of K=32 for HV=4
        args[0] = torch.zeros(3, 2 * 3 * 32 + 4 * 64, dtype=c.mixed_qkv.dtype)
    elif bad == "A_log":
        args[3] = c.A_log[None]
    elif bad == "state":
        args[6] = c.pool[:, :2]
    elif bad == "a":
        args[1] = c.a[:2]
    elif bad == "out":
        args[7] = out[:, 0]
    before = c.buf.clone()
    with pytest.raises(ValueError, match=frag):
        ADAPTERS[engine].packed_decode(*args, algo="pt-reference")
    assert torch.equal(c.buf, before)


# ------------------------------------------------------------------ against the reference

GEOMS = [(2, 4), (1, 2), (2, 2)]          # (H, HV): GVA 2x, 2x, none
CPU_ALGOS = ["pt-reference", "fla-recurrent"]
GPU_ALGOS = [None, "pt-reference", "fla-recurrent", "cuda-v4"]


def _cases():
    out = []
    for i, engine in enumerate(ADAPTERS):
        for j, sd in enumerate((torch.float32, torch.bfloat16)):
            for l2 in (False, True):
                n = len(out)
                out.append(dict(engine=engine, sd=sd, l2=l2, geom=GEOMS[n % 3], seed=n,
                                B=(3 if DEVICE == "cpu" else (3, 17, 64)[n % 3])))
    return out


def _id(c):
    sd = "fp32" if c["sd"] == torch.float32 else "bf16"
    return f"{c['engine']}-{sd}-h{c['geom'][0]}x{c['geom'][1]}-B{c['B']}{'-l2' if c['l2'] else ''}"


@pytest.mark.parametrize("algo", CPU_ALGOS if DEVICE == "cpu" else GPU_ALGOS)
@pytest.mark.parametrize("case", _cases(), ids=_id)
def test_adapter_matches_reference(case, algo):
    if algo is not None:
        ok, why = _pools_ready(algo)
        if not ok:
            pytest.skip(why)
    # fla-recurrent takes K = V in (64, 128, 256); pt-reference also checks K != V.
    K, V = (64, 64) if algo == "fla-recurrent" or DEVICE != "cpu" else (32, 64)
    H, HV = case["geom"]
    c = make_packed(case["engine"], B=case["B"], H=H, HV=HV, K=K, V=V, state_dtype=case["sd"],
                    seed=case["seed"])
    check_adapter_call(c, algo, case["l2"], f"{_id(case)} algo={algo}")


@pytest.mark.parametrize("engine", ADAPTERS)
def test_adapter_padding_rules(engine):
    """vLLM: 0 and -1 pad; SGLang: -1 pads and slot 0 is read and written."""
    c = make_packed(engine, B=4, seed=5)
    assert int(c.idx[1]) == (0 if engine == "vllm" else -1)
    assert int(c.idx[2]) == (-1 if engine == "vllm" else 0)
    check_adapter_call(c, "pt-reference", True, f"{engine} padding")
    assert (0 in c.written()) == (engine == "sglang")


# ------------------------------------------------------------------ the vllm-packed peer

def _problem(**kw):
    return make_problem(**{"B": 4, "pool": True, **kw})


@pytest.mark.parametrize("kw,frag", [(dict(pool=False), "state_indices"),
                                     (dict(inplace=False), "in place"),
                                     (dict(device="cpu", cc=None), "CUDA")])
def test_vllm_packed_refuses_what_the_problem_shows(kw, frag):
    mod = registry.backend_module("vllm-packed")
    assert mod.supports(_problem()) == (True, "")
    ok, why = mod.supports(_problem(**kw))
    assert not ok and frag in why


def test_vllm_packed_available_names_what_is_missing(monkeypatch):
    mod = registry.backend_module("vllm-packed")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "vllm" else real(n, *a))
    ok, why = mod.available("cuda")
    assert not ok and "vllm" in why


def _bind(c, pool, q=None, k=None, v=None):
    x = c.x
    out = nan_out(c)
    rec = record(x.q if q is None else q, x.k if k is None else k, x.v if v is None else v,
                 x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, x.state, False,
                 Pool(c.idx, c.idx, -1) if pool is None else pool)
    return registry.backend_module("vllm-packed").bind(
        rec if pool is not None else rec._replace(pool=None))


@pytest.mark.parametrize("what,frag", [("null_slot", "null_slot must be 0"),
                                       ("write", "new_state_indices"),
                                       ("unpacked", "packed mixed_qkv"),
                                       ("dense", "slot indices")])
def test_vllm_packed_bind_says_why_it_cannot_serve(what, frag):
    """What only the tensors show is refused when binding, before vLLM is even imported."""
    c = make_packed("vllm", device="cpu")
    pool = Pool(c.idx, c.idx, 0)
    if what == "null_slot":
        pool = Pool(c.idx, c.idx, -1)
    elif what == "write":
        pool = Pool(c.idx, c.idx.clone(), 0)
    elif what == "dense":
        pool = None
    loose = make_inputs(B=3, H=2, HV=4, K=32, V=64) if what == "unpacked" else None
    with pytest.raises(ValueError, match=f"vllm-packed cannot serve.*{frag}"):
        if loose is None:
            _bind(c, pool)
        else:
            _bind(c, pool, loose.q, loose.k, loose.v)


def _vllm_packed_usable():
    ok, why = registry.availability("vllm-packed", DEVICE)
    if not ok:
        pytest.skip(f"vllm-packed unavailable here: {why}")


@pytest.mark.parametrize("case", [c for c in _cases() if c["engine"] == "vllm"], ids=_id)
def test_vllm_packed_matches_reference(case):
    _vllm_packed_usable()
    H, HV = case["geom"]
    c = make_packed("vllm", B=case["B"], H=H, HV=HV, K=128, V=128, state_dtype=case["sd"],
                    seed=case["seed"])
    check_adapter_call(c, "vllm-packed", case["l2"], f"vllm-packed {_id(case)}")


@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("engine", ADAPTERS)
def test_adapters_match_vllm_packed(engine, sd):
    """Each adapter on its automatic choice against vLLM's kernel through gdnzoo (the SGLang
    case without slot 0, which vLLM pads), and vllm-packed bit-identical to vLLM's own call."""
    _vllm_packed_usable()
    c = make_packed(engine, B=33, H=4, HV=8, K=128, V=128, state_dtype=sd, seed=21,
                    zero_slot=False)
    buf0 = c.buf.clone()
    outs, bufs = [], []
    for adapter, algo in ((ADAPTERS[engine], None), (vllm_adapter, "vllm-packed"), (None, None)):
        c.buf.copy_(buf0)
        out = nan_out(c)
        if adapter is None:      # vLLM's function itself, as vLLM calls it
            registry.backend_module("vllm-packed")._kernel()(*c.args(out, True))
        else:
            adapter.packed_decode(*c.args(out, True), algo=algo)
        outs.append(out)
        bufs.append(c.buf.clone())
    assert torch.equal(outs[1], outs[2]) and torch.equal(bufs[1], bufs[2])
    assert gate.compare(outs[0], outs[1]).ok and gate.compare(bufs[0], bufs[1]).ok
    pad = [n for n in range(33) if c.padded(n)]
    assert pad and all(torch.equal(o[pad], torch.zeros_like(o[pad])) for o in outs)
    keep = unwritten(c)
    assert all(torch.equal(f[keep], buf0[keep]) for f in bufs)


def test_vllm_packed_refuses_at_call_time():
    """SGLang's padding rule, new_state_indices, and q/k/v that are not one packed row (also
    after a packed call of the same strides was memoized) raise before any kernel runs."""
    _vllm_packed_usable()
    c = make_packed("vllm", B=4, K=128, V=128, seed=3)
    before = c.buf.clone()
    with pytest.raises(ValueError, match="cannot serve"):
        sglang_adapter.packed_decode(*c.args(nan_out(c), False), algo="vllm-packed")
    x = c.x
    with pytest.raises(ValueError, match="cannot serve"):
        gdnzoo.decode(*x.args(), algo="vllm-packed", state_indices=c.idx,
                      new_state_indices=c.idx.clone(), null_slot=0)
    assert torch.equal(c.buf, before)

    def call(q, k, v):
        return gdnzoo.decode(q, k, v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                             out=nan_out(c), algo="vllm-packed", state_indices=c.idx, null_slot=0)
    call(x.q, x.k, x.v)                                 # packed: served, and memoized
    after = c.buf.clone()
    other = [make_packed("vllm", B=4, K=128, V=128, seed=s) for s in (4, 5)]
    with pytest.raises(ValueError, match="cannot serve.*behind q"):
        call(x.q, other[0].x.k, other[1].x.v)           # the same strides, three storages
    assert torch.equal(c.buf, after)


# ------------------------------------------------------------------ kernels launched

def _kernels(fn):
    fn()
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("algo", [None, "vllm-packed", "fla-recurrent", "cuda-v4"])
@pytest.mark.parametrize("engine", ADAPTERS)
def test_adapter_launches_what_decode_launches(engine, algo):
    """An adapter call launches exactly the kernels of the same gdnzoo.decode call."""
    if DEVICE != "cuda":
        pytest.skip("counts CUDA kernels: needs a CUDA device")
    if algo is not None:
        ok, why = _pools_ready(algo)
        if not ok:
            pytest.skip(why)
    if engine == "sglang" and algo == "vllm-packed":
        pytest.skip("vllm-packed cannot serve SGLang's padding rule (tested above)")
    c = make_packed(engine, B=16, H=4, HV=8, K=128, V=128, seed=9, zero_slot=False)
    out = nan_out(c)
    q, k, v, a, b = integrations.packed_views(c.mixed_qkv, c.a, c.b, c.A_log, c.pool, out)
    null = 0 if engine == "vllm" else None
    via_adapter = _kernels(lambda: ADAPTERS[engine].packed_decode(*c.args(out, True), algo=algo))
    via_decode = _kernels(lambda: gdnzoo.decode(
        q, k, v, c.pool, c.A_log, a, c.dt_bias, b, c.scale, out=out, use_qk_l2norm=True,
        algo=algo, state_indices=c.idx, null_slot=null))
    assert via_adapter and via_adapter == via_decode

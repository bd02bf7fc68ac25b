"""Every bad call raises before any kernel runs, naming the argument, and leaves every argument
bit-identical: cold (nothing memoized), and again right after a valid call of the same shapes and
mode (so decode's memo, its guards or its Python signature, has that call): a memo may skip
work, never a check.  Both memo layers are tried (guards on, and off as without dynamo)."""
import math

import numpy as np
import pytest
import torch

import gdnzoo
from gdnzoo import dispatch, guards
from gdnzoo.inputs import make_inputs
from helpers import served_twice

B, T, H, HV, K, V = 2, 1, 2, 4, 16, 8
P = 6                                        # pool slots
IO = torch.bfloat16


def carve(buf, offset, shape, dtype):
    """A contiguous ``dtype`` tensor of ``shape`` at byte ``offset`` of the uint8 ``buf``."""
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return buf[offset:offset + n].view(dtype).view(shape)


def base(out=False, dest=False, pool=None, verify=None, **kw):
    """Valid keyword arguments of gdnzoo.decode (``kw`` added to them).  ``pool``: None
    (dense), "same" (in place at state_indices), "sep" (new_state_indices too) or "other"
    (another pool written).  ``verify``: "states" (intermediate states, no final update) or
    "slots" (per-token slots [B, T] with num_accepted_tokens; a pool)."""
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, seed=0)
    d = dict(q=x.q, k=x.k, v=x.v, state=x.state, A_log=x.A_log, a=x.a, dt_bias=x.dt_bias,
             b=x.b, scale=x.scale, algo="pt-reference")
    if out:
        d["out"] = torch.full((B, T, HV, V), float("nan"), dtype=IO)
    if dest:
        d["new_state"] = torch.full_like(x.state, float("nan"))
    if pool:
        d["state"] = torch.randn(P, HV, V, K)
        d["state_indices"] = torch.tensor([3, 1], dtype=torch.int32)
        if pool == "sep":
            d["new_state_indices"] = torch.tensor([4, 0], dtype=torch.int32)
        if pool == "other":
            d["new_state"] = torch.full((P + 1, HV, V, K), float("nan"))
    if verify == "states":
        d.update(intermediate_states=torch.zeros(3, T + 1, HV, V, K),
                 intermediate_indices=torch.tensor([2, 0], dtype=torch.int32),
                 update_state=False)
    elif verify == "slots":
        d.update(state=torch.randn(P, HV, V, K), num_accepted_tokens=torch.ones(B, dtype=torch.int32),
                 state_indices=torch.arange(1, B * T + 1, dtype=torch.int32).view(B, T))
    d.update(kw)
    return d


def _set(**kw):
    return lambda d: d.update(kw)


def _map(name, f):
    return lambda d: d.update({name: f(d[name])})


def _overlap(first, second, offset=0):
    """``first`` and ``second`` carved from one buffer (zeros), ``second`` starting
    ``offset`` bytes after ``first`` starts (negative: before)."""
    def mutate(d):
        x, y = d[first], d[second]
        nx, ny = x.numel() * x.element_size(), y.numel() * y.element_size()
        at_x, at_y = max(0, -offset), max(0, offset)
        buf = torch.zeros(max(at_x + nx, at_y + ny) + 64, dtype=torch.uint8)
        d[first] = carve(buf, at_x, tuple(x.shape), x.dtype)
        d[second] = carve(buf, at_y, tuple(y.shape), y.dtype)
    return mutate


def _dense_layout(name):          # the same values, strides of a transposed copy
    return _map(name, lambda x: x.transpose(-1, -2).contiguous().transpose(-1, -2))


def _expanded(name):              # batch stride 0: every sequence shares one row
    return _map(name, lambda x: x[:1].expand(x.shape))


def _bad_strides(d):               # out's HV axis steps less than V: elements share memory
    o = d["out"]
    d["out"] = torch.zeros(o.numel(), dtype=o.dtype).as_strided(o.shape, (HV * V, HV * V, 4, 1))


def _requires_grad(name):
    return _map(name, lambda x: x.clone().requires_grad_(True))


def _sparse(name):
    return _map(name, lambda x: x.to_sparse())


def _pool_stride(d):               # slots closer than one slot: they overlap
    s = d["state"]
    d["state"] = torch.zeros(s.numel()).as_strided(s.shape, (V * K,) + s.stride()[1:])


def _meta_all(d):
    for n, x in list(d.items()):
        if isinstance(x, torch.Tensor):
            d[n] = x.to("meta")


def _zero_tokens(d):
    for n in ("q", "k", "v", "a", "b", "out"):
        d[n] = d[n][:, :0]


def _heads_3(d):
    d["q"], d["k"] = (torch.zeros(B, T, 3, K, dtype=IO) for _ in range(2))


D, O, DEST, L2 = {}, dict(out=True), dict(dest=True), dict(use_qk_l2norm=True)
POOL, SEP, OTHER = dict(pool="same"), dict(pool="sep"), dict(pool="other")
VS, VP, VSL = dict(verify="states"), dict(pool="same", verify="states"), dict(verify="slots")
CASES = [
    # (id, structure of the valid call, how to make it bad, exception, message fragments)
    ("q list", D, _set(q=[1.0]), TypeError, ["q:", "torch.Tensor", "list"]),
    ("k None", D, _set(k=None), TypeError, ["k:", "torch.Tensor", "NoneType"]),
    ("v numpy", D, _map("v", lambda x: np.zeros(tuple(x.shape))), TypeError, ["v:", "ndarray"]),
    ("state float", D, _set(state=0.0), TypeError, ["state:", "float"]),
    ("A_log list", D, _set(A_log=[0.0] * HV), TypeError, ["A_log:", "list"]),
    ("a tuple", D, _set(a=(1,)), TypeError, ["a:", "tuple"]),
    ("dt_bias int", D, _set(dt_bias=1), TypeError, ["dt_bias:", "int"]),
    ("b str", D, _set(b="b"), TypeError, ["b:", "str"]),
    ("out list", O, _set(out=[0.0]), TypeError, ["out:", "list"]),
    ("new_state float", DEST, _set(new_state=1.0), TypeError, ["new_state:", "float"]),
    ("q sparse", D, _sparse("q"), TypeError, ["q:", "dense", "sparse_coo"]),
    ("state sparse", D, _sparse("state"), TypeError, ["state:", "dense"]),
    ("state requires grad", D, _requires_grad("state"), ValueError,
     ["state:", "requires_grad", "detach"]),
    ("q requires grad", D, _requires_grad("q"), ValueError, ["q:", "requires_grad"]),
    ("A_log requires grad", D, _requires_grad("A_log"), ValueError, ["A_log:", "requires_grad"]),
    ("out requires grad", O, _requires_grad("out"), ValueError, ["out:", "requires_grad"]),
    ("new_state requires grad", DEST, _requires_grad("new_state"), ValueError,
     ["new_state:", "requires_grad"]),
    ("q rank", D, _map("q", lambda x: x[0]), ValueError, ["q:", "rank 4", "rank 3"]),
    ("k shape", D, _map("k", lambda x: x[:, :, :1]), ValueError, ["k:", "(2, 1, 2, 16)"]),
    ("v batch", D, _map("v", lambda x: x[:1]), ValueError, ["v:", "B=2"]),
    ("v tokens", D, _map("v", lambda x: torch.cat([x, x], 1)), ValueError, ["v:", "T=1"]),
    ("HV % H", D, _heads_3, ValueError, ["HV % H", "HV=4", "H=3"]),
    ("zero tokens", O, _zero_tokens, ValueError, ["every dimension but B must be >= 1"]),
    ("state shape", D, _map("state", lambda x: x[..., :8]), ValueError,
     ["state:", "(2, 4, 8, 16)", "(2, 4, 8, 8)"]),
    ("state rank", D, _map("state", lambda x: x[0]), ValueError, ["state:", "rank 4"]),
    ("A_log shape", D, _map("A_log", lambda x: x[:2]), ValueError, ["A_log:", "(4,)", "(2,)"]),
    ("dt_bias shape", D, _map("dt_bias", lambda x: x[None]), ValueError, ["dt_bias:", "rank 1"]),
    ("a shape", D, _map("a", lambda x: x[:, :, :2]), ValueError, ["a:", "(2, 1, 4)"]),
    ("b rank", D, _map("b", lambda x: x[0]), ValueError, ["b:", "rank 3"]),
    ("out shape", O, _map("out", lambda x: x[..., :7]), ValueError, ["out:", "(2, 1, 4, 8)"]),
    ("new_state shape", DEST, _map("new_state", lambda x: x[:1]), ValueError,
     ["new_state:", "(2, 4, 8, 16)"]),
    ("q fp32", D, _map("q", lambda x: x.float()), TypeError, ["q:", "bf16 or fp16", "fp32"]),
    ("k fp16", D, _map("k", lambda x: x.half()), TypeError, ["k:", "same as q"]),
    ("v fp16", D, _map("v", lambda x: x.half()), TypeError, ["v:", "same as q"]),
    ("a fp32", D, _map("a", lambda x: x.float()), TypeError, ["a:", "bf16 or fp16"]),
    ("b int", D, _map("b", lambda x: x.int()), TypeError, ["b:", "int32"]),
    ("A_log fp64", D, _map("A_log", lambda x: x.double()), TypeError, ["A_log:", "fp64"]),
    ("dt_bias fp16", D, _map("dt_bias", lambda x: x.half()), TypeError, ["dt_bias:", "fp16"]),
    ("state fp16", D, _map("state", lambda x: x.half()), TypeError, ["state:", "fp32 or bf16"]),
    ("state fp64", D, _map("state", lambda x: x.double()), TypeError, ["state:", "fp64"]),
    ("out dtype", O, _map("out", lambda x: x.float()), TypeError, ["out:", "same as v"]),
    ("new_state dtype", DEST, _map("new_state", lambda x: x.to(torch.bfloat16)), TypeError,
     ["new_state:", "same as state"]),
    ("state on meta", D, _map("state", lambda x: x.to("meta")), ValueError,
     ["state:", "device cpu", "meta"]),
    ("A_log on meta", D, _map("A_log", lambda x: x.to("meta")), ValueError, ["A_log:", "meta"]),
    ("out on meta", O, _map("out", lambda x: x.to("meta")), ValueError, ["out:", "meta"]),
    ("all on meta", O, _meta_all, ValueError, ["q:", "cpu or cuda", "meta"]),
    ("q K strided", D, _dense_layout("q"), ValueError, ["q:", "K axis"]),
    ("k K strided", D, _dense_layout("k"), ValueError, ["k:", "K axis"]),
    ("v V strided", D, _dense_layout("v"), ValueError, ["v:", "V axis"]),
    ("state K strided", D, _dense_layout("state"), ValueError, ["state:", "K axis"]),
    ("out V strided", O, _dense_layout("out"), ValueError, ["out:", "V axis"]),
    ("new_state K strided", DEST, _dense_layout("new_state"), ValueError, ["new_state:", "K axis"]),
    ("state expanded in place", D, _expanded("state"), ValueError,
     ["state:", "internal overlap", "(0, "]),
    ("out expanded", O, _expanded("out"), ValueError, ["out:", "internal overlap"]),
    ("new_state expanded", DEST, _expanded("new_state"), ValueError,
     ["new_state:", "internal overlap"]),
    ("out strides overlap", O, _bad_strides, ValueError, ["out:", "internal overlap"]),
    ("new_state overlaps state", DEST, _overlap("state", "new_state", 64), ValueError,
     ["new_state:", "overlaps state"]),
    ("out overlaps state", O, _overlap("state", "out", 1024), ValueError,
     ["out:", "disjoint from state"]),
    ("out overlaps new_state", dict(out=True, dest=True), _overlap("new_state", "out"),
     ValueError, ["out:", "disjoint from new_state"]),
    ("out is v", O, lambda d: d.update(out=d["v"]), ValueError, ["out:", "disjoint from v"]),
    ("out last element on q", O, _overlap("out", "q", B * T * HV * V * 2 - 2), ValueError,
     ["out:", "disjoint from q"]),
    ("out overlaps k", O, _overlap("k", "out", 32), ValueError, ["out:", "disjoint from k"]),
    ("out overlaps a", O, _overlap("out", "a", 6), ValueError, ["out:", "disjoint from a"]),
    ("out overlaps b", O, _overlap("b", "out", -8), ValueError, ["out:", "disjoint from b"]),
    ("out overlaps A_log", O, _overlap("out", "A_log"), ValueError,
     ["out:", "disjoint from A_log"]),
    ("out overlaps dt_bias", O, _overlap("out", "dt_bias", 20), ValueError,
     ["out:", "disjoint from dt_bias"]),
    ("state in place overlaps q", D, _overlap("state", "q", 100), ValueError,
     ["state:", "disjoint from q", "in place"]),
    ("state in place overlaps v", O, _overlap("state", "v", 4000), ValueError,
     ["state:", "disjoint from v"]),
    ("state in place overlaps a", D, _overlap("a", "state", -2), ValueError,
     ["state:", "disjoint from a"]),
    ("new_state overlaps b", DEST, _overlap("new_state", "b", 512), ValueError,
     ["new_state:", "disjoint from b"]),
    ("new_state overlaps A_log", DEST, _overlap("new_state", "A_log", 8), ValueError,
     ["new_state:", "disjoint from A_log"]),
    ("new_state overlaps dt_bias", DEST, _overlap("dt_bias", "new_state", -4), ValueError,
     ["new_state:", "disjoint from dt_bias"]),
    ("new_state overlaps k", DEST, _overlap("new_state", "k", 2000), ValueError,
     ["new_state:", "disjoint from k"]),
    ("scale negative", D, _set(scale=-1.0), ValueError, ["scale:", ">= 0", "-1.0"]),
    ("scale nan", D, _set(scale=float("nan")), ValueError, ["scale:", "finite"]),
    ("scale inf", D, _set(scale=float("inf")), ValueError, ["scale:", "finite"]),
    ("scale str", dict(scale=0.25), _set(scale="0.25"), TypeError, ["scale:", "float", "str"]),
    ("scale True", dict(scale=1.0), _set(scale=True), TypeError, ["scale:", "bool"]),
    ("scale numpy bool", dict(scale=1.0), _set(scale=np.bool_(True)), TypeError,
     ["scale:", "bool"]),
    ("scale complex", D, _set(scale=0.25j), TypeError, ["scale:", "complex"]),
    ("scale list", D, _set(scale=[0.25]), TypeError, ["scale:", "list"]),
    ("scale 2 elements", D, _set(scale=torch.ones(2)), ValueError, ["scale:", "(2,)"]),
    ("use_qk_l2norm 1", L2, _set(use_qk_l2norm=1), TypeError, ["use_qk_l2norm:", "bool", "int"]),
    ("use_qk_l2norm 0", D, _set(use_qk_l2norm=0), TypeError, ["use_qk_l2norm:", "int"]),
    ("use_qk_l2norm None", D, _set(use_qk_l2norm=None), TypeError, ["use_qk_l2norm:"]),
    ("use_qk_l2norm numpy", L2, _set(use_qk_l2norm=np.bool_(True)), TypeError,
     ["use_qk_l2norm:", "numpy.bool"]),
    ("use_qk_l2norm list", D, _set(use_qk_l2norm=[]), TypeError, ["use_qk_l2norm:", "list"]),
    ("algo unknown", D, _set(algo="nope"), ValueError, ["unknown backend 'nope'", "pt-reference"]),
    ("algo empty", D, _set(algo=""), ValueError, ["algo:", "''", "pt-reference"]),
    ("algo list", D, _set(algo=["pt-reference"]), TypeError, ["algo:", "list", "pt-reference"]),
    ("algo int", D, _set(algo=3), TypeError, ["algo:", "int"]),
    ("algo cannot serve", D, _set(algo="cuda-v1"), ValueError, ["cuda-v1", "cannot serve"]),
    # pools
    ("indices float", POOL, _map("state_indices", lambda x: x.float()), TypeError,
     ["state_indices:", "int32 or int64", "float32"]),
    ("indices int16", POOL, _map("state_indices", lambda x: x.short()), TypeError,
     ["state_indices:", "int16"]),
    ("indices too long", POOL, _map("state_indices", lambda x: torch.cat([x, x[:1]])),
     ValueError, ["state_indices:", "(2,)", "(3,)"]),
    ("indices 2-D not [B, T]", POOL, _map("state_indices", lambda x: torch.stack([x, x], 1)),
     ValueError, ["state_indices:", "(2, 1)", "[B, T]", "(2, 2)"]),
    ("indices strided", POOL, _map("state_indices", lambda x: torch.stack([x, x], 1)[:, 0]),
     ValueError, ["state_indices:", "contiguous"]),
    ("indices on meta", POOL, _map("state_indices", lambda x: x.to("meta")), ValueError,
     ["state_indices:", "meta"]),
    ("indices list", POOL, _set(state_indices=[3, 1]), TypeError, ["state_indices:", "list"]),
    ("indices sparse", POOL, _sparse("state_indices"), TypeError, ["state_indices:", "dense"]),
    ("new indices dtype", SEP, _map("new_state_indices", lambda x: x.double()), TypeError,
     ["new_state_indices:", "float64"]),
    ("new indices shape", SEP, _map("new_state_indices", lambda x: x[:1]), ValueError,
     ["new_state_indices:", "(1,)"]),
    ("null_slot True", dict(pool="same", null_slot=1), _set(null_slot=True), TypeError,
     ["null_slot:", "bool"]),
    ("null_slot float", dict(pool="same", null_slot=1), _set(null_slot=1.0), TypeError,
     ["null_slot:", "float"]),
    ("null_slot str", POOL, _set(null_slot="0"), TypeError, ["null_slot:", "str"]),
    ("null_slot past pool", POOL, _set(null_slot=P), ValueError, ["null_slot:", f"P={P}"]),
    ("null_slot negative", POOL, _set(null_slot=-2), ValueError, ["null_slot:", "-2"]),
    ("pool slots overlap", POOL, _pool_stride, ValueError, ["state:", "slots would overlap"]),
    ("pool slot strided", POOL, _dense_layout("state"), ValueError, ["state:", "K axis"]),
    ("pool expanded", POOL, _expanded("state"), ValueError, ["state:", "slots would overlap"]),
    ("pool requires grad", POOL, _requires_grad("state"), ValueError, ["state:", "requires_grad"]),
    ("other pool shape", OTHER, _map("new_state", lambda x: x[..., :8]), ValueError,
     ["new_state:", "pool"]),
    ("new indices without pool", D, _set(new_state_indices=torch.zeros(B, dtype=torch.int32)),
     ValueError, ["new_state_indices:", "state_indices=None"]),
    ("null_slot without pool", D, _set(null_slot=0), ValueError, ["null_slot:", "state_indices"]),
    ("out overlaps pool", dict(pool="same", out=True), _overlap("state", "out", 4096),
     ValueError, ["out:", "disjoint from state"]),
    ("out overlaps indices", dict(pool="same", out=True), _overlap("out", "state_indices", 8),
     ValueError, ["out:", "disjoint from state_indices"]),
    ("pool overlaps indices", POOL, _overlap("state", "state_indices", 4000), ValueError,
     ["state:", "disjoint from state_indices"]),
    ("pool overlaps new indices", SEP, _overlap("state", "new_state_indices", 16), ValueError,
     ["state:", "disjoint from new_state_indices"]),
    ("other pool overlaps pool", OTHER, _overlap("new_state", "state", 64), ValueError,
     ["new_state:", "overlaps state"]),
    ("other pool overlaps indices", OTHER, _overlap("new_state", "state_indices", 8), ValueError,
     ["new_state:", "disjoint from state_indices"]),
    ("pool overlaps q", POOL, _overlap("state", "q", 256), ValueError,
     ["state:", "disjoint from q"]),
    # speculative verify
    ("inter list", VS, _set(intermediate_states=[0.0]), TypeError,
     ["intermediate_states:", "list"]),
    ("inter dtype", VS, _map("intermediate_states", lambda x: x.bfloat16()), TypeError,
     ["intermediate_states:", "same as state"]),
    ("inter T_max < T", VS, _map("intermediate_states", lambda x: x[:, :0]), ValueError,
     ["intermediate_states:", "T_max >= T=1"]),
    ("inter heads", VS, _map("intermediate_states", lambda x: x[:, :, :2]), ValueError,
     ["intermediate_states:", "HV=4"]),
    ("inter block strided", VS, _dense_layout("intermediate_states"), ValueError,
     ["intermediate_states:", "contiguous"]),
    ("inter rows overlap", VS, _map("intermediate_states", lambda x: x.as_strided(
        x.shape, (HV * V * K,) + x.stride()[1:])), ValueError, ["intermediate_states:", "rows"]),
    ("inter requires grad", VS, _requires_grad("intermediate_states"), ValueError,
     ["intermediate_states:", "grad"]),
    ("inter indices alone", D, _set(intermediate_indices=torch.zeros(B, dtype=torch.int32)),
     ValueError, ["intermediate_indices:", "intermediate_states=None"]),
    ("inter indices float", VS, _map("intermediate_indices", lambda x: x.float()), TypeError,
     ["intermediate_indices:", "float32"]),
    ("inter indices length", VS, _map("intermediate_indices", lambda x: x[:1]), ValueError,
     ["intermediate_indices:", "(2,)"]),
    ("update_state int", VS, _set(update_state=0), TypeError, ["update_state:", "bool", "int"]),
    ("update_state None", D, _set(update_state=None), TypeError, ["update_state:", "NoneType"]),
    ("no update with new_state", VS, lambda d: d.update(new_state=torch.zeros_like(d["state"])), ValueError,
     ["new_state:", "update_state=False"]),
    ("accepted without slots", POOL, _set(num_accepted_tokens=torch.ones(B, dtype=torch.int32)),
     ValueError, ["num_accepted_tokens:", "[B, T]"]),
    ("accepted float", VSL, _map("num_accepted_tokens", lambda x: x.float()), TypeError,
     ["num_accepted_tokens:", "float32"]),
    ("accepted length", VSL, _map("num_accepted_tokens", lambda x: x[:1]), ValueError,
     ["num_accepted_tokens:", "(2,)"]),
    ("slots with inter", VSL, _set(intermediate_states=torch.zeros(3, T, HV, V, K)),
     ValueError, ["intermediate_states:", "per-token"]),
    ("slots without update", VSL, _set(update_state=False), ValueError,
     ["update_state:", "per-token"]),
    ("slots with new indices", VSL, _set(new_state_indices=torch.zeros(B, dtype=torch.int32)),
     ValueError, ["new_state_indices:", "per-token"]),
    ("slots columns", VSL, _map("state_indices", lambda x: torch.cat([x, x], 1)), ValueError,
     ["state_indices:", "(2, 1)", "(2, 2)"]),
    ("inter overlaps pool", VP, _overlap("state", "intermediate_states", 512), ValueError,
     ["intermediate_states:", "disjoint from state"]),
    ("inter overlaps q", VS, _overlap("intermediate_states", "q", 64), ValueError,
     ["intermediate_states:", "disjoint from q"]),
    ("out overlaps inter", dict(out=True, verify="states"),
     _overlap("intermediate_states", "out", 128), ValueError,
     ["out:", "disjoint from intermediate_states"]),
    ("inter overlaps its indices", VS, _overlap("intermediate_states", "intermediate_indices", 8),
     ValueError, ["intermediate_states:", "disjoint from intermediate_indices"]),
    ("slots overlap accepted", VSL, _overlap("state", "num_accepted_tokens", 8), ValueError,
     ["state:", "disjoint from num_accepted_tokens"]),
    ("pdl int", D, _set(pdl=1), TypeError, ["pdl:", "'wait'", "int"]),
    ("pdl bool", D, _set(pdl=True), TypeError, ["pdl:", "bool"]),
    ("pdl list", D, _set(pdl=["wait"]), TypeError, ["pdl:", "list"]),
    ("pdl unknown", D, _set(pdl="sometimes"), ValueError, ["pdl:", "'early'", "'sometimes'"]),
    ("pdl empty", POOL, _set(pdl=""), ValueError, ["pdl:", "''"]),
    ("pdl on pt-reference", D, _set(pdl="wait"), ValueError,
     ["'pt-reference' cannot serve", "pdl-wait", "programmatic dependent launch"]),
    ("pdl early in a pool", POOL, _set(pdl="early"), ValueError,
     ["'pt-reference' cannot serve", "programmatic dependent launch (pdl='early')"]),
]


def _snapshot(d):
    """{name: a copy of its bits} of every tensor argument (meta tensors have none)."""
    snap = {}
    for n, x in d.items():
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            y = x.detach()
            y = y.to_dense() if y.layout != torch.strided else y
            snap[n] = y.contiguous().view(torch.uint8).clone() if y.dim() else y.clone()
    return snap


def _same_bits(before, d):
    return all(torch.equal(before[n], _snapshot({n: d[n]})[n]) for n in before)


def _bad_call(d):
    before = _snapshot(d)
    with pytest.raises((TypeError, ValueError)) as ei:
        gdnzoo.decode(**d)
    assert _same_bits(before, d), "a rejected call changed an argument"
    return type(ei.value), str(ei.value)


@pytest.fixture(params=["guards", "signature"])
def memo(request, monkeypatch):
    """decode's memo, emptied; "signature": as in a process without dynamo's guards."""
    monkeypatch.setattr(dispatch, "_MEMO", {})
    if request.param == "signature":
        monkeypatch.setitem(guards._state, "ok", False)
    elif not guards.available():
        pytest.skip(f"torch {torch.__version__}: dynamo TensorGuards failed the self-test")
    return request.param


@pytest.mark.parametrize("what,shape,mutate,exc,frags", CASES, ids=[c[0] for c in CASES])
def test_bad_call_cold_and_warm(what, shape, mutate, exc, frags, memo):
    bad = base(**shape)
    mutate(bad)
    cold = _bad_call(bad)
    assert cold[0] is exc, f"{what}: {cold}"
    for f in frags:
        assert f in cold[1], f"message {cold[1]!r} lacks {f!r}"
    good = base(**shape)
    served_twice(lambda: gdnzoo.decode(**good))
    warm = _bad_call(bad)
    assert warm == cold, f"{what}: cold {cold}, after a valid call {warm}"
    gdnzoo.decode(**base(**shape))                 # and the memo still serves valid calls


def test_reproductions_from_the_report():
    """The calls of the report, verbatim in spirit: out inside new_state, a stride-0 state,
    out=v; each refused with the argument named."""
    x = make_inputs(B=4)
    ns = torch.empty_like(x.state)
    o = ns.view(torch.bfloat16).view(-1)[:4096].view(4, 1, 8, 128)
    with pytest.raises(ValueError, match="out: expected memory disjoint from new_state"):
        gdnzoo.decode(*x.args(), out=o, new_state=ns)
    st = x.state[:1].expand(4, 8, 128, 128)
    for algo in ("pt-reference", None):
        with pytest.raises(ValueError, match="state: .*internal overlap"):
            gdnzoo.decode(*x.args()[:3], st, *x.args()[4:], algo=algo)
    with pytest.raises(ValueError, match="out: expected memory disjoint from v"):
        gdnzoo.decode(*x.args(), out=x.v)


@pytest.mark.parametrize("shape", [O, dict(out=True, dest=True), dict(pool="sep", out=True)],
                         ids=["out", "dest", "pool"])
def test_neighbours_in_one_buffer_are_accepted(shape, memo):
    """No false overlap: written and read tensors packed back to back in one buffer (touching,
    not overlapping) are served, cold and warm, with the reference's result."""
    from gdnzoo.reference import reference_outputs
    from gdnzoo.pool import Pool
    for _ in range(2):
        d = base(**shape)
        names = [n for n, x in d.items() if isinstance(x, torch.Tensor)]
        sizes = [d[n].numel() * d[n].element_size() for n in names]
        buf = torch.zeros(sum(sizes), dtype=torch.uint8)
        at = 0
        for n, size in zip(names, sizes):
            x = d[n]
            d[n] = carve(buf, at, tuple(x.shape), x.dtype)
            d[n].copy_(x)
            at += size
        x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, seed=0)
        x.state = d["state"].clone()
        pool = None
        if "state_indices" in d:
            pool = Pool(d["state_indices"], d["new_state_indices"], -1)
        ref_out, _ = reference_outputs(x, pool=pool)
        out, _ = gdnzoo.decode(**d)
        torch.testing.assert_close(out.float(), ref_out.float(), atol=2e-2, rtol=2e-2)


def test_many_pointer_sets_keep_being_checked(monkeypatch):
    """decode remembers the data pointers it found free of overlaps, a bounded number per
    signature; past that bound, and after it, an overlapping call is still refused."""
    monkeypatch.setattr(dispatch, "_DISJOINT_MAX", 4)
    keep = [base(out=True) for _ in range(7)]
    for d in keep:
        gdnzoo.decode(**d)
    for d in keep:                     # seen before, some forgotten since: all still served
        gdnzoo.decode(**d)
    bad = base(out=True)
    _overlap("state", "out", 8)(bad)
    assert _bad_call(bad)[1].startswith("out: expected memory disjoint from state")


def test_bad_algo_env_cold_and_warm(monkeypatch, memo):
    d = base()
    d.pop("algo")
    monkeypatch.setenv("ALGO", "pt-reference")
    gdnzoo.decode(**d)
    monkeypatch.setenv("ALGO", "nope")
    cold = _bad_call(d)
    assert cold[0] is ValueError and "ALGO env: unknown backend 'nope'" in cold[1]
    assert _bad_call(d) == cold


@pytest.mark.parametrize("value,exc,frag", [
    ("sometimes", ValueError, "GDNZOO_PDL: expected one of 'off', 'wait', 'early', got 'sometimes'"),
    ("wait", ValueError, "cannot launch with programmatic dependent launch (pdl='wait')")])
def test_bad_pdl_env_cold_and_warm(monkeypatch, memo, value, exc, frag):
    """GDNZOO_PDL is what a pdl of None means: a bad value, or a level the backend cannot
    launch, is refused naming it, whether or not the same call was served before."""
    d = base()
    monkeypatch.setenv("GDNZOO_PDL", "off")
    gdnzoo.decode(**d)
    monkeypatch.setenv("GDNZOO_PDL", value)
    cold = _bad_call(d)
    assert cold[0] is exc and frag in cold[1], cold
    assert _bad_call(d) == cold
    assert gdnzoo.decode(**d, pdl="off")[0] is not None     # an explicit pdl wins over the variable


@pytest.mark.parametrize("form", ["dense", "pool", "dest"])
def test_an_empty_batch_is_a_no_op(form):
    """Engines issue empty batches (B = 0): decode returns at once, nothing touched, cold and
    memoized; commit's empty batch likewise."""
    x = make_inputs(B=0, T=2, H=2, HV=4, K=16, V=16)
    pool = torch.randn(3, 4, 16, 16)
    before = pool.clone()
    kw = {}
    state = x.state
    if form == "pool":
        state, kw = pool, dict(state_indices=torch.zeros(0, dtype=torch.int32), null_slot=0)
    if form == "dest":
        kw = dict(new_state=torch.empty_like(x.state))
    for _ in range(2):
        out, ns = gdnzoo.decode(*x.args()[:3], state, *x.args()[4:], **kw)
        assert out.shape == (0, 2, 4, 16)
    assert torch.equal(pool, before)
    inter = torch.randn(2, 2, 4, 16, 16)
    assert gdnzoo.commit(inter, None, torch.zeros(0, dtype=torch.int64), pool,
                         torch.zeros(0, dtype=torch.int64)) is pool
    assert torch.equal(pool, before)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_pdl_request_nobody_serves_runs_without_it(monkeypatch, how):
    """Running without PDL is always correct: the automatic choice drops a request that no
    backend serves here (this CPU) and says so; only an explicit algo that cannot refuses."""
    x = make_inputs(B=2, T=2, H=2, HV=4, K=16, V=16)
    kw = {"pdl": "wait"} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("GDNZOO_PDL", "early")
    sel = gdnzoo.select(*x.args(), **kw)
    assert sel.problem is not None and sel.problem.pdl == "" and "launched without it" in sel.reason
    ref = gdnzoo.decode(*x.clone().args(), pdl="off")
    for _ in range(2):                                         # cold and memoized
        got = gdnzoo.decode(*x.clone().args(), **kw)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    with pytest.raises(ValueError, match="cannot launch with programmatic dependent launch"):
        gdnzoo.decode(*x.clone().args(), algo="pt-reference", **kw)

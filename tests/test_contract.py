"""Every validation failure raises a clear error naming the argument, before any kernel runs."""
import pytest
import torch

import gdnzoo
from gdnzoo import dispatch, registry
from gdnzoo.inputs import make_inputs


def base():
    return make_inputs(B=2, T=1, H=2, HV=4, K=16, V=8, seed=0)


def args_of(x):
    return dict(q=x.q, k=x.k, v=x.v, state=x.state, A_log=x.A_log, a=x.a, dt_bias=x.dt_bias,
                b=x.b, scale=x.scale)


def _overlapping_pair(d):
    n = d["state"].numel()
    buf = torch.zeros(n + 16)
    buf[:n] = d["state"].reshape(-1)
    d.update(state=buf[:n].view(d["state"].shape), new_state=buf[16:].view(d["state"].shape))


CASES = [
    # (what to change, exception, fragments the message must contain)
    ("q rank", lambda d: d.update(q=d["q"][0]), ValueError, ["q:", "rank 4", "rank 3"]),
    ("q dtype", lambda d: d.update(q=d["q"].float()), TypeError, ["q:", "bf16 or fp16", "fp32"]),
    ("k shape", lambda d: d.update(k=d["k"][:, :, :1]), ValueError, ["k:", "(2, 1, 2, 16)", "(2, 1, 1, 16)"]),
    ("k dtype", lambda d: d.update(k=d["k"].half()), TypeError, ["k:", "bf16", "fp16"]),
    ("v batch", lambda d: d.update(v=d["v"][:1]), ValueError, ["v:", "B=2"]),
    ("v dtype", lambda d: d.update(v=d["v"].half()), TypeError, ["v:", "same as q"]),
    ("HV % H", lambda d: d.update(q=torch.zeros(2, 1, 3, 16, dtype=torch.bfloat16),
                                   k=torch.zeros(2, 1, 3, 16, dtype=torch.bfloat16)),
     ValueError, ["HV % H", "HV=4", "H=3"]),
    ("state shape", lambda d: d.update(state=d["state"][:, :, :, :8]), ValueError,
     ["state:", "(2, 4, 8, 16)", "(2, 4, 8, 8)"]),
    ("state dtype", lambda d: d.update(state=d["state"].half()), TypeError,
     ["state:", "fp32 or bf16", "fp16"]),
    ("state K not contiguous", lambda d: d.update(state=d["state"].transpose(2, 3).contiguous().transpose(2, 3)),
     ValueError, ["state:", "K axis", "strides"]),
    ("q K not contiguous", lambda d: d.update(q=d["q"].transpose(2, 3).contiguous().transpose(2, 3)),
     ValueError, ["q:", "K axis"]),
    ("A_log shape", lambda d: d.update(A_log=d["A_log"][:2]), ValueError, ["A_log:", "(4,)", "(2,)"]),
    ("A_log dtype", lambda d: d.update(A_log=d["A_log"].double()), TypeError, ["A_log:", "fp32", "fp64"]),
    ("a shape", lambda d: d.update(a=d["a"][:, :, :2]), ValueError, ["a:", "(2, 1, 4)"]),
    ("a dtype", lambda d: d.update(a=d["a"].float()), TypeError, ["a:", "bf16 or fp16"]),
    ("b rank", lambda d: d.update(b=d["b"][0]), ValueError, ["b:", "rank 3"]),
    ("dt_bias dtype", lambda d: d.update(dt_bias=d["dt_bias"].half()), TypeError,
     ["dt_bias:", "fp32 or bf16", "fp16"]),
    ("scale negative", lambda d: d.update(scale=-1.0), ValueError, ["scale:", ">= 0", "-1.0"]),
    ("scale nan", lambda d: d.update(scale=float("nan")), ValueError, ["scale:", "finite"]),
    ("scale type", lambda d: d.update(scale="x"), TypeError, ["scale:", "float"]),
    ("not a tensor", lambda d: d.update(v=[1, 2]), TypeError, ["v:", "torch.Tensor", "list"]),
    ("out shape", lambda d: d.update(out=torch.empty(2, 1, 4, 7, dtype=torch.bfloat16)), ValueError,
     ["out:", "(2, 1, 4, 8)", "(2, 1, 4, 7)"]),
    ("out dtype", lambda d: d.update(out=torch.empty(2, 1, 4, 8)), TypeError, ["out:", "bf16", "fp32"]),
    ("new_state dtype", lambda d: d.update(new_state=torch.empty(2, 4, 8, 16, dtype=torch.bfloat16)),
     TypeError, ["new_state:", "fp32", "bf16"]),
    ("new_state shape", lambda d: d.update(new_state=torch.empty(1, 4, 8, 16)), ValueError,
     ["new_state:", "(2, 4, 8, 16)"]),
    ("new_state overlaps", lambda d: _overlapping_pair(d), ValueError, ["new_state:", "overlaps"]),
    ("unknown algo", lambda d: d.update(algo="nope"), ValueError,
     ["unknown backend 'nope'", "pt-reference", "cuda-v4"]),
    ("use_qk_l2norm type", lambda d: d.update(use_qk_l2norm=1), TypeError, ["use_qk_l2norm:", "bool"]),
]


@pytest.mark.parametrize("what,mutate,exc,frags", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_clearly_and_leaves_state(what, mutate, exc, frags):
    x = base()
    d = args_of(x)
    mutate(d)
    state = d["state"]
    before = state.clone()
    with pytest.raises(exc) as ei:
        gdnzoo.decode(**d)
    msg = str(ei.value)
    for f in frags:
        assert f in msg, f"message {msg!r} lacks {f!r}"
    assert torch.equal(state, before), "state was modified by a rejected call"


def test_unavailable_algo_names_reason():
    x = base()
    with pytest.raises(ValueError) as ei:
        gdnzoo.decode(*x.args(), algo="cuda-v1")
    msg = str(ei.value)
    assert "cuda-v1" in msg and "cannot serve" in msg and "Available here" in msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to mix devices")
def test_mixed_devices_rejected():
    x = base()
    d = args_of(x)
    d["state"] = d["state"].cuda()
    with pytest.raises(ValueError, match="state: expected device cpu"):
        gdnzoo.decode(**d)


def test_scale_zero_and_none_mean_inv_sqrt_k():
    x = base()
    o1, _ = gdnzoo.decode(*x.clone().args()[:8], None, algo="pt-reference")
    o2, _ = gdnzoo.decode(*x.clone().args()[:8], 0.0, algo="pt-reference")
    o3, _ = gdnzoo.decode(*x.clone().args()[:8], 16 ** -0.5, algo="pt-reference")
    assert torch.equal(o1, o2) and torch.equal(o1, o3)


def test_memoized_decode_sees_a_changed_scale_tensor():
    # decode memoizes validation per signature; a scalar-tensor scale changed in place must not
    # be served from that memo.
    x = base()
    s = torch.tensor(0.25)
    o1, _ = gdnzoo.decode(*x.clone().args()[:8], s, algo="pt-reference")
    s.fill_(0.5)
    o2, _ = gdnzoo.decode(*x.clone().args()[:8], s, algo="pt-reference")
    torch.testing.assert_close(o2.float(), 2 * o1.float(), rtol=1e-2, atol=1e-6)


def test_memoized_decode_follows_the_algo_env(monkeypatch):
    # The same signature resolved under ALGO=a and then ALGO=b must use b the second time.
    calls = []
    real = registry.launcher

    def spy(name, *args, **kw):
        calls.append(name)
        return real(name, *args)
    monkeypatch.setattr(registry, "launcher", spy)
    x = base()
    monkeypatch.setenv("ALGO", "pt-reference")
    gdnzoo.decode(*x.clone().args())
    monkeypatch.setenv("ALGO", "pt-compiled")
    gdnzoo.decode(*x.clone().args())
    assert calls[-2:] == ["pt-reference", "pt-compiled"]


@pytest.mark.parametrize("which", ["out", "new_state"])
def test_memoized_decode_still_refuses_overlapping_buffers(which):
    # The memo skips validate(); the per-call overlap check must still catch an `out` or a
    # `new_state` that lies inside state's memory, with the same signature as a good call.
    x = make_inputs(B=2, T=1, H=2, HV=4, K=16, V=16, state_dtype=torch.bfloat16, seed=3)
    B, T, HV, V = 2, 1, 4, 16
    good = dict(out=torch.empty(B, T, HV, V, dtype=torch.bfloat16),
                new_state=torch.empty_like(x.state))
    gdnzoo.decode(*x.args(), **good, algo="pt-reference")              # memoizes the signature
    flat = x.state.view(-1)
    bad = dict(good)
    if which == "out":
        bad["out"] = flat[7:7 + B * T * HV * V].view(B, T, HV, V)       # dense, same signature
    else:
        bad["new_state"] = flat[:x.state.numel()].view(x.state.shape)[:, :]  # a distinct view
    with pytest.raises(ValueError, match=which):
        gdnzoo.decode(*x.args(), **bad, algo="pt-reference")
    gdnzoo.decode(*x.args(), **good, algo="pt-reference")              # the good call still works


def test_overlap_probes_of_one_shape_keep_their_own_spans():
    # The probe's code is compiled once per shape of the test (which pairs, which slots); each
    # signature binds its own byte spans: an `out` starting on the last byte of the state
    # overlaps it, one byte further it does not, for a small and a large batch alike.
    from gdnzoo import checks
    op = gdnzoo.operation.DECODE
    for B in (1, 6):
        x = make_inputs(B=B, T=1, H=2, HV=4, K=16, V=16, seed=B)
        named = dict(zip(("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"), x.args()[:8]))
        named["out"] = torch.empty_like(x.v)
        probe = checks.overlap_probe(op, named, True)
        ptrs = {n: (i + 1) << 40 for i, n in enumerate(named)}        # far apart
        assert not probe(tuple(ptrs.values()))
        end = ptrs["state"] + checks.byte_span(x.state)
        assert probe(tuple(dict(ptrs, out=end - 1).values()))
        assert not probe(tuple(dict(ptrs, out=end).values()))


def _memo_probe(x, **kw):
    """What decode's memo answers for these inputs (None: it would validate from scratch)."""
    return dispatch.lookup(gdnzoo.operation.DECODE,
                           (*x.args(), kw.get("out"), kw.get("new_state"), False,
                            "pt-reference", *dispatch._NO_SERVE, None,
                            *dispatch._RAW_K_LAST))


def test_memo_guard_serves_only_calls_with_the_same_layout(monkeypatch):
    # The guard replaces the Python signature on the hot path: it must hit for fresh tensors
    # of the same layout, and miss (so decode validates) for any change the signature sees.
    from gdnzoo import guards
    if not guards.available():
        pytest.skip(f"torch {torch.__version__}: dynamo TensorGuards failed the self-test")
    monkeypatch.setattr(dispatch, "_MEMO", {})
    x = base()
    gdnzoo.decode(*x.args(), algo="pt-reference")
    assert not any(isinstance(k[0], str) for k in dispatch._MEMO), \
        "a signature seen once was guarded"
    gdnzoo.decode(*x.clone().args(), algo="pt-reference")        # seen again: guarded
    assert any(isinstance(k[0], str) for k in dispatch._MEMO), "no guard was memoized"
    hit = _memo_probe(x.clone())
    assert hit is not None and hit.guard not in (None, False)
    changed = {
        "state strides": lambda s: s.transpose(2, 3).contiguous().transpose(2, 3),
        "state dtype": lambda s: s.to(torch.float64),
        "state size": lambda s: torch.cat([s, s], 0),
    }
    for what, f in changed.items():
        y = x.clone()
        y.state = f(y.state)
        got = _memo_probe(y)
        assert got is not hit, f"{what} changed, yet the memoized verdict was served"
    # A tensor type the guard did not see (a Parameter) misses the guard, not the signature;
    # requires_grad, which validate refuses, misses both.
    y = x.clone()
    y.q = torch.nn.Parameter(y.q, requires_grad=False)
    assert _memo_probe(y) is hit
    y.q.requires_grad_(True)
    assert _memo_probe(y) is None


def test_decode_without_guards_matches_with_guards(monkeypatch):
    from gdnzoo import guards
    x = base()
    o1, s1 = gdnzoo.decode(*x.clone().args(), algo="pt-reference")
    monkeypatch.setattr(dispatch, "_MEMO", {})
    monkeypatch.setitem(guards._state, "ok", False)
    o2, s2 = gdnzoo.decode(*x.clone().args(), algo="pt-reference")
    o3, s3 = gdnzoo.decode(*x.clone().args(), algo="pt-reference")    # the signature memo
    assert not any(isinstance(k[0], str) for k in dispatch._MEMO)
    assert torch.equal(o1, o2) and torch.equal(o2, o3) and torch.equal(s1, s3)


@pytest.mark.parametrize("name", ["pt-reference", "fla-recurrent"])
def test_a_state_only_read_may_be_expanded(name, device):
    """Destination passing reads state only: a batch stride of 0 (one state for every
    sequence) is served, and matches the same state materialized; written, it is refused."""
    from gdnzoo import registry
    from gdnzoo.reference import reference_outputs
    ok, why = registry.availability(name, device)
    if not ok:
        pytest.skip(f"{name}: {why}")
    x = make_inputs(B=3, T=1, H=1, HV=2, K=64, V=64, seed=5, device=device)
    shared = x.state[:1].expand(x.state.shape)
    ns = torch.empty_like(x.state)
    out, _ = gdnzoo.decode(*x.args()[:3], shared, *x.args()[4:], new_state=ns, algo=name)
    x.state = shared.contiguous()
    ref_out, ref_state = reference_outputs(x)
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ns.cpu(), ref_state.to(ns.dtype).cpu(), atol=1e-4, rtol=1e-3)
    with pytest.raises(ValueError, match="state: .*internal overlap"):
        gdnzoo.decode(*x.args()[:3], shared, *x.args()[4:], algo=name)


def test_out_none_is_a_fresh_empty_like_v():
    """Without out, decode returns a fresh tensor shaped and typed like v: contiguous for v a
    view of a packed mixed_qkv, v's own strides for a dense v; never the same memory twice
    while the first is alive, and equal to the result into a given out."""
    from gdnzoo.inputs import make_inputs
    x = make_inputs(B=3, T=1, H=2, HV=4, K=16, V=16, seed=1)
    qkv = torch.randn(3, 1, 2 * 2 * 16 + 4 * 16, dtype=torch.bfloat16)
    q, k, v = (qkv[..., :32].view(3, 1, 2, 16), qkv[..., 32:64].view(3, 1, 2, 16),
               qkv[..., 64:].view(3, 1, 4, 16))
    s0 = x.state.clone()
    first, _ = gdnzoo.decode(q, k, v, x.state, x.A_log, x.a, x.dt_bias, x.b, algo="pt-reference")
    assert first.shape == v.shape and first.dtype == v.dtype and first.is_contiguous()
    given = torch.empty(3, 1, 4, 16, dtype=torch.bfloat16)
    gdnzoo.decode(q, k, v, s0.clone(), x.A_log, x.a, x.dt_bias, x.b, algo="pt-reference",
                  out=given)
    assert torch.equal(first, given)
    third, _ = gdnzoo.decode(q, k, v, s0.clone(), x.A_log, x.a, x.dt_bias, x.b,
                             algo="pt-reference")
    assert third.data_ptr() != first.data_ptr() and torch.equal(third, first)
    vt = x.v.transpose(0, 1).contiguous().transpose(0, 1)   # dense, batch axis not outermost
    o, _ = gdnzoo.decode(x.q, x.k, vt, x.state, x.A_log, x.a, x.dt_bias, x.b, algo="pt-reference")
    assert o.stride() == vt.stride()


def test_byte_span_and_own_memory_on_views():
    """The byte span (the overlap checks' unit) is the bytes from a tensor's first to one past
    its last element, contiguous or not, empty ones 0; a written tensor whose elements share
    memory is refused, a transposed or sliced one without sharing is not; the remembered
    aliasing pairs are the ones computed afresh."""
    from gdnzoo import checks
    from gdnzoo.operation import PREFILL

    def span(x):                                # from the definition, element by element
        if x.numel() == 0:
            return 0
        last = sum((n - 1) * st for n, st in zip(x.shape, x.stride()))
        return (last + 1) * x.element_size()
    base = torch.zeros(4, 6, 8, dtype=torch.bfloat16)
    views = [base, base[1:3], base[:, 2:], base[..., ::2], base.transpose(0, 2), base[:0],
             base[:, :1], base.unsqueeze(1), torch.zeros(3, 1).expand(3, 4)]
    for v in views:
        assert checks.byte_span(v) == span(v), (tuple(v.shape), v.stride())
    for v in views[:-1]:
        checks.need_own_memory("out", v)
    with pytest.raises(ValueError, match="internal overlap"):
        checks.need_own_memory("out", views[-1])
    names = {"q", "k", "v", "state", "out", "new_state", "cu_seqlens"}
    for inplace in (True, False):
        first = checks.aliasing_pairs(PREFILL, names, inplace)
        assert checks.aliasing_pairs(PREFILL, set(names), inplace) is first
        assert first == checks._aliasing_pairs(PREFILL, names, inplace)

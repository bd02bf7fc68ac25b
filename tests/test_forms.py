"""The gate forms and state layouts of decode and prefill: precomputed gates (g, beta),
allow_neg_eigval, and the K-first state.  Every backend that declares a form is held to the raw,
k-last call of the same inputs (output and state); every backend that does not is refused with
its reason; bad arguments are refused cold and warm, nothing touched."""
from __future__ import annotations

import warnings

import pytest
import torch

import gdnzoo
from gdnzoo import gate, registry
from gdnzoo.inputs import make_inputs, make_prefill_inputs
from gdnzoo.reference import gates
from conftest import DEVICE, HAS_CUDA

FORMS = {"precomputed_gates": "precomputed", "neg_eigval": "neg_eigval", "k_first": "k_first"}


def _kfirst(t):
    return t.transpose(-1, -2).contiguous()


# K = V = 128 on a GPU, where FlashInfer's kernels serve that head size only; 64 on the CPU
D = 128 if HAS_CUDA else 64


def _decode_case(seed, sd=torch.float32):
    return make_inputs(B=3, T=3, H=2, HV=6, K=D, V=D, state_dtype=sd, device=DEVICE,
                       seed=seed)


def _prefill_case(seed, sd=torch.float32):
    # GVA 3 either way; on the CPU three value heads (the interpreter's time is per head)
    H = 2 if HAS_CUDA else 1
    return make_prefill_inputs([0, 1, 65, 7], H=H, HV=3 * H, K=D, V=D, state_dtype=sd,
                               device=DEVICE, seed=seed)


def _served(op, name, form):
    spec = registry.spec(name, op)
    ok, why = registry.availability(name, DEVICE, op)
    return ok and spec.features[form] is True


@pytest.mark.parametrize("sd", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_each_form_matches_the_raw_k_last_call(op, form, sd):
    """For every backend declaring the form: the form's call equals the reference of the same
    step (the precomputed gates are the raw ones' log decay and beta; a K-first state is the
    transpose; allow_neg_eigval is beta = 2 sigmoid(b), against the float64 oracle of it)."""
    names = [n for n in registry.names(op) if _served(op, n, form)]
    assert "pt-reference" in names
    for i, name in enumerate(names):
        x = (_decode_case if op == "decode" else _prefill_case)(seed=i + 10, sd=sd)
        fn = gdnzoo.get(name, op=op)
        ref_out, ref_state = x.reference(True)
        kw = {}
        if form == "precomputed_gates":
            g, beta = gates(x.A_log, x.a, x.dt_bias, x.b)
            kw = dict(g=torch.log(g), beta=beta.to(torch.bfloat16), A_log=None, a=None,
                      dt_bias=None, b=None)
            beta64 = torch.sigmoid(x.b.double()).to(torch.bfloat16)       # what was passed
            ref_out, ref_state = _oracle(op, x, beta=beta64)
        if form == "neg_eigval":
            kw = dict(allow_neg_eigval=True)
            ref_out, ref_state = _oracle(op, x, neg=True)
        state = x.state.clone()
        if form == "k_first":
            state, kw = _kfirst(state), dict(state_layout="k-first")
        names_ = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b") + \
            (("cu_seqlens",) if op == "prefill" else ())
        args = dict(zip(names_, x.args()))
        args["state"] = state
        args.update({n: kw.pop(n) for n in list(kw) if n in args})
        try:
            gdnzoo.select(*args.values(), op=op, use_qk_l2norm=True, algo=name, **kw)
        except ValueError as e:     # said, not silently passed: a warning in the summary
            assert name != "pt-reference" and "cannot serve" in str(e), str(e)
            warnings.warn(f"{op} {name} {form}: {e}")
            continue
        out, new_state = fn(*args.values(), use_qk_l2norm=True, **kw)
        if form == "k_first":
            new_state = new_state.transpose(-1, -2)
        # a backend that rounds its intermediate states (the peers, triton-chunk-bf16) is
        # held to the peers' state bound, as everywhere
        j = gate.judge(out, new_state, ref_out, ref_state, state_dtype=sd,
                       state_tol=gate.state_tol_of(name, op))
        assert j.ok, f"{op} {name} {form}: {j.reason}"


def _oracle(op, x, beta=None, neg=False):
    """The float64 oracle with beta replaced (precomputed) or doubled (allow_neg_eigval)."""
    from gdnzoo import prefill_reference, reference
    g, _ = gates(x.A_log.double(), x.a.double(), x.dt_bias.double(), x.b.double(),
                 torch.float64)
    form = dict(g=torch.log(g), beta=beta) if beta is not None else dict(neg=neg)
    out = torch.empty(x.v.shape, dtype=torch.float64, device=x.v.device)
    st = torch.empty(x.state.shape, dtype=torch.float64, device=x.v.device)
    if op == "decode":
        reference.reference_decode(*x.args(), out, st, True, torch.float64, **form)
    else:
        prefill_reference.reference_prefill(*x.args(), out, st, True,
                                            compute_dtype=torch.float64, **form)
    return out, st


def _form_args(op, x, form):
    """(positional arguments, keywords) of a call of ``x`` in ``form``."""
    args = list(x.args())
    kw = {}
    if form == "precomputed_gates":
        g, beta = gates(x.A_log, x.a, x.dt_bias, x.b)
        args[4:8] = [None] * 4
        kw = dict(g=torch.log(g), beta=beta)
    elif form == "neg_eigval":
        kw = dict(allow_neg_eigval=True)
    else:
        args[3] = _kfirst(x.state)
        kw = dict(state_layout="k-first")
    return args, kw


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_backends_without_a_form_say_why(op, form):
    """A backend whose registry entry does not declare a form is refused, naming it."""
    x = (_decode_case if op == "decode" else _prefill_case)(seed=3)
    args, kw = _form_args(op, x, form)
    for name in registry.names(op):
        if _served(op, name, form) or not registry.availability(name, DEVICE, op)[0]:
            continue
        with pytest.raises(ValueError, match=f"'{name}' cannot serve"):
            gdnzoo.select(*args, op=op, algo=name, **kw)


def _bad(x, **kw):
    return gdnzoo.decode(*x.args(), algo="pt-reference", **kw)


BAD = [
    ("g without beta", lambda x: dict(g=torch.zeros(3, 3, 6), A_log=None, a=None, dt_bias=None,
                                      b=None), ValueError, "beta: the precomputed gates"),
    ("both forms", lambda x: dict(g=torch.zeros(3, 3, 6), beta=torch.zeros(3, 3, 6)),
     ValueError, "A_log: not with the precomputed gates"),
    ("g dtype", lambda x: dict(g=torch.zeros(3, 3, 6, dtype=torch.bfloat16),
                               beta=torch.zeros(3, 3, 6), A_log=None, a=None, dt_bias=None,
                               b=None), TypeError, "g: expected dtype fp32"),
    ("beta shape", lambda x: dict(g=torch.zeros(3, 3, 6), beta=torch.zeros(3, 6), A_log=None,
                                  a=None, dt_bias=None, b=None), ValueError, "beta: expected"),
    ("neg eigval with beta", lambda x: dict(g=torch.zeros(3, 3, 6), beta=torch.zeros(3, 3, 6),
                                            A_log=None, a=None, dt_bias=None, b=None,
                                            allow_neg_eigval=True), ValueError,
     "allow_neg_eigval: only with the raw gate b"),
    ("neg eigval not bool", lambda x: dict(allow_neg_eigval=1), TypeError,
     "allow_neg_eigval: expected bool"),
    ("a missing", lambda x: dict(a=None), TypeError, "a: expected a tensor"),
    ("layout unknown", lambda x: dict(state_layout="v-first"), ValueError,
     "state_layout: expected one of"),
    ("k-first shape", lambda x: dict(state_layout="k-first", state=torch.zeros(3, 6, 64, 32)),
     ValueError, r"state: expected shape \(3, 6, 64, 64\) \[B, HV, K, V\]"),
]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("what,change,exc,frag", BAD, ids=[b[0] for b in BAD])
def test_bad_forms_are_refused_cold_and_warm(what, change, exc, frag, warm):
    x = make_inputs(B=3, T=3, H=2, HV=6, K=64, V=64, seed=5)
    if warm:
        _bad(x.clone())
    kw = change(x)
    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b")
    args = dict(zip(names, x.args()))
    args.update({n: kw.pop(n) for n in list(kw) if n in args})
    before = args["state"].clone()
    with pytest.raises(exc, match=frag):
        gdnzoo.decode(*args.values(), x.scale, algo="pt-reference", **kw)
    assert torch.equal(args["state"], before)


@pytest.mark.skipif(not HAS_CUDA, reason="the forms on a GPU backend: a CUDA device")
def test_forms_keep_one_launch():
    """The fast kernels serve the forms in the kernel: a call launches one kernel."""
    x = make_inputs(B=4, device="cuda")
    for name in ("fla-recurrent", "cuda-v4"):
        for form, kw in (("k_first", dict(state_layout="k-first")),):
            if not _served("decode", name, form):
                continue
            st = _kfirst(x.state)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                gdnzoo.decode(*x.args()[:3], st, *x.args()[4:], algo=name, **kw)
                torch.cuda.synchronize()
            kernels = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            assert len(kernels) <= 2, (name, form, [e.name for e in kernels])


@pytest.mark.parametrize("form", ["pool", "verify"])
def test_k_first_pools_and_verify_match_pt_reference(form):
    """A K-first pool (pages larger than a slot, padding) and a verify call with K-first
    intermediate states, on every backend declaring k_first, against pt-reference's same call
    (the reference's own forms are held to the raw call above)."""
    x = make_inputs(B=3, T=2, H=2, HV=4, K=64, V=64, device=DEVICE, seed=21)
    P, page = 5, 4 * 64 * 64 + 32
    buf = torch.randn(P, page, generator=torch.Generator().manual_seed(4)).mul(0.05)
    pool = buf[:, :4 * 64 * 64].view(P, 4, 64, 64).to(DEVICE)          # [P, HV, K, V]
    kw = dict(state_indices=torch.tensor([4, -1, 1], dtype=torch.int32, device=DEVICE),
              state_layout="k-first", use_qk_l2norm=True)
    if form == "verify":
        kw.update(intermediate_states=torch.full((3, 2, 4, 64, 64), float("nan"),
                                                 device=DEVICE), update_state=False)
    results = {}
    for name in registry.names():
        if not _served("decode", name, "k_first") or registry.spec(name).pools is not True:
            continue
        if form == "verify" and registry.spec(name).verify is not True:
            continue
        p, k = pool.clone(), dict(kw)
        if "intermediate_states" in k:
            k["intermediate_states"] = kw["intermediate_states"].clone()
        out, ns = gdnzoo.decode(*x.args()[:3], p, *x.args()[4:], algo=name, **k)
        results[name] = (out, ns, k.get("intermediate_states"))
    ref = results.pop("pt-reference")
    assert results, "no backend besides pt-reference declares a K-first pool"
    for name, (out, ns, inter) in results.items():
        assert torch.allclose(out.float(), ref[0].float(), atol=2e-3, rtol=2e-2), name
        assert torch.allclose(ns, ref[1], atol=1e-5, rtol=1e-4), name
        if inter is not None:
            written = ~torch.isnan(ref[2])
            assert torch.equal(written, ~torch.isnan(inter)), name
            assert torch.allclose(inter[written], ref[2][written], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_a_hard_reset_is_exact_on_every_backend_of_ours(op):
    """g = -inf (the state forgotten at that token), and a huge negative g, through every
    backend of ours that takes the precomputed gates, against the float64 oracle (output and
    state).  The peers' answers are their own (FlashInfer's is not held to it)."""
    from gdnzoo import prefill_reference, reference
    x = (_decode_case if op == "decode" else _prefill_case)(seed=7)
    g, _ = gates(x.A_log, x.a, x.dt_bias, x.b)
    g = torch.log(g)
    beta = torch.sigmoid(x.b.float())
    flat = g.view(-1, g.shape[-1])
    flat[[1, 40 % flat.shape[0]], 0] = float("-inf")
    flat[2, 1] = -1e30
    out = torch.empty(x.v.shape, dtype=torch.float64, device=x.v.device)
    st = torch.empty(x.state.shape, dtype=torch.float64, device=x.v.device)
    args = list(x.args())
    args[4:8] = [None] * 4
    if op == "decode":
        reference.reference_decode(*args, out, st, True, torch.float64, g=g, beta=beta)
    else:
        prefill_reference.reference_prefill(*args, out, st, True, compute_dtype=torch.float64,
                                            g=g, beta=beta)
    peers = ("flashinfer", "fla", "vllm")
    names = [n for n in registry.names(op) if _served(op, n, "precomputed_gates")
             and not set(registry.spec(n, op).requires) & set(peers)]
    assert "pt-reference" in names
    for name in names:
        try:
            o, s = gdnzoo.get(name, op=op)(*args[:3], x.state.clone(), *args[4:], g=g,
                                            beta=beta, use_qk_l2norm=True)
        except ValueError as e:
            assert name != "pt-reference" and "cannot serve" in str(e), str(e)
            continue
        j = gate.judge(o, s, out, st, state_dtype=torch.float32,
                       state_tol=gate.state_tol_of(name, op))
        assert j.ok, f"{op} {name}: {j.reason}"

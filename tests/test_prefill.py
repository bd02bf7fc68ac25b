"""gdnzoo.prefill: every backend registered for prefill against the float64 oracle, output and
state, and the contract's refusals (cold and right after a valid call, nothing touched)."""
from __future__ import annotations

import math

import pytest
import torch

import gdnzoo
from gdnzoo import gate, registry
from gdnzoo.inputs import make_prefill_inputs
from gdnzoo.pool import Pool
from gdnzoo.prefill_reference import chunk, chunked_sequence, reference_prefill
from conftest import DEVICE, HAS_CUDA
from helpers import served_twice

LENGTHS = [0, 1, 63, 64, 65, 130]
LONG = [300] if not HAS_CUDA else [2000]
# (lengths, H, HV, K, state dtype, l2norm, dest, state given)
CASES = [
    (LENGTHS, 2, 2, 64, torch.float32, False, False, True),
    (LENGTHS, 2, 4, 64, torch.bfloat16, True, True, True),
    (LENGTHS, 2, 6, 64, torch.float32, True, False, False),
    (LONG, 1, 3, 64, torch.float32, True, True, True),
    ([17, 0, 40], 2, 4, 128, torch.bfloat16, False, False, True),
]
# Backends that compile per signature or run token by token through the interpreter take every
# other case here.
SLOW_ON_CPU = {"pt-compiled", "fla-recurrent"}


def _id(c):
    lengths, H, HV, K, sd, l2, dest, given = c
    return (f"{'x'.join(map(str, lengths)) if len(lengths) < 4 else 'mix'}-{H}/{HV}-K{K}-"
            f"{'fp32' if sd == torch.float32 else 'bf16'}{'-l2' if l2 else ''}"
            f"{'-dest' if dest else ''}{'' if given else '-zeros'}")


def _why_skip(backend, i):
    """Why the matrix skips ``backend`` on case ``i`` here (None: it runs), and the inputs."""
    lengths, H, HV, K, sd, l2, dest, given = CASES[i]
    ok, why = registry.availability(backend, DEVICE, "prefill")
    if not ok:
        return f"{backend} unavailable here: {why}", None
    if backend in SLOW_ON_CPU and not HAS_CUDA and i % 2:
        return f"{backend}: every other case on CPU (compiles per signature)", None
    x = make_prefill_inputs(lengths, H=H, HV=HV, K=K, V=K, state_dtype=sd, device=DEVICE,
                            seed=i, state=given)
    problem, _ = gdnzoo.prefill_contract.verdict(
        x.args() + (None, None, l2, None, None, None, None, backend))
    ok, why = registry.can_serve(backend, problem)
    if not ok:
        return f"{backend} cannot serve {_id(CASES[i])}: {why}", None
    return None, x


@pytest.mark.parametrize("i", range(len(CASES)), ids=[_id(c) for c in CASES])
@pytest.mark.parametrize("backend", registry.names("prefill"))
def test_prefill_matches_reference(backend, i):
    lengths, H, HV, K, sd, l2, dest, given = CASES[i]
    why, x = _why_skip(backend, i)
    if why:
        pytest.skip(why)
    j, out, new_state = gate.gated_call(gdnzoo.get(backend, op="prefill"), x, dest=dest,
                                        use_qk_l2norm=l2,
                                        state_tol=gate.state_tol_of(backend, "prefill"))
    assert j.ok, f"{backend} {_id(CASES[i])}: {j.reason}"


def test_every_available_prefill_backend_runs_a_case():
    # Self-contained (any -k selection, any number of workers): each available backend but
    # the peers (their own shapes) has a case of the matrix it is not skipped on.
    avail = [b.name for b in gdnzoo.list_backends(DEVICE, op="prefill") if b.available]
    missing = [n for n in avail if n not in ("fi-baseline", "fla-upstream")
               and all(_why_skip(n, i)[0] for i in range(len(CASES)))]
    assert not missing, f"available prefill backends that skip every case: {missing}"


def test_chunked_form_equals_the_token_loop():
    """The WY form (pt-compiled's math) against the per-token loop in float64, a sequence that
    ends mid-chunk, every head at once."""
    x = make_prefill_inputs([150], H=2, HV=4, K=32, V=32, state_dtype=torch.float64,
                            io_dtype=torch.float32, seed=5)
    out = torch.empty(150, 4, 32, dtype=torch.float64)
    ns = torch.empty(1, 4, 32, 32, dtype=torch.float64)
    reference_prefill(*x.args()[:9], 0.2, out, ns, True, compute_dtype=torch.float64)
    o2, s2 = chunked_sequence(x.q, x.k, x.v, x.state[0], x.A_log, x.a, x.dt_bias, x.b, 0.2,
                              True, chunk)
    assert torch.allclose(o2, out, atol=1e-12) and torch.allclose(s2, ns[0], atol=1e-12)


# ------------------------------------------------------------------ pools

def _pool_case(sd=torch.float32, seed=0):
    x = make_prefill_inputs([5, 0, 9, 3, 7], H=2, HV=4, K=32, V=32, state_dtype=sd,
                            seed=seed, device=DEVICE)
    P = 9
    g = torch.Generator().manual_seed(seed)
    pool_buf = torch.randn(P, 4 * 32 * 32 + 17, generator=g).mul(0.05).to(sd)  # page > slot
    pool = pool_buf[:, :4 * 32 * 32].view(P, 4, 32, 32).to(DEVICE)
    idx = torch.tensor([3, 7, -1, 8, 0], dtype=torch.int32, device=DEVICE)  # -1 pads seq 2
    init = torch.tensor([True, True, True, False, True], device=DEVICE)
    return x, pool, idx, init


@pytest.mark.parametrize("backend", ["pt-reference", "pt-compiled"])
@pytest.mark.parametrize("form", ["in-place", "null-slot", "write-pool"])
def test_prefill_pools(backend, form):
    x, pool, idx, init = _pool_case()
    kw = dict(state_indices=idx, has_initial_state=init, algo=backend)
    target, write = pool, idx
    if form == "null-slot":
        kw["null_slot"] = 0                                     # seq 4 reads slot 0: padding
    if form == "write-pool":
        target = torch.randn(pool.shape, generator=torch.Generator().manual_seed(1)).to(
            pool.dtype).to(DEVICE)
        write = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32, device=DEVICE)
        kw.update(new_state=target, new_state_indices=write)
    before_pool, before_target = pool.clone(), target.clone()
    out = torch.full(tuple(x.v.shape), float("nan"), dtype=x.v.dtype, device=DEVICE)
    o, ns = gdnzoo.prefill(x.q, x.k, x.v, pool, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
                           out=out, **kw)
    assert o is out and ns is target
    null = kw.get("null_slot", -1)
    p = Pool(idx, write, null)
    ref_out = torch.empty(tuple(x.v.shape), dtype=torch.float64)
    ref_pool = before_target.double() if form == "write-pool" else before_pool.double()
    reference_prefill(x.q, x.k, x.v, before_pool.double(), x.A_log, x.a, x.dt_bias, x.b,
                      x.cu_seqlens, x.scale, ref_out, ref_pool, False, p, init,
                      compute_dtype=torch.float64)
    j = gate.judge(o, ns, ref_out, ref_pool, state_dtype=pool.dtype)
    assert j.ok, j.reason
    cu = x.cu_seqlens.tolist()
    padded = [2] + ([4] if null == 0 else [])
    for n in padded:                                           # zeros out, nothing touched
        assert torch.count_nonzero(o[cu[n]:cu[n + 1]]) == 0
    named = set(write.tolist()) if form == "write-pool" else set(idx.tolist())
    for s in range(pool.shape[0]):
        if s not in named or (form != "write-pool" and s == null):
            assert torch.equal(ns[s], before_target[s]), f"slot {s} not named, yet written"
    if form == "write-pool":
        assert torch.equal(pool, before_pool)


def test_has_initial_state_false_reads_nothing():
    """A sequence without an initial state starts from zeros: NaN in its slot changes nothing."""
    x, pool, idx, init = _pool_case(seed=3)
    pool[8] = float("nan")                                      # seq 3: has_initial_state False
    out, ns = gdnzoo.prefill(x.q, x.k, x.v, pool, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
                             state_indices=idx, has_initial_state=init, algo="pt-reference")
    assert torch.isfinite(out).all() and torch.isfinite(ns[8]).all()


# ------------------------------------------------------------------ bad inputs

def _valid():
    return make_prefill_inputs([3, 5], H=2, HV=4, K=32, V=32, device=DEVICE, seed=9)


def _call(x, **kw):
    return gdnzoo.prefill(*x.args(), **kw)


BAD = [
    ("cu_seqlens dtype", lambda x: {"cu_seqlens": x.cu_seqlens.float()}, TypeError,
     "cu_seqlens"),
    ("cu_seqlens rank", lambda x: {"cu_seqlens": x.cu_seqlens[None]}, ValueError, "cu_seqlens"),
    ("cu_seqlens empty", lambda x: {"cu_seqlens": x.cu_seqlens[:0]}, ValueError, "cu_seqlens"),
    ("cu_seqlens device", lambda x: {"cu_seqlens": x.cu_seqlens.to("meta")}, ValueError,
     "cu_seqlens"),
    ("state N", lambda x: {"state": x.state[:1].clone()}, ValueError, "state"),
    ("heads not a multiple", lambda x: {"v": x.v[:, :3].contiguous(),
                                        "A_log": x.A_log[:3].clone(),
                                        "dt_bias": x.dt_bias[:3].clone(),
                                        "a": x.a[:, :3].contiguous(),
                                        "b": x.b[:, :3].contiguous()}, ValueError, "HV"),
    ("K axis not contiguous", lambda x: {"q": x.q.transpose(1, 2).contiguous()
                                         .transpose(1, 2)}, ValueError, "q: expected the K axis"),
    ("has_initial_state dtype", lambda x: {"has_initial_state": torch.ones(2, device=DEVICE)},
     TypeError, "has_initial_state"),
    ("has_initial_state strided", lambda x: {"has_initial_state": torch.ones(
        4, dtype=torch.bool, device=DEVICE)[::2]}, ValueError,
     "has_initial_state: expected a contiguous"),
    ("null_slot without pool", lambda x: {"null_slot": 0}, ValueError, "null_slot"),
    ("pool without state", lambda x: {"state": None, "state_indices":
                                      torch.zeros(2, dtype=torch.int32, device=DEVICE)},
     ValueError, "state_indices"),
    ("out dtype", lambda x: {"out": torch.empty(8, 4, 32, dtype=torch.float32, device=DEVICE)},
     TypeError, "out"),
]


def _bad_kwargs(x, change):
    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens", "scale")
    args = dict(zip(names, x.args()))
    kw = {}
    for n, val in change(x).items():
        (args if n in args else kw)[n] = val
    return args, kw


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("what,change,exc,frag", BAD, ids=[b[0] for b in BAD])
def test_bad_prefill_inputs(what, change, exc, frag, warm):
    x = _valid()
    if warm:                                   # a valid call first (memoized and guarded)
        served_twice(lambda: _call(x.clone(), algo="pt-reference"))
    args, kw = _bad_kwargs(x, change)
    before = {n: v.clone() for n, v in args.items()
              if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    with pytest.raises(exc, match=frag):
        gdnzoo.prefill(*args.values(), algo="pt-reference", **kw)
    for n, v in before.items():
        assert torch.equal(args[n], v), f"{n} touched by a refused call"


def test_cu_seqlens_values_checked_on_request(monkeypatch):
    x = _valid()
    bad = torch.tensor([0, 5, 3], dtype=torch.int32, device=DEVICE)
    monkeypatch.setenv("GDNZOO_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 3"):
        gdnzoo.prefill(*x.args()[:8], bad, algo="pt-reference")
    end = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="expected T = 8"):
        gdnzoo.prefill(*x.args()[:8], end, algo="pt-reference")


@pytest.mark.parametrize("algo", ["pt-reference", "pt-compiled"])
def test_cu_seqlens_values_checked_by_backends_that_read_them_on_the_host(algo):
    """pt-reference and pt-compiled read cu_seqlens on the host anyway: bad values are
    refused there without the debug switch, before anything is written."""
    ok, why = registry.availability(algo, op="prefill")
    if not ok:
        pytest.skip(f"{algo}: {why}")
    x = _valid()
    out = torch.full_like(x.v, 7.0)
    for bad, frag in (([0, 5, 3], r"cu_seqlens\[2\] = 3"), ([1, 3, 8], r"cu_seqlens\[0\] = 1"),
                      ([0, 3, 7], "expected T = 8")):
        state = x.state.clone()
        cu = torch.tensor(bad, dtype=torch.int32, device=DEVICE)
        with pytest.raises(ValueError, match=frag):
            gdnzoo.prefill(*x.args()[:3], state, *x.args()[4:8], cu, out=out, algo=algo)
        assert torch.equal(state, x.state) and bool((out == 7.0).all()), \
            "written before the refusal"


def test_zero_tokens_and_zero_sequences():
    x = make_prefill_inputs([0, 0], H=2, HV=4, K=32, V=32, device=DEVICE)
    out, ns = gdnzoo.prefill(*x.args(), algo="pt-reference")
    assert out.shape == (0, 4, 32) and torch.equal(ns, x.state)
    y = make_prefill_inputs([], H=2, HV=4, K=32, V=32, device=DEVICE)
    out, ns = gdnzoo.prefill(*y.args(), algo="pt-reference")
    assert out.shape == (0, 4, 32) and ns.shape == (0, 4, 32, 32)


def test_select_says_who_serves_prefill():
    x = _valid()
    sel = gdnzoo.select(*x.args(), op="prefill")
    assert sel.name in registry.names("prefill") and sel.source in ("fallback", "ALGO env") \
        or sel.source.startswith("default table")


def test_algo_env_for_another_operation_is_ignored(monkeypatch):
    """ALGO=cuda-v4 names a decode backend: prefill chooses as if it were unset."""
    monkeypatch.setenv("ALGO", "cuda-v4")
    x = _valid()
    sel = gdnzoo.select(*x.args(), op="prefill")
    assert sel.name != "cuda-v4" and "names no prefill backend" in sel.reason
    monkeypatch.setenv("ALGO", "no-such-backend")
    with pytest.raises(ValueError, match="ALGO env: unknown backend 'no-such-backend' for prefill"):
        gdnzoo.select(*x.args(), op="prefill")


def test_scale_default_is_one_over_sqrt_k():
    x = _valid()
    a, _ = gdnzoo.prefill(*x.clone().args()[:9], None, algo="pt-reference")
    b, _ = gdnzoo.prefill(*x.clone().args()[:9], 1 / math.sqrt(32), algo="pt-reference")
    assert torch.equal(a, b)


def test_initial_states_of_no_state_are_on_the_inputs_device():
    """state=None: the zeros go where the inputs are (a GPU run of the oracle with state=None
    once built them on the CPU)."""
    from gdnzoo.prefill_reference import initial_states
    init, real = initial_states(None, 3, 2, 8, 8, device=torch.device("meta"))
    assert init.device.type == real.device.type == "meta" and init.shape == (3, 2, 8, 8)


@pytest.mark.parametrize("algo", ["pt-reference", "pt-compiled"])
@pytest.mark.parametrize("reset", [float("-inf"), -1e30], ids=["-inf", "-1e30"])
def test_hard_reset_gates_in_the_chunked_form(algo, reset):
    """Precomputed log decays with a hard reset (g = -inf, or a huge negative g) inside a
    chunk: the chunked form (pt-compiled) as exact as the token-by-token one."""
    ok, why = registry.availability(algo, op="prefill")
    if not ok:
        pytest.skip(f"{algo}: {why}")
    x = make_prefill_inputs([70, 9], H=2, HV=4, K=32, V=32, device=DEVICE, seed=3)
    g = -torch.rand(79, 4, device=DEVICE) * 0.5
    g[[4, 64, 72], 1] = reset
    beta = torch.rand(79, 4, device=DEVICE)
    ref_out = torch.empty(79, 4, 32, dtype=torch.float64, device=DEVICE)
    ref_state = torch.empty(2, 4, 32, 32, dtype=torch.float64, device=DEVICE)
    reference_prefill(x.q, x.k, x.v, x.state, x.A_log, None, x.dt_bias, None, x.cu_seqlens,
                      x.scale or 32 ** -0.5, ref_out, ref_state, compute_dtype=torch.float64,
                      g=g, beta=beta)
    out, new = gdnzoo.prefill(x.q, x.k, x.v, x.state.clone(), None, None, None, None,
                              x.cu_seqlens, g=g, beta=beta, algo=algo)
    j = gate.judge(out, new, ref_out, ref_state, state_dtype=torch.float32)
    assert j.ok, j.reason


@pytest.mark.parametrize("algo", ["triton-chunk", "fla-recurrent"])
@pytest.mark.parametrize("cu", [[0, 3, 9], [0, 5, 3, 6], [-4, 3, 6]], ids=["past-T", "decreasing",
                                                                          "negative"])
def test_bad_cu_seqlens_values_never_reach_outside_the_tensors(algo, cu):
    """Values that break the contract (checked only with GDNZOO_CHECK_INDICES=1: a host sync)
    give wrong results, never a row outside the tensors: each sequence is held inside [0, T]
    by the kernels (they read past q and wrote past out, and corrupted the heap)."""
    ok, why = registry.availability(algo, DEVICE, op="prefill")
    if not ok:
        pytest.skip(f"{algo}: {why}")
    T, N = 6, len(cu) - 1
    x = make_prefill_inputs([3, 3] if N == 2 else [2, 2, 2], H=1, HV=2, K=64, V=64,
                            device=DEVICE, seed=5)
    big = torch.full((T + 16, 2, 64), 7.0, dtype=x.v.dtype, device=DEVICE)
    states = torch.full((N + 2, 2, 64, 64), 7.0, device=DEVICE)
    state = states[:N]
    state.copy_(x.state)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    gdnzoo.prefill(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, cu_t, out=big[:T],
                   algo=algo)
    assert bool((big[T:] == 7.0).all()) and bool((states[N:] == 7.0).all())

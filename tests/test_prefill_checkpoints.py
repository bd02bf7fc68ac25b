"""gdnzoo.prefill's state checkpoints (``checkpoints``, ``checkpoint_every``): every backend
that declares them against the float64 per-token oracle (each checkpoint row, the outputs and
the final states, under the project gate), dense and pool forms, k-last and K-first; the
packing (rows past the last checkpoint and a padded sequence's rows untouched); who refuses
and why; bad arguments refused cold and right after a valid call, nothing touched; the torch
operator with the new trailing arguments."""
from __future__ import annotations

import pytest
import torch

import gdnzoo
from gdnzoo import gate, registry
from gdnzoo.inputs import make_prefill_inputs
from gdnzoo.pool import Pool
from gdnzoo.prefill_contract import Problem, checkpoint_offsets
from gdnzoo.prefill_reference import reference_outputs
from conftest import DEVICE, HAS_CUDA

F64 = torch.float64
LENGTHS = [0, 63, 64, 128, 130, 200]      # ends before, on and past a checkpoint
# (lengths, H, HV, checkpoint_every, state dtype, form, k_first); form: "inplace", "dest",
# "zeros" (state None), "pool" (a pool with padding)
CASES = [
    (LENGTHS, 1, 1, 64, torch.float32, "inplace", False),
    (LENGTHS, 1, 2, 128, torch.bfloat16, "dest", False),
    ([130, 64, 0, 200], 1, 2, 64, torch.float32, "zeros", False),
    ([200, 64, 0, 130, 70], 1, 2, 64, torch.bfloat16, "pool", False),
    ([128, 0, 131], 2, 4, 64, torch.float32, "inplace", True),
    ([70, 256, 128], 1, 2, 128, torch.float32, "pool", True),
    # the contest geometry (K = V = 128, which fi-baseline needs), longer sequences: GPU only
    # (the float64 per-token oracle of them takes minutes on 2 CPU cores)
    ([0, 63, 64, 128, 130, 200, 1000], 4, 8, 64, torch.float32, "inplace", False),
    ([1000, 0, 130, 256], 4, 8, 128, torch.bfloat16, "dest", False),
    # a pool with padding at K = V = 128, two chunks a sequence or more on average (cuda-chunk's
    # warpgroup-MMA "bf16x3" chain on Hopper)
    ([700, 64, 0, 130, 300], 2, 8, 64, torch.float32, "pool", False),
]
DIM = {6: 128, 7: 128, 8: 128}             # K = V of a case (default 64)
SERVERS = [n for n in registry.names("prefill")
           if registry.spec(n, "prefill").features["checkpoints"] is True]
# pt-compiled compiles per signature, triton-chunk and fla-recurrent run in the interpreter
# (fla-recurrent token by token, ~20 ms a token and head): on CPU a few cases.
SLOW_ON_CPU = {"pt-compiled": (1, 3), "triton-chunk": (0, 1, 2, 3, 5), "fla-recurrent": (5,)}


def _id(c):
    lengths, H, HV, every, sd, form, kf = c
    return (f"{'x'.join(map(str, lengths))}-{H}/{HV}-every{every}-"
            f"{'fp32' if sd == torch.float32 else 'bf16'}-{form}{'-kfirst' if kf else ''}")


def _layout(t, k_first):
    """A k-last [.., V, K] tensor in the call's layout (K-first: [.., K, V], V contiguous)."""
    return t.transpose(-1, -2).contiguous() if k_first else t


def _case(i):
    """(inputs, call keywords, the pool or None, the Pool record, the checkpoints tensor)."""
    lengths, H, HV, every, sd, form, kf = CASES[i]
    D = DIM.get(i, 64)
    x = make_prefill_inputs(lengths, H=H, HV=HV, K=D, V=D, state_dtype=sd, device=DEVICE,
                            seed=40 + i, state=form != "zeros")
    kw = dict(checkpoint_every=every, use_qk_l2norm=True)
    if kf:
        kw["state_layout"] = "k-first"
    pool = p = None
    if form == "pool":
        N, P = len(lengths), len(lengths) + 3
        gen = torch.Generator().manual_seed(i)
        pool = (torch.randn(P, HV, D, D, generator=gen) * 0.05).to(sd).to(DEVICE)
        idx = torch.tensor([4, -1, 1, 6, 0][:N], dtype=torch.int32, device=DEVICE)
        kw.update(state_indices=idx, null_slot=0)           # seq 1 and the one at slot 0 pad
        p = Pool(idx, idx, 0)
    elif form == "dest":
        kw["new_state"] = torch.full((len(lengths), HV, D, D), float("nan"), dtype=sd,
                                     device=DEVICE)
    rows = sum(lengths) // every + 1                         # one more than the bound
    kw["checkpoints"] = torch.full((rows, HV, D, D), float("nan"), dtype=sd, device=DEVICE)
    return x, kw, pool, p


def _oracle(x, kw, pool, p):
    """Float64 (out, states, checkpoints k-last) of the case; the padding rows stay NaN."""
    every = kw["checkpoint_every"]
    ck = torch.full(tuple(kw["checkpoints"].shape), float("nan"), dtype=F64, device=DEVICE)
    if pool is not None:
        y = gdnzoo.inputs.PrefillInputs(x.q, x.k, x.v, pool.clone(), x.A_log, x.a, x.dt_bias,
                                        x.b, x.cu_seqlens, x.scale)
        out, st = reference_outputs(y, True, pool=p, checkpoints=ck, checkpoint_every=every)
    else:
        out, st = reference_outputs(x, True, checkpoints=ck, checkpoint_every=every)
    return out, st, ck


def _judge(what, got, ref, dtype, backend):
    """A checkpoint under the bound its backend's final state is judged with (the peers that
    round their intermediate states to bf16: the peers' bound)."""
    v = gate.compare(got, ref, dtype=dtype)
    e = gate.relative_error(got, ref)
    tol = gate.state_tol_of(backend, "prefill") or gate.strict_tol("state", dtype)
    assert v.ok and e < tol, f"{what}: {v.reason} relative error {e:.3g} (bound {tol:g})"


@pytest.mark.parametrize("i", range(len(CASES)), ids=[_id(c) for c in CASES])
@pytest.mark.parametrize("backend", SERVERS)
def test_checkpoints_match_the_per_token_oracle(backend, i):
    ok, why = registry.availability(backend, DEVICE, "prefill")
    if not ok:
        pytest.skip(f"{backend} unavailable here: {why}")
    if not HAS_CUDA and i in DIM:
        pytest.skip("K = V = 128 cases run on a GPU (minutes on the CPU)")
    if not HAS_CUDA and backend in SLOW_ON_CPU and i not in SLOW_ON_CPU[backend]:
        pytest.skip(f"{backend}: a few cases on CPU (compiles per signature / interpreter)")
    lengths, H, HV, every, sd, form, kf = CASES[i]
    x, kw, pool, p = _case(i)
    ref_out, ref_state, ref_ck = _oracle(x, kw, pool, p)
    state = _layout(pool if pool is not None else x.state, kf) \
        if form != "zeros" else None
    if kf and "new_state" in kw:
        kw["new_state"] = _layout(kw["new_state"], True)
    ck = kw["checkpoints"] = _layout(kw["checkpoints"], kf)
    problem, _ = gdnzoo.prefill_contract.validate(*x.args()[:3], state, *x.args()[4:], **kw)
    ok, why = registry.can_serve(backend, problem)
    if not ok:
        pytest.skip(f"{backend} cannot serve {_id(CASES[i])}: {why}")
    out, ns = gdnzoo.prefill(*x.args()[:3], state, *x.args()[4:], algo=backend, **kw)
    ck_k_last = _layout(ck, kf)
    ns_k_last = _layout(ns, kf)
    off = checkpoint_offsets(x.cu_seqlens, every).tolist()
    real = [True] * len(lengths) if p is None else \
        [0 < s < pool.shape[0] for s in kw["state_indices"].tolist()]   # null_slot 0 pads
    for n, L in enumerate(lengths):
        rows = slice(off[n], off[n + 1])
        assert off[n + 1] - off[n] == L // every
        if not real[n]:                                        # a padded sequence: untouched
            assert torch.isnan(ck_k_last[rows]).all(), f"padded sequence {n} wrote checkpoints"
            continue
        for m in range(off[n + 1] - off[n]):
            _judge(f"{backend} {_id(CASES[i])} seq {n} checkpoint {m + 1}",
                   ck_k_last[off[n] + m], ref_ck[off[n] + m], sd, backend)
        if L and L % every == 0:                               # the last one is the final state
            assert torch.equal(ck_k_last[off[n + 1] - 1],
                               ns_k_last[n if p is None else p.write[n].item()])
    assert torch.isnan(ck_k_last[off[-1]:]).all(), "rows past the last checkpoint written"
    tol = gate.state_tol_of(backend, "prefill")
    j = gate.judge(out, ns_k_last, ref_out, ref_state, state_dtype=sd, state_tol=tol)
    assert j.ok, f"{backend} {_id(CASES[i])}: {j.reason}"


def test_the_oracle_checkpoints_are_the_states_of_shorter_calls():
    """The oracle's checkpoint m of a sequence is the final state of the same call cut after
    m * checkpoint_every tokens (computed without checkpoints)."""
    x = make_prefill_inputs([200, 130], H=1, HV=2, K=32, V=32, seed=3)
    ck = torch.full((6, 2, 32, 32), float("nan"), dtype=F64)
    reference_outputs(x, checkpoints=ck, checkpoint_every=64)
    for n, start, m, row in ((0, 0, 1, 0), (0, 0, 3, 2), (1, 200, 2, 4)):
        cut = slice(start, start + 64 * m)
        y = gdnzoo.inputs.PrefillInputs(x.q[cut], x.k[cut], x.v[cut], x.state[n:n + 1],
                                        x.A_log, x.a[cut], x.dt_bias, x.b[cut],
                                        torch.tensor([0, 64 * m], dtype=torch.int32), x.scale)
        assert torch.equal(reference_outputs(y)[1][0], ck[row])
    assert not torch.isnan(ck[:5]).any() and torch.isnan(ck[5]).all()   # 200 // 64 + 130 // 64


# ------------------------------------------------------------------ who serves, who refuses

def test_every_prefill_backend_declares_checkpoints(monkeypatch):
    """Each backend says true or why not; one that does not serve them is refused with that
    reason (availability set aside: the peers need a GPU)."""
    monkeypatch.setattr(registry, "availability", lambda *a, **k: (True, ""))
    p = Problem(N=2, T=256, H=4, HV=8, K=128, V=128, state_dtype=torch.float32,
                io_dtype=torch.bfloat16, device="cuda", cc=(9, 0), checkpoint_every=64)
    refused = []
    for name in registry.names("prefill"):
        says = registry.spec(name, "prefill").features["checkpoints"]
        assert says is True or (isinstance(says, str) and len(says) > 20), (name, says)
        ok, why = registry.can_serve(name, p)
        if says is not True:
            refused.append(name)
            assert not ok and why.startswith("cannot write state checkpoints (checkpoints, "
                                             "checkpoint_every=64): ") and says in why, why
        else:
            assert "checkpoints" not in why, (name, why)
    assert "fla-upstream" in refused and {"pt-reference", "triton-chunk"} <= set(SERVERS)


# ------------------------------------------------------------------ bad inputs

def _valid(state_dtype=torch.float32):
    return make_prefill_inputs([64, 70], H=2, HV=4, K=32, V=32, state_dtype=state_dtype,
                               device=DEVICE, seed=9)


def _ck(rows=2, dtype=torch.float32, **kw):
    return torch.zeros(rows, 4, 32, 32, dtype=dtype, device=DEVICE, **kw)


def _sharing_out():
    """out [134, 4, 32] bf16 and checkpoints [2, 4, 32, 32] fp32 in one overlapping buffer."""
    buf = torch.zeros(20000, device=DEVICE)
    return dict(out=buf.view(torch.bfloat16)[:134 * 4 * 32].view(134, 4, 32),
                checkpoints=buf[100:100 + 2 * 4 * 32 * 32].view(2, 4, 32, 32),
                checkpoint_every=64)


BAD = [
    ("dtype", lambda x: dict(checkpoints=_ck(dtype=torch.bfloat16), checkpoint_every=64),
     TypeError, "checkpoints: expected dtype fp32 .the dtype of the state written., got bf16"),
    ("not a tensor", lambda x: dict(checkpoints=[0.0], checkpoint_every=64), TypeError,
     "checkpoints: expected a torch.Tensor"),
    ("rank", lambda x: dict(checkpoints=_ck()[0], checkpoint_every=64), ValueError,
     "checkpoints: expected a rank-4|checkpoints: expected .*4"),
    ("rows too few", lambda x: dict(checkpoints=_ck(rows=1), checkpoint_every=64), ValueError,
     r"checkpoints: expected shape \[R, HV, V, K\] .* R >= T // checkpoint_every = 134 // 64"),
    ("heads", lambda x: dict(checkpoints=_ck()[:, :2], checkpoint_every=64), ValueError,
     "checkpoints: expected shape"),
    ("every not a multiple of 64", lambda x: dict(checkpoints=_ck(), checkpoint_every=96),
     ValueError, "checkpoint_every: expected a positive multiple of 64"),
    ("every zero", lambda x: dict(checkpoints=_ck(), checkpoint_every=0), ValueError,
     "checkpoint_every: expected a positive multiple of 64"),
    ("every negative", lambda x: dict(checkpoints=_ck(), checkpoint_every=-64), ValueError,
     "checkpoint_every: expected a positive multiple of 64"),
    ("every float", lambda x: dict(checkpoints=_ck(), checkpoint_every=64.0), TypeError,
     "checkpoint_every: expected an int"),
    ("every bool", lambda x: dict(checkpoints=_ck(), checkpoint_every=True), TypeError,
     "checkpoint_every: expected an int"),
    ("checkpoints without every", lambda x: dict(checkpoints=_ck()), TypeError,
     "checkpoint_every: expected an int .* with checkpoints, got None"),
    ("every without checkpoints", lambda x: dict(checkpoint_every=64), ValueError,
     "checkpoint_every: only with checkpoints"),
    ("device", lambda x: dict(checkpoints=_ck().to("meta"), checkpoint_every=64), ValueError,
     "checkpoints: expected device"),
    ("K axis not contiguous", lambda x: dict(checkpoints=_ck().transpose(2, 3),
                                             checkpoint_every=64), ValueError,
     "checkpoints: expected the K axis"),
    ("K-first layout, V axis not contiguous", lambda x: dict(
        checkpoints=_ck().transpose(2, 3), checkpoint_every=64, state=None,
        state_layout="k-first"),
     ValueError, "checkpoints: expected the V axis"),
    ("shared rows", lambda x: dict(checkpoints=_ck(rows=1).expand(2, 4, 32, 32),
                                   checkpoint_every=64), ValueError,
     "checkpoints: it is written"),
    ("overlaps the state", lambda x: dict(checkpoints=x.state, checkpoint_every=64), ValueError,
     "checkpoints: expected memory disjoint from state|state: expected memory disjoint from "
     "checkpoints|checkpoints: .*overlap"),
    ("overlaps out", lambda x: _sharing_out(), ValueError,
     "out: expected memory disjoint from checkpoints"),
    ("requires grad", lambda x: dict(checkpoints=_ck(requires_grad=True), checkpoint_every=64),
     ValueError, "checkpoints: expected a tensor that does not require grad"),
]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("what,change,exc,frag", BAD, ids=[b[0] for b in BAD])
def test_bad_checkpoint_arguments(what, change, exc, frag, warm):
    x = _valid()
    if warm:                                   # a valid call with checkpoints first (memoized)
        gdnzoo.prefill(*x.clone().args(), checkpoints=_ck(), checkpoint_every=64,
                       algo="pt-reference")
    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens", "scale")
    args = dict(zip(names, x.args()))
    kw = change(x)
    args.update({n: kw.pop(n) for n in list(kw) if n in args})
    touched = {n: v for n, v in {**args, **kw}.items()
               if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    before = {n: v.clone() for n, v in touched.items()}
    with pytest.raises(exc, match=frag):
        gdnzoo.prefill(*args.values(), algo="pt-reference", **kw)
    for n, v in before.items():
        assert torch.equal(touched[n], v), f"{n} touched by a refused call"


def test_the_rows_required_are_t_over_the_interval():
    """R >= T // checkpoint_every, checkable without reading the lengths: zero rows when T is
    shorter than the interval; one when T reaches it, though no sequence does (left as it
    was)."""
    x = make_prefill_inputs([62, 0, 1], H=2, HV=4, K=32, V=32, device=DEVICE, seed=2)
    out, ns = gdnzoo.prefill(*x.args(), checkpoints=_ck(rows=0), checkpoint_every=64,
                             algo="pt-reference")
    assert torch.isfinite(ns).all()
    y = make_prefill_inputs([63, 0, 1], H=2, HV=4, K=32, V=32, device=DEVICE, seed=2)
    with pytest.raises(ValueError, match="R >= T // checkpoint_every = 64 // 64 = 1"):
        gdnzoo.prefill(*y.args(), checkpoints=_ck(rows=0), checkpoint_every=64)
    ck = torch.full((1, 4, 32, 32), float("nan"), device=DEVICE)
    gdnzoo.prefill(*y.args(), checkpoints=ck, checkpoint_every=64, algo="pt-reference")
    assert torch.isnan(ck).all()


def test_offsets_on_the_device():
    cu = torch.tensor([0, 63, 63, 191, 400], dtype=torch.int32, device=DEVICE)
    off = checkpoint_offsets(cu, 64)
    assert off.device == cu.device and off.tolist() == [0, 0, 0, 2, 5]
    assert checkpoint_offsets(cu, 128).tolist() == [0, 0, 0, 1, 2]


# ------------------------------------------------------------------ the torch operator

def test_the_operator_takes_the_checkpoints():
    """torch.ops.gdnzoo.prefill_ declares checkpoints written; eager and torch.compile calls
    of gdnzoo.prefill with checkpoints write the same rows."""
    import gdnzoo.op  # noqa: F401  (registers the operators)
    schema = torch.ops.gdnzoo.prefill_.default._schema
    args = {a.name: a for a in schema.arguments}
    assert args["checkpoints"].alias_info.is_write and "checkpoint_every" in args
    x = _valid()

    def fill(x, ck):
        o, s = gdnzoo.prefill(*x.args(), checkpoints=ck, checkpoint_every=64,
                              algo="pt-reference")
        return o + 1, s
    a, b = _ck(), _ck()
    want = fill(x.clone(), a)
    got = torch.compile(fill, fullgraph=True)(x.clone(), b)
    assert all(torch.equal(u, w) for u, w in zip(want, got)) and torch.equal(a, b)
    assert a.abs().sum() > 0


def test_triton_chunk_needs_a_chunk_that_divides_the_interval():
    """Checkpoints are stored at chunk ends: a config chunk of 128 cannot store every 64
    tokens (refused before any kernel, naming the config)."""
    from gdnzoo.backends import triton_chunk as tc
    ok, why = tc.available(DEVICE)
    if not ok:
        pytest.skip(why)
    x = make_prefill_inputs([130], H=1, HV=1, K=64, V=64, device=DEVICE)
    ck = torch.full((2, 1, 64, 64), float("nan"), device=DEVICE)
    out = torch.full(tuple(x.v.shape), float("nan"), dtype=x.v.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="config: chunk=128 must divide checkpoint_every=64"):
        tc.launch(*x.args(), out, x.state, False, checkpoints=ck, checkpoint_every=64,
                  config=dict(chunk=128))
    assert torch.isnan(ck).all() and torch.isnan(out.float()).all()


@pytest.mark.parametrize("algo", ["triton-chunk", "fla-recurrent"])
def test_bad_cu_seqlens_never_write_checkpoints_past_the_rows_asked_for(algo):
    """Overlapping sequences (a decreasing ``cu_seqlens``, checked only with
    GDNZOO_CHECK_INDICES=1) count more checkpoints than T // checkpoint_every: the kernels
    stop at the rows the contract asks of the buffer (they wrote past it)."""
    ok, why = registry.availability(algo, DEVICE, op="prefill")
    if not ok:
        pytest.skip(f"{algo}: {why}")
    T, every = 128, 64
    x = make_prefill_inputs([T], H=1, HV=1, K=64, V=64, device=DEVICE, seed=9)
    rows = torch.full((T // every + 4, 1, 64, 64), 7.0, device=DEVICE)
    state = torch.zeros(3, 1, 64, 64, device=DEVICE)
    cu = torch.tensor([0, T, 0, T], dtype=torch.int32, device=DEVICE)   # 0 and 2 overlap
    gdnzoo.prefill(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, cu,
                   checkpoints=rows[:T // every], checkpoint_every=every, algo=algo)
    assert bool((rows[T // every:] == 7.0).all())
    assert not bool((rows[:T // every] == 7.0).any())

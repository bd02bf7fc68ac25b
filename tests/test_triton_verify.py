"""Speculative verify (gdnzoo/verify.py) in fla-recurrent's Triton kernel, against the float64
reference (gdnzoo.reference.reference_verify_outputs): out, every stored intermediate state and
per-token slot, padded rows zero, and every other bit of the state (pool page gaps included)
and intermediate storage unchanged.

The three forms at T = 2, 3, 4, 8 (CPU: 2, 3, 8), fp32 and bf16 state, GVA, l2norm, int32 and
int64 indices, each kind of padding (-1, null_slot, >= P, counts outside 1..T, intermediate
rows -1 and >= S, per-token write slots -1 / null_slot / >= P), a dense state with and without
intermediate_indices; explicit tilings (several programs per sequence); one bound launcher
taking each call's index tensors; verify and other calls never sharing a launcher; fla-tma
refusing verify.  CUDA only: CUDA-graph capture replayed with new data, indices and counts,
and offsets past 2^31 elements.  Without a GPU the kernel runs in the Triton interpreter
(conftest sets TRITON_INTERPRET=1), so the CPU cases stay small.
"""
import dataclasses
import itertools

import pytest
import torch

import gdnzoo
from conftest import DEVICE, HAS_CUDA
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.inputs import make_inputs
from gdnzoo.pool import Pool
from gdnzoo.reference import reference_verify_outputs
from gdnzoo.verify import Verify
from helpers import assert_matches, record, run
from gdnzoo.inputs import make_verify_case
from verify_cases import expected_writes

NAME = "fla-recurrent"
TOKENS = (2, 3, 4, 8) if HAS_CUDA else (2, 3, 8)
HEAD = 128 if HAS_CUDA else 64                # K = V


def _backend():
    from gdnzoo.backends import fla_recurrent as mod
    ok, why = mod.available(DEVICE)
    if not ok:
        pytest.skip(f"{NAME} unavailable: {why}")
    return mod


# ------------------------------------------------------------------------------ checking

def _bits(t):
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _outside(buf, view, blocks):
    """A mask over ``buf`` set outside the [HV, V, K] blocks of ``view`` at ``blocks`` (index
    tuples of its leading dimensions)."""
    keep = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
    size = view[(0,) * (view.dim() - 3)].numel()
    base = view.storage_offset() - buf.storage_offset()
    for blk in blocks:
        start = base + sum(i * s for i, s in zip(blk, view.stride()))
        keep[start:start + size] = False
    return keep


def _expect(case, l2):
    """The float64 reference of a case and copies of the storage it may write."""
    ref = reference_verify_outputs(case.x, case.verify(), l2, case.pool())
    return ref, case.buf.clone(), None if case.inter_buf is None else case.inter_buf.clone()


def _assert_verified(case, out, expect, what):
    """out, the written state slots and intermediate steps against the reference; padded rows
    zero; every other bit of the state and intermediate storage as before the call."""
    (ref_out, ref_state, ref_inter), buf0, ibuf0 = expect
    x = case.x
    padded, slots, inter = expected_writes(case)
    rows = sorted(slots)
    assert_matches(out, x.state[rows], ref_out, ref_state[rows], x.state.dtype, what)
    for n in padded:
        assert torch.equal(out[n], torch.zeros_like(out[n])), f"{what}: padded row {n} not 0"
    keep = _outside(case.buf, x.state, [(s,) for s in rows])
    assert torch.equal(_bits(case.buf)[keep], _bits(buf0)[keep]), \
        f"{what}: state storage written outside the slots {rows}"
    if case.inter is None:
        return
    blocks = [(r, t) for r, t, _ in inter]
    if blocks:
        got = torch.stack([case.inter[blk] for blk in blocks])
        ref = torch.stack([ref_inter[blk] for blk in blocks])
        assert_matches(out, got, ref_out, ref, x.state.dtype, f"{what}: intermediate states")
    keep = _outside(case.inter_buf, case.inter, blocks)
    assert torch.equal(_bits(case.inter_buf)[keep], _bits(ibuf0)[keep]), \
        f"{what}: intermediate storage written outside the steps stored"


def _nan_out(case):
    x = case.x
    return torch.full((*x.q.shape[:2], x.v.shape[2], x.v.shape[3]), float("nan"),
                      dtype=x.v.dtype, device=x.q.device)


def _decode(case, l2, out):
    gdnzoo.decode(*case.x.args(), out=out, use_qk_l2norm=l2, algo=NAME, **case.kwargs())


def _check(case, l2, what, call=_decode):
    """Run ``call(case, l2, out)`` on a NaN-filled out and check it (:func:`_assert_verified`),
    the inputs and index tensors untouched."""
    x = case.x
    expect = _expect(case, l2)
    inputs = [t.clone() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)]
    indices = [None if t is None else t.clone() for t in (case.idx, case.inter_idx,
                                                          case.accepted)]
    out = _nan_out(case)
    call(case, l2, out)
    if HAS_CUDA:
        torch.cuda.synchronize()
    _assert_verified(case, out, expect, what)
    for t, t0 in zip((x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias), inputs):
        assert torch.equal(t, t0), f"{what}: an input was modified"
    for t, t0 in zip((case.idx, case.inter_idx, case.accepted), indices):
        assert t is None or torch.equal(t, t0), f"{what}: an index tensor was modified"


def _pad_columns(case, huge):
    """Per-token slots: sequence 0 writes no state at one column (slot 0 made the null slot),
    sequence 2 none at one column >= P (``huge``: 2^40 with int64 indices); neither is the
    column the sequence reads."""
    B, T = case.idx.shape
    P = case.x.state.shape[0]
    acc = [1] * B if case.accepted is None else case.accepted.tolist()
    case.null_slot = 0                      # make_verify_case never uses slot 0 otherwise
    for n, slot in ((0, 0), (2, 2**40 if huge else P + 5)):
        if n < B:
            case.idx[n, T - 1 if acc[n] != T else 0] = slot


# ------------------------------------------------------------------------------ the forms

def _cases():
    """(form, T, state dtype) crossed; the padding, geometry (GVA in three of four), l2norm,
    index dtype and intermediate rows cycle through the cases."""
    pads = {"states": (None, "neg", "null", "past", "row"),
            "update": ("row", None, "past", "null", "neg"),
            "slots": (None, "neg", "null", "past", "acc", "cols"),
            "dense": ("row", None)}
    out = []
    for i, (form, T, sd) in enumerate(itertools.product(
            ("states", "update", "slots", "dense"), TOKENS, (torch.float32, torch.bfloat16))):
        H, HV = ((1, 4), (2, 4), (1, 2), (2, 2))[i % 4]
        out.append(dict(form=form, T=T, sd=sd, pad=pads[form][i % len(pads[form])], H=H, HV=HV,
                        l2=bool(i % 3 == 1), idx=(torch.int32, torch.int64)[i // 2 % 2],
                        rows="default" if i % 4 == 3 else "indexed",
                        update=form == "update" or form == "dense" and i % 2 == 0,
                        B=3 if DEVICE == "cpu" else (1, 5, 33)[i % 3], seed=100 + i))
    return out


CASES = _cases()
# The dedicated tests below start from this case and change what they test.
BASE = dict(form="states", T=3, sd=torch.float32, pad=None, H=2, HV=4, l2=False,
            idx=torch.int32, rows="indexed", update=False, B=3, seed=0)


def _id(c):
    return (f"{c['form']}-T{c['T']}-{'fp32' if c['sd'] == torch.float32 else 'bf16'}-B{c['B']}-"
            f"h{c['H']}x{c['HV']}-{c['pad'] or 'nopad'}-"
            f"{'i64' if c['idx'] == torch.int64 else 'i32'}{'-l2' if c['l2'] else ''}"
            f"{'-rown' if c['rows'] == 'default' else ''}")


def _make(c, **kw):
    """A case of make_verify_case; form "update" is "states" writing the final state too,
    "dense" is "states" on a dense state, pad "cols" is :func:`_pad_columns`."""
    case = make_verify_case("slots" if c["form"] == "slots" else "states", B=c["B"], T=c["T"],
                            H=c["H"], HV=c["HV"], K=HEAD, V=HEAD, state_dtype=c["sd"],
                            device=DEVICE, seed=c["seed"],
                            pad=None if c["pad"] == "cols" else c["pad"], update=c["update"],
                            dense=c["form"] == "dense", index_dtype=c["idx"], rows=c["rows"],
                            **kw)
    if c["pad"] == "cols":
        _pad_columns(case, huge=c["idx"] == torch.int64)
    return case


@pytest.mark.parametrize("c", CASES, ids=_id)
def test_verify_against_reference(c):
    _backend()
    _check(_make(c), c["l2"], f"{NAME} {_id(c)}")


@pytest.mark.parametrize("accepted", range(1, 5))
def test_per_token_slots_each_accepted_count(accepted):
    _backend()
    c = dict(BASE, form="slots", T=4, pad="cols", seed=200 + accepted, idx=torch.int64)
    _check(_make(c, accepted=accepted), True, f"accepted={accepted}")


def test_counts_outside_one_to_t_pad_the_sequence():
    """Counts 0, -3 and T+1 pad their sequences (no state or slot written, zero rows)."""
    _backend()
    case = _make(dict(BASE, form="slots", B=4, seed=211))
    case.accepted.copy_(torch.tensor([0, 2, -3, 4], dtype=case.accepted.dtype))
    _check(case, False, "counts 0, 2, -3, T+1")


@pytest.mark.parametrize("rows", ("default", "indexed"))
def test_update_state_false_leaves_the_state_bit_identical(rows):
    """Deferred commit, pool and dense state: nothing but intermediate states is written."""
    _backend()
    for dense in (False, True):
        c = dict(BASE, form="dense" if dense else "states", rows=rows, seed=221 + dense)
        case = _make(c)
        assert not case.update
        before = case.buf.clone()
        _check(case, False, f"update_state=False dense={dense} rows={rows}")
        assert torch.equal(_bits(case.buf), _bits(before)), "the state changed"


# ------------------------------------------------------------------------------ launches

def _pool_verify(case):
    return case.pool(), case.verify()


def _run_with(config):
    def call(case, l2, out):
        x = case.x
        pool, verify = _pool_verify(case)
        run(_backend(), *x.args(), out, x.state, l2, pool, verify, config=config)
    return call


@pytest.mark.parametrize("form", ("states", "update", "slots", "dense"))
def test_explicit_tiling(form):
    """Four programs per (sequence, head) of 16 rows, 4 lanes a row, constant strides: each
    program reads its sequence's indices and count and stores its rows of every state."""
    _backend()
    c = dict(BASE, form=form, pad={"slots": "cols", "dense": "row"}.get(form, "neg"), H=1,
             HV=2, update=form in ("update", "dense"), seed=231)
    _check(_make(c), True, f"config (16, 1, 1, 4, 1) {form}", _run_with((16, 1, 1, 4, 1)))


@pytest.mark.parametrize("form", ("states", "slots"))
def test_bound_launcher_takes_each_calls_indices(form):
    """One bound launcher, three calls with other index tensors, counts and contents (on a GPU
    the later calls take the cached launch; the third call's index tensors sit 4 bytes off
    16-byte alignment, which Triton's own path serves)."""
    mod = _backend()
    c = dict(BASE, form=form, pad="neg", H=1, HV=2)
    bound = {}

    def call_with(shift):
        def call(case, l2, out):
            if shift:
                for name in ("idx", "inter_idx", "accepted"):
                    t = getattr(case, name)
                    if t is not None:
                        moved = torch.cat([t[:1], t]).contiguous()[1:]
                        setattr(case, name, moved)
            x = case.x
            pool, verify = _pool_verify(case)
            rec = record(*x.args(), out, x.state, l2, pool, verify)
            if not bound:
                bound["f"] = mod.bind(rec)
            bound["f"](rec)
        return call
    for seed, shift in ((241, False), (242, False), (243, True)):
        _check(_make(dict(c, seed=seed)), False, f"{form} call {seed}", call_with(shift))
    if HAS_CUDA:                 # the aligned calls made a fast launcher (CuPy: a raw Launch)
        made = [f for (base, aligned), f in mod._DISPATCH.fast.items()
                if aligned and base[1] == "verify"]
        assert made and all(f is not None for f in made), "no fast launcher for verify calls"


def test_verify_and_other_calls_never_share_a_launcher():
    """The launch key separates dense, pool and every verify variant; calls alternating
    between them on the same tensors each get their own results."""
    mod = _backend()
    key = mod._DISPATCH.key
    case = _make(dict(BASE, T=2, seed=251))             # int32 intermediate_indices
    x = case.x
    out = _nan_out(case)
    args = (*x.args()[:-1], out, x.state, False)
    pool = case.pool()
    base = dict(states=case.inter, indices=case.inter_idx, update=True, per_token=False,
                accepted=None)
    variants = [None] + [Verify(**dict(base, **kw)) for kw in (
        {}, dict(update=False), dict(indices=None), dict(indices=case.inter_idx.long()),
        dict(states=case.inter[:2]), dict(states=None, indices=None, update=False))]
    keys = [key(*args, pool, v) for v in variants] + [key(*args, None, variants[1])]
    assert len(set(keys)) == len(keys), "two kinds of call share a launch key"
    slots = make_verify_case("slots", B=3, T=2, H=2, HV=4, K=HEAD, V=HEAD, device=DEVICE,
                             seed=252)
    sx = slots.x
    sargs = (*sx.args()[:-1], _nan_out(slots), sx.state, False)
    with_acc, without = slots.verify(), slots.verify()._replace(accepted=None)
    assert len({key(*sargs, slots.pool(), with_acc), key(*sargs, slots.pool(), without),
                key(*sargs, slots.pool(), None)}) == 3
    # the same tensors, verify and pool calls in turn, each against its own reference
    from gdnzoo.reference import reference_outputs
    for rnd in range(2):
        _check(case, False, f"verify round {rnd}")
        ref_out, ref_pool = reference_outputs(x, False, pool=pool)
        written = pool.read.long()
        o = _nan_out(case)
        run(mod, *x.args()[:-1], x.scale, o, x.state, False, pool)
        assert_matches(o, x.state[written], ref_out, ref_pool[written], x.state.dtype,
                       f"pool round {rnd}")


def test_tma_refuses_verify():
    from gdnzoo.backends import fla_tma
    case = make_verify_case("states", B=2, T=2, H=1, HV=2, K=64, V=64, device=DEVICE, seed=5)
    x = case.x
    before = case.buf.clone()
    with pytest.raises(ValueError, match="fla-tma.*verify"):
        run(fla_tma, *x.args(), _nan_out(case), x.state, False, case.pool(), case.verify())
    assert torch.equal(case.buf, before)


def test_non_verify_calls_pass_no_verify_arguments():
    """Dense and pool calls hand the kernel None for every verify argument (absent constants:
    their compiled code is the code from before verify) and the default verify constexprs."""
    x = make_inputs(B=2, T=2, H=1, HV=2, K=64, V=64, device="cpu", seed=1)
    assert tlaunch.verify_args(x.state, None) == (None, None, None)
    assert tlaunch.runtime_args(*x.args()[:-1], x.v, x.state, None)[-3:] == (None, None, None)
    assert tlaunch.verify_mode(None) == (0, 1, 0)
    v = Verify(None, None, True, True, None)
    assert tlaunch.verify_mode(v) == (0, 1, 0) and tlaunch.pool_mode(None, v) == 3
    assert all(t is x.state for t in tlaunch.verify_args(x.state, v))


# ------------------------------------------------------------------------------ CUDA only

def _clone_case(case):
    """A deep copy: the same views over copies of the storage."""
    def view(buf, t):
        if t is None:
            return None, None
        b = buf.clone()
        return b, b.as_strided(t.shape, t.stride(), t.storage_offset() - buf.storage_offset())
    buf, state = view(case.buf, case.x.state)
    ibuf, inter = view(case.inter_buf, case.inter)
    x = dataclasses.replace(case.x, **{n: getattr(case.x, n).clone() for n in
                                       ("q", "k", "v", "a", "b", "A_log", "dt_bias")},
                            state=state)
    opt = lambda t: None if t is None else t.clone()        # noqa: E731
    return dataclasses.replace(case, x=x, buf=buf, inter=inter, inter_buf=ibuf,
                               idx=opt(case.idx), inter_idx=opt(case.inter_idx),
                               accepted=opt(case.accepted))


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("form", ("states", "update", "slots", "dense"))
def test_cuda_graph_replays_new_data_indices_and_counts(form):
    """Capture one gdnzoo.decode verify call; replay it after copying new inputs, state,
    indices and counts into the captured tensors: bit-identical to an eager call on copies,
    and right against the reference."""
    _backend()
    c = dict(BASE, form=form, T=4, B=8, l2=True, update=form in ("update", "dense"))
    pads = {"states": "row", "update": "null", "slots": "cols", "dense": "row"}

    def make(seed, pad):
        case = _make(dict(c, seed=seed, pad=pad))
        if case.idx is not None:
            case.null_slot = 0          # captured with the call: the same in every replay
        return case
    case = make(301, None)
    out = _nan_out(case)

    def call():
        _decode(case, True, out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()                                      # compile, bind and resolve before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    for seed, pad in ((302, None), (303, pads[form]), (304, None)):
        new = make(seed, pad)
        for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"):
            getattr(case.x, n).copy_(getattr(new.x, n))
        for n in ("buf", "inter_buf", "idx", "inter_idx", "accepted"):
            if getattr(case, n) is not None:
                getattr(case, n).copy_(getattr(new, n))
        eager = _clone_case(case)
        e_out = _nan_out(eager)
        _decode(eager, True, e_out)
        expect = _expect(case, True)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, e_out), f"replay {seed}: out differs from the eager call"
        assert torch.equal(_bits(case.buf), _bits(eager.buf)), f"replay {seed}: state differs"
        if case.inter_buf is not None:
            assert torch.equal(_bits(case.inter_buf), _bits(eager.inter_buf)), \
                f"replay {seed}: intermediate states differ"
        _assert_verified(case, out, expect, f"{form} replay {seed} pad {pad}")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU with ~9 GB free")
def test_offsets_past_int32():
    """An intermediate row and a per-token slot that start past 2^31 elements (bf16 buffers
    of ~4.3 GB each): 64-bit row and slot offsets."""
    mod = _backend()
    free = torch.cuda.mem_get_info()[0]
    if free < 10 * 2**30:
        pytest.skip(f"needs 10 GiB free GPU memory, has {free / 2**30:.1f}")
    B, T, H, HV, K, V = 2, 2, 2, 4, 128, 128
    sd, slot = torch.bfloat16, HV * V * K
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device="cuda", seed=61)
    far = 2**31 + 4096                              # row 1 / slot 1 starts here
    ibuf = torch.zeros(far + T * slot, dtype=sd, device="cuda")
    inter = ibuf.as_strided((2, T, HV, V, K), (far, slot, V * K, K, 1))
    rows = torch.tensor([1, -1], dtype=torch.int64, device="cuda")
    verify = Verify(inter, rows, True, False, None)
    ref_out, ref_state, ref_inter = reference_verify_outputs(x, verify, False)
    state = x.state.clone()
    out = torch.full((B, T, HV, V), float("nan"), dtype=sd, device="cuda")
    run(mod, *x.args()[:3], state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, state, False,
            None, verify)
    torch.cuda.synchronize()
    assert_matches(out, inter[1, :T], ref_out, ref_inter[1, :T], sd, "intermediate row 1")
    assert_matches(out, state, ref_out, ref_state, sd, "final state")
    inter[1].zero_()
    assert not bool(ibuf.any()), "an intermediate write landed outside row 1"
    del ibuf, inter
    pbuf = torch.zeros(far + slot, dtype=sd, device="cuda")
    pool = pbuf.as_strided((2, HV, V, K), (far, V * K, K, 1))
    pool[0] = x.state[0]
    idx = torch.tensor([[0, 1], [-1, -1]], dtype=torch.int32, device="cuda")
    verify = Verify(None, None, True, True, None)
    y = dataclasses.replace(x, state=pool)
    ref_out, ref_pool, _ = reference_verify_outputs(y, verify, False, Pool(idx, idx, -1))
    out.fill_(float("nan"))
    run(mod, *x.args()[:3], pool, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, pool, False,
            Pool(idx, idx, -1), verify)
    torch.cuda.synchronize()
    assert_matches(out, pool[:2], ref_out, ref_pool[:2], sd, "per-token slots 0 and 1")
    pool[:2].zero_()
    assert not bool(pbuf.any()), "a per-token write landed outside slots 0 and 1"

"""cuda-v4's K-first decode (``cuda_v4_kfirst.cu``): a state [B, HV, K, V] (V contiguous) read
and written where it lies.  On the GPU against the float64 oracle of the k-last step (output
and state, the transposed state, under the correctness gate): B, T, GVA 1/2/3, K = V = 64, 128
and V != K, fp32 and bf16 states, bf16 and fp16 io, the L2 norm, in place and destination
passing, precomputed gates and allow_neg_eigval, every launch shape the kernel takes (explicit
configs), the element-load variant (a state at a 4-byte offset), a page-strided pool with
padding, a CUDA graph replayed with new data, and the speculative verify's forms against
pt-reference; the staged form (GDN_STAGED, the head's tile in shared memory) at every size it
serves.  On the CPU: the launch-shape rule and its refusals, and the staged form's rule."""
from __future__ import annotations

import pytest
import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.backends import _cuda_v4_kfirst as kf
from gdnzoo.inputs import make_inputs
from helpers import cuda_missing

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


gpu = pytest.mark.skipif(cuda_missing() is not None,
                         reason=f"cuda-v4's K-first kernel needs a GPU and CuPy: {cuda_missing()}")


def kfirst(t):
    return t.transpose(-1, -2).contiguous()


def check(x, l2=False, dest=False, config=None, offset=0, **form):
    """One K-first call through cuda-v4 (``config``: its launch fields) against the float64
    oracle of the k-last call; the state at ``offset`` elements into its buffer."""
    ref_out, ref_state = x.reference(l2) if not form else _form_reference(x, l2, **form)
    st = kfirst(x.state)
    buf = torch.empty(st.numel() + offset, dtype=st.dtype, device=st.device)
    state = buf[offset:].view(st.shape)
    state.copy_(st)
    new = torch.full_like(state, float("nan")) if dest else None
    args = list(x.args())
    args[3] = state
    if form.get("g") is not None:
        args[4:8] = [None] * 4
    if config is None:
        out, ns = gdnzoo.decode(*args, use_qk_l2norm=l2, new_state=new,
                                state_layout="k-first", algo="cuda-v4", **form)
    else:
        from gdnzoo.backends import cuda_v4
        out = torch.empty_like(x.v)
        ns = state if new is None else new
        cuda_v4.run(_record(x, state, out, new, l2, **form), config=config)
    j = gate.judge(out, ns.transpose(-1, -2), ref_out, ref_state)
    assert j.ok, j.reason
    if dest:
        assert torch.equal(state, st)                     # the input state untouched


def _record(x, state, out, new_state, l2, **form):
    """The validated decode call record of a K-first call (for an explicit config)."""
    from gdnzoo import dispatch
    from gdnzoo.operation import DECODE
    named = {arg.name: arg.default for arg in DECODE.args}
    raw = form.get("g") is None
    named.update(q=x.q, k=x.k, v=x.v, state=state, A_log=x.A_log if raw else None,
                 a=x.a if raw else None, dt_bias=x.dt_bias if raw else None,
                 b=x.b if raw else None, scale=x.scale, out=out, new_state=new_state, use_qk_l2norm=l2,
                 algo=None, state_layout="k-first", **form)
    return dispatch.record(DECODE, tuple(named[n] for n in DECODE.names), "cuda-v4")


def _form_reference(x, l2, g=None, beta=None, allow_neg_eigval=False):
    from gdnzoo.reference import reference_decode
    out = torch.empty(x.v.shape, dtype=torch.float64, device=x.v.device)
    st = torch.empty(x.state.shape, dtype=torch.float64, device=x.v.device)
    args = list(x.args())
    if g is not None:
        args[4:8] = [None] * 4
    reference_decode(*args, out, st, l2, torch.float64, g=g, beta=beta,
                     neg=allow_neg_eigval)
    return out, st


@gpu
@pytest.mark.parametrize("B,T,H,HV,K,V", [(1, 1, 16, 32, 128, 128), (5, 1, 4, 8, 128, 128),
                                          (3, 3, 2, 6, 128, 128), (2, 2, 4, 4, 64, 64),
                                          (4, 1, 2, 4, 128, 64), (3, 2, 2, 4, 64, 128)])
@pytest.mark.parametrize("sd", [F32, BF16], ids=["fp32", "bf16"])
def test_shapes(B, T, H, HV, K, V, sd):
    for seed, (l2, dest) in enumerate([(False, False), (True, True)]):
        check(make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device="cuda",
                          seed=seed), l2=l2, dest=dest)


@gpu
def test_fp16_io():
    check(make_inputs(B=3, T=2, H=2, HV=4, io_dtype=F16, device="cuda", seed=3), l2=True)


@gpu
def test_precomputed_gates_and_neg_eigval():
    """g and beta in place of the raw gates; beta = 2 sigmoid(b) with allow_neg_eigval."""
    from gdnzoo.reference import gates
    x = make_inputs(B=3, T=2, H=2, HV=4, device="cuda", seed=4)
    g, beta = gates(x.A_log, x.a, x.dt_bias, x.b)
    check(x, l2=True, g=torch.log(g), beta=beta)
    check(x, l2=True, allow_neg_eigval=True)


@gpu
@pytest.mark.parametrize("sd", [F32, BF16], ids=["fp32", "bf16"])
def test_every_launch_shape(sd):
    """Every (warps, lanes) the kernel takes at K = V = 128 (explicit configs)."""
    x = make_inputs(B=2, T=2, H=2, HV=4, state_dtype=sd, device="cuda", seed=5)
    size = torch.empty(0, dtype=sd).element_size()
    shapes = [(w, n) for n in kf.LANES for w in (1, 2, 4, 8)
              if not kf.refusal(128, 128, size, w, n, True)]
    assert len(shapes) >= 10
    for w, n in shapes:
        check(x.clone(), l2=True, config=dict(warps=w, row_groups=1, lanes_per_row=n, hint=3))


@gpu
def test_element_loads():
    """A state 4 bytes off a 16-byte boundary: the variant with one column a lane."""
    check(make_inputs(B=3, T=2, H=2, HV=4, device="cuda", seed=6), l2=True, offset=1)


@gpu
def test_pool_with_padding_and_pages():
    """A K-first pool whose pages are larger than a slot; padding reads and writes nothing."""
    x = make_inputs(B=3, T=1, H=2, HV=4, device="cuda", seed=7)
    P, page = 6, 4 * 128 * 128 + 64
    buf = torch.randn(P, page, device="cuda") * 0.05
    pool = buf[:, :4 * 128 * 128].view(P, 4, 128, 128)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device="cuda")
    before = buf.clone()
    x.state = pool.transpose(-1, -2)[idx.clamp(min=0).long()].contiguous()
    ref_out, ref_state = x.reference(True)
    args = list(x.args())
    args[3] = pool
    out, _ = gdnzoo.decode(*args, use_qk_l2norm=True, state_indices=idx,
                           state_layout="k-first", algo="cuda-v4")
    for i, s in enumerate(idx.tolist()):
        if s < 0:
            assert not out[i].any()
            continue
        j = gate.judge(out[i:i + 1], pool[s:s + 1].transpose(-1, -2), ref_out[i:i + 1],
                       ref_state[i:i + 1])
        assert j.ok, j.reason
    touched = torch.zeros(P, dtype=torch.bool)
    touched[[4, 1]] = True
    assert torch.equal(buf[~touched], before[~touched])
    assert torch.equal(buf[touched][:, 4 * 128 * 128:], before[touched][:, 4 * 128 * 128:])


@pytest.fixture
def staged_everywhere(monkeypatch):
    """Every K-first call that GDN_STAGED can serve takes it (no size floor), with fresh
    launchers; yields the ``staged`` flag of each K-first launch built."""
    from gdnzoo import dispatch
    from gdnzoo.backends import cuda_v4
    monkeypatch.setattr(kf, "STAGED_BYTES", 0)
    monkeypatch.setattr(dispatch, "_MEMO", {})
    monkeypatch.setattr(cuda_v4, "_binds", {})
    seen, launch = [], kf.launch

    def spy(bound, vec16, *a, **kw):
        seen.append(bool(a[4] if len(a) > 4 else kw.get("staged", False)))
        return launch(bound, vec16, *a, **kw)
    monkeypatch.setattr(kf, "launch", spy)
    yield seen


@gpu
@pytest.mark.parametrize("sd", [F32, BF16], ids=["fp32", "bf16"])
def test_staged_form(sd, staged_everywhere):
    """GDN_STAGED (the head's tile staged in shared memory by bulk copies) where the size floor
    is lifted: in place and destination passing, GVA 1, 2 and 3, with and without the L2 norm,
    fp16 io, precomputed gates, allow_neg_eigval, a padded page-strided pool, a CUDA graph
    replayed with new data; T > 1, K = 64 and an fp32 state to another tensor keep the
    register tile."""
    from gdnzoo.reference import gates
    bf16 = sd == BF16                     # destination passing: bf16 states only
    for seed, (B, H, HV, l2, dest) in enumerate([(3, 2, 4, True, False), (2, 4, 4, False, bf16),
                                                 (4, 2, 6, True, bf16), (1, 16, 32, True, False)]):
        check(make_inputs(B=B, T=1, H=H, HV=HV, state_dtype=sd, device="cuda", seed=seed),
              l2=l2, dest=dest)
    check(make_inputs(B=3, T=1, H=2, HV=4, state_dtype=sd, io_dtype=F16, device="cuda",
                      seed=11), l2=True)
    x = make_inputs(B=3, T=1, H=2, HV=4, state_dtype=sd, device="cuda", seed=12)
    g, beta = gates(x.A_log, x.a, x.dt_bias, x.b)
    check(x, l2=True, g=torch.log(g), beta=beta)
    check(x, l2=True, allow_neg_eigval=True)
    assert staged_everywhere and all(staged_everywhere)
    if bf16:
        test_pool_with_padding_and_pages()
        test_graph_replay_with_new_data()
        assert all(staged_everywhere)
    staged_everywhere.clear()
    check(make_inputs(B=2, T=2, H=2, HV=4, state_dtype=sd, device="cuda", seed=13), l2=True)
    check(make_inputs(B=2, T=1, H=2, HV=4, K=64, V=64, state_dtype=sd, device="cuda", seed=14))
    if not bf16:
        check(make_inputs(B=2, T=1, H=2, HV=4, state_dtype=sd, device="cuda", seed=15), dest=True)
    assert staged_everywhere and not any(staged_everywhere)


def test_staged_rule():
    """pick_staged: one token, no verify form, K = V = 128, the K rows contiguous, states of
    STAGED_BYTES or more, bf16 or in place (the H200's measured cells)."""
    mb = 1 << 20
    assert kf.pick_staged(2, 64 * 32, 128, 128, 1, True, 128, False)          # bf16 64 MB
    assert kf.pick_staged(2, 64 * 32, 128, 128, 1, False, 128, False)         # to another
    assert not kf.pick_staged(2, 16 * 32, 128, 128, 1, True, 128, False)      # 16 MB
    assert kf.pick_staged(4, 32 * 32, 128, 128, 1, True, 128, False)          # fp32 64 MB
    assert not kf.pick_staged(4, 256 * 32, 128, 128, 1, False, 128, False)    # fp32 dest
    assert not kf.pick_staged(2, 256 * 32, 128, 128, 2, True, 128, False)     # T = 2
    assert not kf.pick_staged(2, 256 * 32, 128, 128, 1, True, 128, True)      # verify
    assert not kf.pick_staged(2, 256 * 32, 128, 128, 1, True, 136, False)     # rows apart
    assert not kf.pick_staged(2, 4096 * 4, 64, 64, 1, True, 64, False)        # K = 64
    assert kf.STAGED_BYTES == 64 * mb
    assert kf.staged_smem(2) < 48 * 1024 < kf.staged_smem(4) <= 227 * 1024


def test_cuda_v4_launch_paths_pass_dynamic_shared_memory(monkeypatch):
    """Both of cuda-v4's per-call launch paths (the tensors', and the dense raw-gate
    ``with_pointers``) launch with the Launch's dynamic shared memory: the staged form's tile
    lives there (without it the first GPU run read out of bounds)."""
    from types import SimpleNamespace
    from gdnzoo.backends import _cuda_build as cuda_build
    from gdnzoo.backends import cuda_v4
    seen = []
    monkeypatch.setattr(cuda_build, "launch_raw", lambda *a: seen.append(a))
    launch = cuda_build.Launch(SimpleNamespace(func=7), 64, 256, 0,
                               template=bytes(cuda_build.PARAMS.size), shared=37968)
    bound = object.__new__(cuda_v4.Bound)
    bound.strides_aligned, bound.vec16, bound.dest = True, launch, False
    x = make_inputs(B=2, T=1, H=2, HV=4, seed=16)
    out = torch.empty_like(x.v)
    bound.launch(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, out, x.state)
    ptrs = [t.data_ptr() for t in (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b)]
    assert bound.with_pointers((*ptrs, out.data_ptr(), 0), x.scale)     # CPU tensors: aligned
    assert len(seen) == 2 and all(c[1:4] == (64, 256, 0) and c[-1] == 37968 for c in seen)


@gpu
def test_graph_replay_with_new_data():
    x = make_inputs(B=4, T=1, H=2, HV=4, device="cuda", seed=8)
    y = make_inputs(B=4, T=1, H=2, HV=4, device="cuda", seed=9)
    st = kfirst(x.state)
    args = list(x.args())
    args[3] = st
    out = torch.empty_like(x.v)
    run = lambda: gdnzoo.decode(*args, out=out, state_layout="k-first",  # noqa: E731
                                algo="cuda-v4")
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    for dst, src in zip(args[:3] + args[4:8], list(y.args())[:3] + list(y.args())[4:8]):
        dst.copy_(src)
    st.copy_(kfirst(y.state))
    g.replay()
    torch.cuda.synchronize()
    ref_out, ref_state = y.reference(False)
    j = gate.judge(out, st.transpose(-1, -2), ref_out, ref_state)
    assert j.ok, j.reason


def test_launch_shape_rule_and_refusals():
    """The rule's shapes serve every head size cuda-v4 takes; refusals name the reason."""
    for size in (4, 2):
        for K in (32, 64, 128, 256):
            for V in (32, 64, 96, 128, 256):
                for BHV in (1, 32 * 256):               # latency- and bandwidth-bound
                    w, n, _ = kf.shape(size, BHV, K, V)
                    assert not kf.refusal(K, V, size, w, n, True), (size, BHV, K, V)
                    w, n, _ = kf.shape(size, BHV, K, V, vec16=False)
                    assert not kf.refusal(K, V, size, w, n, False), (size, BHV, K, V)
    assert kf.shape(4, 32, 128, 128) == (2, 8, 3)          # B = 1 of 16/32: latency
    assert kf.shape(4, 32 * 256, 128, 128) == (4, 2, 3)    # B = 256: two lines a row
    assert kf.shape(4, 32 * 256, 128, 128, inplace=False) == (4, 2, 0)
    assert kf.shape(2, 32 * 64, 128, 128) == (4, 4, 3)
    assert kf.shape(2, 32, 64, 32) == (2, 8, 3)            # 32 columns: 8 lanes along K
    assert "divide V" in kf.refusal(128, 32, 2, 4, 4, True)     # 64 columns a block
    assert "state values a lane" in kf.refusal(128, 128, 2, 1, 2, True)
    assert "lanes along K" in kf.refusal(128, 128, 4, 1, 32, True)
    assert "dividing K" in kf.refusal(64, 64, 4, 8, 16, True)
    assert kf.serves(128, 128, 4) == ""


def _verify_call(name, case, l2, ibuf, shape, strides):
    """A verify call of ``case`` (gdnzoo.inputs.make_verify_case, k-last) on a K-first copy of
    its state storage and a copy of ``ibuf``, K-first intermediate storage viewed as ``shape``
    and ``strides``: (out, pool, intermediate storage, its view)."""
    x = case.x
    pool = kfirst(x.state)
    kw = case.kwargs()
    buf = view = None
    if ibuf is not None:
        buf = ibuf.clone()
        view = kw["intermediate_states"] = buf.as_strided(shape, strides)
    out, _ = gdnzoo.decode(*x.args()[:3], pool, *x.args()[4:], use_qk_l2norm=l2,
                           state_layout="k-first", algo=name, **kw)
    return out, pool, buf, view


VERIFY_FORMS = [  # (form, update, rows, pad, dense)
    ("states", False, "indexed", None, False), ("states", True, "default", "neg", False),
    ("states", False, "indexed", "row", False), ("states", True, "indexed", "null", False),
    ("states", True, "default", None, True), ("slots", True, "indexed", None, False),
    ("slots", True, "indexed", "col", False), ("slots", True, "indexed", "acc", False),
]


@gpu
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
@pytest.mark.parametrize("form,update,rows,pad,dense", VERIFY_FORMS,
                         ids=[f"{f}{'+upd' if u else ''}-{r}-{p or 'nopad'}{'-dense' * d}"
                              for f, u, r, p, d in VERIFY_FORMS])
def test_verify_forms_match_pt_reference(form, update, rows, pad, dense, sd):
    """The speculative verify's forms on a K-first state and K-first intermediate states:
    cuda-v4 against pt-reference on the same call (the reference's verify code, whose forms
    tests/test_verify.py holds to the float64 oracle, on transposed views of the K-first
    states): the outputs, the whole state storage (written slots under
    the gate, the rest bit-identical) and the whole intermediate storage, gaps between its
    steps and rows included (the same elements written, under the gate; the rest
    bit-identical)."""
    from gdnzoo.inputs import intermediate_buffer, make_verify_case
    from verify_cases import _blocks_mask, expected_writes
    for T, H, HV, K, l2, idx in ((2, 2, 4, 128, False, torch.int32),
                                 (4, 2, 6, 64, True, torch.int64),
                                 (3, 4, 4, 128, True, torch.int32)):
        case = make_verify_case(form, B=5, T=T, H=H, HV=HV, K=K, V=K, state_dtype=sd,
                                device="cuda", seed=T + 10 * K, pad=pad, update=update,
                                dense=dense, index_dtype=idx, rows=rows)
        ibuf, shape, strides = None, None, None
        if case.inter is not None:                     # K-first [S, T_max, HV, K, V], gaps
            S, T_max = case.inter.shape[:2]
            ibuf, view = intermediate_buffer(S, T_max, HV, K, K, dtype=sd, device="cuda",
                                             step_gap=64, row_gap=96,
                                             gen=torch.Generator().manual_seed(T))
            shape, strides = view.shape, view.stride()
        ref = _verify_call("pt-reference", case, l2, ibuf, shape, strides)
        got = _verify_call("cuda-v4", case, l2, ibuf, shape, strides)
        what = f"T={T} {H}/{HV} K={K}"
        padded, slots, inter = expected_writes(case)
        rows_w = sorted(slots)
        j = gate.judge(got[0], got[1][rows_w], ref[0], ref[1][rows_w], state_dtype=sd)
        assert j.ok, f"{what}: out or state: {j.reason}"
        for n in padded:
            assert not got[0][n].any(), f"{what}: padded sequence {n}'s outputs not zero"
        other = torch.ones(got[1].shape[0], dtype=torch.bool, device="cuda")
        other[rows_w] = False
        assert torch.equal(got[1][other], kfirst(case.x.state)[other]), \
            f"{what}: a slot written that the call does not write"
        if ibuf is not None:
            blocks = [(r, t) for r, t, _ in inter]
            assert blocks or pad == "row", what
            if blocks:
                j = gate.judge(got[0], torch.stack([got[3][b_] for b_ in blocks]), ref[0],
                               torch.stack([ref[3][b_] for b_ in blocks]), state_dtype=sd)
                assert j.ok, f"{what}: intermediate states: {j.reason}"
            keep = _blocks_mask(got[2], got[3], blocks)
            assert torch.equal(got[2][keep], ibuf[keep]), \
                f"{what}: intermediate storage written outside the stored steps"

"""cuda-chunk's prep kernel (backends/cuda_chunk_prep.cu) against triton-chunk's Triton prep
kernel: both write the workspace for the same inputs, which must agree (T^T and M^T as their
stored parts, the five factors per token) over gate forms, dtypes, precisions, GVA ratios and
ragged batches with a zero-length sequence; grouping a k-head's value heads in one CTA must
not change a bit of it.  Outputs and states of cuda-chunk against the reference run in the
registry's matrices (tests/test_prefill.py, test_forms.py, test_prefill_checkpoints.py).  The
refusals and the config checks run on CPU."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gdnzoo.backends import _cuda_chunk_prep as prep
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends import cuda_chunk
from gdnzoo.inputs import make_prefill_inputs

from conftest import DEVICE
from helpers import cuda_missing

MISSING = cuda_missing((8, 0)) or (None if cuda_chunk.available("cuda")[0]
                                   else cuda_chunk.available("cuda")[1])


@pytest.mark.parametrize("K, io, precision, chunk, word", [
    (64, torch.bfloat16, "bf16x3", 64, "K = 128"),
    (128, torch.float16, "bf16x3", 64, "bfloat16"),
    (128, torch.bfloat16, "ieee", 64, "'ieee'"),
    (128, torch.bfloat16, "bf16x3", 32, "chunk=64"),
])
def test_the_prep_kernel_refuses_what_it_is_not_written_for(K, io, precision, chunk, word):
    ok, why = prep.serves(K, io, precision, chunk)
    assert not ok and word in why
    assert prep.serves(128, torch.bfloat16, "bf16", 64) == (True, "")


def test_config_prep_is_checked_before_any_kernel():
    fixed = dict(block_v=32, warps=4, segments=1)      # no SM count needed
    with pytest.raises(ValueError, match="prep must be one of"):
        tc.resolve(dict(fixed, prep="gpu"), 1, 8, 128, torch.device("cuda"))
    with pytest.raises(ValueError, match="prep 'cuda'.*'tf32'"):
        tc.resolve(dict(fixed, prep="cuda", precision="tf32"), 1, 8, 128, torch.device("cuda"))
    with pytest.raises(ValueError, match="prep 'cuda' needs a CUDA device"):
        tc.resolve(dict(fixed, prep="cuda"), 1, 8, 128, torch.device("cpu"))


def test_cuda_chunk_picks_its_chain_unless_the_config_names_one(monkeypatch):
    """cuda-chunk runs triton-chunk with prep "cuda" and chain "auto" (the "bf16x3" chain on
    warpgroup MMAs where pick_x3 prefers it, else the Triton one); a config naming a chain
    keeps it."""
    seen = []
    monkeypatch.setattr(tc, "bind", lambda call, config: seen.append(config) or (lambda r: None))
    for config in (None, dict(block_v=16), dict(chain="triton"), dict(chain="cuda")):
        cuda_chunk.run(None, config=config)
    assert [(c.prep, c.chain) for c in seen] == [("cuda", "auto"), ("cuda", "auto"),
                                                  ("cuda", "triton"), ("cuda", "cuda")]
    assert seen[1].block_v == 16


def test_one_value_head_a_cta_up_to_group_waves_of_capped_ctas_then_groups_of_three_or_four():
    waves = prep.GROUP_WAVES * 132 * prep.CTAS_PER_SM_CAPPED
    assert [prep.pick_heads(g, waves, 132) for g in (1, 2, 3, 4, 6, 8)] == [1] * 6
    assert [prep.pick_heads(g, waves + 1, 132) for g in (1, 2, 3, 4, 6, 8)] == \
        [1, 1, 3, 4, 3, 4]


def test_registers_are_capped_only_past_one_wave_of_uncapped_ctas():
    wave = 132 * prep.CTAS_PER_SM
    assert prep.min_ctas(wave, 132) == prep.CTAS_PER_SM
    assert prep.min_ctas(wave + 1, 132) == prep.CTAS_PER_SM_CAPPED > prep.CTAS_PER_SM


def _workspace(x, gates, precision, neg, use_cuda, heads=None):
    c = tc.resolve(dict(precision=precision, segments=1), x.cu_seqlens.numel() - 1,
                   x.v.shape[1], x.v.shape[2], x.q.device, tokens=x.q.shape[0])
    T, HV = x.q.shape[0], x.v.shape[1]
    ws = torch.full((tc.workspace_numel(T, HV, c),), float("nan"), device=x.q.device)
    mats, vecs = tc._workspace(ws, T, HV, c, x.q.device)
    if gates:
        g = -torch.rand(x.a.shape, device=x.q.device) * 3.0
        beta = torch.rand(x.b.shape, device=x.q.device).to(x.b.dtype)
        args = tlaunch.prefill_gates(None, None, None, None, g, beta)
    else:
        args = tlaunch.prefill_gates(x.A_log, x.a, x.dt_bias, x.b, None, None)
    kind, ga, gb, A_log, dt_bias = args
    launch = (lambda *a, **kw: prep.launch(*a, **kw, heads=heads)) if use_cuda else (
        lambda *a, neg, pdl: tc.launch_prep(*a, neg=neg))
    launch(x.q, x.k, ga, gb, A_log, dt_bias, x.cu_seqlens, mats, vecs, x.scale or 128 ** -0.5,
           True, kind, c, neg=neg, pdl=False)
    torch.cuda.synchronize()
    return mats, vecs


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


CASES = [
    # lengths, H, HV, gates precomputed, precision, neg, dtype of a/b, cu_seqlens dtype
    ([300], 2, 4, False, "bf16x3", False, torch.bfloat16, torch.int32),
    ([2048, 1, 700, 0, 63, 65, 130], 4, 8, False, "bf16x3", False, torch.bfloat16, torch.int64),
    ([200, 64, 0, 129], 2, 6, True, "bf16x3", False, torch.float32, torch.int32),
    ([200, 64, 0, 129], 4, 8, False, "bf16", True, torch.float32, torch.int32),
    ([1, 17, 500], 1, 1, False, "bf16", False, torch.bfloat16, torch.int64),
    ([700, 0, 90], 2, 8, False, "bf16x3", False, torch.bfloat16, torch.int32),
    # 140 sequences: past the 128 bounds the prep's sequence search keeps in shared memory
    ([(37 * i) % 150 for i in range(140)], 2, 4, False, "bf16", False, torch.bfloat16,
     torch.int32),
]


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk cannot run here: {MISSING}")
@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_cuda_prep_writes_the_triton_prep_workspace(i):
    lens, H, HV, gates, precision, neg, gdt, cdt = CASES[i]
    x = make_prefill_inputs(lens, H=H, HV=HV, device="cuda", seed=i, index_dtype=cdt)
    x = dataclasses.replace(x, a=x.a.to(gdt), b=x.b.to(gdt))
    torch.manual_seed(i)
    want = _workspace(x, gates, precision, neg, use_cuda=False)
    torch.manual_seed(i)
    got = _workspace(x, gates, precision, neg, use_cuda=True)
    T, HV = x.q.shape[0], x.v.shape[1]
    np_ = 2 if precision == "bf16x3" else 1
    n = T * HV * 2 * np_ * 64                   # "bf16" uses the first half of the buffer
    mw, mg = (m[:n].view(T, HV, 2, np_, 64).float().sum(3) for m in (want[0], got[0]))
    assert not torch.isnan(mg).any() and not torch.isnan(got[1]).any(), "a row left unwritten"
    # the kernels' exp and sums differ in the last bits; T = (I + A)^-1 carries that through
    # its conditioning, larger with allow_neg_eigval (beta up to 2): 2.8e-5 measured on an H200
    tol = 1e-4 if neg else 2e-5
    assert _rel(mg, mw) < tol, f"T^T / M^T differ: {_rel(mg, mw):.2e}"
    assert _rel(got[1], want[1]) < 2e-5, f"per-token factors differ: {_rel(got[1], want[1]):.2e}"


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk cannot run here: {MISSING}")
@pytest.mark.parametrize("i", range(len(CASES)))
def test_value_heads_grouped_in_a_cta_write_the_same_workspace_bit_for_bit(i):
    """Every divisor of GVA up to prep.MAX_HEADS as the value heads a CTA: the workspace one
    head a CTA writes, bit for bit (each head's arithmetic is the same)."""
    lens, H, HV, gates, precision, neg, gdt, cdt = CASES[i]
    x = make_prefill_inputs(lens, H=H, HV=HV, device="cuda", seed=i, index_dtype=cdt)
    x = dataclasses.replace(x, a=x.a.to(gdt), b=x.b.to(gdt))
    torch.manual_seed(i)
    one = _workspace(x, gates, precision, neg, use_cuda=True, heads=1)
    for h in (d for d in range(2, prep.MAX_HEADS + 1) if (HV // H) % d == 0):
        torch.manual_seed(i)
        got = _workspace(x, gates, precision, neg, use_cuda=True, heads=h)
        for a, b in zip(got, one):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0),
                                                                     b.nan_to_num(0)), h


HOPPER_MISSING = MISSING or cuda_missing((9, 0))


@pytest.mark.skipif(HOPPER_MISSING is not None,
                    reason=f"needs a GPU with stmatrix to compare against: {HOPPER_MISSING}")
@pytest.mark.parametrize("precision", ["bf16", "bf16x3"])
def test_the_pre_hopper_build_writes_the_workspace_of_the_hopper_build(monkeypatch, precision):
    """Before Hopper (no stmatrix) the "bf16" rows are staged by plain stores: that build, as
    compute_80 PTX the driver compiles for this GPU, writes the native build's workspace bit
    for bit."""
    from gdnzoo.backends import _cuda_build as cb
    lens, H, HV = [300, 64, 0, 129], 2, 4
    x = make_prefill_inputs(lens, H=H, HV=HV, device="cuda", seed=11)
    native = _workspace(x, False, precision, False, use_cuda=True)
    monkeypatch.setattr(cb, "arch_option",
                        lambda cc, supported=None: ("--gpu-architecture=compute_80", "ptx"))
    monkeypatch.setattr(cb, "_kernels", {})
    older = _workspace(x, False, precision, False, use_cuda=True)
    for a, b in zip(older, native):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0),
                                                                 b.nan_to_num(0))


@pytest.mark.skipif(not tc.available(DEVICE)[0], reason=tc.available(DEVICE)[1])
def test_a_bad_prep_is_refused_cold_and_right_after_a_valid_call():
    """Config.prep is checked on every call before any kernel: nothing is written."""
    dev = DEVICE
    x = make_prefill_inputs([70, 3], H=1, HV=2, K=64, V=64, device=dev, seed=4)
    out = torch.full((73, 2, 64), float("nan"), dtype=x.q.dtype, device=dev)
    ns = torch.full_like(x.state, float("nan"))

    def call(config):
        tc.launch(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale,
                  out, ns, True, config=config)
    with pytest.raises(ValueError, match="prep must be one of"):
        call(dict(prep="gpu"))
    assert torch.isnan(out).all() and torch.isnan(ns).all()
    call(None)
    before = (out.clone(), ns.clone())
    assert not torch.isnan(before[0]).any()
    with pytest.raises(ValueError, match="prep must be one of"):
        call(dict(prep="gpu"))
    assert torch.equal(out, before[0]) and torch.equal(ns, before[1])

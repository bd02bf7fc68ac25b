"""cuda-chunk-bf16's sequential kernel (backends/cuda_chunk_chain.cu: warpgroup MMAs, TMA copies)
against triton-chunk's sequential kernel with the same "bf16" products, on the same workspace
(both after cuda-chunk's prep): outputs, states, pools and checkpoints must be bit-identical in
every state form (dense, K-first, pools with padding and has_initial_state, separate write slots,
bf16 states, checkpoints, PDL, int32/int64 indices, V = 64, sequences shorter than a chunk),
and views off the CUDA kernels' 16-byte grain must take the Triton kernels.  Outputs and states
against the reference run in the registry's matrices (tests/test_prefill.py, test_forms.py,
test_prefill_checkpoints.py, test_prefill_graphs.py).  Refusals, config checks and the 16-byte
rule run on CPU."""
from __future__ import annotations

import re

import pytest
import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _cuda_chunk_prep as prep
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import cuda_chunk_bf16
from gdnzoo.backends import triton_chunk as tc
from gdnzoo.inputs import make_prefill_inputs
from gdnzoo.prefill_contract import Problem

from helpers import cuda_missing

BF16 = torch.bfloat16
MISSING = cuda_missing((9, 0)) or (
    None if torch.cuda.get_device_capability() == chain.CC
    else f"the chain kernel is sm_90a only, this GPU is {torch.cuda.get_device_capability()}") \
    or (None if cuda_chunk_bf16.available("cuda")[0] else cuda_chunk_bf16.available("cuda")[1])


@pytest.mark.parametrize("cc, K, V, io, precision, chunk, word", [
    ((8, 0), 128, 128, BF16, "bf16", 64, "compute capability 9.0"),
    ((10, 0), 128, 128, BF16, "bf16", 64, "compute capability 9.0"),
    ((9, 0), 64, 128, BF16, "bf16", 64, "K = 128"),
    ((9, 0), 128, 96, BF16, "bf16", 64, "V % 64"),
    ((9, 0), 128, 128, torch.float16, "bf16", 64, "bfloat16"),
    ((9, 0), 128, 128, BF16, "tf32x3", 64, "'bf16' and 'bf16x3' products only"),
    ((9, 0), 128, 128, BF16, "bf16", 32, "chunk=64"),
])
def test_the_chain_kernel_refuses_what_it_is_not_written_for(cc, K, V, io, precision, chunk,
                                                             word):
    ok, why = chain.serves(cc, K, V, io, precision, chunk)
    assert not ok and word in why
    assert chain.serves((9, 0), 128, 64, BF16, "bf16", 64) == (True, "")
    assert chain.serves((9, 0), 128, 128, BF16, "bf16x3", 64) == (True, "")


def _problem(**kw):
    base = dict(N=2, T=100, H=4, HV=8, K=128, V=128, state_dtype=torch.float32, io_dtype=BF16,
                device="cuda", cc=(9, 0))
    return Problem(**{**base, **kw})


def test_cuda_chunk_bf16_says_why_it_cannot_serve():
    assert cuda_chunk_bf16.supports(_problem()) == (True, "")
    for kw, word in [(dict(cc=(8, 9)), "compute capability 9.0"), (dict(V=96), "V=96"),
                     (dict(K=64), "K = 128"), (dict(io_dtype=torch.float16), "bfloat16"),
                     (dict(device="cpu"), "CUDA GPU|Triton interpreter")]:
        ok, why = cuda_chunk_bf16.supports(_problem(**kw))
        assert not ok and re.search(word, why), (kw, why)


def test_cuda_chunk_bf16_runs_triton_chunk_with_both_cuda_kernels(monkeypatch):
    """Its entry point is triton-chunk's with prep and chain "cuda" and precision "bf16"."""
    seen = {}
    monkeypatch.setattr(tc, "bind", lambda call, config: seen.update(config=config)
                        or (lambda rec: seen.update(rec=rec)))
    cuda_chunk_bf16.run("record", config=dict(block_v=16))
    assert seen["rec"] == "record"
    c = seen["config"]
    assert (c.prep, c.chain, c.precision, c.block_v) == ("cuda", "cuda", "bf16", 16)


def test_config_chain_is_checked_before_any_kernel():
    fixed = dict(block_v=32, warps=4, segments=1)      # no SM count needed
    with pytest.raises(ValueError, match="chain must be one of"):
        tc.resolve(dict(fixed, chain="wgmma"), 1, 8, 128, torch.device("cpu"))
    with pytest.raises(ValueError, match="chain 'cuda' needs a CUDA device"):
        tc.resolve(dict(fixed, chain="cuda", precision="bf16"), 1, 8, 128, torch.device("cpu"))


def test_the_16_byte_rule_of_the_cuda_kernels_copies():
    x = torch.zeros(8, 4, 136, dtype=BF16)
    assert cuda_build.aligned16(x[..., :128])             # rows of 272 bytes: 16-byte strides
    assert not cuda_build.aligned16(x[..., 1:129])        # base 2 bytes off
    assert not cuda_build.aligned16(torch.zeros(8, 4, 129, dtype=BF16)[..., :128])  # 258 B rows
    assert not cuda_build.aligned16(x.transpose(0, 2))    # last dim not contiguous
    assert not cuda_build.aligned16(x[:0])                # nothing to copy
    assert cuda_build.aligned16(*(x[..., :128],) * 4)
    assert not cuda_build.aligned16(x[..., :128], x[..., :128], x[..., 1:129], x[..., :128])


def test_segments_fill_one_wave_of_ctas_once_each_has_enough_chunks():
    long = 8192
    def pick(programs, tokens, N):
        return tc.pick_segments(programs, 132, tokens, N, 64, most=chain.MAX_SEGMENTS)
    assert pick(16, long, 1) == 4             # 4/8 heads: 112 CTAs
    assert pick(64, long, 1) == 1             # 16/32: 192 > 132
    assert pick(16, 2 * 16 * 64, 1) == 2      # 16 chunks a segment at most
    assert pick(16, long, 8) == 1             # 8 sequences of 1024


def test_cut_sequences_take_more_segments_in_the_solo_form_while_each_keeps_64_chunks():
    def pick(programs, tokens, N):
        return tc.pick_cuda_segments(programs, 132, tokens, N, 64)
    assert pick(16, 32768, 1) == 8            # 4/8 heads: 15 x 16 = 240 CTAs, 64 chunks each
    assert pick(16, 8192, 1) == 4             # 8 would leave 16 chunks a segment
    assert pick(16, 5 * 64 * 64, 1) == 5
    assert pick(32, 32768, 2) == 4            # 2 sequences: 7 x 32 = 224 CTAs
    assert pick(64, 32768, 1) == 1            # 16/32: one wave cuts nothing, none then
    assert pick(128, 8192, 8) == 1


def test_segments_past_one_wave_take_the_solo_form():
    assert chain.pick_form(240, 132, True)          # 8 segments at 4/8 heads
    assert not chain.pick_form(112, 132, True)      # 4: one wave of the 185 KB form
    assert not chain.pick_form(240, 132, False)     # unsegmented: past two waves only
    assert chain.pick_form(512, 132, False)


def test_the_prep_runs_beside_chains_that_leave_half_the_sms_free(monkeypatch):
    monkeypatch.delenv("GDNZOO_PREFILL_OVERLAP", raising=False)
    assert tc.overlap_allowed()
    monkeypatch.setenv("NV_SANITIZER_INJECTION_PORT_BASE", "49152")   # compute-sanitizer's
    assert not tc.overlap_allowed()
    monkeypatch.delenv("NV_SANITIZER_INJECTION_PORT_BASE")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40")     # a share of the SMs
    assert not tc.overlap_allowed()
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    monkeypatch.setenv("GDNZOO_PREFILL_OVERLAP", "0")                  # for ncu
    assert not tc.overlap_allowed()
    assert chain.pick_overlap(66, 132, 1) and not chain.pick_overlap(67, 132, 1)
    assert not chain.pick_overlap(0, 132, 1) and not chain.pick_overlap(64, 132, 2)
    # its flags fit the "bf16" workspace's unused half, after the rows
    mats = torch.zeros(2 * 100 * 4 * 2 * 64, dtype=BF16)       # T = 100, HV = 4, fp32 words
    f = chain.flags_for(mats, 100, 4, 3)
    assert f.dtype == torch.int32 and f.numel() >= (100 // 64 + 3) * 4 + 1
    assert f.data_ptr() == mats.data_ptr() + 100 * 4 * 64 * 4
    assert chain.flags_for(torch.zeros(2 * 1 * 1 * 2 * 64, dtype=BF16), 1, 1, 64) is None
    # no prep CTA fits an SM beside a chain CTA (228 KB, 1 KB reserved a CTA): sharing one
    # slowed the chain more than the prep gained (lab/notebook/h200/prep_beside_2026-11-30/)
    assert chain.SMEM + prep.SMEM + 2 * 1024 > 228 * 1024


def test_the_solo_form_takes_grids_past_two_waves():
    assert not chain.pick_solo(264, 132) and chain.pick_solo(265, 132)
    assert chain.SOLO_SMEM * 2 + 2 * 1024 <= 228 * 1024      # two CTAs an SM on Hopper
    assert chain.SMEM > 114 * 1024                            # the 185 KB form: one an SM


def _run(x, state, new_state, out, chain_kind, segments=1, precision="bf16", **kw):
    cfg = dict(precision=precision, prep="cuda", chain=chain_kind, segments=segments)
    tc.launch(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale, out,
              new_state, True, config=cfg, **kw)
    torch.cuda.synchronize()


def _both(x, make_state, make_new, **kw):
    """(out, state, new_state, checkpoints) of the Triton chain, then of the CUDA chain, each
    on its own copies; ``make_new(state)`` gives the buffer written (``state`` for in place)."""
    res = []
    for kind in ("triton", "cuda"):
        state = make_state()
        new = make_new(state)
        out = torch.full_like(x.v, float("nan"))
        extra = dict(kw)
        if "checkpoints" in extra:
            extra["checkpoints"] = extra["checkpoints"].clone()
        _run(x, state, new, out, kind, **extra)
        res.append((out, state, new, extra.get("checkpoints")))
    return res


def _skip_unless_beside_can_run():
    """The prep beside the chain needs both kernels on the GPU at once: skipped where the product
    never runs it (compute-sanitizer runs one kernel at a time, where the chain would wait ~9 s
    and trap; an MPS share of the SMs; GDNZOO_PREFILL_OVERLAP=0)."""
    if not tc.overlap_allowed():
        pytest.skip("the prep beside the chain cannot run in this process: compute-sanitizer, "
                    "an MPS share of the SMs or GDNZOO_PREFILL_OVERLAP=0 (the product then runs "
                    "the prep first)")


def _spy_launches(monkeypatch, what):
    """The chain kernel's launches as made (:class:`chain.Chain`, once a plan: a call of
    ``tc.launch``, or a signature of ``gdnzoo.prefill``), each recorded as ``what(its
    keywords)`` in the list returned."""
    launched, real = [], chain.Chain

    def spy(*a, **kw):
        launched.append(what(kw))
        return real(*a, **kw)
    monkeypatch.setattr(chain, "Chain", spy)
    return launched


def _nan(t):
    return torch.full_like(t, float("nan"))


def _same(a, b, what):
    if a is None:
        assert b is None
        return
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN places differ"
    assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), \
        f"{what}: max |diff| {(a.double() - b.double()).abs().nan_to_num(0).max():.3e}"


FORMS = ["dense-bf16", "dense-bf16-pdl", "kfirst-inplace", "pool-inplace-padding",
         "pool-write-slots-bf16", "checkpoints-no-state", "v64-short", "cu64"]


def _form_runs(form, **extra):
    """One FORMS case: the Triton chain's and the CUDA chain's (out, state, new_state,
    checkpoints) on the same inputs (``extra``: more launch keywords, e.g. the precision), and
    the tokens T."""
    lens = {"v64-short": [5, 0, 63, 17], "cu64": [1000, 1, 130]}.get(form, [300, 64, 0, 200, 129])
    H, HV, V = (1, 2, 64) if form == "v64-short" else (2, 4, 128)
    x = make_prefill_inputs(lens, H=H, HV=HV, K=128, V=V, device="cuda", seed=len(form),
                            index_dtype=torch.int64 if form == "cu64" else torch.int32)
    T, dev = x.q.shape[0], "cuda"
    assert len(lens) == x.cu_seqlens.numel() - 1
    if form.startswith("dense") or form in ("v64-short", "cu64"):
        st = x.state.to(BF16) if form.startswith("dense") else x.state
        return _both(x, st.clone, _nan, pdl=form.endswith("pdl"), **extra), T
    if form == "kfirst-inplace":
        kf = x.state.transpose(-1, -2).contiguous()
        return _both(x, kf.clone, lambda s: s, k_first=True, **extra), T
    if form == "pool-inplace-padding":
        pool = torch.randn(7, HV, V, 128, device=dev) * 0.05
        return _both(x, pool.clone, lambda s: s, **extra,
                     state_indices=torch.tensor([3, -1, 5, 0, 6], dtype=torch.int32, device=dev),
                     null_slot=6, has_initial_state=torch.tensor([True, True, False, True, True],
                                                                 device=dev)), T
    if form == "pool-write-slots-bf16":
        pool = torch.randn(7, HV, V, 128, device=dev) * 0.05
        return _both(x, lambda: pool, lambda s: _nan(torch.zeros(9, HV, V, 128, device=dev)
                                                      .to(BF16)), **extra,
                     state_indices=torch.tensor([3, -1, 5, 0, 6], device=dev),
                     new_state_indices=torch.tensor([8, 2, 1, -1, 4], device=dev)), T
    ck = torch.full((T // 128, HV, V, 128), float("nan"), device=dev)   # checkpoints, no state
    return _both(x, lambda: None, lambda s: _nan(x.state), checkpoints=ck,
                 checkpoint_every=128, **extra), T


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk-bf16 cannot run here: {MISSING}")
@pytest.mark.parametrize("kind", ["split", "solo", "beside"])
@pytest.mark.parametrize("form", FORMS)
def test_the_chain_kernel_matches_the_triton_chain_bit_for_bit(form, kind, monkeypatch):
    """Every form of the chain kernel: the 185 KB one with an outputs warpgroup after the prep
    kernel ("split") and with the prep kernel beside it ("beside"), and "solo"."""
    if kind == "beside":
        _skip_unless_beside_can_run()
    monkeypatch.setattr(chain, "pick_solo", lambda grid, n_sm: kind == "solo")
    monkeypatch.setattr(chain, "pick_overlap", lambda *a: kind == "beside")
    monkeypatch.setattr(tc, "overlap_allowed", lambda: True)
    launched = _spy_launches(monkeypatch, lambda kw: (kw.get("flags"), kw.get("after_prep")))
    runs, T = _form_runs(form)
    (o_t, _, n_t, c_t), (o_c, _, n_c, c_c) = runs
    # the prep beside the chain, or the chain as the prep's programmatic dependent
    assert launched == [(kind == "beside", kind != "beside")], "the form asked for ran"
    assert not o_c[: T].isnan().any(), "an output row left unwritten"
    _same(o_c, o_t, "out")
    _same(n_c, n_t, "state")
    _same(c_c, c_t, "checkpoints")


def _close(a, b, what, tol):
    """The same NaN places, and relative RMS of the difference within ``tol``."""
    if a is None:
        assert b is None
        return
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN places differ"
    a, b = a.double().nan_to_num(0.0), b.double().nan_to_num(0.0)
    err = float((a - b).norm() / b.norm().clamp_min(1e-30))
    assert err <= tol, f"{what}: relative RMS difference {err:.3e} > {tol:g}"


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk-bf16 cannot run here: {MISSING}")
@pytest.mark.parametrize("form", FORMS)
def test_the_x3_chain_matches_the_triton_x3_chain(form, monkeypatch):
    """The "bf16x3" chain (cuda-chunk's, GDN_X3: every product in three bf16 passes, one CTA an
    SM) against triton-chunk's "bf16x3" chain on the same workspace, in every state form: the
    same written places, states and checkpoints within fp32 sums' reordering (1e-5 relative),
    outputs within their bf16 rounding (4e-3); both kernels' own errors against the reference
    run in the registry's matrices (cuda-chunk)."""
    launched = _spy_launches(monkeypatch, lambda kw: (kw.get("x3"), kw.get("after_prep")))
    runs, T = _form_runs(form, precision="bf16x3")
    (o_t, _, n_t, c_t), (o_c, _, n_c, c_c) = runs
    assert launched == [(True, False)], "the x3 chain, after the prep plainly"
    assert not o_c[: T].isnan().any(), "an output row left unwritten"
    bf16_state = n_t.dtype == BF16
    _close(o_c, o_t, "out", 4e-3)
    _close(n_c, n_t, "state", 4e-3 if bf16_state else 1e-5)
    _close(c_c, c_t, "checkpoints", 1e-5)


def test_the_x3_chain_runs_where_the_triton_chain_takes_32_row_tiles_and_two_chunks():
    """pick_x3 on the cells measured on an H200 (132 SMs): where the x3 chain was faster, and
    where it was not (16-row Triton tiles in one wave; one-chunk sequences)."""
    def pick(H_V, N, L):
        return chain.pick_x3(N, H_V[1], 128, N * L, 132)
    for faster in [((16, 32), 1, 8192), ((16, 32), 8, 1024), ((16, 32), 16, 256),
                   ((16, 64), 8, 1024), ((16, 48), 1, 8192), ((4, 8), 8, 1024), ((4, 8), 16, 256),
                   ((2, 8), 8, 1024), ((8, 16), 2, 4096)]:
        assert pick(*faster), faster
    for slower in [((4, 8), 1, 8192), ((4, 8), 64, 64), ((16, 32), 64, 64)]:
        assert not pick(*slower), slower


def test_auto_resolves_with_checkpoints_as_without(monkeypatch):
    """Chain "auto" reaches resolve unchanged with checkpoints too (the x3 chain's checkpoint
    form is timed and picked by the same rule)."""
    asked = []

    def stop(config, *a, **kw):
        asked.append(tc.normalize(config).chain)
        raise RuntimeError("stop")
    monkeypatch.setattr(tc, "resolve", stop)
    x = make_prefill_inputs([130], H=1, HV=2, K=128, V=128, device="cpu", seed=0)
    for ck in (None, torch.zeros(2, 2, 128, 128)):
        with pytest.raises(RuntimeError, match="stop"):
            tc.launch(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, None,
                      x.v.clone(), x.state.clone(), True, checkpoints=ck,
                      checkpoint_every=None if ck is None else 64,
                      config=dict(precision="bf16x3", prep="cuda", chain="auto"))
    assert asked == ["auto", "auto"]


def test_auto_takes_the_x3_chain_where_it_runs_segments_or_pick_x3_prefers_it(monkeypatch):
    """Chain "auto" with "bf16x3" products on a (stand-in) Hopper of 132 SMs: the x3 chain in
    segments for one long sequence of few heads, whole where pick_x3 prefers it, the Triton
    chain where neither holds; with one segment asked for, the segments do not count."""
    monkeypatch.setattr(tc.cuda_build, "capability", lambda d: (9, 0))
    monkeypatch.setattr(tc.cuda_build, "sm_count", lambda d: 132)
    dev = torch.device("cuda")

    def pick(HV, N, L, **kw):
        c = tc._resolve(dict(precision="bf16x3", prep="cuda", chain="auto", **kw), N, HV, 128,
                        dev, N * L)
        return c.chain, c.segments
    assert pick(8, 1, 8192) == ("cuda", 8)      # 8 segments, paired
    assert pick(8, 1, 8192, segments=1) == ("triton", 1)
    assert pick(8, 1, 8192, segments=1, block_v=16, warps=4) == ("triton", 1)
    assert pick(8, 1, 2048) == ("cuda", 4)
    assert pick(32, 8, 1024) == ("cuda", 1)
    assert pick(16, 1, 8192)[0] == "triton"       # neither 8 paired nor 4 fit one wave
    assert pick(8, 1, 1024)[0] == "triton"
    assert pick(32, 64, 64)[0] == "triton"


def test_the_segmented_x3_chain_pairs_its_ctas_past_one_wave():
    """pick_pair: the segmented x3 chain's 109 KB paired form (two CTAs an SM) for grids past one
    wave of one CTA an SM; within one wave the 133 KB form (its T^T lo rows two chunks ahead)."""
    assert not chain.pick_pair(112, 132)         # 4/8 heads, 4 segments
    assert chain.pick_pair(240, 132)             # 4/8 heads, 8 segments
    assert chain.pick_pair(133, 132) and not chain.pick_pair(132, 132)
    # the paired layout fits two CTAs an SM (228 KB, 1 KB reserved each); the unpaired does not
    assert 2 * (chain.X3_PAIR_SMEM + 1024) <= 228 * 1024 < 2 * (chain.X3_SMEM + 1024)
    # what the launcher compiles: the paired switch only for a segmented grid past one wave
    assert chain.x3_form(8, 240, 132) == ({"GDN_X3": 1, "GDN_X3_PAIR": 1}, chain.X3_PAIR_SMEM)
    assert chain.x3_form(4, 112, 132) == ({"GDN_X3": 1}, chain.X3_SMEM)
    assert chain.x3_form(0, 512, 132) == ({"GDN_X3": 1}, chain.X3_SMEM)   # unsegmented


def test_the_x3_chain_runs_its_solo_form():
    """133 KB: one CTA an SM (two would need 266 KB), never beside the prep; chain "auto" is
    the Triton chain where no CUDA device serves it."""
    assert 114 * 1024 < chain.X3_SMEM <= 227 * 1024
    with pytest.raises(ValueError, match="x3: the solo form, no flags"):
        chain.launch(*([None] * 9), solo=False, x3=True)
    fixed = dict(block_v=32, warps=4)
    c = tc.resolve(dict(fixed, chain="auto", segments=1), 1, 8, 128, torch.device("cpu"))
    assert c.chain == "triton"


def test_the_x3_chain_takes_segments_within_one_wave():
    """pick_x3_segments: eight segments where their 15 chains of N HV V / 64 CTAs fit one wave
    of the paired form (two CTAs on each of 132 SMs) and hold 16 chunks each; else four where
    their 7 chains fit one wave of one CTA an SM and hold 8 chunks each; else one (fewer
    segments were slower than the Triton chain on an H200)."""
    def segs(H_V, N, L):
        return tc.pick_x3_segments(N, H_V[1], 128, N * L, 132, 64)
    assert segs((4, 8), 1, 8192) == 8            # 15 x 16 = 240 CTAs, two an SM
    assert segs((2, 8), 1, 32768) == 8
    assert segs((4, 8), 1, 4096) == 4            # eight would hold 8 chunks each: four of 16
    assert segs((4, 8), 1, 2048) == 4            # 32 chunks: four segments of 8
    assert segs((4, 8), 1, 1024) == 1            # two of 8 would fit: one
    assert segs((8, 16), 1, 8192) == 1           # 3 x 32 = 96 fits, 7 x 32 does not
    assert segs((4, 8), 2, 4096) == 1
    assert segs((16, 32), 1, 8192) == 1
    assert segs((4, 8), 8, 1024) == 1


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk-bf16 cannot run here: {MISSING}")
@pytest.mark.parametrize("form", ["dense", "pool-padding-kfirst", "no-state-bf16"])
@pytest.mark.parametrize("segments", [2, 3, 4, 8])
@pytest.mark.parametrize("kind", ["split", "solo", "x3"])
def test_segmented_chains_match_the_triton_segments(form, segments, kind, monkeypatch):
    """Each sequence cut into segments (the chains side by side, then triton-chunk's combine and
    output kernels): the "bf16" CUDA chains (both forms) against triton-chunk's cp_chain_kernel,
    outputs and final states bit-identical; the x3 chains against its "bf16x3" ones as the
    unsegmented x3 test judges them (a long sequence, a short one, an empty one)."""
    monkeypatch.setattr(chain, "pick_solo", lambda grid, n_sm: kind == "solo")
    launched = _spy_launches(monkeypatch, lambda kw: kw.get("after_prep"))
    precision = "bf16x3" if kind == "x3" else "bf16"
    lens = [3000, 70, 0, 1200]
    x = make_prefill_inputs(lens, H=2, HV=4, device="cuda", seed=segments)
    dev, HV = "cuda", 4
    gen = torch.Generator(device=dev).manual_seed(segments)
    pool = (torch.randn(6, HV, 128, 128, device=dev, generator=gen) * 0.05).transpose(-1, -2)
    res = []
    for chain_kind in ("triton", "cuda"):
        out = torch.full_like(x.v, float("nan"))
        kw = {}
        if form == "dense":
            state = x.state.clone()
            new = _nan(state)
        elif form == "pool-padding-kfirst":
            state = pool.contiguous()          # a fresh copy for each kind
            new = state
            kw = dict(state_indices=torch.tensor([4, 1, -1, 5], dtype=torch.int32, device=dev),
                      null_slot=5, has_initial_state=torch.tensor([True, False, True, True],
                                                                 device=dev), k_first=True)
        else:
            state, new = None, _nan(x.state).to(BF16)
        _run(x, state, new, out, chain_kind, segments=segments, precision=precision, **kw)
        res.append((out, new))
    # the "bf16" CUDA chains as the prep's programmatic dependent, the x3 ones after it plainly
    assert launched == [kind != "x3"]
    if kind == "x3":
        _close(res[1][0], res[0][0], "out", 4e-3)
        _close(res[1][1], res[0][1], "state", 4e-3 if res[0][1].dtype == BF16 else 1e-5)
    else:
        _same(res[1][0], res[0][0], "out")
        _same(res[1][1], res[0][1], "state")


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk-bf16 cannot run here: {MISSING}")
@pytest.mark.parametrize("precision", ["bf16", "bf16x3"])
def test_views_off_the_16_byte_grain_take_the_triton_kernels(monkeypatch, precision):
    """q as a view 2 bytes off a 16-byte boundary: neither CUDA kernel is launched (their
    16-byte copies would fault), and the results are those of triton-chunk's own kernels."""
    x = make_prefill_inputs([200, 70], H=2, HV=4, device="cuda", seed=7)
    wide = torch.zeros(x.q.shape[0], 2, 136, dtype=BF16, device="cuda")
    wide[..., 1:129] = x.q
    q_off = wide[..., 1:129]
    launched = []
    for mod, name in ((chain, "Chain"), (prep, "Prep")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, **kw: (launched.append(1),
                                                                 _r(*a, **kw))[1])
    cuda = dict(prep="cuda", chain="cuda" if precision == "bf16" else "triton")
    res = []
    for q, kinds in ((q_off, cuda), (x.q, dict(prep="triton", chain="triton"))):
        out, ns = torch.full_like(x.v, float("nan")), _nan(x.state)
        tc.launch(q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale,
                  out, ns, True, config=dict(precision=precision, **kinds))
        torch.cuda.synchronize()
        res.append((out, ns))
    assert not launched
    for q_ok in (x.q, q_off):         # the spies see what the aligned call launches
        tc.launch(q_ok, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale,
                  torch.empty_like(x.v), _nan(x.state), True, config=dict(precision=precision,
                                                                          **cuda))
    assert len(launched) == (2 if precision == "bf16" else 1)
    _same(res[0][0], res[1][0], "out")
    _same(res[0][1], res[1][1], "state")


@pytest.mark.skipif(MISSING is not None, reason=f"cuda-chunk-bf16 cannot run here: {MISSING}")
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_the_prep_beside_the_chain_replays_in_a_cuda_graph(pdl, monkeypatch):
    """One sequence (the prep beside the chain by the product's rule) captured once and replayed
    with new data: each replay clears and sets its flags again; bit for bit the eager call."""
    import gdnzoo
    _skip_unless_beside_can_run()
    monkeypatch.setattr(tc, "overlap_allowed", lambda: True)
    launched = _spy_launches(monkeypatch, lambda kw: kw.get("flags"))

    def inputs(seed):
        return make_prefill_inputs([700], H=2, HV=4, K=128, V=128, device="cuda", seed=seed)
    bufs, out = inputs(1), None

    def call(x, out):
        return gdnzoo.prefill(*x.args(), out=out, use_qk_l2norm=True, algo="cuda-chunk-bf16",
                              pdl="wait" if pdl else None)
    out = torch.empty_like(bufs.v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(bufs, out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(bufs, out)
    assert launched and all(launched), "the prep ran beside the chain"
    for seed in (2, 3):
        y = inputs(seed)
        for name in ("q", "k", "v", "A_log", "a", "dt_bias", "b", "state"):
            getattr(bufs, name).copy_(getattr(y, name))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_state = call(y, None)
        _same(out, want_out, f"out, replay {seed}")
        _same(bufs.state, want_state, f"state, replay {seed}")

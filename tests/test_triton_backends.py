"""Checks specific to the two Triton backends (fla-recurrent, fla-tma).

The shared matrix (test_matrix.py) covers shapes x dtypes x modes through gdnzoo.decode; here:
the launch-shape tables, explicit tilings (several V tiles per head, several tiles per program),
views with odd strides, T > 1, GVA ratios, K/V 64 and 256, the TMA alignment refusal, the
launch cache, state pools (page-strided, padding by -1, null_slot and indices past the pool,
other write slots and another pool, int32 and int64 indices; every byte outside the written
slots unchanged), and (CUDA only) capture and replay in a CUDA graph, a grid past 2^31 state
elements and a pool slot past 2^31 elements.  Without a GPU the kernels run through the Triton
interpreter (conftest sets TRITON_INTERPRET=1), so CPU cases stay small.
"""
import importlib

import pytest
import torch

from conftest import DEVICE, HAS_CUDA
from gdnzoo.contract import Problem
from gdnzoo.inputs import make_inputs, paged_pool
from helpers import assert_matches, record, run
from gdnzoo.reference import reference_outputs

NAMES = {"fla-recurrent": "gdnzoo.backends.fla_recurrent", "fla-tma": "gdnzoo.backends.fla_tma"}
H100 = "NVIDIA H100 80GB HBM3"


def _backend(name):
    mod = importlib.import_module(NAMES[name])
    ok, why = mod.available(DEVICE)
    if not ok:
        pytest.skip(f"{name} unavailable: {why}")
    return mod


def _call(mod, x, l2, inplace, config=None, views=False):
    """Run on NaN-poisoned outputs; returns (out, new_state). ``views`` passes strided views."""
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2], x.v.shape[3]
    dev = x.q.device
    q, k, v, a, b, A_log, dt_bias, state = x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.state
    if views:
        # q and k interleaved in one buffer, v inside a wider one, a/b every other element,
        # A_log/dt_bias strided, state and out inside larger pools at an offset.
        qk = torch.empty(B, T, H, 2, K, dtype=q.dtype, device=dev)
        qk[:, :, :, 0], qk[:, :, :, 1] = q, k
        q, k = qk[:, :, :, 0], qk[:, :, :, 1]
        vbig = torch.zeros(B, T, HV + 3, V, dtype=v.dtype, device=dev)
        vbig[:, :, 1:HV + 1] = v
        v = vbig[:, :, 1:HV + 1]
        ab = torch.stack([a, b], dim=-1)
        a, b = ab[..., 0], ab[..., 1]
        A_log = torch.stack([A_log, A_log * 0], -1)[:, 0]
        dt_bias = torch.stack([dt_bias, dt_bias * 0], -1)[:, 0]
        pool = torch.zeros(B + 2, HV + 1, V, K, dtype=state.dtype, device=dev)
        pool[1:B + 1, :HV] = state
        state = pool[1:B + 1, :HV]
        assert not state.is_contiguous() and not a.is_contiguous() and A_log.stride(0) == 2
    ins = [t.clone() for t in (q, k, v, a, b, A_log, dt_bias)]
    state_before = state.clone()
    obig = torch.full((B, T + 1, HV, V + 64), float("nan"), dtype=x.v.dtype, device=dev)
    out = obig[:, 1:, :, 32:32 + V] if views else torch.full((B, T, HV, V), float("nan"),
                                                             dtype=x.v.dtype, device=dev)
    if inplace:
        new_state = state
    else:
        nbig = torch.full((B, HV, V, K + 64), float("nan"), dtype=state.dtype, device=dev)
        new_state = nbig[..., 64:] if views else torch.full_like(state, float("nan"))
    if config is None:
        run(mod, q, k, v, state, A_log, a, dt_bias, b, x.scale, out, new_state, l2)
    else:
        mod.launch(q, k, v, state, A_log, a, dt_bias, b, x.scale, out, new_state, l2, config=config)
    for before, after in zip(ins, (q, k, v, a, b, A_log, dt_bias)):
        assert torch.equal(before, after), "an input was modified"
    if not inplace:
        assert torch.equal(state, state_before), "state was modified in destination-passing mode"
    if views:
        assert torch.isnan(obig[:, 0]).all() and torch.isnan(obig[..., :32]).all(), \
            "wrote outside the out view"
    return out, new_state


# (B, T, H, HV, K, V, state dtype, l2norm, in place, views, recurrent config (BV, warps,
# stages[, lanes per row[, DENSE]]: DENSE 1 with views must fall back to the strides passed),
# tma config)
CASES = [
    (2, 1, 4, 8, 128, 128, torch.float32, False, True, False, None, None),
    (1, 3, 2, 8, 64, 128, torch.bfloat16, True, False, False, (16, 1, 1, 4, 1), (16, 2, 1, 2, False)),
    (1, 2, 1, 2, 256, 64, torch.float32, True, True, False, (8, 1, 1, 8, 1), (8, 4, 1, 3, False)),
    (2, 2, 2, 4, 128, 64, torch.float32, False, False, True, (32, 2, 1, 4, 1), (16, 2, 2, 2, True)),
    (2, 1, 4, 8, 64, 64, torch.bfloat16, False, True, True, (64, 1, 1), (32, 2, 1, 2, False)),
]


def _case_id(c):
    B, T, H, HV, K, V, sd, l2, inplace, views = c[:10]
    return (f"B{B}-T{T}-h{H}x{HV}-K{K}V{V}-{'fp32' if sd == torch.float32 else 'bf16'}"
            f"{'-l2' if l2 else ''}-{'inplace' if inplace else 'dest'}{'-views' if views else ''}")


@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_against_reference(name, case):
    mod = _backend(name)
    B, T, H, HV, K, V, sd, l2, inplace, views, cfg_rec, cfg_tma = case
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device=DEVICE, seed=B * T + K)
    ref_out, ref_state = reference_outputs(x, l2)
    cfg = cfg_rec if name == "fla-recurrent" else cfg_tma
    out, new_state = _call(mod, x, l2, inplace, config=cfg, views=views)
    assert_matches(out, new_state, ref_out, ref_state, sd, what=f"{name} {_case_id(case)}")


def test_recurrent_fits_rows_to_k_and_v():
    from gdnzoo.backends import fla_recurrent as m
    # a row without LPR takes all of a row's 16-byte vectors, at most 32 lanes; without DENSE,
    # the strides passed (0)
    assert m.fit_config("fp32", 8, 128, 128, (4, 1, 1, 8, 1)) == (4, 1, 1, 8, 1)
    assert m.fit_config("fp32", 9, 128, 128, (64, 8, 2)) == (64, 8, 2, 32, 0)
    assert m.fit_config("bf16", 1, 64, 128, (16, 2, 1))[3] == 8      # 8 lanes of 8 bf16 fill K=64
    assert m.fit_config("fp32", 1, 64, 64, (4, 1, 1))[3] == 16
    assert m.fit_lpr("bf16", 64, 16) == 8 and m.fit_lpr("fp32", 256, 32) == 32
    # K=256: a 32x256 fp32 tile over 4 warps is 64 registers a thread: kept; over 1 warp it
    # would be 256, so warps grow to 4; BV never exceeds V; the grid stays on one axis
    assert m.fit_config("fp32", 1000, 256, 128, (32, 4, 3))[:3] == (32, 4, 3)
    assert m.fit_config("fp32", 1, 256, 128, (32, 1, 1))[:3] == (32, 4, 1)
    assert m.fit_config("fp32", 1, 64, 64, (128, 8, 1))[0] == 64
    BV = m.fit_config("fp32", 2**29, 64, 64, (4, 1, 1))[0]
    assert 2**29 * (64 // BV) <= m.GRID_LIMIT
    for B in (1, 8, 9, 64, 512, 2**17):
        for K in (64, 128, 256):
            for sd in ("fp32", "bf16"):
                for inplace, T in ((True, 1), (False, 1), (True, 2), (False, 5)):
                    BV, nw, ns, lpr, dense = m.table_config(H100, sd, B, 4, 8, K, 128, inplace, T)
                    assert 128 % BV == 0 and BV * K <= 64 * 32 * nw
                    assert B * 8 * (128 // BV) <= m.GRID_LIMIT
                    assert K % (lpr * m.vec_elems(sd)) == 0


def test_tma_fits_rows_to_k_and_v():
    from gdnzoo.backends import fla_tma as m
    for B in (1, 8, 9, 512):
        for K in (64, 128, 256):
            for sd, nbytes in (("fp32", 4), ("bf16", 2)):
                BV, tiles, nw, ns, ws = m.table_config(H100, sd, B, 4, 8, K, 128)
                assert 128 % (BV * tiles) == 0 and BV * K <= 64 * 32 * nw
                assert BV * K * nbytes * (ns + 1) <= m.SMEM_BUDGET
    # 64x256 fp32 needs 8 warps for registers; 5 buffers of it exceed shared memory: BV 32
    assert m.fit_config((64, 8, 1, 4, False), 1, 256, 64, 4) == (32, 2, 8, 4, False)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_supports_reasons(name):
    mod = importlib.import_module(NAMES[name])
    p = Problem(B=1, T=1, H=4, HV=8, K=96, V=128, state_dtype=torch.float32,
                io_dtype=torch.bfloat16, device=DEVICE)
    ok, why = mod.supports(p)
    assert not ok and "K" in why and "96" in why
    if DEVICE == "cpu":
        big = Problem(B=64, T=4, H=4, HV=8, K=128, V=128, state_dtype=torch.float32,
                      io_dtype=torch.bfloat16, device="cpu")
        ok, why = mod.supports(big)
        assert not ok and "interpreter" in why


def test_tma_refuses_misaligned_state():
    mod = _backend("fla-tma")
    x = make_inputs(B=1, T=1, H=1, HV=2, K=64, V=64, device=DEVICE, seed=3)
    flat = torch.zeros(x.state.numel() + 4, dtype=x.state.dtype, device=DEVICE)
    state = flat[1:1 + x.state.numel()].view(x.state.shape)     # 4 bytes off alignment
    state.copy_(x.state)
    before = state.clone()
    out = torch.empty(1, 1, 2, 64, dtype=x.v.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="16-byte"):
        run(mod, x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, state, False)
    assert torch.equal(state, before)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_repeat_calls_take_new_pointers(name):
    """The launch cache must pass each call's own tensors (second call: the fast path on GPU)."""
    mod = _backend(name)
    for seed in (1, 2):
        x = make_inputs(B=1, T=1, H=4, HV=8, K=128, V=128, device=DEVICE, seed=seed)
        ref_out, ref_state = reference_outputs(x, False)
        out, new_state = _call(mod, x, False, inplace=(seed == 1))
        assert_matches(out, new_state, ref_out, ref_state, torch.float32, what=f"call {seed}")


@pytest.mark.skipif(not HAS_CUDA, reason="the raw launch path exists on a CUDA device only")
@pytest.mark.parametrize("name", sorted(NAMES))
def test_cached_launches_are_raw_and_take_a_new_scale(name):
    """With CuPy present, repeat calls launch through cuda_build.Launch (a prebuilt parameter
    block, see _triton_launch.raw_launch); each call's pointers and scale must reach the kernel."""
    import importlib.util
    from gdnzoo.backends import _cuda_build as cuda_build
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("the raw launch needs CuPy's driver binding")
    mod = _backend(name)
    mod._DISPATCH.fast.clear()
    for seed, scale in ((5, 0.5), (6, 0.125), (7, None)):
        x = make_inputs(B=2, T=1, H=4, HV=8, K=128, V=128, device=DEVICE, seed=seed, scale=scale)
        ref_out, ref_state = reference_outputs(x, False)
        out, new_state = _call(mod, x, False, inplace=True)
        assert_matches(out, new_state, ref_out, ref_state, torch.float32, what=f"scale {scale}")
    kinds = {type(f).__name__ for f in mod._DISPATCH.fast.values()}
    assert kinds == {"Launch"}, f"cached launchers: {kinds}"
    assert all(isinstance(f, cuda_build.Launch) for f in mod._DISPATCH.fast.values())


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "dest"])
def test_cuda_graph_capture_and_replay(name, inplace):
    mod = _backend(name)
    x = make_inputs(B=4, T=1, H=4, HV=8, K=128, V=128, device="cuda", seed=5)
    bufs = x.clone()
    out = torch.empty(4, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    dst = bufs.state if inplace else torch.empty_like(bufs.state)
    args = (bufs.q, bufs.k, bufs.v, bufs.state, bufs.A_log, bufs.a, bufs.dt_bias, bufs.b,
            bufs.scale, out, dst, False)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(mod, *args)                                    # first call compiles and caches
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(mod, *args)
    for seed in (6, 7):
        y = make_inputs(B=4, T=1, H=4, HV=8, K=128, V=128, device="cuda", seed=seed)
        for name_, t in (("q", y.q), ("k", y.k), ("v", y.v), ("state", y.state), ("a", y.a),
                         ("b", y.b), ("A_log", y.A_log), ("dt_bias", y.dt_bias)):
            getattr(bufs, name_).copy_(t)
        out.fill_(float("nan"))
        if not inplace:
            dst.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref_out, ref_state = reference_outputs(y, False)
        assert_matches(out, dst, ref_out, ref_state, torch.float32, what=f"replay seed {seed}")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU with ~9 GB free")
@pytest.mark.parametrize("name", sorted(NAMES))
def test_grid_past_int32_offsets(name):
    """B*HV = 2^20 programs' worth of heads and 2^32 state elements: 64-bit addressing."""
    mod = _backend(name)
    B, HV, K, V = 2**17, 8, 64, 64
    free = torch.cuda.mem_get_info()[0]
    if free < 10 * 2**30:
        pytest.skip(f"needs 10 GiB free GPU memory, has {free / 2**30:.1f}")
    small = make_inputs(B=2, T=1, H=4, HV=HV, K=K, V=V, state_dtype=torch.bfloat16,
                        device="cuda", seed=11)
    state = torch.zeros(B, HV, V, K, dtype=torch.bfloat16, device="cuda")
    q = small.q[:1].expand(B, -1, -1, -1).contiguous()
    k = small.k[:1].expand(B, -1, -1, -1).contiguous()
    v = small.v[:1].expand(B, -1, -1, -1).contiguous()
    a = small.a[:1].expand(B, -1, -1).contiguous()
    b = small.b[:1].expand(B, -1, -1).contiguous()
    for n in (0, B // 2, B - 1):                          # B-1 lies past 2^31 elements
        state[n] = small.state[0]
    out = torch.full((B, 1, HV, V), float("nan"), dtype=torch.bfloat16, device="cuda")
    run(mod, q, k, v, state, small.A_log, a, small.dt_bias, b, small.scale, out, state, False)
    torch.cuda.synchronize()
    ref_out, ref_state = reference_outputs(small, False)
    for n in (0, B // 2, B - 1):
        assert_matches(out[n:n + 1], state[n:n + 1], ref_out[:1], ref_state[:1],
                       torch.bfloat16, what=f"sequence {n}")
    del state


# ------------------------------------------------------------------------------ state pools
# A pool case: (T, state dtype, l2norm, index dtype, padding, writes).  Padding: "neg" (-1),
# "null" (null_slot=0), "past" (indices >= P, one of them huge).  Writes: "same" (the read
# slots, in place), "slots" (other slots of the same pool), "pool" (slots of another pool).
# Sequence 1 is padding; with "past" sequence 3 too; with "slots"/"pool" sequence 2 reads a real
# slot and writes a padding one (its output is computed, no state written).
POOL_CASES = [
    (1, torch.float32, False, torch.int32, "neg", "same"),
    (3, torch.bfloat16, True, torch.int64, "null", "same"),
    (1, torch.bfloat16, False, torch.int64, "past", "slots"),
    (3, torch.float32, True, torch.int32, "null", "slots"),
    (1, torch.float32, True, torch.int64, "neg", "pool"),
    (3, torch.bfloat16, False, torch.int32, "past", "pool"),
]
POOL_GEOMETRY = dict(B=4, H=2, HV=4, K=64, V=64)     # GVA: two v-heads per q/k head
GAP = 64                      # elements between slots (a page larger than a slot, as vLLM's)


def _pool_id(c):
    T, sd, l2, idt, pad, writes = c
    return (f"T{T}-{'fp32' if sd == torch.float32 else 'bf16'}{'-l2' if l2 else ''}-"
            f"{str(idt).replace('torch.', '')}-pad_{pad}-write_{writes}")


def _page_pool(P, x, gen):
    """A pool [P, HV, V, K] of x's geometry with stride(0) = HV*V*K + GAP, random slots and NaN
    in the page gaps; returns (pool, its whole buffer)."""
    p = paged_pool(P, *x.state.shape[1:], dtype=x.state.dtype, device=DEVICE, gap=GAP,
                   fill="slots", gen=gen)
    return p.state, p.buf


def _bits(buf):
    return buf.view(torch.int32 if buf.element_size() == 4 else torch.int16)


def _assert_untouched_but(before, after, slots, pool):
    """``after`` equals ``before`` bit for bit (page gaps included) outside the blocks of
    ``slots``."""
    keep = torch.ones(before.numel(), dtype=torch.bool, device=before.device)
    n = pool[0].numel()
    for s in slots:
        keep[s * pool.stride(0):s * pool.stride(0) + n] = False
    assert torch.equal(_bits(before)[keep], _bits(after)[keep]), \
        "pool memory changed outside the slots written"


def _pool_inputs(case, seed, B=4):
    """(x with x.state the read pool, its buffer, new pool or None, its buffer, read, write
    (None: the read indices), null_slot or None)."""
    T, sd, l2, idt, pad, writes = case
    g = dict(POOL_GEOMETRY, B=B)
    x = make_inputs(T=T, **g, state_dtype=sd, device=DEVICE, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    P = 2 * B + 5                      # room for B read and B other write slots
    x.state, buf = _page_pool(P, x, gen)
    PN = P + 3 if writes == "pool" else P
    npool, nbuf = _page_pool(PN, x, gen) if writes == "pool" else (None, None)
    slots = (torch.randperm(P - 1, generator=gen) + 1).tolist()     # real slots, never 0
    huge = 2**31 - 1 if idt == torch.int32 else 2**40
    pad_read = {"neg": -1, "null": 0, "past": P}[pad]
    read = slots[:B]
    read[1] = pad_read
    if pad == "neg":
        read[3] = 0                    # slot 0 is a real slot without null_slot
    if pad == "past":
        read[3] = huge
    write = None
    if writes != "same":
        free = slots[B:] if writes == "slots" else \
            (torch.randperm(PN - 1, generator=gen) + 1).tolist()
        write = free[:B]
        write[2] = {"neg": -1, "null": 0, "past": PN}[pad]
        write = torch.tensor(write, dtype=idt, device=DEVICE)
    for n in (1, 3) if pad == "past" else (1,):           # padded: any inputs, even NaN
        x.q[n] = float("nan")
        x.v[n] = float("nan")
    return (x, buf, npool, nbuf, torch.tensor(read, dtype=idt, device=DEVICE), write,
            0 if pad == "null" else None)


def _check_pool_call(call, case, seed, what):
    """Run ``call(x, out, new_state, read, write, null_slot)`` on a pool case and check out,
    the written slots against the float64 reference, zeros for padded sequences, and every
    other byte of both pools unchanged."""
    from gdnzoo import pool as pools
    T, sd, l2 = case[:3]
    x, buf, npool, nbuf, read, write, null = _pool_inputs(case, seed)
    target, tbuf = (x.state, buf) if npool is None else (npool, nbuf)
    p = pools.Pool(read, read if write is None else write, -1 if null is None else null)
    rd, wr = pools.live(p, x.state.shape[0], target.shape[0])
    ref_out, ref_pool = reference_outputs(x, l2, pool=p, new_pool=npool)
    before, tbefore = buf.clone(), tbuf.clone()
    B, HV, V = x.q.shape[0], x.v.shape[2], x.v.shape[3]
    out = torch.full((B, T, HV, V), float("nan"), dtype=x.v.dtype, device=DEVICE)
    call(x, out, target, read, write, null)
    written = p.write[wr].long()
    assert torch.equal(out[~rd], torch.zeros_like(out[~rd])), f"{what}: padded rows not zero"
    assert_matches(out, target[written], ref_out, ref_pool[written], sd, what=what)
    _assert_untouched_but(tbefore, tbuf, written.tolist(), target)
    if npool is not None:
        assert torch.equal(_bits(before), _bits(buf)), f"{what}: the read pool changed"


@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("case", POOL_CASES, ids=_pool_id)
def test_pool_against_reference(name, case):
    """The backend's own run with a Pool, the table's launch shape."""
    from gdnzoo.pool import Pool
    mod = _backend(name)

    def call(x, out, target, read, write, null):
        pool = Pool(read, read if write is None else write, -1 if null is None else null)
        run(mod, x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, target,
                case[2], pool)
    _check_pool_call(call, case, seed=11, what=f"{name} {_pool_id(case)}")


@pytest.mark.parametrize("case", POOL_CASES, ids=_pool_id)
def test_pool_through_decode(case):
    """fla-recurrent through gdnzoo.decode's pool arguments."""
    import gdnzoo
    _backend("fla-recurrent")

    def call(x, out, target, read, write, null):
        gdnzoo.decode(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out=out,
                      new_state=target, use_qk_l2norm=case[2], algo="fla-recurrent",
                      state_indices=read, new_state_indices=write, null_slot=null)
    _check_pool_call(call, case, seed=12, what=f"decode {_pool_id(case)}")


# explicit tilings in a pool: several programs per sequence read its slot; DENSE constant
# strides for the per-token tensors with the pool's slot stride passed
POOL_CONFIGS = {"fla-recurrent": (32, 1, 1, 4, 1), "fla-tma": (16, 2, 1, 2, False)}


@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("case", [POOL_CASES[1], POOL_CASES[4]], ids=_pool_id)
def test_pool_explicit_tiling(name, case):
    from gdnzoo.pool import Pool
    mod = _backend(name)

    def call(x, out, target, read, write, null):
        pool = Pool(read, read if write is None else write, -1 if null is None else null)
        mod.launch(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, target,
                   case[2], pool, config=POOL_CONFIGS[name])
    _check_pool_call(call, case, seed=13, what=f"{name} {POOL_CONFIGS[name]} {_pool_id(case)}")


@pytest.mark.parametrize("name", sorted(NAMES))
def test_pool_bound_launcher_takes_each_calls_indices(name):
    """One bound launcher, three calls with other index tensors and contents (on a GPU the
    later calls take the cached launch; the third index tensor sits 4 bytes off 16-byte
    alignment, which Triton's own path serves)."""
    from gdnzoo.pool import Pool
    mod = _backend(name)
    case = (1, torch.float32, False, torch.int32, "neg", "slots")
    bound = {}

    def call_with(shift):
        def call(x, out, target, read, write, null):
            if shift:
                read = torch.cat([read[:1], read]).contiguous()[1:]
                write = torch.cat([write[:1], write]).contiguous()[1:]
            pool = Pool(read, write, -1)
            rec = record(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out,
                         target, False, pool)
            if not bound:
                bound["f"] = mod.bind(rec)
            bound["f"](rec)
        return call
    for seed, shift in ((21, False), (22, False), (23, True)):
        _check_pool_call(call_with(shift), case, seed=seed, what=f"{name} call {seed}")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU with ~9 GB free")
@pytest.mark.parametrize("name", sorted(NAMES))
def test_pool_slot_past_int32_offsets(name):
    """vLLM's page (HV=32 fp32: 540,672 elements a slot) in a pool of 4100 slots: slots from
    3972 on start past 2^31 elements, so slot x stride(0) must be 64-bit."""
    from gdnzoo.pool import Pool
    mod = _backend(name)
    B, H, HV, K, V, P, page = 4, 16, 32, 128, 128, 4100, 540672
    need = P * page * 4
    free = torch.cuda.mem_get_info()[0]
    if free < need + 2**30:
        pytest.skip(f"needs {(need + 2**30) / 2**30:.1f} GiB free GPU memory, has "
                    f"{free / 2**30:.1f}")
    x = make_inputs(B=B, T=1, H=H, HV=HV, K=K, V=V, device="cuda", seed=31)
    ref_out, ref_state = reference_outputs(x, True)
    big = paged_pool(P, HV, V, K, device="cuda", fill="zeros")
    buf, pool = big.buf, big.state
    assert pool.stride(0) == page
    read = torch.tensor([4099, 0, 4000, 3972], dtype=torch.int32, device="cuda")
    assert 3972 * page > 2**31
    for n in (0, 2, 3):
        pool[read[n]] = x.state[n]
    out = torch.full((B, 1, HV, V), float("nan"), dtype=torch.bfloat16, device="cuda")
    run(mod, x.q, x.k, x.v, pool, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, pool, True,
            Pool(read, read, 0))
    torch.cuda.synchronize()
    assert torch.equal(out[1], torch.zeros_like(out[1])), "the null slot's row is not zero"
    for n in (0, 2, 3):
        assert_matches(out[n:n + 1], pool[read[n]][None], ref_out[n:n + 1],
                       ref_state[n:n + 1], torch.float32, what=f"slot {int(read[n])}")
    for s in (0, 3971, 3973, 4001, 4098):                 # neighbours and the null slot
        assert int(torch.count_nonzero(buf[s * page:(s + 1) * page])) == 0, f"slot {s} written"
    for s in (3972, 4000, 4099):                          # the page gaps after written slots
        assert int(torch.count_nonzero(buf[s * page + HV * V * K:(s + 1) * page])) == 0
    del pool, buf


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("writes", ["same", "slots", "pool"])
def test_pool_cuda_graph_replays_with_new_indices(name, writes):
    """Capture a pool call, then replay it with new slot indices (padding included) and new
    data copied into the captured buffers."""
    from gdnzoo import pool as pools
    mod = _backend(name)
    case = (1, torch.float32, True, torch.int32, "neg", writes)
    x, buf, npool, nbuf, read, write, null = _pool_inputs(case, seed=41, B=8)
    target, tbuf = (x.state, buf) if npool is None else (npool, nbuf)
    write_buf = read.clone() if write is None else write
    p = pools.Pool(read, read if write is None else write_buf, -1)
    out = torch.empty(8, 1, 4, 64, dtype=torch.bfloat16, device="cuda")
    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, target, True, p)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(mod, *args)                                    # first call compiles and caches
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(mod, *args)
    for seed in (42, 43):
        y, ybuf, ynpool, ynbuf, yread, ywrite, _ = _pool_inputs(case, seed=seed, B=8)
        for t, src in ((x.q, y.q), (x.k, y.k), (x.v, y.v), (x.a, y.a), (x.b, y.b),
                       (x.A_log, y.A_log), (x.dt_bias, y.dt_bias), (buf, ybuf), (read, yread)):
            t.copy_(src)
        if npool is not None:
            nbuf.copy_(ynbuf)
        if write is not None:
            write_buf.copy_(ywrite)
        yp = pools.Pool(yread, yread if ywrite is None else ywrite, -1)
        rd, wr = pools.live(yp, x.state.shape[0], target.shape[0])
        ref_out, ref_pool = reference_outputs(y, True, pool=yp, new_pool=ynpool)
        tbefore = tbuf.clone()
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        written = yp.write[wr].long()
        assert torch.equal(out[~rd], torch.zeros_like(out[~rd])), f"replay {seed}: padding"
        assert_matches(out, target[written], ref_out, ref_pool[written], torch.float32,
                       what=f"replay seed {seed}")
        _assert_untouched_but(tbefore, tbuf, written.tolist(), target)

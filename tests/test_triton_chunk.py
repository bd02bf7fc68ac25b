"""triton-chunk (backends/triton_chunk.py): the chunked prefill against a float64 per-token
oracle written here, output and final state, under the project gate (gdnzoo.gate: the contest's
elementwise rule and the relative-error bounds).

Every call runs with ``out`` (and a dense destination state) filled with NaN first, so an
unwritten element fails, and checks that q, k, v, the gates, cu_seqlens and (destination
passing) the source state are unchanged.  On CPU the kernels run in the Triton interpreter
(tests/conftest.py), at K = V = 64 mostly and a few heads, to keep this file near two minutes.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE
from gdnzoo import gate
from gdnzoo.backends import triton_chunk as tc

F64 = torch.float64
pytestmark = pytest.mark.skipif(not tc.available(DEVICE)[0], reason=tc.available(DEVICE)[1])


# ------------------------------------------------------------------ oracle and inputs

def oracle(q, k, v, init, decay, beta, cu, scale, l2):
    """The recurrence token by token in float64: outputs [T, HV, V] and each sequence's final
    state [N, HV, V, K] (k-last).  ``init`` [N, HV, V, K] (None: zeros); ``decay``, ``beta``
    [T, HV] (the multiplicative decay g and the post-sigmoid beta)."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    qx = q.to(F64).repeat_interleave(HV // H, dim=1)          # GVA as repeat_interleave gives
    kx = k.to(F64).repeat_interleave(HV // H, dim=1)
    if l2:
        qx = qx * torch.rsqrt((qx * qx).sum(-1, keepdim=True) + 1e-6)
        kx = kx * torch.rsqrt((kx * kx).sum(-1, keepdim=True) + 1e-6)
    vx, g, bt = v.to(F64), decay.to(F64), beta.to(F64)
    N = cu.numel() - 1
    out = torch.zeros(T, HV, V, dtype=F64)
    final = torch.zeros(N, HV, V, K, dtype=F64)
    bounds = cu.tolist()
    for n in range(N):
        S = torch.zeros(HV, V, K, dtype=F64) if init is None else init[n].to(F64).clone()
        for t in range(bounds[n], bounds[n + 1]):
            S = S * g[t, :, None, None]                              # decay first
            u = bt[t, :, None] * (vx[t] - torch.einsum("hvk,hk->hv", S, kx[t]))
            S = S + u[:, :, None] * kx[t, :, None, :]
            out[t] = scale * torch.einsum("hvk,hk->hv", S, qx[t])    # the updated state
        final[n] = S
    return out, final


def raw_gates(A_log, a, dt_bias, b):
    """(decay g, beta) in float64 from the raw gates, softplus with beta 1, threshold 20."""
    sp = F.softplus(a.to(F64) + dt_bias.to(F64), beta=1.0, threshold=20.0)
    return torch.exp(-torch.exp(A_log.to(F64)) * sp), torch.sigmoid(b.to(F64))


def make(lens, H=1, HV=1, K=64, V=64, io=torch.bfloat16, seed=0, cu_dtype=torch.int32):
    """Packed inputs with the decode tests' magnitudes (gdnzoo.inputs.make_inputs)."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    A_log = torch.log(1.0 + 15.0 * torch.rand(HV, generator=gen))
    dt = torch.exp(math.log(1e-3) + math.log(100.0) * torch.rand(HV, generator=gen))
    return dict(
        q=randn(T, H, K, std=K ** -0.5).to(io), k=randn(T, H, K, std=K ** -0.5).to(io),
        v=randn(T, HV, V, std=0.5).to(io), A_log=A_log, dt_bias=dt + torch.log(-torch.expm1(-dt)),
        a=randn(T, HV).to(io), b=randn(T, HV, std=1.5).to(io),
        cu_seqlens=torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()],
                                dtype=cu_dtype),
        states=randn(len(lens), HV, V, K, std=0.05))


def to_device(x, device):
    return {n: t.to(device) for n, t in x.items()}


def judge(out, new_state, ref_out, ref_state, what):
    """The project gate on outputs and states; returns the relative errors."""
    j = gate.judge(out.cpu(), new_state.cpu(), ref_out, ref_state, state_dtype=new_state.dtype)
    assert j.ok, f"{what}: {j.reason}"
    return j.rel_err_out, j.rel_err_state


def launch(x, state, out, new_state, l2, scale=None, **kw):
    """tc.launch on the dict ``x``, checking that it changed none of its inputs."""
    names = ("q", "k", "v", "A_log", "a", "dt_bias", "b", "cu_seqlens")
    before = {n: x[n].clone() for n in names}
    src = None if state is None or state is new_state else state.clone()
    tc.launch(x["q"], x["k"], x["v"], state, x["A_log"], x["a"], x["dt_bias"], x["b"],
              x["cu_seqlens"], scale, out, new_state, l2, **kw)
    for n in names:
        assert torch.equal(x[n], before[n]), f"{n} modified by the call"
    if src is not None:
        assert torch.equal(state, src), "state modified by a destination-passing call"


def nan_like(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def k_last(stored, k_first):
    """A state or pool as its k-last view ([.., V, K])."""
    return stored.transpose(-1, -2) if k_first else stored


# ------------------------------------------------------------------ dense batches

LENGTHS = [0, 1, 63, 64, 65, 130, 200]           # empty, 1, C-1, C, C+1, 2C+2, a longer one

DENSE = [
    # lens, H, HV, K, state dtype (None: zeros), l2, io dtype, seed, config
    pytest.param(LENGTHS, 1, 1, 64, torch.float32, True, torch.bfloat16, 0, None, id="lengths-l2"),
    pytest.param(LENGTHS, 1, 1, 64, torch.float32, False, torch.bfloat16, 1, None, id="lengths"),
    pytest.param([1, 64, 70], 1, 2, 64, torch.bfloat16, True, torch.bfloat16, 2, None,
                 id="gva2-bf16state"),
    pytest.param([5, 65], 1, 3, 64, torch.float32, False, torch.bfloat16, 3, None, id="gva3"),
    pytest.param([30, 40], 2, 4, 64, None, True, torch.bfloat16, 4, None, id="zeros-state"),
    pytest.param([100], 1, 1, 64, torch.float32, True, torch.float16, 5, dict(base=64),
                 id="fp16-base64"),
    pytest.param([130], 1, 1, 128, torch.float32, True, torch.bfloat16, 6, dict(base=32),
                 id="d128-base32"),
    pytest.param([70, 33], 1, 2, 64, torch.float32, True, torch.bfloat16, 7,
                 dict(chunk=32, precision="ieee", block_v=32), id="c32-ieee-bv32"),
    pytest.param([0, 0], 1, 2, 64, torch.float32, True, torch.bfloat16, 8, None, id="no-tokens"),
    pytest.param([130, 7], 1, 1, 64, torch.float32, True, torch.bfloat16, 9, dict(base=8),
                 id="base8"),
    # chunk j+1's v rows loaded by hand during chunk j, and not (the GPU's default at 16 rows)
    pytest.param([70, 130, 1], 1, 2, 64, torch.float32, True, torch.bfloat16, 11,
                 dict(block_v=16, v_ahead=1), id="bv16-v-ahead"),
    pytest.param([70, 130, 1], 1, 2, 64, torch.float32, True, torch.bfloat16, 12,
                 dict(block_v=16, v_ahead=0), id="bv16-v-not-ahead"),
    # each sequence's chunks in segments run side by side, then joined
    pytest.param(LENGTHS, 1, 1, 64, torch.float32, True, torch.bfloat16, 13,
                 dict(segments=2), id="segments2"),
    pytest.param([200, 0, 150], 1, 3, 64, torch.bfloat16, False, torch.bfloat16, 14,
                 dict(segments=3), id="segments3-gva3-bf16state"),
    pytest.param([260, 5], 1, 2, 64, None, True, torch.float16, 15,
                 dict(segments=4, block_v=32, v_ahead=1), id="segments4-zeros-fp16"),
    # products of the state's chain rounded to bf16: judged as a bf16 state is
    pytest.param([1, 64, 70], 1, 2, 64, torch.bfloat16, True, torch.bfloat16, 10,
                 dict(precision="bf16"), id="bf16state-bf16prec", marks=pytest.mark.skipif(
                     not torch.cuda.is_available(), reason="Triton 3.6's interpreter truncates "
                     "fp32 -> bf16 (the GPU rounds to nearest): its error is not the kernel's")),
    # segments with "bf16" products keep their outputs in bf16 between the chains and the join
    pytest.param([300, 70, 0, 200], 1, 2, 64, torch.bfloat16, True, torch.bfloat16, 17,
                 dict(precision="bf16", segments=3), id="segments3-bf16prec",
                 marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton 3.6's "
                     "interpreter truncates fp32 -> bf16 (the GPU rounds to nearest)")),
    # the tile "bf16" products take past one wave: 64 rows, one warpgroup (warpgroup MMAs)
    pytest.param([1, 64, 70, 200], 1, 2, 128, torch.bfloat16, True, torch.bfloat16, 16,
                 dict(precision="bf16", block_v=64, warps=4), id="bf16state-bf16prec-bv64w4",
                 marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton 3.6's "
                     "interpreter truncates fp32 -> bf16 (the GPU rounds to nearest)")),
]


def check(device, lens, H=1, HV=1, K=64, *, l2=True, io=torch.bfloat16,
          state_dtype=torch.float32, seed=0, cu_dtype=torch.int32, scale=None, inplace=False,
          k_first=False, **kw):
    """One packed batch (K = V) against the oracle: ``state_dtype`` None is no initial state;
    in place or into a NaN-filled new state, k-last or K-first (stored [N, HV, K, V]); ``kw``
    goes to the launch."""
    x = make(lens, H, HV, K, K, io, seed, cu_dtype)
    init = None if state_dtype is None else x["states"].to(state_dtype)
    ref_out, ref_state = oracle(x["q"], x["k"], x["v"], init, *raw_gates(
        x["A_log"], x["a"], x["dt_bias"], x["b"]), x["cu_seqlens"], scale or K ** -0.5, l2)
    x = to_device(x, device)
    state = None if init is None else k_last(init.to(device), k_first).contiguous()
    out = nan_like((sum(lens), HV, K), io, device)
    new_state = state if inplace else \
        nan_like((len(lens), HV, K, K), state_dtype or torch.float32, device)
    launch(x, state, out, new_state, l2, scale=scale, k_first=k_first, **kw)
    return judge(out, k_last(new_state, k_first), ref_out, ref_state,
                 f"lens={lens} H={H} HV={HV}")


@pytest.mark.parametrize("lens,H,HV,K,state_dtype,l2,io,seed,config", DENSE)
def test_dense_destination_passing(device, lens, H, HV, K, state_dtype, l2, io, seed, config):
    """Outputs and final states of a packed batch, new states in a distinct tensor."""
    check(device, lens, H, HV, K, l2=l2, io=io, state_dtype=state_dtype, seed=seed,
          config=config)


def test_many_sequences(device):
    """260 sequences, most empty, the non-empty ones on both sides of the prep kernel's
    256-sequence count block (K = V = 32 to keep it short)."""
    lens = [0] * 260
    lens[3], lens[257], lens[259] = 5, 70, 2
    check(device, lens, K=32, seed=13, cu_dtype=torch.int64)


def test_in_place_and_scale(device):
    """In place (``new_state is state``), an explicit scale, int64 cu_seqlens."""
    check(device, [10, 64, 3], 1, 2, seed=11, cu_dtype=torch.int64, scale=0.3, inplace=True)


def test_k_first_in_place(device):
    """A dense K-first state ([N, HV, K, V], V contiguous) updated in place."""
    check(device, [66, 5], 1, 2, seed=14, inplace=True, k_first=True)


@pytest.mark.parametrize("reset", [None, float("-inf"), -1e30], ids=["plain", "-inf", "-1e30"])
def test_precomputed_gates(device, reset):
    """FLA's gates: g as fp32 log-decay, beta post-sigmoid (bf16 here); a hard reset (g = -inf,
    or a huge negative g) inside a chunk, and one on a chunk's first token, as exact as the
    rest (it made the within-chunk sums NaN or cancel to garbage)."""
    lens = [65, 7]
    x = make(lens, 1, 2, seed=12)
    decay, beta = raw_gates(x["A_log"], x["a"], x["dt_bias"], x["b"])
    g, beta = torch.log(decay).float(), beta.to(torch.bfloat16)
    if reset is not None:
        g[[5, 64, 66], 0] = reset
        g[30, 1] = reset
    ref_out, ref_state = oracle(x["q"], x["k"], x["v"], x["states"], torch.exp(g.to(F64)),
                                beta, x["cu_seqlens"], 64 ** -0.5, True)
    x = to_device(x, device)
    g, beta = g.to(device), beta.to(device)
    out = nan_like((sum(lens), 2, 64), torch.bfloat16, device)
    new_state = nan_like(x["states"].shape, torch.float32, device)
    launch(x, x["states"], out, new_state, True, g=g, beta=beta)
    judge(out, new_state, ref_out, ref_state, "precomputed gates")


# ------------------------------------------------------------------ pools

def stored_pool(values, k_first, device, extra=32):
    """``values`` [P, HV, V, K] as a pool on ``device`` whose slots lie HV*V*K + ``extra``
    elements apart: k-last, or K-first ([P, HV, K, V], V contiguous)."""
    P, HV, V, K = values.shape
    base = torch.zeros(P, HV * V * K + extra, dtype=values.dtype, device=device)
    if k_first:
        stored = base[:, :HV * V * K].view(P, HV, K, V)
        stored.copy_(values.transpose(-1, -2))
    else:
        stored = base[:, :HV * V * K].view(P, HV, V, K)
        stored.copy_(values)
    return stored


@pytest.mark.parametrize("separate,k_first,segments", [(False, False, 1), (True, True, 1),
                                                       (True, False, 2)],
                         ids=["in-place", "write-pool-k-first", "write-pool-segments2"])
def test_pool(device, separate, k_first, segments):
    """Six sequences on a pool of P = 6 slots: read slots [3, -1, 5 (= null_slot), 9 (>= P),
    0, 1], has_initial_state [T, T, F, T, F, T]; written in place, or to a pool of 7 slots at
    [6, 2, 1, -1, 4, -1] (the last a real read with a padding write: outputs, no write).  Padded
    sequences' outputs are zero; every slot not written is bit-identical.  With ``segments``
    the last sequence is 140 tokens (three chunks, from its slot's state)."""
    lens = [3, 5, 20, 2, 66, 140 if segments > 1 else 10]
    HV, K, P, null = 2, 64, 6, 5
    x = make(lens, 1, HV, seed=21 + separate)
    gen = torch.Generator().manual_seed(22 + separate)
    values = torch.randn(P, HV, K, K, generator=gen) * 0.05
    read = torch.tensor([3, -1, null, 9, 0, 1], dtype=torch.int64)
    has_init = torch.tensor([True, True, False, True, False, True])
    write = torch.tensor([6, 2, 1, -1, 4, -1], dtype=torch.int32) if separate else read
    PN = 7 if separate else P
    real = ((read >= 0) & (read < P) & (read != null)).tolist()
    init = torch.stack([values[int(r)] if ok and h else torch.zeros(HV, K, K)
                        for r, ok, h in zip(read, real, has_init.tolist())])
    ref_out, ref_state = oracle(x["q"], x["k"], x["v"], init, *raw_gates(
        x["A_log"], x["a"], x["dt_bias"], x["b"]), x["cu_seqlens"], K ** -0.5, True)
    cu = x["cu_seqlens"].tolist()
    for n, ok in enumerate(real):
        if not ok:
            ref_out[cu[n]:cu[n + 1]] = 0.0
    written = {int(w): n for n, (w, ok) in enumerate(zip(write.tolist(), real))
               if ok and 0 <= w < PN and w != null}

    x = to_device(x, device)
    pool = stored_pool(values, k_first, device)
    new = stored_pool(torch.randn(PN, HV, K, K, generator=gen) * 0.05, k_first, device) \
        if separate else pool
    pool_before, new_before = pool.clone(), new.clone()
    out = nan_like((sum(lens), HV, K), torch.bfloat16, device)
    launch(x, pool, out, new, True, state_indices=read.to(device),
           new_state_indices=write.to(device) if separate else None, null_slot=null,
           has_initial_state=has_init.to(device), k_first=k_first,
           config=dict(segments=segments))
    got = torch.stack([k_last(new, k_first)[w] for w in written])
    judge(out, got, ref_out, ref_state[list(written.values())], "pool")
    for s in range(PN):
        if s not in written:
            assert torch.equal(new[s], new_before[s]), f"slot {s} not written but changed"
    if separate:
        assert torch.equal(pool, pool_before), "the read pool changed"


# ------------------------------------------------------------------ the plain functions

def test_config_checked():
    with pytest.raises(ValueError, match="config: block_v"):
        tc.resolve(dict(block_v=24), 1, 8, 128, torch.device("cpu"))
    with pytest.raises(ValueError, match="config: precision"):
        tc.resolve(dict(precision="fp8"), 1, 8, 128, torch.device("cpu"))
    with pytest.raises(ValueError, match="config: chunk"):
        tc.resolve((16, 8, 2, 4, 48), 1, 8, 128, torch.device("cpu"))
    with pytest.raises(ValueError, match="config: base"):
        tc.resolve(dict(chunk=32, base=64), 1, 8, 128, torch.device("cpu"))
    with pytest.raises(ValueError, match="config:"):
        tc.normalize(dict(bogus=1))
    c = tc.resolve(None, 1, 8, 128, torch.device("cpu"))
    assert c.block_v == 128 and c.chunk == 64 and c.precision == "bf16x3" and c.warps == 4
    assert tc.resolve(dict(block_v=16), 1, 8, 128, torch.device("cpu")).warps == 8
    assert tc.resolve(dict(block_v=16, warps=2), 1, 8, 128, torch.device("cpu")).warps == 2
    with pytest.raises(ValueError, match="config: v_ahead"):
        tc.resolve(dict(v_ahead=2), 1, 8, 128, torch.device("cpu"))
    ahead = tc.resolve(dict(block_v=16), 1, 8, 128, torch.device("cpu"))
    assert (ahead.v_ahead, ahead.stages) == (1, 3)
    assert (c.v_ahead, c.stages) == (0, 2)
    assert tc.resolve(dict(block_v=16, v_ahead=0), 1, 8, 128, torch.device("cpu")).stages == 2
    assert tc.resolve(dict(block_v=32, v_ahead=1, stages=2), 1, 8, 128, torch.device("cpu"))[2:] \
        == (2, 4, 64, "bf16x3", 8, 1, 1, "triton", "triton")
    for bad in (-1, tc.MAX_SEGMENTS + 1):
        with pytest.raises(ValueError, match="config: segments"):
            tc.resolve(dict(segments=bad), 1, 8, 128, torch.device("cpu"))


@pytest.mark.parametrize("case", ["checkpoints", "K != V"])
def test_segments_fall_back_to_one_chain(device, case):
    """Segments need K == V (the identity chain's rows are the state's) and store no
    checkpoints: the launch runs one chain a sequence then, and says so in its Config."""
    K, V = (64, 64) if case == "checkpoints" else (64, 32)
    x = make([70], 1, 1, K, V, torch.bfloat16, 0, torch.int32)
    x = to_device(x, device)
    out = torch.empty(70, 1, V, dtype=torch.bfloat16, device=device)
    new = torch.empty(1, 1, V, K, dtype=torch.float32, device=device)
    kw = dict(checkpoints=torch.empty(1, 1, V, K, device=device), checkpoint_every=64) \
        if case == "checkpoints" else {}
    c = tc.launch(x["q"], x["k"], x["v"], None, x["A_log"], x["a"], x["dt_bias"], x["b"],
                  x["cu_seqlens"], None, out, new, True, config=dict(segments=2), **kw)
    assert c.segments == 1


def test_two_segments_while_three_times_the_programs_fit_one_wave():
    long = 2 * tc.SEGMENT_MIN_CHUNKS * 64      # two segments' worth
    assert tc.pick_segments(32, 132, 8192, 1, 64) == 2   # 2/4 heads, one sequence: 96 programs
    assert tc.pick_segments(44, 132, long, 1, 64) == 2
    assert tc.pick_segments(44, 132, 2 * long - 1, 2, 64) == 1   # the sequences too short
    assert tc.pick_segments(45, 132, 8192, 1, 64) == 1
    assert tc.pick_segments(64, 132, 8192, 1, 64) == 1   # 4/8: 192 programs past 132 SMs
    assert tc.resolve(None, 1, 4, 128, torch.device("cpu")).segments == 1  # CPU: one chain


def test_block_v_is_16_while_one_wave_holds_them_else_32():
    assert tc.pick_block_v(8, 128, 132) == 16          # 1 x 8 heads: 64 programs
    assert tc.pick_block_v(32, 128, 132) == 32         # 16/32 at one sequence: 128
    assert tc.pick_block_v(64, 128, 132) == 32
    assert tc.pick_block_v(1024, 128, 132) == 32
    assert tc.pick_block_v(1024, 16, 132) == 16


def test_block_v_with_bf16_products_is_64_once_64_row_programs_fill_more_than_one_wave():
    assert tc.pick_block_v(8, 128, 132, "bf16") == 16          # 4/8 at one sequence
    assert tc.pick_block_v(32, 128, 132, "bf16") == 32         # 4/8 at 4 sequences
    assert tc.pick_block_v(66, 128, 132, "bf16") == 32         # 132 programs: one wave
    assert tc.pick_block_v(67, 128, 132, "bf16") == 64
    assert tc.pick_block_v(256, 128, 132, "bf16") == 64        # 16/32 at 8 sequences
    assert tc.pick_block_v(256, 128, 132) == 32                # bf16x3 spills at 64 rows
    assert tc.pick_block_v(1024, 32, 132, "bf16") == 32        # V not a multiple of 64
    c = tc.resolve(dict(precision="bf16"), 8, 32, 128, torch.device("cpu"))
    assert c.block_v == 128                                    # the interpreter: fewest programs


def test_warps_8_at_16_rows_and_at_32_rows_within_one_wave_else_4():
    assert tc.pick_warps(16, 64, 132) == 8
    assert tc.pick_warps(16, 4096, 132) == 8
    assert tc.pick_warps(32, 128, 132) == 8            # 16/32 at one sequence
    assert tc.pick_warps(32, 133, 132) == 4
    assert tc.pick_warps(32, 2048, 132) == 4           # 16/64 at 8 sequences
    assert tc.pick_warps(64, 16, 132) == 4
    assert tc.pick_warps(32, 128, 0) == 4              # the interpreter (no SMs)
    assert tc.pick_warps(32, 128, 132, "bf16") == 4    # one product: 4 warps faster
    assert tc.pick_warps(16, 64, 132, "bf16") == 8
    assert tc.resolve(dict(block_v=32), 1, 32, 128, torch.device("cpu")).warps == 4
    assert tc.resolve(dict(block_v=32, warps=2), 1, 32, 128, torch.device("cpu")).warps == 2


def test_supports_reasons():
    ok = dict(H=4, HV=8, K=128, V=128, io_dtype=torch.bfloat16, device="cuda")
    assert tc.serves(**ok) == (True, "")
    for bad, word in ((dict(HV=6), "GVA"), (dict(K=96), "K and V"),
                      (dict(io_dtype=torch.float32), "bfloat16"),
                      (dict(state_dtype=torch.float16), "state")):
        res, why = tc.serves(**{**ok, **bad})
        assert not res and word in why


def test_workspace(device):
    """An explicit workspace is used as given; a short one is refused before any launch."""
    lens = [64, 9]
    x = make(lens, 1, 1, seed=31)
    ref_out, ref_state = oracle(x["q"], x["k"], x["v"], x["states"], *raw_gates(
        x["A_log"], x["a"], x["dt_bias"], x["b"]), x["cu_seqlens"], 64 ** -0.5, False)
    x = to_device(x, device)
    ws = tc.workspace_for(sum(lens), 1, device=device)
    assert ws.numel() == sum(lens) * (2 * 64 + tc.VECTORS)
    out = nan_like((sum(lens), 1, 64), torch.bfloat16, device)
    new_state = nan_like(x["states"].shape, torch.float32, device)
    with pytest.raises(ValueError, match="workspace"):
        launch(x, x["states"], out, new_state, False, workspace=ws[:-1])
    launch(x, x["states"], out, new_state, False, workspace=ws)
    judge(out, new_state, ref_out, ref_state, "explicit workspace")


RAW = [                                             # K, tc.launch's keywords
    pytest.param(64, {}, id="one-chain"),
    pytest.param(64, dict(config=dict(segments=3)), id="segments3"),
    pytest.param(64, dict(pdl=True), id="pdl", marks=pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
        reason="programmatic dependent launch needs compute capability 9.0 or newer")),
    pytest.param(128, dict(config=dict(precision="bf16", prep="cuda", chain="cuda", segments=2)),
                 id="cuda-prep-chain-segments2", marks=pytest.mark.skipif(
                     not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                     reason="the CUDA chain kernel needs compute capability 9.0")),
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="raw launches need a CUDA device")
@pytest.mark.parametrize("K,kw", RAW)
def test_raw_launches_match_tritons_own(device, K, kw):
    """After a signature's first call, the Triton kernels of a call are launched raw (every
    runtime argument and the grid written per call): a second call on new buffers of another
    token count, the same signature, gives what Triton's own launch gives."""
    pytest.importorskip("cupy", reason="the raw launch binds cuLaunchKernel through CuPy")

    def run(x):
        out = nan_like((x["v"].shape[0], 2, K), torch.bfloat16, device)
        new = nan_like((4, 2, K, K), torch.float32, device)
        launch(x, x["states"], out, new, True, **kw)
        return out, new

    xs = [to_device(make([300, 70, 0, last], 1, 2, K, K, seed=s), device)
          for s, last in ((51, 200), (52, 184))]        # 570 and 554 tokens: T % 16 alike
    tc._LAUNCH.fast.clear()
    run(xs[0])
    assert any(tc._LAUNCH.fast.values()), "no Triton kernel got a raw launch"
    seen = set(tc._LAUNCH.fast)
    got = run(xs[1])
    assert set(tc._LAUNCH.fast) == seen, "a new token count made a new signature"
    tc._LAUNCH.fast.clear()
    want = run(xs[1])
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_resolve_remembers_answers_not_refusals():
    """resolve() answers a repeated call from its memo (the same Config), a config differing in
    one field gets its own answer, and a refused config is refused on every call."""
    cpu = torch.device("cpu")
    a = tc.resolve(dict(block_v=32), 2, 4, 64, cpu, tokens=100)
    assert tc.resolve(dict(block_v=32), 2, 4, 64, cpu, tokens=100) is a
    assert tc.resolve(dict(block_v=16), 2, 4, 64, cpu, tokens=100).block_v == 16
    assert tc.resolve(tc.Config(block_v=32), 2, 4, 64, cpu, tokens=100) == a
    for _ in range(2):
        with pytest.raises(ValueError, match="config: block_v"):
            tc.resolve(dict(block_v=24), 2, 4, 64, cpu, tokens=100)


def test_launch_cache_binds_once_per_signature():
    """_triton_launch.LaunchCache: a signature's first call through Triton's own launch, later
    ones through the bound raw launch with the call's own arguments and grid; a new token count
    of the same specialization is no new signature, a constexpr's value or an int of another
    specialization (1, a multiple of 16, 64-bit) is; a tensor off 16 bytes, or a signature
    whose raw launch cannot be made, always through Triton's; full, it starts over."""
    from gdnzoo.backends import _triton_launch as tlaunch
    triton_calls, raw_calls = [], []

    class Param:
        def __init__(self, const):
            self.is_constexpr = const

    class Kernel:                                   # kernel[grid](*args, **kw) -> "compiled"
        params = [Param(False), Param(False), Param(False), Param(True)]   # a, b, T, MODE

        def __getitem__(self, grid):
            return lambda *args, **kw: triton_calls.append((grid, args, kw)) or "compiled"

    def bind(compiled, args, dev):
        assert compiled == "compiled" and dev == -1
        if args[3] == "no raw":
            raise AttributeError("parameters not laid out so")
        return lambda grid0, a: raw_calls.append((grid0, a))

    cache, kern = tlaunch.LaunchCache(limit=4, bind=bind), Kernel()
    a, b = torch.zeros(8), torch.zeros(8)
    for _ in range(3):
        cache(kern, 5, (a, b, 7, "x"), num_warps=4)
    assert len(triton_calls) == 1 and raw_calls == [(5, (a, b, 7, "x"))] * 2
    c = torch.zeros(8)
    cache(kern, 6, (c, b, 9, "x"), num_warps=4)       # new pointers, grid and T: the same
    assert raw_calls[-1] == (6, (c, b, 9, "x")) and len(triton_calls) == 1
    for t in (1, 32, 2 ** 40):                          # ints Triton specializes otherwise
        cache(kern, 5, (a, b, t, "x"), num_warps=4)
    assert len(triton_calls) == 4
    cache(kern, 5, (a, b, 7, "y"), num_warps=4)       # another constexpr: another signature
    cache(kern, 5, (a, b, 7, "x"), num_warps=8)       # another keyword: another signature
    assert len(triton_calls) == 6
    off = torch.zeros(9)[1:]                          # 4 bytes past a 16-byte boundary
    for _ in range(2):
        cache(kern, 5, (off, b, 7, "x"), num_warps=4)
    assert len(triton_calls) == 8
    for _ in range(2):
        cache(kern, 5, (a, b, 7, "no raw"), num_warps=4)
    assert len(triton_calls) == 10 and cache.fast[next(reversed(cache.fast))] is False
    assert len(cache.fast) <= 4                       # cleared once full


def test_launch_cache_reads_a_kernels_constexprs():
    """The launch cache keys constexprs by value and runtime values by their specialization:
    it reads which is which from a Triton kernel's parameters (this Triton's JITFunction, made
    directly: under the interpreter ``triton.jit`` gives none), and keys every value by value
    where a kernel does not say."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    from gdnzoo.backends import _triton_launch as tlaunch

    def shape(x, n, M: tl.constexpr, s, P: tl.constexpr):     # a kernel's parameters only
        pass
    assert tlaunch.constexpr_positions(JITFunction(shape)) == {2, 4}
    assert tlaunch.constexpr_positions(object()) is None


def test_launch_cache_spec_classes():
    """What the launch cache keys a plain runtime value by: Triton's specialization of it (an
    int's width, == 1 and % 16; a float's type; anything else its value)."""
    from gdnzoo.backends import _triton_launch as tlaunch

    class Param:
        is_constexpr = False

    class Kernel:
        params = [Param(), Param()]

    cache, kern, t = tlaunch.LaunchCache(), Kernel(), torch.zeros(4)

    def sc(x):
        return cache.key(kern, (t, x), {})[0]
    assert sc(7) == sc(9) == sc(2 ** 31 - 1) != sc(2 ** 31)
    assert sc(16) == sc(4096) != sc(8) and sc(1) != sc(3) and sc(-16) == sc(32)
    assert sc(2 ** 63) != sc(2 ** 62 + 1) and sc(0.5) == sc(2.0) != sc(2)
    assert sc("bf16") != sc("bf16x3") and sc("bf16") == sc("bf16") and sc(None) != sc(0)
    assert cache.key(kern, (t, 7), {})[1] == -1          # the first tensor's device


@pytest.mark.slow
def test_long_sequence_d128(device):
    """One 700-token sequence and a short one at K = V = 128, GVA 2."""
    check(device, [700, 20], 1, 2, 128, seed=41)


def test_bf16_entry_is_triton_chunk_with_precision_bf16(monkeypatch):
    """``triton-chunk-bf16`` runs this module's launch with precision "bf16" (the rest of the
    config as given), is judged with the peers' state bound, and runs on CUDA only (the
    interpreter's truncating bf16 casts are not the GPU's rounding)."""
    from types import SimpleNamespace

    from gdnzoo import gate, registry
    from gdnzoo.backends import triton_chunk_bf16
    seen = {}
    monkeypatch.setattr(tc, "bind", lambda call, config: seen.update(config=config, call=call)
                        or seen.setdefault("launched", []).append)
    call = SimpleNamespace()                   # a stand-in record
    triton_chunk_bf16.run(call, config=dict(block_v=16))
    assert seen["call"] is call and seen["launched"] == [call]
    assert seen["config"].precision == "bf16" and seen["config"].block_v == 16
    assert gate.state_tol_of("triton-chunk-bf16", "prefill") == gate.PEER_STATE_TOL
    assert registry.spec("triton-chunk-bf16", "prefill").devices == ("cuda",)
    assert gate.state_tol_of("triton-chunk", "prefill") is None


def test_bind_makes_a_plan_once_a_form_and_launches_every_record(monkeypatch):
    """The dispatcher's bound launcher: one :class:`tc.Plan` for calls of one signature, each
    call on its own data (the same bits as a fresh launch on that data); q 8 bytes off 16 is
    another plan, and so are a pool's separate write slots, which the signature does not show,
    and a change of GDNZOO_PREFILL_OVERLAP."""
    import gdnzoo
    from gdnzoo.inputs import make_prefill_inputs
    made, real = [], tc.Plan

    class Spy(real):
        def __init__(self, *a, **kw):
            made.append(1)
            super().__init__(*a, **kw)
    monkeypatch.setattr(tc, "Plan", Spy)
    gdnzoo.registry.reset_caches()       # no verdict (and launcher) of an earlier test

    def run(seed, off=False, write=None):
        x = make_prefill_inputs([70, 0, 33], H=1, HV=2, K=64, V=64, seed=seed, device=DEVICE)
        q = x.q
        if off:                          # the same shape and strides, 8 bytes past 16
            q = torch.empty(q.numel() + 4, dtype=q.dtype, device=DEVICE)[4:].view(q.shape)
            q.copy_(x.q)
        pool = torch.cat([x.state, x.state])
        idx = torch.arange(3, dtype=torch.int32, device=DEVICE)
        kw = dict(state_indices=idx, new_state_indices=idx if write is None else idx + write)
        before = len(made)
        o, _ = gdnzoo.prefill(q, x.k, x.v, pool, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
                              x.scale, algo="triton-chunk", **kw)
        n = len(made) - before           # plans the call made
        want_o, want_s = torch.empty_like(o), torch.cat([x.state, x.state])
        tc.launch(x.q, x.k, x.v, want_s, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens, x.scale,
                  want_o, want_s, False, state_indices=idx,
                  new_state_indices=None if write is None else idx + write)
        assert torch.equal(o, want_o) and torch.equal(pool, want_s), (seed, off, write)
        return n

    counts = [run(0), run(1), run(2), run(3, off=True), run(4), run(5, write=3), run(6, write=3)]
    monkeypatch.setenv("GDNZOO_PREFILL_OVERLAP", "0")       # read per call, not per signature
    counts += [run(7), run(8)]
    assert counts == [1, 0, 0, 1, 0, 1, 0, 1, 0], counts

"""cuda-v4 on state pools (gdnzoo.pool), on the GPU, against the float64 pool reference.

Through ``gdnzoo.decode(..., algo="cuda-v4", state_indices=...)``: random distinct slots of a
page-strided pool (each slot followed by a gap, as vLLM's conv + SSM pages), padding (-1,
``null_slot=0``, a slot >= P: out rows exactly zero, no state read or written), separate write
slots in the same pool and in another one, write padding (-1, null_slot, >= PN: out computed, no
state written), int32/int64 indices (mixed too), T=1 and 3, fp32/bf16 state, GVA 1/2/4, the L2
norm, B in {1, 5, 64, 300}.  Every call checks the out rows and written slots with the
correctness gate and the whole pool buffer, page gaps and unwritten slots included,
bit-identical to before.  Also: explicit launch configs (staging, shared and split q/k, FMA
chains) through ``cuda_v4.run``, the element-load variant (a pool at a 2-byte offset), a slot
whose offset passes 2^31 elements, and a CUDA graph replayed with new indices and new data.
"""
from __future__ import annotations


import pytest
import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.backends import cuda_v4
from gdnzoo.contract import validate
from gdnzoo import inputs
from gdnzoo.inputs import make_inputs, paged_pool
from gdnzoo.pool import Pool, live
from gdnzoo.reference import reference_outputs
from helpers import cuda_missing, record, run

F32, BF16 = torch.float32, torch.bfloat16
I32, I64 = torch.int32, torch.int64
K = V = 128


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda_missing() is not None,
                                 reason=f"cuda-v4 state pools need a GPU and CuPy: "
                                        f"{cuda_missing()}")]


def page_pool(P, HV, dtype, seed, V=V, offset=0):
    """(buffer, pool): a pool [P, HV, V, K] of pages (a slot plus a gap of 1/32 slot) in a
    random buffer with one more page on either side, so that a write to slot -1 or P lands in
    the buffer and shows; ``offset`` elements come first (1 of bf16: the pool is not 16-byte
    aligned)."""
    p = paged_pool(P, HV, V, K, dtype=dtype, device="cuda", guard=1, offset=offset,
                   gen=torch.Generator(device="cuda").manual_seed(seed))
    return p.buf, p.state


def distinct_slots(n, lo, hi, seed, exclude=()):
    """n distinct random slots in [lo, hi), none of ``exclude``."""
    return inputs.distinct_slots(hi, n, torch.Generator().manual_seed(seed), low=lo,
                                 exclude=exclude).tolist()


def expect(x, pool_t, buf, p, new_pool=None, new_buf=None, l2=False):
    """Before a call: the float64 reference and snapshots of the buffers it may touch."""
    x.state = pool_t
    ref_out, ref_pool = reference_outputs(x, l2, pool=p, new_pool=new_pool)
    return dict(ref_out=ref_out, ref_pool=ref_pool, buf=buf.clone(),
                new_buf=None if new_buf is None else new_buf.clone())


def verify(what, e, out, pool_t, buf, p, new_pool=None, new_buf=None):
    """After a call: padded out rows exactly zero, the others and the written slots through
    the gate, every other element of the written pool's buffer (unwritten slots, page gaps)
    bit-identical (the pages around the pool too), and with another pool the read pool's
    buffer untouched."""
    target = pool_t if new_pool is None else new_pool
    target_buf = buf if new_pool is None else new_buf
    rd, wr = live(p, pool_t.shape[0], target.shape[0])
    written = p.write[wr].long()
    sd = pool_t.dtype
    assert bool((out[~rd] == 0).all()), f"{what}: padded sequences' out rows are not zero"
    j = gate.judge(out[rd], target[written], e["ref_out"][rd], e["ref_pool"][written],
                   state_dtype=sd)
    assert j.ok, f"{what}: {j.reason}"
    before = e["buf"] if new_pool is None else e["new_buf"]
    want = before.clone()
    slot, page = target.shape[1] * target.shape[2] * target.shape[3], target.stride(0)
    want.as_strided(target.shape, target.stride(), target.storage_offset())[written] = \
        target[written]
    assert torch.equal(want, target_buf), \
        f"{what}: the pool changed outside the written slots ({slot} of every {page} elements)"
    if new_pool is not None:
        assert torch.equal(e["buf"], buf), f"{what}: destination passing changed the read pool"


def nan_out(x):
    B, T = x.q.shape[:2]
    return torch.full((B, T, *x.v.shape[2:]), float("nan"), dtype=x.v.dtype, device="cuda")


def decode(x, pool_t, p, new_pool, null_slot, l2, out):
    nsi = None if p.same_indices else p.write
    got_out, got = gdnzoo.decode(x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                                 out=out, new_state=new_pool, use_qk_l2norm=l2, algo="cuda-v4",
                                 state_indices=p.read, new_state_indices=nsi, null_slot=null_slot)
    assert got_out is out and got is (pool_t if new_pool is None else new_pool)


def index_sets(B, P, PN, mode, seed):
    """(read, write or None, null_slot) as lists for a case ``mode``.  Slot 0 is the null slot
    wherever there is padding; with B >= 5, sequences 1-3 read padding (-1, null, P) and
    sequence 4 writes padding (-1); with B >= 64, sequences 5 and 6 write padding too (PN and
    null).  "moved" writes the same pool at slots no sequence reads; "dest" another pool of PN
    slots; "dest_same" another pool with the read indices, sequence 4 reading a slot >= PN."""
    pad = B >= 5
    null = 0 if pad else None
    read = distinct_slots(B, 1, PN if mode == "dest_same" else P, seed)
    write = None
    if mode == "moved":
        write = distinct_slots(B, 1, P, seed + 1, exclude=set(read))
    elif mode == "dest":
        write = distinct_slots(B, 1, PN, seed + 1)
    elif mode == "dest_same" and pad:
        read[4] = PN + 2                                    # a real slot beyond the new pool
    if pad:
        read[1:4] = [-1, 0, P]
        if write is not None:
            write[4] = -1
            if B >= 64:
                write[5:7] = [PN, 0]
    return read, write, null


# (B, T, state dtype, H, HV, L2 norm, mode, read index dtype, write index dtype)
CASES = [
    (1, 1, F32, 4, 8, True, "inplace", I32, None),
    (5, 1, BF16, 2, 8, False, "inplace", I64, None),        # GVA 4
    (64, 1, F32, 4, 8, True, "moved", I32, I32),
    (300, 1, BF16, 4, 8, True, "dest", I64, I64),
    (5, 3, F32, 8, 8, False, "dest", I32, I32),            # GVA 1
    (64, 3, BF16, 4, 8, True, "moved", I64, I64),
    (300, 3, F32, 4, 8, False, "inplace", I32, None),
    (1, 3, BF16, 4, 8, True, "dest_same", I32, None),
    (5, 3, BF16, 4, 8, True, "dest_same", I64, None),
    (64, 1, F32, 4, 8, False, "dest", I32, I64),           # mixed index dtypes
]


def _case_id(c):
    B, T, sd, H, HV, l2, mode, ri, wi = c
    return (f"B{B}-T{T}-{'fp32' if sd is F32 else 'bf16'}-gva{HV // H}-{mode}-"
            f"{str(ri)[-5:]}{'' if wi is None else '-' + str(wi)[-5:]}{'-l2' if l2 else ''}")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_pool_decode_matches_reference(case):
    B, T, sd, H, HV, l2, mode, ri, wi = case
    seed = B * 10 + T
    P = 2 * B + 40
    PN = {"dest": B + 20, "dest_same": P - 8}.get(mode, P)   # slots of the pool written
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device="cuda", seed=seed)
    buf, pool_t = page_pool(P, HV, sd, seed)
    new_buf = new_pool = None
    if mode.startswith("dest"):
        new_buf, new_pool = page_pool(PN, HV, sd, seed + 1)
    read, write, null = index_sets(B, P, PN, mode, seed)
    r = torch.tensor(read, dtype=ri, device="cuda")
    p = Pool(r, r if write is None else torch.tensor(write, dtype=wi, device="cuda"),
             -1 if null is None else null)
    e = expect(x, pool_t, buf, p, new_pool, new_buf, l2)
    out = nan_out(x)
    decode(x, pool_t, p, new_pool, null, l2, out)
    torch.cuda.synchronize()
    verify(_case_id(case), e, out, pool_t, buf, p, new_pool, new_buf)

    # The same launcher with every sequence padding: zeros out, nothing written anywhere.
    pads = ([-1, 0, P] if null == 0 else [-1, P]) * B
    r.copy_(torch.tensor(pads[:B], dtype=ri))
    e = expect(x, pool_t, buf, p, new_pool, new_buf, l2)
    out = nan_out(x)
    decode(x, pool_t, p, new_pool, null, l2, out)
    torch.cuda.synchronize()
    assert bool((out == 0).all()), "all padding: out rows not zero"
    verify(_case_id(case) + " all padding", e, out, pool_t, buf, p, new_pool, new_buf)


# (config, state dtype, T, V): staging (SMEM, T = 1), shared q/k (QKS 1), q/k split over a lane
# pair (QKS 2), both with staging, FMA chains; V = 96 leaves a tail of rows.
POOL_CONFIGS = [
    ((2, 8, 8, 2, 1, 0, 1, 0), F32, 1, V),
    ((4, 4, 8, 2, 1, 0, 1, 2), BF16, 1, 96),
    ((8, 8, 16, 3, 1, 0, 1, 1), BF16, 1, V),
    ((1, 2, 8, 2, 1, 0, 0, 1), F32, 3, V),
    ((1, 2, 16, 0, 1, 0, 0, 2), BF16, 3, 96),
    ((4, 1, 4, 0, 1, 4), F32, 1, V),
]


@pytest.mark.parametrize("cfg,sd,T,Vc", POOL_CONFIGS, ids=lambda v: str(v).replace(" ", ""))
def test_pool_explicit_configs(cfg, sd, T, Vc):
    B, H, HV, P = 5, 4, 8, 30
    seed = 7 + T
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=Vc, state_dtype=sd, device="cuda", seed=seed)
    buf, pool_t = page_pool(P, HV, sd, seed, V=Vc)
    read, write, null = index_sets(B, P, P, "moved", seed)
    p = Pool(torch.tensor(read, dtype=I32, device="cuda"),
             torch.tensor(write, dtype=I32, device="cuda"), null)
    e = expect(x, pool_t, buf, p, l2=True)
    out = nan_out(x)
    validate(x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale, out=out,
             use_qk_l2norm=True, state_indices=p.read, new_state_indices=p.write, null_slot=null)
    run(cuda_v4, x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, pool_t, True,
                p, config=cfg)
    torch.cuda.synchronize()
    verify(f"config {cfg} T={T} V={Vc}", e, out, pool_t, buf, p)


def test_pool_element_loads_when_misaligned():
    # A bf16 pool 2 bytes into its buffer: not 16-byte aligned, so the element-load variant.
    B, T, H, HV, P = 5, 1, 4, 8, 24
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=BF16, device="cuda", seed=3)
    buf, pool_t = page_pool(P, HV, BF16, 3, offset=1)
    assert pool_t.data_ptr() % 16
    read, _, null = index_sets(B, P, P, "inplace", 3)
    r = torch.tensor(read, dtype=I64, device="cuda")
    p = Pool(r, r, null)
    e = expect(x, pool_t, buf, p, l2=True)
    out = nan_out(x)
    decode(x, pool_t, p, None, null, True, out)
    torch.cuda.synchronize()
    verify("misaligned bf16 pool", e, out, pool_t, buf, p)


def test_slot_offset_past_2_31_elements():
    # vLLM's fp32 page at HV=32: 540,672 elements a slot, so slot 3972 and up start past 2^31.
    HV, H, page, P = 32, 16, 540_672, 4_100
    need = P * page * 4
    free = torch.cuda.mem_get_info()[0]
    if free < need + (2 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB for a {P}-slot fp32 pool plus 2 GiB, "
                    f"{free / 2**30:.1f} GiB free on the GPU")
    big = paged_pool(P, HV, V, K, device="cuda", fill="zeros")
    buf, pool_t = big.buf, big.state
    assert pool_t.stride(0) == page
    slots = [4_000, 4_099, 17, 4_051]
    x = make_inputs(B=len(slots), T=1, H=H, HV=HV, K=K, V=V, state_dtype=F32, device="cuda",
                    seed=11)
    ref_out, ref_state = reference_outputs(x, True)          # the same slots as a dense batch
    idx = torch.tensor(slots, dtype=I32, device="cuda")
    pool_t[idx.long()] = x.state
    out = nan_out(x)
    gdnzoo.decode(x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale, out=out,
                  use_qk_l2norm=True, algo="cuda-v4", state_indices=idx)
    torch.cuda.synchronize()
    j = gate.judge(out, pool_t[idx.long()], ref_out, ref_state, state_dtype=F32)
    assert j.ok, f"slots {slots}: {j.reason}"
    pool_t[idx.long()] = 0
    assert not bool(buf.any()), "a write landed outside the four slots"


def test_graph_capture_replays_new_indices_and_data():
    B, T, H, HV, P = 8, 1, 4, 8, 40
    sd = F32
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device="cuda", seed=20)
    buf, pool_t = page_pool(P, HV, sd, 20)
    read = torch.zeros(B, dtype=I32, device="cuda")
    write = torch.zeros(B, dtype=I32, device="cuda")
    out = torch.empty(B, T, HV, V, dtype=x.v.dtype, device="cuda")
    p = Pool(read, write, 0)

    def call():
        decode(x, pool_t, p, None, 0, True, out)

    def load(seed, padded):
        r, w, _ = index_sets(B, P, P, "moved", seed)
        if not padded:
            r[1:4] = distinct_slots(3, 1, P, seed + 2, exclude=set(r) | set(w))
            w[4] = distinct_slots(1, 1, P, seed + 3, exclude=set(r) | set(w))[0]
        read.copy_(torch.tensor(r, dtype=I32))
        write.copy_(torch.tensor(w, dtype=I32))

    load(20, padded=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()                                      # compile, bind and resolve before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    for seed, padded in ((21, False), (22, True), (23, False)):
        y = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device="cuda", seed=seed)
        for name in ("q", "k", "v", "A_log", "a", "dt_bias", "b"):
            getattr(x, name).copy_(getattr(y, name))
        buf.copy_(page_pool(P, HV, sd, seed)[0])
        load(seed, padded)
        e = expect(x, pool_t, buf, p, l2=True)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        verify(f"graph replay seed {seed}{' padded' if padded else ''}", e, out, pool_t, buf, p)

"""cuda-v4's speculative verify (gdnzoo.verify): intermediate states, deferred commit
(update_state=False) and per-token slots, served by the kernel itself.

Without a GPU: every verify variant family compiles with nvcc (sm_90a, sm_100a), the switches
need each other as documented, a plain decode keeps its parameter block while a verify variant
takes the verify fields after it, update_state=False leaves no state store in the code, and
the launcher marshals the switches, the verify fields and the per-call pointers.

On a GPU, through ``gdnzoo.decode(algo="cuda-v4")`` (and ``cuda_v4.run`` for explicit launch
shapes) against the float64 reference: out, every stored intermediate state and per-token slot
through the correctness gate, padded out rows exactly zero, everything else of the state and
intermediate storage bit-identical (random gaps between pages and blocks); T in {2, 3, 4, 8},
fp32/bf16 state, GVA 1/2/4, the L2 norm, int32/int64 indices, every padding case, dense state,
each accepted count, explicit shapes (staging at T=1, shared and split q/k, chains, a tail of
rows, element loads), an intermediate offset past 2^31 elements, and a CUDA graph replayed with
new data, indices and accepted counts equal to eager calls.
"""
from __future__ import annotations

import functools
import subprocess

import pytest
import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import cuda_v4
from gdnzoo.contract import validate
from gdnzoo.reference import reference_verify_outputs
from conftest import DEVICE
from gdnzoo.inputs import make_verify_case
from helpers import cuda_missing, record
from verify_cases import check_verify_call
from v4_runs import (H100, NVCC, check_run, compile_failures, needs_nvcc, params_at,
                     run_case)
from v4_defines import v4_defines

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
I32, I64 = torch.int32, torch.int64


_defs = functools.partial(v4_defines, T=3, HINT=2)     # a verify variant's defaults


# Every variant family with each verify form: intermediate rows n (INTER 1) or indexed
# (INTER 2, int32/int64), with and without the final store, on a dense state and on pools
# (POOL 1, 2); per-token slots without (POOL 3) and with accepted counts (POOL 4); in
# registers, staged (SMEM, T = 1), shared q/k (QKS 1), split q/k (QKS 2), element loads
# (VEC16 0), FMA chains, a tail of rows (V 96), strided layouts, K 64 and 256.
VERIFY_VARIANTS = [
    _defs(INTER=1, UPDATE=1),
    _defs(INTER=1, UPDATE=0, sd=BF16, l2=True, DENSE=0),
    _defs(INTER=0, UPDATE=0, POOL=1, IDX64=1),
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=8, W=1, RW=8),
    _defs(INTER=2, UPDATE=1, POOL=2, IDX64=7, sd=BF16, io=F16, QKS=2, LPR=8, W=4),
    _defs(INTER=2, UPDATE=1, IDX64=0, QKS=1, W=4, RW=2, LPR=8, l2=True),
    _defs(INTER=1, UPDATE=0, T=1, SMEM=1, W=8, RW=8, LPR=16, POOL=1, IDX64=0),
    _defs(INTER=2, UPDATE=1, T=1, SMEM=1, QKS=2, W=4, RW=4, LPR=8, sd=BF16, IDX64=4),
    _defs(INTER=1, UPDATE=1, V=96, HV=64, GVA=4, W=4, RW=1, LPR=32, VEC16=0, HINT=0, DENSE=0),
    _defs(INTER=2, UPDATE=0, K=64, V=64, T=2, RW=4, LPR=8, CHAIN=4, POOL=2, IDX64=4),
    _defs(INTER=0, UPDATE=1, POOL=3, IDX64=0),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=8, sd=BF16, l2=True, DENSE=0),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=8, T=4, QKS=1, W=4, RW=2, LPR=8),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=1, T=1, SMEM=1, QKS=1, W=8, RW=8, LPR=16),
    _defs(INTER=0, UPDATE=1, POOL=3, IDX64=1, V=96, RW=4, LPR=32, VEC16=0, HINT=0),
    _defs(INTER=1, UPDATE=1, K=256, V=256, HV=6, GVA=3, RW=4, LPR=16, sd=BF16, POOL=1,
          IDX64=0),
    # every token at once (GDN_CHUNK): each form, T 2 to 16, K 32 to 256, fp32/fp16 q/k
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=8, W=4, RW=1, LPR=16, l2=True, CHUNK=1),
    _defs(INTER=1, UPDATE=1, T=2, sd=BF16, io=F16, DENSE=0, CHUNK=1),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=4, W=1, RW=4, LPR=8, CHAIN=4, CHUNK=1),
    _defs(INTER=0, UPDATE=1, POOL=3, IDX64=1, V=96, T=3, RW=4, LPR=32, l2=True, CHUNK=1),
    _defs(INTER=1, UPDATE=1, K=256, V=256, HV=6, GVA=3, T=16, RW=2, LPR=32, sd=BF16, l2=True,
          POOL=1, IDX64=0, CHUNK=1),
    _defs(INTER=2, UPDATE=0, K=32, V=64, T=2, W=1, RW=1, LPR=4, io=F32, POOL=2, IDX64=0,
          CHUNK=1),
    # ... with the Gram entries in each lane's registers (GDN_CHUNK 2, T <= 4)
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=4, W=1, RW=1, LPR=16, l2=True, CHUNK=2),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=2, W=4, RW=2, LPR=16, sd=BF16, CHUNK=2),
    _defs(INTER=1, UPDATE=1, V=96, T=3, RW=4, LPR=32, io=F16, DENSE=0, CHAIN=4, CHUNK=2),
    # the token loop a token ahead (GDN_AHEAD): each form, own and split q/k, element loads,
    # a tail, chains, T 2 to 16
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=8, W=4, RW=1, LPR=16, QKS=2, l2=True, AHEAD=1),
    _defs(INTER=1, UPDATE=1, T=2, sd=BF16, io=F16, DENSE=0, AHEAD=1),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=4, W=1, RW=4, LPR=8, CHAIN=4, QKS=2, AHEAD=1),
    _defs(INTER=0, UPDATE=1, POOL=3, IDX64=1, V=96, T=3, RW=4, LPR=32, VEC16=0, HINT=0,
          AHEAD=1),
    _defs(INTER=1, UPDATE=1, K=256, V=256, HV=6, GVA=3, T=16, RW=2, LPR=32, sd=BF16, l2=True,
          POOL=1, IDX64=0, AHEAD=1),
    # ... unrolled with every token's q and k before the loop too (GDN_AHEAD 3)
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=8, W=1, RW=1, LPR=16, QKS=2, l2=True, AHEAD=3),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=4, W=2, RW=2, LPR=16, sd=BF16, AHEAD=3),
    _defs(INTER=1, UPDATE=1, V=96, T=3, RW=4, LPR=32, VEC16=0, HINT=0, io=F16, AHEAD=3),
    # ... and rolled, everything one token ahead (GDN_AHEAD 2)
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=8, W=4, RW=1, LPR=16, QKS=2, l2=True, AHEAD=2),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=4, W=1, RW=4, LPR=8, CHAIN=4, AHEAD=2),
    _defs(INTER=1, UPDATE=1, V=96, T=3, RW=4, LPR=32, VEC16=0, HINT=0, sd=BF16, DENSE=0,
          AHEAD=2),
    _defs(INTER=0, UPDATE=1, POOL=3, IDX64=1, T=2, W=2, RW=2, LPR=16, QKS=2, AHEAD=2),
    # the head's scalars from the block (GDN_HSC): each ahead and q/k mode, one warp and eight,
    # element loads, a round of 8 tokens a warp (T 16, one warp), K 32, state-early PDL
    _defs(INTER=2, UPDATE=0, POOL=1, IDX64=4, T=8, W=4, RW=1, LPR=16, QKS=2, l2=True, AHEAD=3,
          HSC=1),
    _defs(INTER=0, UPDATE=1, POOL=4, IDX64=9, T=5, W=2, RW=2, LPR=8, sd=BF16, AHEAD=2, HSC=1),
    _defs(INTER=1, UPDATE=1, T=3, W=8, RW=1, LPR=16, QKS=1, l2=True, HSC=1),
    _defs(INTER=1, UPDATE=1, V=96, T=3, RW=4, LPR=32, VEC16=0, HINT=0, io=F16, AHEAD=1, HSC=1),
    _defs(INTER=2, UPDATE=1, K=32, V=64, T=16, W=1, RW=1, LPR=4, io=F32, IDX64=0, AHEAD=1,
          HSC=1),
    _defs(INTER=0, UPDATE=1, POOL=3, IDX64=1, T=4, W=4, RW=1, LPR=16, QKS=2, AHEAD=3, HSC=1,
          PDL=2),
]
ARCHS = [(9, 0), (10, 0)]


def _nvcc(defs, cc=(9, 0), out="/dev/null", what="--cubin"):
    cmd = [NVCC, *cuda_build.nvcc_args(defs, cc), what, "-o", str(out), str(cuda_v4.SOURCE)]
    return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@needs_nvcc
def test_verify_variants_compile_with_nvcc():
    failed = compile_failures(_nvcc, [(d, cc) for d in VERIFY_VARIANTS for cc in ARCHS])
    assert not failed, "nvcc failed:\n" + "\n\n".join(failed)


@needs_nvcc
@pytest.mark.parametrize("defs,word", [
    (_defs(INTER=1), "GDN_INTER and GDN_UPDATE"),             # one without the other
    (_defs(UPDATE=0), "GDN_INTER and GDN_UPDATE"),
    (_defs(INTER=2, UPDATE=1), "-D options"),                 # indexed rows need GDN_IDX64
    (_defs(INTER=1, UPDATE=1, POOL=3, IDX64=0), "per-token"),
    (_defs(INTER=0, UPDATE=0, POOL=4, IDX64=0), "per-token"),
    (_defs(T=1, CHUNK=1), "GDN_CHUNK"),                         # the chunk: T > 1 ...
    (_defs(QKS=1, CHUNK=1), "GDN_CHUNK"),                       # ... and its own q/k staging
    (_defs(T=1, AHEAD=1), "GDN_AHEAD"),                         # a token ahead: T > 1 ...
    (_defs(QKS=1, AHEAD=1), "GDN_AHEAD"),                       # ... q/k not staged per block
    (_defs(CHUNK=1, AHEAD=1), "GDN_AHEAD"),                     # ... and the token loop
    (_defs(AHEAD=4), "GDN_AHEAD"),
    (_defs(T=5, CHUNK=2), "GDN_CHUNK"),                         # the register Gram: T <= 4
    (_defs(T=2, CHUNK=3), "GDN_CHUNK"),
    (_defs(T=1, HSC=1), "GDN_HSC"),                             # the head's scalars: T > 1 ...
    (_defs(T=2, CHUNK=1, HSC=1), "GDN_HSC"),                    # ... and the token loop
    (_defs(T=2, HSC=2), "GDN_HSC"),
], ids=["inter-alone", "update-alone", "no-idx64", "slots+inter", "slots+deferred",
        "chunk-T1", "chunk-qks", "ahead-T1", "ahead-qks", "ahead-chunk", "ahead-4", "chunk2-T5",
        "chunk-3", "hsc-T1", "hsc-chunk", "hsc-2"])
def test_verify_switches_need_each_other(defs, word):
    _, r = _nvcc(defs)
    assert r.returncode != 0 and word in r.stderr, r.stderr[-1000:]


def _ptx(defs, tmp_path, name):
    path = tmp_path / f"{name}.ptx"
    cmd, r = _nvcc(defs, out=path, what="--ptx")
    assert r.returncode == 0, r.stderr[-2000:]
    return path.read_text()


@needs_nvcc
def test_parameter_blocks_and_the_deferred_store(tmp_path):
    # Every variant takes the one GdnParams block (the verify fields are in it).
    size = lambda ptx: int(ptx.split("gdn_decode_v4_param_0[")[1].split("]")[0])  # noqa: E731
    vec_stores = lambda ptx: sum("st.global.cs.v4" in ln or "st.global.v4" in ln   # noqa: E731
                                 for ln in ptx.splitlines())
    plain = _ptx(_defs(), tmp_path, "plain")
    pool = _ptx(_defs(POOL=2, IDX64=3), tmp_path, "pool")
    inter = _ptx(_defs(INTER=2, UPDATE=0, POOL=1, IDX64=4), tmp_path, "inter")
    slots = _ptx(_defs(INTER=0, UPDATE=1, POOL=4, IDX64=0), tmp_path, "slots")
    deferred = _ptx(_defs(INTER=0, UPDATE=0, POOL=1, IDX64=0), tmp_path, "deferred")
    sizes = {size(x) for x in (plain, pool, inter, slots, deferred)}
    assert sizes == {cuda_build.PARAMS.size}
    # 16-byte state stores: the final store only (RW groups x NV vectors, one copy in the
    # code: the token loop is not unrolled), in the token loop for the verify forms, none at
    # all when the final store is deferred and nothing else is stored.
    assert vec_stores(plain) > 0 and vec_stores(inter) > 0 and vec_stores(slots) > 0
    assert vec_stores(deferred) == 0


# --------------------------------------------------------------- marshalling (no GPU needed)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Compiling and the driver call replaced by recorders (the block the driver gets decoded
    from its bytes)."""
    compiled, launches = [], []

    def get_kernel(src, name, defs, dev):
        compiled.append(dict(defs))
        return ("kernel", len(compiled))

    monkeypatch.setattr(cuda_build, "get_kernel", get_kernel)
    monkeypatch.setattr(cuda_build, "launch_raw",
                        lambda func, grid, block, dev, argv, shared=0: launches.append(
                            (func, grid, block, params_at(argv))))
    monkeypatch.setattr(cuda_v4, "_binds", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: H100)
    return compiled, launches


def test_verify_marshalling(fake_gpu):
    compiled, launches = fake_gpu
    # Dense state, intermediate row n, final store: INTER 1, no index dtype needed.
    case = make_verify_case("states", B=3, T=3, H=2, HV=4, dense=True, rows="default",
                            update=True, seed=1)
    run_case(case)
    d, (_, grid, block, f) = compiled[-1], launches[-1]
    assert (d["GDN_POOL"], d["GDN_INTER"], d["GDN_UPDATE"]) == (0, 1, 1) and "GDN_IDX64" not in d
    w, rw, lpr = cuda_v4.table_config(H100, F32, 3, 2, 4, 128, 128, True, 3, verify=True)[:3]
    assert (d["GDN_W"], d["GDN_RW"], d["GDN_LPR"], d["GDN_T"]) == (w, rw, lpr, 3)
    assert grid == 3 * 4 * cuda_v4.blocks_per_head(128, w, rw, lpr) and block == 32 * w
    inter = case.inter
    assert (f["inter"], f["inter_idx"], f["accepted"]) == (inter.data_ptr(), 0, 0)
    assert (f["i_n"], f["i_t"], f["S"]) == (inter.stride(0), inter.stride(1), inter.shape[0])
    assert f["state"] == case.x.state.data_ptr() and f["idx"] == 0
    # Same signature, another intermediate buffer: no new variant, its pointer in the block.
    n = len(compiled)
    other = torch.empty_like(case.inter_buf).as_strided(inter.shape, inter.stride())
    case.inter = other
    run_case(case)
    assert len(compiled) == n and launches[-1][3]["inter"] == other.data_ptr() != f["inter"]

    # A pool, int64 slots and rows, deferred commit: POOL 1, IDX64 bits 0-2, UPDATE 0.
    case = make_verify_case("states", B=3, T=2, seed=2, index_dtype=I64, update=False)
    run_case(case, l2=True)
    d, f = compiled[-1], launches[-1][3]
    assert (d["GDN_POOL"], d["GDN_IDX64"], d["GDN_INTER"], d["GDN_UPDATE"]) == (1, 7, 2, 0)
    w, rw, lpr = cuda_v4.table_config(H100, F32, 3, 2, 4, 128, 128, True, 2, pool=True,
                                      verify=True)[:3]
    assert (d["GDN_W"], d["GDN_RW"], d["GDN_LPR"], d["GDN_L2NORM"]) == (w, rw, lpr, 1)
    assert (f["idx"], f["new_idx"], f["inter_idx"]) == (case.idx.data_ptr(),) * 2 + (
        case.inter_idx.data_ptr(),)
    assert (f["P"], f["S"]) == (case.x.state.shape[0], case.inter.shape[0])
    # int32 rows into the same pool: another variant (IDX64 bit 2 clear).
    case.inter_idx = case.inter_idx.int()
    run_case(case, l2=True)
    assert compiled[-1]["GDN_IDX64"] == 3 and compiled[-1]["GDN_INTER"] == 2

    # Per-token slots: POOL 4 with accepted counts (int64: IDX64 bit 3), 3 without.
    case = make_verify_case("slots", B=3, T=4, seed=3, index_dtype=I32)
    case.accepted = case.accepted.long()
    run_case(case)
    d, f = compiled[-1], launches[-1][3]
    assert (d["GDN_POOL"], d["GDN_IDX64"], d["GDN_INTER"], d["GDN_UPDATE"]) == (4, 8, 0, 1)
    assert (f["idx"], f["accepted"], f["inter"]) == (case.idx.data_ptr(),
                                                     case.accepted.data_ptr(), 0)
    case.accepted = None
    run_case(case)
    assert (compiled[-1]["GDN_POOL"], compiled[-1]["GDN_IDX64"]) == (3, 0)
    assert launches[-1][3]["accepted"] == 0


def test_verify_element_loads_when_the_intermediates_are_misaligned(fake_gpu):
    compiled, launches = fake_gpu
    case = make_verify_case("states", B=2, T=2, seed=4, state_dtype=BF16)
    run_case(case)
    assert compiled[-1]["GDN_VEC16"] == 1
    inter = case.inter
    shifted = case.inter_buf.new_zeros(case.inter_buf.numel() + 1)[1:]      # 2 bytes off
    case.inter = shifted.as_strided(inter.shape, inter.stride())
    run_case(case)
    assert compiled[-1]["GDN_VEC16"] == 0 and launches[-1][3]["inter"] % 16
    # Strides that are not a multiple of 16 bytes: element loads from the bind on.
    odd = case.inter_buf.new_zeros(case.inter_buf.numel() + 64)
    case.inter = odd.as_strided(inter.shape, (inter.stride(0) + 1, inter.stride(1) + 1,
                                              *inter.stride()[2:]))
    n = len(compiled)
    run_case(case)
    assert len(compiled) == n + 1 and compiled[-1]["GDN_VEC16"] == 0


def test_verify_plain_and_pool_launchers_stay_apart(fake_gpu):
    case = make_verify_case("states", B=2, T=2, seed=5, update=True)
    x, pool, ver = case.x, case.pool(), case.verify()
    out = torch.empty(2, 2, *x.v.shape[2:], dtype=x.v.dtype)
    args = (*x.args(), out, x.state, False)
    pooled = cuda_v4.bind(record(*args, pool))
    verified = cuda_v4.bind(record(*args, pool, ver))
    deferred = cuda_v4.bind(record(*args, pool, ver._replace(update=False)))
    assert len({id(pooled), id(verified), id(deferred)}) == 3
    assert cuda_v4.bind(record(*args, pool, ver)) is verified


# ------------------------------------------------------------------------------------- GPU

needs_gpu = pytest.mark.skipif(cuda_missing() is not None,
                               reason=f"cuda-v4 verify runs need a GPU and CuPy: {cuda_missing()}")


def _matrix():
    """(seed, form, update, T, state dtype, pad, H, HV, l2, index dtype, rows, B): each form at
    every T and state dtype, unpadded and with one padding case, the cases taking turns so that
    each form meets all of its own; GVA 1/2/4, int32/int64, B 1/5/33."""
    out = []
    for form, update in (("states", False), ("states", True), ("slots", True)):
        pads = ("neg", "null", "past") + (("acc", "col") if form == "slots" else ("row",))
        for j, (T, sd) in enumerate((T, sd) for T in (2, 3, 4, 8) for sd in (F32, BF16)):
            for pad in (None, pads[j % len(pads)]):
                i = len(out)
                H, HV = ((4, 4), (2, 4), (1, 4))[i % 3]
                B = (1, 5, 33)[i % 3] if pad is None else (5, 33)[i % 2]
                out.append((i, form, update, T, sd, pad, H, HV, bool(i % 2),
                            (I32, I64)[i % 4 // 2], "default" if i % 5 == 4 else "indexed", B))
    return out


def _mid(c):
    _, form, update, T, sd, pad, H, HV, l2, idx, rows, B = c
    return (f"{form}{'+upd' if update else ''}-T{T}-{'fp32' if sd is F32 else 'bf16'}-B{B}-"
            f"gva{HV // H}-{pad or 'nopad'}-{str(idx)[-5:]}{'-l2' if l2 else ''}"
            f"{'-rows' if rows == 'default' else ''}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("c", _matrix(), ids=_mid)
def test_verify_matches_reference(c):
    seed, form, update, T, sd, pad, H, HV, l2, idx, rows, B = c
    case = make_verify_case(form, B=B, T=T, H=H, HV=HV, state_dtype=sd, device=DEVICE,
                            seed=seed, pad=pad, update=update, index_dtype=idx, rows=rows)
    check_verify_call("cuda-v4", case, l2, f"cuda-v4 {_mid(c)}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("update", (False, True))
@pytest.mark.parametrize("rows", ("default", "indexed"))
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
def test_verify_dense_state(update, rows, sd):
    for T, B in ((2, 1), (4, 7)):
        case = make_verify_case("states", B=B, T=T, state_dtype=sd, device=DEVICE,
                                seed=60 + T, dense=True, update=update, rows=rows)
        check_verify_call("cuda-v4", case, True, f"dense T={T} B={B} update={update} {rows}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("T", (2, 3, 4, 8))
def test_verify_slots_each_accepted_count(T):
    for acc in range(1, T + 1):
        for sd in (F32, BF16):
            case = make_verify_case("slots", B=5, T=T, state_dtype=sd, device=DEVICE,
                                    seed=70 + acc, accepted=acc, pad="col",
                                    index_dtype=(I32, I64)[acc % 2])
            check_verify_call("cuda-v4", case, acc % 2 == 0, f"slots T={T} accepted={acc}")
    # No num_accepted_tokens: column 0 is read.
    case = make_verify_case("slots", B=5, T=T, device=DEVICE, seed=79, accepted=1)
    case.accepted = None
    check_verify_call("cuda-v4", case, False, f"slots T={T} without num_accepted_tokens")


@pytest.mark.gpu
@needs_gpu
def test_deferred_commit_leaves_the_pool_bit_identical():
    for pad in (None, "neg", "row"):
        case = make_verify_case("states", B=6, T=4, device=DEVICE, seed=80, pad=pad,
                                update=False)
        before = case.buf.clone()
        check_verify_call("cuda-v4", case, True, f"update_state=False pad={pad}")
        assert torch.equal(case.buf, before), "update_state=False wrote the pool"


# (config, T, V): staging at T=1 (with split and shared q/k), shared q/k, split q/k, FMA
# chains, a tail of rows (V 96), T = 8 with .nc loads and streaming stores; every token at once
# (the chunk) at T 2, 3, 4, 8, with a tail, chains and precise gates, and with its Gram entries
# in registers (chunk 2) at T 2, 3, 4 the same ways (and at T 8, where chunk 1 serves it); the
# token loop a token
# ahead, unrolled (1, and 3 with every token's q and k first) and rolled (2), at T 2, 3, 4, 8
# with split and own q/k, a tail, chains and precise gates; the head's scalars from the block
# (HSC) with each ahead, own, split and shared q/k, eight warps for three tokens, one warp for
# eight, T 3, 4, 5, 8, 32 lanes a row with a tail (fp32; bf16 takes 16 lanes a row at most).
EXPLICIT = [
    ((2, 8, 8, 2, 1, 0, 1, 0), 1, 128),
    ((4, 4, 8, 2, 1, 0, 1, 2), 1, 96),
    ((8, 8, 16, 3, 1, 0, 1, 1), 1, 128),
    ((1, 2, 8, 2, 1, 0, 0, 1), 3, 128),
    ((1, 2, 16, 0, 1, 0, 0, 2), 4, 96),
    ((4, 1, 4, 0, 1, 4), 2, 128),
    ((2, 2, 16, 3, 1, 0, 0, 0), 8, 96),
    ((4, 1, 16, 3, 1, 0, 0, 0, 1), 2, 128),
    ((2, 2, 16, 2, 0, 0, 0, 0, 1), 8, 96),
    ((1, 4, 8, 0, 1, 4, 0, 0, 1), 4, 128),
    ((8, 1, 16, 3, 1, 0, 0, 0, 1), 3, 128),
    ((1, 1, 16, 3, 1, 0, 0, 0, 2), 4, 128),
    ((4, 2, 16, 2, 0, 0, 0, 0, 2), 2, 96),
    ((1, 4, 8, 0, 1, 4, 0, 0, 2), 3, 128),
    ((2, 2, 16, 3, 1, 0, 0, 0, 2), 8, 128),
    ((4, 1, 16, 3, 1, 0, 0, 2, 0, 1), 2, 128),
    ((2, 2, 16, 2, 0, 0, 0, 2, 0, 1), 8, 96),
    ((1, 4, 8, 0, 1, 4, 0, 0, 0, 1), 4, 128),
    ((8, 1, 16, 3, 1, 0, 0, 0, 0, 1), 3, 128),
    ((1, 1, 16, 3, 1, 0, 0, 2, 0, 3), 8, 128),
    ((2, 2, 16, 2, 0, 0, 0, 2, 0, 3), 3, 96),
    ((1, 2, 16, 0, 1, 4, 0, 0, 0, 3), 4, 128),
    ((4, 1, 16, 3, 1, 0, 0, 0, 0, 3), 2, 128),
    ((1, 1, 16, 3, 1, 0, 0, 2, 0, 2), 8, 128),
    ((2, 2, 16, 2, 0, 0, 0, 2, 0, 2), 3, 96),
    ((1, 4, 8, 0, 1, 4, 0, 0, 0, 2), 4, 128),
    ((4, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1), 8, 128),
    ((2, 2, 16, 2, 0, 0, 0, 2, 0, 2, 1), 3, 96),
    ((1, 4, 8, 0, 1, 4, 0, 0, 0, 1, 1), 4, 128),
    ((8, 1, 16, 3, 1, 0, 0, 1, 0, 0, 1), 3, 128),
    ((4, 2, 8, 3, 1, 0, 0, 2, 0, 0, 1), 8, 96),
    ((1, 1, 16, 3, 1, 0, 0, 0, 0, 3, 1), 8, 128),
    ((2, 1, 16, 3, 0, 0, 0, 0, 0, 1, 1), 5, 128),
    ((8, 1, 32, 3, 1, 0, 0, 0, 0, 3, 1), 8, 96),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("cfg,T,V", EXPLICIT, ids=lambda v: str(v).replace(" ", ""))
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
def test_verify_explicit_configs(cfg, T, V, sd):
    why = cuda_v4.valid_config(128, V, sd, *cfg[:3])
    if why:                                          # 32 lanes a row: fp32 only at K = 128
        pytest.skip(f"{cfg[:3]} cannot serve this state dtype: {why}")
    for form, update, pad in (("states", True, "null"), ("states", False, "row"),
                              ("slots", True, "acc")):
        case = make_verify_case(form, B=5, T=T, V=V, state_dtype=sd, device=DEVICE, seed=90,
                                pad=pad, update=update)
        check_run(case, True, f"{cfg} T={T} V={V} {form} update={update} pad={pad}", cfg)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("l2", (False, True), ids=("raw", "l2"))
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
def test_verify_head_scalars_each_gva_and_token_count(l2, sd):
    # HSC: tokens split over the block's warps (W 4: T 2 leaves two warps idle, T 5 gives two
    # warps a second token, T 8 a round of two tokens each); GVA 1, 2 and 4.
    for i, (T, (H, HV)) in enumerate(((2, (4, 4)), (5, (2, 4)), (8, (1, 4)))):
        case = make_verify_case(("states", "slots", "states")[i], B=3, T=T, H=H, HV=HV,
                                state_dtype=sd, device=DEVICE, seed=110 + i, update=i != 2)
        check_run(case, l2, f"head scalars T={T} H={H} HV={HV} l2={l2}",
                   (4, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
def test_verify_head_scalars_do_not_depend_on_the_warps(sd):
    # A PDL launch may double a row's warps and must write what the plain launch writes: the
    # head's scalars are summed in one order at every W (W 1, 2, 4, 8 at T 5: 8, 4, 2 and 2
    # tokens a warp's round, lane groups of 4, 8, 16 and 16), bit for bit.
    got = []
    for w in (1, 2, 4, 8):
        case = make_verify_case("states", B=3, T=5, state_dtype=sd, device=DEVICE, seed=120,
                                update=True)
        out = run_case(case, True, (w, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1))
        torch.cuda.synchronize()
        got.append((w, out, case.buf, case.inter_buf))
    for w, *bufs in got[1:]:
        for name, a, b in zip(("out", "state", "intermediate"), got[0][1:], bufs):
            assert torch.equal(a, b), f"W={w}: {name} differs from W=1"


@pytest.mark.gpu
@needs_gpu
def test_verify_element_loads_on_a_misaligned_intermediate():
    case = make_verify_case("states", B=5, T=3, state_dtype=BF16, device=DEVICE, seed=95,
                            pad="neg", update=True)
    inter = case.inter
    case.inter_buf = torch.randn(case.inter_buf.numel() + 1, device=DEVICE).to(BF16)
    case.inter = case.inter_buf[1:].as_strided(inter.shape, inter.stride())
    assert case.inter.data_ptr() % 16
    check_verify_call("cuda-v4", case, True, "misaligned bf16 intermediate_states")


@pytest.mark.gpu
@needs_gpu
def test_intermediate_offset_past_2_31_elements():
    # Two rows of bf16 states, the second starting past 2^31 elements (64-bit offsets).
    B, T, H, HV, K = 2, 2, 2, 4, 128
    slot = HV * K * K
    row = 2**31 + 4096
    need = (row + T * slot) * 2
    free = torch.cuda.mem_get_info()[0]
    if free < need + (2 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB plus 2 GiB, {free / 2**30:.1f} GiB free")
    case = make_verify_case("states", B=B, T=T, H=H, HV=HV, state_dtype=BF16, device=DEVICE,
                            seed=96, dense=True, update=True)
    big = torch.zeros(row + T * slot, dtype=BF16, device=DEVICE)
    case.inter = big.as_strided((2, T, HV, K, K), (row, slot, K * K, K, 1))
    case.inter_idx = torch.tensor([1, 0], dtype=I64, device=DEVICE)
    case.inter_buf = None
    ref_out, _, ref_inter = reference_verify_outputs(case.x, case.verify(), False, None)
    out = torch.empty_like(ref_out, dtype=case.x.v.dtype)
    gdnzoo.decode(*case.x.args(), out=out, algo="cuda-v4", **case.kwargs())
    torch.cuda.synchronize()
    j = gate.judge(out, case.inter, ref_out, ref_inter, state_dtype=BF16)
    assert j.ok, f"intermediate past 2^31 elements: {j.reason}"
    case.inter[:] = 0
    assert not bool(big.any()), "a write landed outside the two rows"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("form", ("states", "slots"))
def test_graph_replay_with_new_data_indices_and_counts(form):
    """A captured verify call replayed with new inputs, new indices and (slots) new accepted
    counts writes what eager calls write on copies of the same buffers, bit for bit."""
    B, T = 6, 4
    case = make_verify_case(form, B=B, T=T, device=DEVICE, seed=100, update=True)
    x = case.x
    out = torch.empty(B, T, *x.v.shape[2:], dtype=x.v.dtype, device=DEVICE)

    def call(c, o):
        gdnzoo.decode(*c.x.args(), out=o, use_qk_l2norm=True, algo="cuda-v4", **c.kwargs())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(case, out)                                # compile, bind and resolve first
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call(case, out)
    for seed, pad in ((101, None), (102, "past" if form == "states" else "acc"), (103, "neg")):
        new = make_verify_case(form, B=B, T=T, device=DEVICE, seed=seed, update=True, pad=pad)
        for name in ("q", "k", "v", "A_log", "a", "dt_bias", "b"):
            getattr(x, name).copy_(getattr(new.x, name))
        case.buf.copy_(new.buf)
        case.idx.copy_(new.idx)
        if form == "states":
            case.inter_buf.copy_(new.inter_buf)
            case.inter_idx.copy_(new.inter_idx)
        else:
            case.accepted.copy_(new.accepted)
        eager = make_verify_case(form, B=B, T=T, device=DEVICE, seed=seed, update=True,
                                 pad=pad)
        eager_out = torch.full_like(out, float("nan"))
        call(eager, eager_out)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out), f"{form} replay {seed}: out differs from eager"
        assert torch.equal(case.buf, eager.buf), f"{form} replay {seed}: pool differs"
        if form == "states":
            assert torch.equal(case.inter_buf, eager.inter_buf), \
                f"{form} replay {seed}: intermediate states differ"
        check_verify_call("cuda-v4", eager, True, f"{form} replay {seed} (eager, reference)")

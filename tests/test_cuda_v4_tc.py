"""cuda-v4's tensor-core verify (launch rows with ``kernel: tc-verify``, backends/cuda_v4_tc.cu,
its host side backends/_cuda_v4_tc.py).

Without a GPU: its variants compile with nvcc (sm_90a, sm_100a), what it cannot serve fails to
compile with its reason, and the launcher binds it where it serves (its kernel, grid and block,
cuda-v4's parameter block) and the token loop of the row's other fields everywhere else.

On a GPU, through ``cuda_v4.run`` with a tc-verify shape, against the float64 reference:
out, every intermediate and final state, padded rows zero, everything else bit-identical;
T 1 to 8, fp32/bf16 state, GVA 1/2/4, the L2 norm and not, precise and fast gates, int32/int64
indices, every padding case, a dense state, intermediate rows by index and by sequence, the
final store and not, separate write slots, destination passing, the engines' packed q/k/v and
a/b views (the strides compiled in); vLLM's per-token slots with and without
num_accepted_tokens, every padding case, in place and into a separate pool; each case asserts
that the tensor-core kernel ran.
"""
from __future__ import annotations

import subprocess

import pytest
import torch

from gdnzoo import gate
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _cuda_v4_tc as tc_verify
from gdnzoo.backends import cuda_v4
from gdnzoo.contract import validate
from gdnzoo.reference import reference_verify_outputs
from conftest import DEVICE
from v4_defines import v4_defines
from v4_runs import (H100, NVCC, check_run, compile_failures, needs_nvcc, params_at,
                     run_case)
from gdnzoo.inputs import make_verify_case
from helpers import cuda_missing, record, run

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
I32, I64 = torch.int32, torch.int64
# A tensor-core verify row, cuda_v4.cu's fields for the calls it does not serve the token loop
# of 8 warps (16 lanes a row, split q/k, q/k ahead, the head's scalars from the block); fast
# and precise gates.
TC = (8, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1, "tc-verify")
TC_PRECISE = (8, 1, 16, 3, 0, 0, 0, 2, 0, 3, 1, "tc-verify")
_SC = tuple((f"GDN_SC_{n}", 4096 + 16 * i)                 # some compiled-in strides
            for i, n in enumerate(cuda_build.STRIDE_FIELDS + ("i_n", "i_t")))
_defs = v4_defines

# Each form on a dense state and on pools (POOL 1, 2), intermediate rows n and by index
# (int32/int64), T 1 to 8, fp32/bf16 state, the L2 norm, precise gates, compiled-in strides.
TC_VARIANTS = [
    _defs(T=8, INTER=1, UPDATE=0, sd=BF16),
    _defs(T=4, INTER=2, UPDATE=1, POOL=1, IDX64=0, l2=True),
    _defs(T=3, INTER=2, UPDATE=1, POOL=2, IDX64=7, sd=BF16, FAST=0),
    tuple(sorted(_defs(T=2, INTER=2, UPDATE=0, POOL=1, IDX64=4, DENSE=2, l2=True) + _SC)),
    _defs(T=1, INTER=1, UPDATE=1),
    _defs(T=8, INTER=0, UPDATE=1, POOL=4, IDX64=0, sd=BF16, l2=True),
    _defs(T=4, INTER=0, UPDATE=1, POOL=3, IDX64=1),
    tuple(sorted(_defs(T=2, INTER=0, UPDATE=1, POOL=4, IDX64=9, DENSE=2, FAST=0) + _SC)),
    _defs(T=5, INTER=2, UPDATE=0, POOL=1, IDX64=5, HV=32, GVA=4, sd=BF16, l2=True),
]


def _nvcc(defs, cc=(9, 0)):
    cmd = [NVCC, *cuda_build.nvcc_args(defs, cc), "--cubin", "-o", "/dev/null",
           str(tc_verify.SOURCE)]
    return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@needs_nvcc
def test_tc_variants_compile_with_nvcc():
    failed = compile_failures(_nvcc, [(d, cc) for d in TC_VARIANTS for cc in ((9, 0), (10, 0))])
    assert not failed, "nvcc failed:\n" + "\n\n".join(failed)


@needs_nvcc
@pytest.mark.parametrize("defs,word", [
    (_defs(T=9, INTER=1, UPDATE=1), "T <= 8"),
    (_defs(T=4, INTER=1, UPDATE=1, io=F16), "bf16 q, k, v"),
    (_defs(T=4, INTER=0, UPDATE=1, POOL=1, IDX64=0), "intermediate states"),
    (_defs(T=4, INTER=0, UPDATE=0, POOL=3, IDX64=0), "per-token slots"),
    (_defs(T=4, K=64, V=64, INTER=1, UPDATE=1), "K = V = 128"),
    (_defs(T=4, INTER=1, UPDATE=1, DENSE=0), "GDN_DENSE"),
    (_defs(T=4, INTER=2, UPDATE=1), "-D options"),            # indexed rows need GDN_IDX64
], ids=["T9", "fp16", "no-inter", "slots-deferred", "K64", "dense0", "no-idx64"])
def test_tc_refuses_what_it_cannot_serve(defs, word):
    _, r = _nvcc(defs)
    assert r.returncode != 0 and word in r.stderr, r.stderr[-1000:]


# --------------------------------------------------------------- marshalling (no GPU needed)


@pytest.fixture
def recorded(monkeypatch):
    """Compiling and the driver call replaced by recorders: (source name, kernel, defines) and
    (grid, block) of every launch."""
    kernels, launches = [], []

    def get_kernel(src, name, defs, dev):
        kernels.append((src.name, name, dict(defs)))
        return ("kernel", len(kernels))

    monkeypatch.setattr(cuda_build, "get_kernel", get_kernel)
    monkeypatch.setattr(cuda_build, "launch_raw",
                        lambda func, grid, block, dev, argv, shared=0: launches.append(
                            (grid, block, params_at(argv))))
    monkeypatch.setattr(cuda_v4, "_binds", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: H100)
    return kernels, launches


def test_tc_binds_where_it_serves(recorded):
    kernels, launches = recorded
    # A pool, indexed int64 rows, the final store: the tensor-core kernel, 16 blocks a head.
    case = make_verify_case("states", B=3, T=4, H=2, HV=4, seed=1, update=True, index_dtype=I64)
    run_case(case, l2=True, config=TC)
    src, name, d = kernels[-1]
    assert (src, name) == (tc_verify.SOURCE.name, tc_verify.KERNEL)
    assert (d["GDN_POOL"], d["GDN_INTER"], d["GDN_UPDATE"], d["GDN_IDX64"]) == (1, 2, 1, 7)
    assert (d["GDN_T"], d["GDN_L2NORM"], d["GDN_FASTGATE"]) == (4, 1, 1)
    # fp32 up to T = 4: the compute warps' Gram, 8 warps and the loader
    assert launches[-1][:2] == (3 * 4 * 128 // tc_verify.ROWS, 288)
    # dt_bias's pointer in the first line's ``accepted`` field (the kernel reads it there)
    f = launches[-1][2]
    assert f["accepted"] == f["dt_bias"] == case.x.dt_bias.data_ptr() and f["S"] == 5
    # A dense state, rows n, precise gates: still the tensor-core kernel.
    case = make_verify_case("states", B=2, T=8, seed=2, dense=True, rows="default",
                            state_dtype=BF16)
    run_case(case, config=TC_PRECISE)
    src, _, d = kernels[-1]
    assert src == tc_verify.SOURCE.name and (d["GDN_POOL"], d["GDN_INTER"]) == (0, 1)
    assert d["GDN_FASTGATE"] == 0 and d["GDN_STATE_DT"] == cuda_build.DTYPE_CODE[BF16]
    # bf16, intermediate states: the loader makes the Gram, a flags warp reads the third line
    assert launches[-1][1] == 320
    # Per-token slots with accepted counts: accepted stays, dt_bias in the new_state field and
    # new_state (here the pool itself) in the intermediate-states field.
    case = make_verify_case("slots", B=2, T=8, seed=4, index_dtype=I64)
    run_case(case, config=TC)
    src, _, d = kernels[-1]
    assert src == tc_verify.SOURCE.name
    assert (d["GDN_POOL"], d["GDN_INTER"], d["GDN_UPDATE"], d["GDN_IDX64"]) == (4, 0, 1, 9)
    f = launches[-1][2]
    assert launches[-1][:2] == (2 * 4 * 128 // tc_verify.ROWS, 320)   # + the flags warp
    assert f["accepted"] == case.accepted.data_ptr() and f["idx"] == case.idx.data_ptr()
    assert f["new_state"] == f["dt_bias"] == case.x.dt_bias.data_ptr()
    assert f["inter"] == case.x.state.data_ptr()


@pytest.mark.parametrize("why", ["slots-T9", "T9", "fp16", "K64"])
def test_tc_falls_back_to_the_token_loop(recorded, why):
    kernels, launches = recorded
    kw = dict(form="slots", T=9) if why == "slots-T9" else dict(T=9) if why == "T9" else \
        dict(K=64, V=64) if why == "K64" else {}
    case = make_verify_case(kw.pop("form", "states"), B=2, T=kw.pop("T", 4), seed=3, **kw)
    if why == "fp16":
        for n in ("q", "k", "v"):
            setattr(case.x, n, getattr(case.x, n).to(F16))
    run_case(case, config=TC)
    src, name, d = kernels[-1]
    assert (src, name) == (cuda_v4.SOURCE.name, cuda_v4.KERNEL)
    assert "GDN_CHUNK" not in d and d["GDN_AHEAD"] in (1, 3) and d["GDN_HSC"] == 1
    assert launches[-1][1] == 32 * d["GDN_W"]
    want = 0 if case.accepted is None else case.accepted.data_ptr()
    f = launches[-1][2]
    assert f["accepted"] == want and f["new_state"] == case.x.state.data_ptr()   # its fields


def test_tc_misaligned_call_takes_the_element_loads(recorded):
    # A signature the tensor-core kernel serves, called once with q 2 bytes off 16: that call
    # runs cuda_v4.cu's element-load variant with GdnParams' own fields; the aligned calls
    # before and after it the tensor-core kernel with its moved fields.
    kernels, launches = recorded
    case = make_verify_case("states", B=2, T=4, seed=5, update=True)
    x = case.x
    run_case(case, config=TC)
    assert kernels[-1][:2] == (tc_verify.SOURCE.name, tc_verify.KERNEL)
    aligned_q = x.q
    x.q = x.q.new_zeros(x.q.numel() + 1)[1:].view_as(x.q).copy_(x.q)         # 2 bytes off
    run_case(case, config=TC)
    src, name, d = kernels[-1]
    assert (src, name) == (cuda_v4.SOURCE.name, cuda_v4.KERNEL) and d["GDN_VEC16"] == 0
    f = launches[-1][2]
    assert launches[-1][1] == 32 * d["GDN_W"] and f["q"] == x.q.data_ptr()
    assert f["accepted"] == 0 and f["new_state"] == x.state.data_ptr() != f["dt_bias"]
    x.q = aligned_q
    run_case(case, config=TC)
    assert len(kernels) == 2 and launches[-1][2]["accepted"] == x.dt_bias.data_ptr()


def test_tc_refusal_names_each_reason():
    def serve(**kw):
        call = dict(K=128, V=128, T=4, io_dtype=BF16, switches=dict(pool=1, inter=2, update=1),
                    vec16=True, pdl=0, grid=128)
        return tc_verify.refusal(**{**call, **kw})

    assert serve() == ""
    assert serve(switches=dict(pool=4, inter=0, update=1)) == ""          # per-token slots
    assert serve(switches=dict(pool=3, inter=0, update=1)) == ""
    assert "intermediate states" in serve(switches=dict(pool=1, inter=0, update=1))
    assert "K = V = 128" in serve(K=64, V=64) and "T <= 8" in serve(T=9)
    assert "bf16" in serve(io_dtype=F16) and "aligned" in serve(vec16=False)
    assert "programmatic" in serve(pdl=2) and "grid" in serve(grid=2**31)


def test_tc_is_a_verify_candidate():
    assert TC[:2] + TC[3:] == cuda_v4.verify_candidates(128, 128, 8, [1], 8)[0][:2] + \
        cuda_v4.verify_candidates(128, 128, 8, [1], 8)[0][3:]
    assert all(c[11:] != ("tc-verify",) for c in cuda_v4.verify_candidates(64, 64, 8, [1], 4))
    assert all(c[11:] != ("tc-verify",) for c in cuda_v4.verify_candidates(128, 128, 8, [1], 9))


# ------------------------------------------------------------------------------- on a GPU

needs_gpu = pytest.mark.skipif(cuda_missing() is not None,
                               reason=f"cuda-v4 runs need a GPU and CuPy: {cuda_missing()}")


def _packed(x):
    """q, k, v as views of one [B*T, 2*H*K + HV*V] tensor and a, b of one [B*T, 2*HV] (the
    engines' layout): strided, so the strides are compiled in."""
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2:]
    m = torch.cat([x.q.reshape(B * T, H * K), x.k.reshape(B * T, H * K),
                   x.v.reshape(B * T, HV * V)], dim=1).view(B, T, -1)
    x.q = m[:, :, :H * K].unflatten(2, (H, K))
    x.k = m[:, :, H * K:2 * H * K].unflatten(2, (H, K))
    x.v = m[:, :, 2 * H * K:].unflatten(2, (HV, V))
    g = torch.cat([x.a.reshape(B * T, HV), x.b.reshape(B * T, HV)], dim=1).view(B, T, -1)
    x.a, x.b = g[:, :, :HV], g[:, :, HV:]


def _write_slots(case, pad):
    """Separate write slots: pool slots no sequence reads (sequence 0's padding with pad)."""
    P = case.x.state.shape[0]
    free = sorted(set(range(1, P)) - set(case.idx.tolist()))
    w = torch.tensor(free[:case.idx.shape[0]], dtype=case.idx.dtype)
    if pad:
        w[0] = -1
    return w.to(case.idx.device)


def _tc_matrix():
    """(seed, T, state dtype, update, pad, H, HV, l2, index dtype, rows, B, layout): every T
    and state dtype, the padding cases, layouts and switches taking turns."""
    pads = (None, "neg", "null", "past", "row")
    layouts = ("pool", "packed", "dense", "write", "pool")
    out = []
    for j, (T, sd) in enumerate((T, sd) for T in (1, 2, 3, 4, 5, 8) for sd in (F32, BF16)):
        H, HV = ((4, 4), (2, 4), (1, 4), (4, 8))[j % 4]
        layout = layouts[j % len(layouts)]
        pad = None if layout == "dense" else pads[j // 2 % len(pads)]
        out.append((j, T, sd, j % 3 != 1, pad, H, HV, j % 2 == 0, (I32, I64)[j // 2 % 2],
                    "default" if j % 4 == 3 else "indexed", (1, 5, 3)[j % 3] if pad is None
                    else 5, layout))
    # A padded read slot above T = 4, where the kernel checks it after the state's MMAs.
    out.append((12, 8, F32, True, "neg", 4, 8, False, I64, "indexed", 5, "pool"))
    out.append((13, 6, BF16, False, "null", 2, 4, True, I32, "default", 5, "write"))
    return out


def _tid(c):
    j, T, sd, upd, pad, H, HV, l2, idx, rows, B, layout = c
    return (f"T{T}-{'fp32' if sd is F32 else 'bf16'}{'-upd' if upd else ''}-B{B}-gva{HV // H}"
            f"-{pad or 'nopad'}-{str(idx)[-5:]}{'-l2' if l2 else ''}-{rows}-{layout}")


def _tc_used(monkeypatch):
    """The kernel names cuda_build compiles from now on (a fresh bind)."""
    used = []
    real = cuda_build.get_kernel
    monkeypatch.setattr(cuda_build, "get_kernel",
                        lambda src, name, *a: used.append(name) or real(src, name, *a))
    monkeypatch.setattr(cuda_v4, "_binds", {})
    return used


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("c", _tc_matrix(), ids=_tid)
def test_tc_matches_reference(c, monkeypatch):
    j, T, sd, update, pad, H, HV, l2, idx, rows, B, layout = c
    case = make_verify_case("states", B=B, T=T, H=H, HV=HV, state_dtype=sd, device=DEVICE,
                            seed=200 + j, pad=pad, update=update, index_dtype=idx, rows=rows,
                            dense=layout == "dense")
    if layout == "packed":
        _packed(case.x)
    write = _write_slots(case, pad is not None) if layout == "write" else None
    used = _tc_used(monkeypatch)
    check_run(case, l2, _tid(c), TC_PRECISE if j % 5 == 2 else TC, write)
    assert used == [tc_verify.KERNEL], f"{_tid(c)}: ran {used}, not the tensor-core verify"


def _slots_matrix():
    """(seed, T, state dtype, pad, H, HV, l2, index dtype, accepted, B, layout) for per-token
    slots: every T and state dtype, the padding cases (a read slot, a count outside 1..T, a
    token's write slot), counts random, all T and none (column 0), in place and into a
    separate pool."""
    pads = (None, "neg", "acc", "col", "null", "past")
    out = []
    for j, (T, sd) in enumerate((T, sd) for T in (1, 2, 3, 4, 6, 8) for sd in (F32, BF16)):
        H, HV = ((4, 4), (2, 4), (1, 4), (4, 8))[j % 4]
        pad = pads[j % len(pads)] if T > 1 or j % len(pads) != 3 else None
        acc = ("random", "all", "none")[j // 2 % 3]
        layout = ("pool", "packed", "pool", "dest")[j % 4]
        out.append((j, T, sd, pad, H, HV, j % 2 == 0, (I32, I64)[j // 2 % 2], acc,
                    (1, 5, 3)[j % 3] if pad is None else 5, layout))
    return out


def _sid(c):
    j, T, sd, pad, H, HV, l2, idx, acc, B, layout = c
    return (f"T{T}-{'fp32' if sd is F32 else 'bf16'}-B{B}-gva{HV // H}-{pad or 'nopad'}"
            f"-{str(idx)[-5:]}{'-l2' if l2 else ''}-acc_{acc}-{layout}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("c", _slots_matrix(), ids=_sid)
def test_tc_slots_match_reference(c, monkeypatch):
    j, T, sd, pad, H, HV, l2, idx, acc, B, layout = c
    case = make_verify_case("slots", B=B, T=T, H=H, HV=HV, state_dtype=sd, device=DEVICE,
                            seed=240 + j, pad=pad, index_dtype=idx,
                            accepted=T if acc == "all" else "random")
    if acc == "none":                  # no num_accepted_tokens: every sequence reads column 0
        case.accepted = None
    if layout == "packed":
        _packed(case.x)
    used = _tc_used(monkeypatch)
    if layout == "dest":
        _slots_into_new_pool(case, l2, _sid(c))
    else:
        check_run(case, l2, _sid(c), TC_PRECISE if j % 5 == 2 else TC)
    assert used == [tc_verify.KERNEL], f"{_sid(c)}: ran {used}, not the tensor-core verify"


def _slots_into_new_pool(case, l2, what):
    """Per-token slots into a separate pool of the same shape: each token's state in its slot
    of it, nothing else of it written, the read pool untouched."""
    x, ver, pool = case.x, case.verify(), case.pool()
    new = torch.full_like(x.state, float("nan"))
    ref_out, ref_new, _ = reference_verify_outputs(x, ver, l2, pool, new_pool=new)
    before = x.state.clone()
    B, T = x.q.shape[:2]
    out = torch.empty(B, T, *x.v.shape[2:], dtype=x.v.dtype, device=DEVICE)
    validate(*x.args(), out=out, new_state=new, use_qk_l2norm=l2, **case.kwargs())
    run(cuda_v4, *x.args(), out, new, l2, pool, ver, config=TC)
    torch.cuda.synchronize()
    assert torch.equal(x.state, before), f"{what}: the read pool was written"
    written = ~torch.isnan(new.flatten(1)).all(1)
    want = ~torch.isnan(ref_new.flatten(1)).all(1)
    assert torch.equal(written, want), f"{what}: slots written {written.nonzero().flatten()}, " \
                                       f"expected {want.nonzero().flatten()}"
    rows = want.nonzero().flatten().tolist()
    j = gate.judge(out, new[rows], ref_out, ref_new[rows], state_dtype=x.state.dtype)
    assert j.ok, f"{what}: {j.reason}"


def _run_dense_update(sd, T, seed, make_out, monkeypatch, what):
    """A dense state read, the final states into a separate new_state, ``out`` from
    ``make_out(shape, dtype)``: the tensor-core kernel ran, the state is untouched, and out,
    every final and intermediate state match the reference.  Returns out."""
    case = make_verify_case("states", B=3, T=T, state_dtype=sd, device=DEVICE, seed=seed,
                            dense=True, update=True)
    x, ver = case.x, case.verify()
    new = torch.full_like(x.state, float("nan"))
    ref_out, ref_new, ref_inter = reference_verify_outputs(x, ver, True, None, new_pool=new)
    before = x.state.clone()
    out = make_out(ref_out.shape, x.v.dtype)
    validate(*x.args(), out=out, new_state=new, use_qk_l2norm=True, **case.kwargs())
    used = _tc_used(monkeypatch)
    run(cuda_v4, *x.args(), out, new, True, None, ver, config=TC)
    torch.cuda.synchronize()
    assert used == [tc_verify.KERNEL]
    j = gate.judge(out, new, ref_out, ref_new, state_dtype=sd)
    assert j.ok, f"{what}: {j.reason}"
    assert torch.equal(x.state, before), f"{what} wrote the state"
    rows = case.inter_idx.tolist()
    j = gate.judge(out, case.inter[rows, :T], ref_out, ref_inter[rows, :T], state_dtype=sd)
    assert j.ok, f"{what}, intermediate states: {j.reason}"
    return out


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
def test_tc_destination_passing(sd, monkeypatch):
    _run_dense_update(sd, 4, 230, lambda shape, dt: torch.empty(shape, dtype=dt, device=DEVICE),
                      monkeypatch, "destination passing")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("T", (6, 8))
def test_tc_unaligned_out(T, monkeypatch):
    # An fp32 state above T = 4 gathers each block's 8 outputs of a token and stores them as 16
    # bytes; an out two bytes past a 16-byte boundary takes the scalar stores instead, and writes
    # nothing outside out.
    bufs = []

    def unaligned(shape, dt):
        n = torch.Size(shape).numel()
        bufs.append(torch.full((n + 8,), -7.0, dtype=dt, device=DEVICE))
        out = bufs[0][1:n + 1].view(shape)
        assert out.data_ptr() % 16 == 2
        return out

    out = _run_dense_update(F32, T, 240 + T, unaligned, monkeypatch, "unaligned out")
    buf, n = bufs[0], out.numel()
    assert bool((buf[0] == -7.0).item()) and bool((buf[n + 1:] == -7.0).all().item()), \
        "wrote outside out"

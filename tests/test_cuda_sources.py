"""The CUDA backends (cuda-v1, cuda-v4) without a GPU: their .cu sources compile with nvcc for
sm_90a and sm_100a under the same -D/-std options the runtime passes to NVRTC, and the Python
launchers marshal arguments, key their caches and pick launch shapes correctly.  In place vs
destination-passing is a runtime property (new_state == state), not a compile variant.
State pools (GDN_POOL 1/2, int32/int64 slot indices) compile in every variant family and marshal
their slot counts, null_slot and per-call index pointers.  GPU tests at the end: CUDA-graph
capture and replay with new data, strided views (the pool tests: tests/test_cuda_v4_pool.py)."""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _cuda_chunk_chain as cuda_chunk_chain
from gdnzoo.backends import _cuda_chunk_prep as cuda_chunk_prep
from gdnzoo.backends import _cuda_v4_kfirst as cuda_v4_kfirst
from gdnzoo.backends import _cuda_v4_tc as tc_verify
from gdnzoo.backends import cuda_v1, cuda_v4
from gdnzoo import tables
from gdnzoo.contract import validate
from gdnzoo.inputs import make_inputs, make_problem, paged_pool
from gdnzoo.pool import Pool
from v4_runs import params_at
from helpers import cuda_missing, record, run

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
NVCC = shutil.which("nvcc")

# (source, state, io, a, b, dt_bias, K, l2norm, extra -D)
def _v4(V=128, T=1, HV=8, GVA=2, W=2, RW=2, LPR=32, VEC16=1, HINT=0, FAST=0, DENSE=0, CHAIN=0,
        SMEM=0, QKS=0, POOL=0, IDX64=None):
    d = dict(v=V, t=T, hv=HV, gva=GVA, w=W, rw=RW, lpr=LPR, vec16=VEC16, hint=HINT,
             fastgate=FAST, dense=DENSE, chain=CHAIN, smem=SMEM, qks=QKS, pool=POOL)
    if POOL:
        d["idx64"] = IDX64
    return d


VARIANTS = [
    (cuda_v1.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, {}),
    (cuda_v1.SOURCE, BF16, F16, F16, BF16, BF16, 128, True, {}),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, _v4()),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(W=4, RW=4, LPR=8, HINT=3, FAST=1,
                                                                 DENSE=1)),
    (cuda_v4.SOURCE, BF16, F16, F16, F16, BF16, 128, True, _v4(T=3, W=1, RW=8, LPR=16, HINT=1,
                                                                  DENSE=1)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, _v4(W=8, RW=4, LPR=8, HINT=2, FAST=1)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(V=96, HV=64, GVA=4, W=4, RW=1,
                                                                 VEC16=0)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, _v4(T=2, RW=4, VEC16=0)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 32, False, _v4(V=32, RW=8, LPR=8)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(W=4, RW=1, LPR=4, CHAIN=4,
                                                                 DENSE=1)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, _v4(T=2, W=1, RW=4, LPR=8,
                                                                   CHAIN=32)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, True, _v4(W=8, RW=8, LPR=16, SMEM=1,
                                                                  HINT=3, DENSE=1)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, _v4(V=96, W=4, RW=4, LPR=16,
                                                                  SMEM=1, CHAIN=4)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 256, True, _v4(V=256, HV=6, GVA=3, RW=4,
                                                                  LPR=16)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, _v4(W=4, RW=2, LPR=8, QKS=1,
                                                                   HINT=2, DENSE=1)),
    (cuda_v4.SOURCE, F32, F32, BF16, BF16, F32, 256, True, _v4(V=64, T=3, W=1, RW=4, LPR=16,
                                                                QKS=1)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, _v4(W=8, RW=8, LPR=16, SMEM=1,
                                                                  QKS=1, DENSE=1)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(W=1, RW=2, LPR=16, QKS=2,
                                                                 DENSE=1)),
    (cuda_v4.SOURCE, BF16, F32, BF16, BF16, F32, 128, False, _v4(T=3, W=4, RW=2, LPR=4, QKS=2)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, True, _v4(W=4, RW=4, LPR=8, SMEM=1,
                                                                  QKS=2, HINT=2, DENSE=1)),
]
# State pools: read = write indices (1) or separate write indices (2), int32/int64 indices
# (IDX64 bit 0: read, bit 1: write), in the register, staged (SMEM), shared q/k (QKS 1, 2),
# element-load (VEC16=0), multi-token and tail (V=96) variants, dense and strided.
POOL_VARIANTS = [
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(W=1, RW=4, LPR=8, HINT=3, FAST=1,
                                                                 DENSE=1, POOL=1, IDX64=0)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, _v4(W=2, RW=2, LPR=16, POOL=1,
                                                                   IDX64=3)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, _v4(T=3, W=1, RW=8, LPR=16, HINT=2,
                                                                  DENSE=1, POOL=2, IDX64=1)),
    (cuda_v4.SOURCE, BF16, F16, F16, F16, BF16, 128, True, _v4(T=3, W=4, RW=2, LPR=4, QKS=2,
                                                                POOL=2, IDX64=2)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(W=8, RW=8, LPR=16, SMEM=1, HINT=2,
                                                                 DENSE=1, POOL=1, IDX64=1)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, _v4(V=96, W=4, RW=4, LPR=16, SMEM=1,
                                                                   QKS=1, POOL=2, IDX64=0)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, _v4(W=4, RW=2, LPR=8, QKS=1, HINT=2,
                                                                 DENSE=1, POOL=2, IDX64=3)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, True, _v4(W=4, RW=4, LPR=8, SMEM=1, QKS=2,
                                                                  HINT=2, POOL=1, IDX64=0)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, _v4(V=96, HV=64, GVA=4, W=4, RW=1,
                                                                  VEC16=0, POOL=1, IDX64=0)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 64, True, _v4(V=64, T=2, W=2, RW=4, LPR=8,
                                                                 CHAIN=4, DENSE=1, POOL=2,
                                                                 IDX64=1)),
]
# cuda-v4's K-first kernel (cuda_v4_kfirst.cu): lanes along K (LK), 16-byte and element loads,
# dense, runtime and compiled-in strides, pools, the gate forms, PDL, K != V, and the verify
# forms (intermediate rows n or indexed, the final store or not, per-token slots), GDN_STAGED.
def _kf(V=128, T=1, HV=8, GVA=2, W=1, LK=8, VEC16=1, HINT=3, FAST=1, DENSE=1, POOL=0,
        IDX64=None, **form):
    d = dict(v=V, t=T, hv=HV, gva=GVA, w=W, lk=LK, vec16=VEC16, hint=HINT, fastgate=FAST,
             dense=DENSE, pool=POOL, **form)
    if POOL:
        d["idx64"] = IDX64
    return d


KFIRST_VARIANTS = [(cuda_v4_kfirst.SOURCE, *rest) for rest in [
    (F32, BF16, BF16, BF16, F32, 128, True, _kf()),
    (BF16, BF16, BF16, BF16, F32, 128, False, _kf(T=3, W=2, LK=16, HINT=0, DENSE=0)),
    (F32, F16, F16, F16, BF16, 64, True, _kf(V=64, LK=4, W=2, POOL=1, IDX64=1, gates=1)),
    (BF16, F32, BF16, BF16, F32, 128, True, _kf(V=96, HV=6, GVA=3, LK=16, POOL=2, IDX64=2,
                                                 neg=1, pdl=1)),
    (F32, BF16, BF16, BF16, F32, 128, False, _kf(LK=2, VEC16=0, HINT=0, FAST=0, DENSE=0)),
    (F32, BF16, BF16, BF16, F32, 128, True, _kf(T=4, POOL=1, IDX64=0, inter=1, update=0)),
    (BF16, BF16, BF16, BF16, F32, 128, False, _kf(T=3, W=2, DENSE=0, POOL=1, IDX64=5, inter=2,
                                                   update=1)),
    (F32, BF16, BF16, BF16, F32, 64, True, _kf(V=64, T=2, DENSE=1, inter=1, update=1)),
    (F32, BF16, BF16, BF16, F32, 128, True, _kf(T=4, VEC16=0, HINT=0, POOL=4, IDX64=9,
                                                 inter=0, update=1)),
    (BF16, BF16, BF16, BF16, F32, 128, False, _kf(T=2, POOL=3, IDX64=0, inter=0, update=1)),
    # GDN_STAGED (the head's tile staged in shared memory): dense, compiled-in strides, pools,
    # precomputed gates, PDL, fp16 io, both state dtypes
    (BF16, BF16, BF16, BF16, F32, 128, True, _kf(W=8, LK=4, staged=1)),
    (F32, F16, F16, F16, BF16, 128, False, _kf(HV=6, GVA=3, W=8, LK=4, DENSE=0, POOL=2,
                                               IDX64=3, gates=1, pdl=1, staged=1)),
    (F32, BF16, BF16, BF16, F32, 128, True, _kf(W=8, LK=4, POOL=1, IDX64=0, neg=1, staged=1)),
]]
ARCHS = [(9, 0), (10, 0)]


def _nvcc(src, defs, cc):
    cmd = [NVCC, *cuda_build.nvcc_args(defs, cc), "--cubin", "-o", "/dev/null", str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return cmd, r


def _compile_all(variants):
    jobs = []
    for src, sd, io, ad, bd, dd, K, l2, extra in variants:
        defs = cuda_build.defines(sd, io, ad, bd, dd, K, l2, **extra)
        jobs += [(src, defs, cc) for cc in ARCHS]
    _run(jobs)


def _run(jobs):
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda j: _nvcc(*j), jobs))
    failed = [f"{' '.join(cmd)}\n{r.stderr[-2000:]}" for cmd, r in results if r.returncode != 0]
    assert not failed, "nvcc failed:\n" + "\n\n".join(failed)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_sources_compile_with_nvcc():
    _compile_all([(s, sd, io, ad, bd, dd, K, l2, dict(x, pool=0) if s == cuda_v4.SOURCE else x)
                  for s, sd, io, ad, bd, dd, K, l2, x in VARIANTS])


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_pool_variants_compile_with_nvcc():
    _compile_all(POOL_VARIANTS)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_kfirst_variants_compile_with_nvcc():
    _compile_all(KFIRST_VARIANTS)


# cuda-chunk's prep kernel: raw and precomputed gates, every gate dtype, NEG, PDL, both stores,
# one to four value heads a CTA, registers capped for four CTAs an SM (the default) or three
PREP_VARIANTS = [dict(GATES=0, A_DT=1, B_DT=1, ALOG_DT=0, DTB_DT=0, NEG=0, PDL=0, STORE3=1),
                 dict(GATES=1, A_DT=0, B_DT=2, ALOG_DT=0, DTB_DT=0, NEG=0, PDL=1, STORE3=0,
                      HEADS=2, MIN_CTAS=3),
                 dict(GATES=0, A_DT=2, B_DT=0, ALOG_DT=1, DTB_DT=2, NEG=1, PDL=0, STORE3=1,
                      HEADS=3),
                 dict(GATES=0, A_DT=1, B_DT=1, ALOG_DT=0, DTB_DT=0, NEG=0, PDL=0, STORE3=0,
                      HEADS=4)]


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_chunk_prep_variants_compile_with_nvcc():
    _run([(cuda_chunk_prep.SOURCE, tuple(sorted((f"GDN_{n}", v) for n, v in d.items())), cc)
          for d in PREP_VARIANTS for cc in ARCHS])


# cuda-chunk-bf16's chain kernel (sm_90a only: warpgroup MMAs): dense, pools, checkpoints,
# state dtypes, PDL, index widths
CHAIN_VARIANTS = [dict(STATE0=1, POOL=0, HAS_INIT=0, CKPT=0, PDL=0, S_DT=0, NS_DT=0, C_DT=0),
                  dict(STATE0=1, POOL=1, HAS_INIT=1, CKPT=0, PDL=1, S_DT=1, NS_DT=1, IDX64=0),
                  dict(STATE0=1, POOL=2, HAS_INIT=0, CKPT=1, PDL=0, S_DT=0, NS_DT=1, C_DT=1,
                       CU64=0, IDX64=1, NIDX64=0),
                  dict(STATE0=0, POOL=0, CKPT=1, NO_OUT=1),
                  dict(STATE0=1, POOL=1, HAS_INIT=1, SEG=4, S_DT=1),     # segments' chains
                  dict(STATE0=0, POOL=0, SEG=2, CU64=0),
                  # "bf16x3" products (cuda-chunk's): the solo form only
                  dict(STATE0=1, POOL=1, HAS_INIT=1, SOLO=1, X3=1, PDL=2, S_DT=1, NS_DT=1),
                  dict(STATE0=1, POOL=2, SOLO=1, X3=1, CKPT=1, C_DT=1, IDX64=0)]


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_chunk_chain_variants_compile_with_nvcc():
    smem = (("GDN_SMEM", cuda_chunk_chain.SMEM),)
    _run([(cuda_chunk_chain.SOURCE,
           smem + tuple(sorted((f"GDN_{n}", v) for n, v in d.items())), (9, 0))
          for d in CHAIN_VARIANTS])


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_v4_needs_the_pool_defines():
    # GDN_POOL is required, and GDN_IDX64 with a pool: a host that forgets them gets an error,
    # not a kernel that reads the wrong index width.
    for extra in (dict(_v4(), pool=None), _v4(POOL=1, IDX64=None)):
        extra = {k: v for k, v in extra.items() if v is not None}
        defs = cuda_build.defines(F32, BF16, BF16, BF16, F32, 128, False, **extra)
        _, r = _nvcc(cuda_v4.SOURCE, defs, (9, 0))
        assert r.returncode != 0 and "-D options" in r.stderr, extra


def _param_offsets(ptx):
    """The byte offsets of the parameter block that a kernel's PTX loads: direct
    ([param_0+off]) or through a register holding the block's address plus a constant."""
    base = {reg: 0 for reg in re.findall(r"mov\.b64\s+(%rd\d+), gdn_decode_v4_param_0;", ptx)}
    for dst, src, c in re.findall(r"add\.s64\s+(%rd\d+), (%rd\d+), (-?\d+);", ptx):
        if src in base:
            base[dst] = base[src] + int(c)
    loads = re.findall(r"ld\.param[^\[\n]*\[([^\]+]+)\+?(-?\d*)\]", ptx)
    return {base.get(at, 0) + int(off or 0) for at, off in loads
            if at in base or at == "gdn_decode_v4_param_0"}


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
@pytest.mark.parametrize("extra", [dict(T=1, POOL=0), dict(T=1, POOL=1, IDX64=0),
                                   dict(T=4, POOL=1, IDX64=0, INTER=2, UPDATE=0, CHUNK=2),
                                   dict(T=3, POOL=4, IDX64=9, INTER=0, UPDATE=1, AHEAD=3)])
def test_v4_call_strides_compiled_in(tmp_path, extra):
    """GDN_DENSE=2 (a strided call): the strides are the -DGDN_SC_ constants the host passes,
    so the kernel reads no stride field (GdnParams' q_n .. dtb_h, the verify i_n and i_t) from
    its parameter block; GDN_DENSE=0 reads them there."""
    x = make_inputs(B=2, T=extra["T"], H=4, HV=8, K=128, V=128)
    wide = torch.zeros(*x.q.shape[:3], 3 * 128, dtype=x.q.dtype)
    verify = "INTER" in extra
    states = types.SimpleNamespace(states=torch.empty(9, 7, 8, 128, 128, device="meta"))
    values = cuda_build.param_values(wide[..., :128], x.k, x.v, x.state, x.A_log, x.a,
                                     x.dt_bias, x.b, x.scale, x.v.clone(), x.state,
                                     verify=states if verify else None)
    sc = dict(cuda_v4.stride_defines(values, verify))
    assert sc["GDN_SC_q_n"] == x.q.shape[1] * 4 * 384 and len(sc) == 26 + 2 * verify
    if verify:
        assert (sc["GDN_SC_i_n"], sc["GDN_SC_i_t"]) == (7 * 8 * 128 * 128, 8 * 128 * 128)
    stride_bytes = {8 * cuda_build.PARAM_FIELDS.index(n)
                    for n in cuda_build.STRIDE_FIELDS + ("i_n", "i_t") * verify}
    knobs = {k.lower(): v for k, v in extra.items()}
    read = {}
    for dense in (0, 2):
        defs = cuda_build.defines(F32, BF16, BF16, BF16, F32, 128, True, **dict(
            _v4(W=4, RW=1, LPR=16, HINT=3, FAST=1, DENSE=dense), **knobs))
        defs = tuple(sorted(defs + (tuple(sc.items()) if dense == 2 else ())))
        ptx = tmp_path / f"d{dense}.ptx"
        cmd = [NVCC, *cuda_build.nvcc_args(defs, (9, 0)), "--ptx", "-o", str(ptx),
               str(cuda_v4.SOURCE)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        read[dense] = _param_offsets(ptx.read_text()) & stride_bytes
    assert read[0] and not read[2], read


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
@pytest.mark.parametrize("extra, first", [
    (dict(T=1, POOL=0), {"state"}),
    (dict(T=1, POOL=1, IDX64=0), {"P", "null_slot", "s_n", "state", "idx"}),
    (dict(T=2, POOL=2, IDX64=3), {"P", "null_slot", "s_n", "state", "idx"}),
    (dict(T=4, POOL=1, IDX64=4, INTER=2, UPDATE=0, AHEAD=3, HSC=1),
     {"P", "null_slot", "s_n", "state", "idx"}),
    (dict(T=3, POOL=4, IDX64=9, INTER=0, UPDATE=1, AHEAD=3),
     {"P", "null_slot", "s_n", "state", "idx", "accepted"}),
])
def test_v4_parameter_lines(tmp_path, extra, first):
    """GdnParams is ordered by first read (gdn_common.cuh): what a dense layout (GDN_DENSE=1)
    reads before its state loads, the state pointer and a pool's slot check and slot stride,
    sits in the first 48 bytes, the 64-byte constant-cache line the launch's memory
    descriptor shares; everything else it reads sits in the next two lines (a verify call's
    intermediate strides, runtime values at GDN_DENSE=1, in the fourth), none of the sizes
    and strides it compiles in."""
    defs = cuda_build.defines(F32, BF16, BF16, BF16, F32, 128, True, **dict(
        _v4(W=4, RW=1, LPR=16, HINT=3, FAST=1, DENSE=1),
        **{k.lower(): v for k, v in extra.items()}))
    ptx = tmp_path / "k.ptx"
    cmd = [NVCC, *cuda_build.nvcc_args(defs, (9, 0)), "--ptx", "-o", str(ptx),
           str(cuda_v4.SOURCE)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    read = {cuda_build.PARAM_FIELDS[o // 8] for o in _param_offsets(ptx.read_text())}
    at = {n: 8 * i for i, n in enumerate(cuda_build.PARAM_FIELDS)}
    assert {n for n in read if at[n] < 48} == first
    end = at["B"] if "INTER" in extra else at["i_n"]
    assert max(at[n] for n in read) < end == 48 + 128 + 16 * ("INTER" in extra), sorted(read)


def test_nvcc_flags_match_nvrtc_options():
    defs = cuda_build.defines(F32, BF16, BF16, F16, F32, 128, True, **_v4())
    nvrtc = cuda_build.nvrtc_options(defs, "--gpu-architecture=sm_90a")
    nvcc = cuda_build.nvcc_args(defs, (9, 0))
    same = [o for o in nvrtc if o.startswith(("-D", "-std"))]
    assert same == [o for o in nvcc if o.startswith(("-D", "-std"))]
    assert "-DGDN_RW=2" in same and "-DGDN_L2NORM=1" in same and "-DGDN_B_DT=2" in same
    assert "-gencode=arch=compute_90a,code=sm_90a" in nvcc


def test_param_fields_mirror_the_c_struct():
    text = cuda_build.HEADER.read_text()
    body = re.search(r"struct GdnParams \{(.*?)\};", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            names += [n.strip().lstrip("*") for n in decl.split(None, 2)[-1].split(",")] \
                if decl.startswith("long long") else [decl.split()[-1].lstrip("*")]
    assert tuple(names) == cuda_build.PARAM_FIELDS
    assert cuda_build.PARAMS.size == 8 * len(names)


def _unpack(values):
    buf = bytearray(cuda_build.PARAMS.size)
    cuda_build.PARAMS.pack_into(buf, 0, *values)
    return dict(zip(cuda_build.PARAM_FIELDS, cuda_build.PARAMS.unpack(bytes(buf))))


def test_param_values_of_strided_views():
    x = make_inputs(B=3, T=2, H=2, HV=4, K=16, V=8)
    q = torch.zeros(3, 2, 5, 16)[:, :, 1:3]                 # a view: head stride 16, t stride 80
    out = torch.empty(3, 2, 4, 8)
    new_state = torch.empty(3, 4, 8, 16)
    vals = cuda_build.param_values(q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, 0.25,
                                   out, new_state)
    f = _unpack(vals)
    assert f["q"] == q.data_ptr() and f["new_state"] == new_state.data_ptr()
    assert (f["q_n"], f["q_t"], f["q_h"]) == q.stride()[:3] == (160, 80, 16)
    assert (f["s_n"], f["s_h"], f["s_v"]) == x.state.stride()[:3]
    assert (f["B"], f["T"], f["H"], f["HV"], f["V"]) == (3, 2, 2, 4, 8)
    assert f["scale"] == 0.25 and f["A_log_h"] == 1
    assert (f["idx"], f["new_idx"], f["P"], f["PN"], f["null_slot"]) == (0, 0, 0, 0, -1)
    # a pool: slot counts of both pools and null_slot; the index pointers are written per call
    pool = torch.zeros(7, 4 * 8 * 16 + 32)[:, :4 * 8 * 16].view(7, 4, 8, 16)
    dest = torch.zeros(5, 4, 8, 16)
    idx = torch.tensor([3, 0, 6], dtype=torch.int32)
    f = _unpack(cuda_build.param_values(q, x.k, x.v, pool, x.A_log, x.a, x.dt_bias, x.b, 0.25,
                                        out, dest, Pool(idx, idx, 0)))
    assert (f["idx"], f["new_idx"], f["P"], f["PN"], f["null_slot"]) == (0, 0, 7, 5, 0)
    assert (f["s_n"], f["s_h"], f["ns_n"]) == (4 * 8 * 16 + 32, 8 * 16, 4 * 8 * 16)
    assert (f["S"], f["i_n"], f["i_t"], f["inter"], f["accepted"]) == (0, 0, 0, 0, 0)
    # a verify call: the intermediate states' rows and strides (the pointers: per call)
    inter = types.SimpleNamespace(states=torch.empty(6, 3, 4, 8, 16, device="meta"))
    f = _unpack(cuda_build.param_values(q, x.k, x.v, pool, x.A_log, x.a, x.dt_bias, x.b, 0.25,
                                        out, dest, Pool(idx, idx, 0), inter))
    assert (f["S"], f["i_n"], f["i_t"], f["inter"]) == (6, 3 * 4 * 8 * 16, 4 * 8 * 16, 0)
    # the per-call pointers, one pack_into: the 15 pointers, nothing else
    assert cuda_build.HEAD.size == 8 * len(cuda_build.HEAD_FIELDS) == 8 * 15
    assert set(cuda_build.HEAD_FIELDS) == {"state", "idx", "accepted", "q", "k", "v", "a", "b",
                                           "A_log", "new_state", "out", "dt_bias", "inter_idx",
                                           "new_idx", "inter"}
    assert cuda_build.HEAD_OFFSET == 8 * cuda_build.PARAM_FIELDS.index("state")


def test_defines_and_arch_options():
    d = dict(cuda_build.defines(BF16, F16, F16, BF16, BF16, 64, True, rw=4, hv=8))
    assert d == dict(GDN_K=64, GDN_STATE_DT=1, GDN_IO_DT=2, GDN_A_DT=2, GDN_B_DT=1, GDN_DTB_DT=1,
                     GDN_L2NORM=1, GDN_RW=4, GDN_HV=8)
    assert cuda_build.arch_option((9, 0)) == ("--gpu-architecture=sm_90a", "cubin")
    assert cuda_build.arch_option((10, 0), {90, 100}) == ("--gpu-architecture=sm_100a", "cubin")
    assert cuda_build.arch_option((8, 9), {80, 89, 90}) == ("--gpu-architecture=sm_89", "cubin")
    assert cuda_build.arch_option((12, 5), {90, 100, 120}) == ("--gpu-architecture=compute_120", "ptx")


def test_dense_is_torch_contiguity_of_every_tensor():
    """cuda_build.dense gates the constant-stride kernels (cuda-v4 GDN_DENSE, fla-recurrent
    DENSE): any strided tensor turns it off; a size-1 dimension's stride does not."""
    x = make_inputs(B=1, T=1, H=2, HV=4, K=64, V=64, state_dtype=torch.float32, device="cpu", seed=0)
    out = torch.empty(1, 1, 4, 64, dtype=x.v.dtype)
    args = [x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, out, x.state]
    assert cuda_build.dense(*args)
    pool = torch.zeros(1, 8, 64, 64)
    for i, view in ((3, pool[:, ::2]), (9, pool[:, 1::2]), (0, x.q.transpose(2, 3)),
                    (4, torch.stack([x.A_log, x.A_log], -1)[:, 0])):
        assert not cuda_build.dense(*args[:i], view, *args[i + 1:]), i
    # B = T = 1: the batch and token strides of q are free (torch ignores size-1 dims)
    q1 = torch.empty(1, 1, 2, 64).as_strided((1, 1, 2, 64), (999, 777, 64, 1))
    assert cuda_build.dense(q1, *args[1:])


def test_cache_key_tracks_source_options_and_compiler(tmp_path, monkeypatch):
    base = cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 0), "cubin")
    assert base == cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 0), "cubin")
    assert base != cuda_build.cache_key("src2", ["-DGDN_K=128"], (13, 0), "cubin")
    assert base != cuda_build.cache_key("src", ["-DGDN_K=64"], (13, 0), "cubin")
    assert base != cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 1), "cubin")
    # every header a source may include (cuda_v4.cu's own besides gdn_common.cuh)
    assert {"gdn_common.cuh", "cuda_v4_lane.cuh", "cuda_v4_tokens.cuh"} <= {
        p.name for p in cuda_build.HEADER.parent.glob("*.cuh")}
    for name in ("gdn_common.cuh", "cuda_v4_lane.cuh"):
        (tmp_path / name).write_text((cuda_build.HEADER.parent / name).read_text())
    monkeypatch.setattr(cuda_build, "HEADER", tmp_path / "gdn_common.cuh")
    key = cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 0), "cubin")
    (tmp_path / "cuda_v4_lane.cuh").write_text("// changed\n")
    assert key != cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 0), "cubin")


_problem = make_problem         # the contest geometry on an sm_90 GPU


def test_supports_reasons():
    assert cuda_v1.supports(_problem()) == (True, "")
    assert cuda_v4.supports(_problem(state_dtype=BF16, B=512)) == (True, "")
    for mod, p, word in ((cuda_v1, _problem(device="cpu"), "CUDA"),
                         (cuda_v1, _problem(K=256, V=256), "K <= 128"),
                         (cuda_v1, _problem(V=512), "V <= 256"),
                         (cuda_v4, _problem(K=96, V=96), "K in"),
                         (cuda_v4, _problem(cc=(7, 5)), "8.0"),
                         (cuda_v4, _problem(B=2**28), "grid")):
        ok, why = mod.supports(p)
        assert not ok and word in why, (p.describe(), why)


H100 = "NVIDIA H100 80GB HBM3"


def _v4_row(slug, state, mode, tokens, B):
    """The normalized cuda-v4 config of one file's row set at batch B (no fallback)."""
    f = tables.launch_tables().files[slug]
    for r in f.row_sets("cuda-v4", state)[("cuda-v4", state, mode, tokens, ())]:
        if r.lo <= B and (r.hi is None or B <= r.hi):
            return cuda_v4.CONFIG.normalize(r.config)
    raise AssertionError("no row")


def test_v4_rows_are_valid_shapes():
    for f in tables.launch_tables().files.values():
        for r in f.rows:
            if r.backend != "cuda-v4":
                continue
            sd = {"fp32": F32, "bf16": BF16}[r.state]
            w, rw, lpr, hint, fast, *_ = cuda_v4.CONFIG.normalize(r.config)
            assert cuda_v4.valid_config(128, 128, sd, w, rw, lpr) == "", (f.slug, r)
            assert hint in (0, 1, 2, 3) and fast in (0, 1)
    assert cuda_v4.valid_config(128, 128, BF16, 1, 1, 32)          # 32 lanes x 8 > K
    assert cuda_v4.valid_config(128, 128, F32, 1, 17, 16)          # 17 groups of 2 rows > 32
    assert cuda_v4.valid_config(128, 128, F32, 16, 1, 32)          # too many warps
    assert cuda_v4.blocks_per_head(128, 4, 2, 32) == 16 and cuda_v4.blocks_per_head(100, 4, 2, 16) == 7



@pytest.fixture
def fake_gpu(monkeypatch):
    """Replace compiling and the driver call by recorders; the parameter block handed to the
    driver is decoded from the bytes actually passed."""
    compiled, launches = [], []

    def get_kernel(src, name, defs, dev):
        compiled.append((Path(src).name, name, dict(defs), dev))
        return ("kernel", len(compiled))

    monkeypatch.setattr(cuda_build, "get_kernel", get_kernel)
    monkeypatch.setattr(cuda_build, "launch_raw",
                        lambda func, grid, block, dev, argv, shared=0: launches.append(
                            (func, grid, block, dev, params_at(argv))))
    monkeypatch.setattr(cuda_v1, "_binds", {})
    monkeypatch.setattr(cuda_v4, "_binds", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H100 80GB HBM3")
    return compiled, launches


def _call(mod, x, l2=False, inplace=True, **kw):
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2:]
    out = torch.empty(B, T, HV, V, dtype=x.v.dtype)
    ns = x.state if inplace else torch.empty_like(x.state)
    validate(*x.args(), out=out, new_state=ns, use_qk_l2norm=l2)
    run(mod, *x.args()[:-1], x.scale, out, ns, l2, **kw)
    return out, ns


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "dest"])
def test_every_call_path_writes_the_pointers_by_name(fake_gpu, inplace):
    """The per-call pointers (HEAD_FIELDS) are packed positionally in three places: cuda-v4's
    tensor path, its warm path from gdnzoo.decode's pointers, and cuda-v1.  Each must put every
    pointer in its named field (decoded from the bytes the driver gets)."""
    _, launches = fake_gpu
    x = make_inputs(B=2, H=4, HV=8)
    out = torch.empty(2, 1, 8, 128, dtype=x.v.dtype)
    ns = x.state if inplace else torch.empty_like(x.state)
    want = dict(state=x.state, new_state=ns, q=x.q, k=x.k, v=x.v, a=x.a, b=x.b, A_log=x.A_log,
                dt_bias=x.dt_bias, out=out)
    want = {n: want[n].data_ptr() if n in want else 0 for n in cuda_build.HEAD_FIELDS}
    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, False)
    rec = record(*args)
    bound = cuda_v4.bind(rec)
    bound(rec)
    # gdnzoo.dispatch.DENSE_POINTERS order; new_state 0 in place
    ptrs = [t.data_ptr() for t in (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, out)]
    assert bound.with_pointers(ptrs + [0 if inplace else ns.data_ptr()], x.scale) is True
    run(cuda_v1, *args)
    assert len(launches) == 3
    for *_, f in launches:
        assert {n: f[n] for n in cuda_build.HEAD_FIELDS} == want


def test_v4_launch_marshalling(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=1, H=4, HV=8)
    _call(cuda_v4, x)
    y = make_inputs(B=1, H=4, HV=8, seed=1)
    _call(cuda_v4, y)                                          # same signature: one compile
    assert len(compiled) == 1 and len(launches) == 2
    src, name, defs, _ = compiled[0]
    assert (src, name) == ("cuda_v4.cu", "gdn_decode_v4")
    w, rw, lpr, hint, fast, chain, smem, qks, *_ = cuda_v4.table_config(H100, F32, 1, 4, 8, 128, 128)
    assert defs == dict(GDN_K=128, GDN_V=128, GDN_T=1, GDN_HV=8, GDN_GVA=2, GDN_STATE_DT=0,
                        GDN_IO_DT=1, GDN_A_DT=1, GDN_B_DT=1, GDN_DTB_DT=0, GDN_L2NORM=0,
                        GDN_W=w, GDN_RW=rw, GDN_LPR=lpr, GDN_VEC16=1, GDN_HINT=hint,
                        GDN_FASTGATE=fast, GDN_DENSE=1, GDN_CHAIN=chain, GDN_SMEM=smem,
                        GDN_QKS=qks, GDN_POOL=0)
    func, grid, block, _, f = launches[0]
    assert block == 32 * w and grid == 8 * cuda_v4.blocks_per_head(128, w, rw, lpr)
    assert f["state"] == f["new_state"] == x.state.data_ptr() and f["q"] == x.q.data_ptr()
    assert (f["s_n"], f["s_h"], f["s_v"]) == x.state.stride()[:3] and f["scale"] == x.scale
    assert (f["B"], f["T"], f["H"], f["HV"], f["V"]) == (1, 1, 4, 8, 128)
    g = launches[1][4]                                          # pointers patched, rest equal
    assert g["q"] == y.q.data_ptr() and g["state"] == y.state.data_ptr() != f["state"]
    fixed = [n for n in cuda_build.PARAM_FIELDS if n not in cuda_build.HEAD_FIELDS]
    assert {n: g[n] for n in fixed} == {n: f[n] for n in fixed}
    _, ns = _call(cuda_v4, x, inplace=False)                   # destination passing: its table
    assert launches[-1][4]["new_state"] == ns.data_ptr() != launches[-1][4]["state"]
    dw, drw, dlpr, dhint = cuda_v4.table_config(H100, F32, 1, 4, 8, 128, 128, inplace=False)[:4]
    assert launches[-1][2] == 32 * dw and launches[-1][1] == 8 * cuda_v4.blocks_per_head(
        128, dw, drw, dlpr) and compiled[-1][2]["GDN_HINT"] == dhint
    n = len(compiled)
    _call(cuda_v4, x, inplace=False)                           # same signature and mode
    assert len(compiled) == n
    _call(cuda_v4, x, l2=True)                                 # new variant
    assert len(compiled) == n + 1 and compiled[-1][2]["GDN_L2NORM"] == 1
    x2 = make_inputs(B=1, T=2, H=4, HV=8, K=128, V=128)        # T >= 2: its own table
    _call(cuda_v4, x2)
    mw, mrw, mlpr, mhint = cuda_v4.table_config(H100, F32, 1, 4, 8, 128, 128, T=2)[:4]
    assert (mw, mrw, mlpr, mhint) == _v4_row("h100", "fp32", "any", 2, 1)[:4]
    assert launches[-1][2] == 32 * mw and compiled[-1][2]["GDN_T"] == 2
    assert (compiled[-1][2]["GDN_RW"], compiled[-1][2]["GDN_LPR"]) == (mrw, mlpr)
    _call(cuda_v4, x, config=(2, 8, 16, 3))
    assert launches[-1][2] == 64 and launches[-1][1] == 8 * 4
    assert (compiled[-1][2]["GDN_LPR"], compiled[-1][2]["GDN_HINT"]) == (16, 3)
    with pytest.raises(ValueError, match="LPR"):
        _call(cuda_v4, x, config=(1, 1, 64, 0))


def test_v4_dense_flag_follows_the_strides(fake_gpu):
    compiled, _ = fake_gpu
    x = make_inputs(B=2, T=2, H=2, HV=4, K=64, V=64)
    _call(cuda_v4, x)
    assert compiled[-1][2]["GDN_DENSE"] == 1
    wide = torch.zeros(2, 2, 2, 2 * 64, dtype=x.q.dtype)      # q as a strided view: not dense
    wide[..., :64].copy_(x.q)
    x.q = wide[..., :64]
    _call(cuda_v4, x)
    d = compiled[-1][2]
    # strided: the call's strides compiled in (GDN_DENSE=2), each field its tensor's stride
    assert d["GDN_DENSE"] == 2
    assert [d[f"GDN_SC_q_{a}"] for a in "nth"] == list(x.q.stride()[:3]) == [512, 256, 128]
    assert [d[f"GDN_SC_k_{a}"] for a in "nth"] == list(x.k.stride()[:3])
    assert (d["GDN_SC_s_n"], d["GDN_SC_s_h"], d["GDN_SC_s_v"]) == x.state.stride()[:3]
    assert not any(n.startswith("GDN_SC_i_") for n in d)         # no verify: no i_n, i_t
    n = len(compiled)
    wide2 = torch.zeros(2, 2, 2, 3 * 64, dtype=x.q.dtype)      # another layout: its own variant
    wide2[..., :64].copy_(x.q)
    x.q = wide2[..., :64]
    _call(cuda_v4, x)
    assert len(compiled) == n + 1 and compiled[-1][2]["GDN_SC_q_n"] == 768


def test_contiguity_ignores_size_one_dims():
    # cuda-v4's GDN_DENSE relies on torch's contiguity: a size-1 dim may carry any stride.
    t = torch.zeros(1, 1, 4, 8)
    assert t.is_contiguous() and t.as_strided((1, 1, 4, 8), (999, 7, 8, 1)).is_contiguous()
    assert not torch.zeros(4, 8).t().is_contiguous()
    assert not torch.zeros(3, 4, 16)[:, :, :8].is_contiguous()


def test_bind_is_reused_and_keeps_no_tensors(fake_gpu):
    import gc
    import weakref
    compiled, launches = fake_gpu
    x = make_inputs(B=2, H=4, HV=8)
    out = torch.empty(2, 1, 8, 128, dtype=BF16)
    bound = cuda_v4.bind(record(*x.args(), out, x.state, False))
    assert cuda_v4.bind(record(*x.args(), out, x.state, False)) is bound
    ref = weakref.ref(x.state)
    bound(record(*x.args(), out, x.state, False))
    del x
    gc.collect()
    assert ref() is None                                       # the launcher holds no tensors
    assert len(compiled) == 1 and len(launches) == 1


def test_v4_falls_back_to_element_loads_when_misaligned(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=2, H=2, HV=4, K=128, V=32, state_dtype=BF16)
    _call(cuda_v4, x)
    assert compiled[-1][2]["GDN_VEC16"] == 1
    big = torch.zeros(2 * 4 * 32 * 128 + 1, dtype=BF16)
    big[1:].copy_(x.state.flatten())
    x.state = big[1:].view(2, 4, 32, 128)                    # 2-byte offset: not 16-byte aligned
    _call(cuda_v4, x)                                         # same signature, new pointer
    assert compiled[-1][2]["GDN_VEC16"] == 0 and compiled[-1][2]["GDN_LPR"] == 32
    w, rw = cuda_v4.table_config(H100, BF16, 2, 2, 4, 128, 32)[:2]
    assert launches[-1][1] == 8 * cuda_v4.blocks_per_head(32, w, rw, 32)   # one row per group
    assert launches[-1][4]["state"] == x.state.data_ptr()


def test_v4_qks_modes_fall_back_where_they_cannot_serve(fake_gpu):
    # QKS 2 splits q/k over the two rows of a lane pair: it needs 16-byte vectors and LPR <= 16;
    # elsewhere (and QKS 1 without 16-byte vectors) the variant reads q/k per lane (QKS 0).
    assert [cuda_v4.effective_qks(q, True, 16) for q in (0, 1, 2)] == [0, 1, 2]
    assert cuda_v4.effective_qks(2, True, 32) == 0 and cuda_v4.effective_qks(1, True, 32) == 1
    assert cuda_v4.effective_qks(2, False, 16) == 0 and cuda_v4.effective_qks(1, False, 4) == 0
    compiled, _ = fake_gpu
    x = make_inputs(B=2, H=2, HV=4, K=128, V=32, state_dtype=F32)
    _call(cuda_v4, x, config=(2, 2, 16, 0, 1, 0, 0, 2))
    assert compiled[-1][2]["GDN_QKS"] == 2
    _call(cuda_v4, x, config=(2, 1, 32, 0, 1, 0, 0, 2))
    assert compiled[-1][2]["GDN_QKS"] == 0


def test_v4_chunk_serves_t_above_1_with_16_byte_vectors(fake_gpu):
    # GDN_CHUNK stages q/k itself (q/k mode 0) and needs T > 1 and 16-byte vectors; elsewhere
    # the variant is the one without it (no GDN_CHUNK define: the same cache entry as before).
    # Chunk 2 (the Gram entries in registers) up to T = 4, chunk 1 above; a value outside
    # 0..2 is refused before anything compiles.  The tensor-core verify (kernel tc-verify,
    # tests/test_cuda_v4_tc.py) serves verify calls only: a plain decode of such a row gets
    # cuda_v4.cu with the row's other fields; an unknown kernel is refused too.
    compiled, _ = fake_gpu
    cfg = (2, 2, 16, 0, 1, 0, 0, 2, 1)
    for T, c, want in ((1, 1, None), (3, 1, 1), (cuda_v4.CHUNK_MAX_T + 1, 1, None), (1, 2, None),
                       (2, 2, 2), (cuda_v4.CHUNK_REG_MAX_T, 2, 2),
                       (cuda_v4.CHUNK_REG_MAX_T + 1, 2, 1)):
        x = make_inputs(B=2, T=T, H=2, HV=4, K=128, V=32, state_dtype=F32)
        _call(cuda_v4, x, config=cfg[:8] + (c,))
        d = compiled[-1][2]
        assert d.get("GDN_CHUNK") == want, (T, c, d)
        assert d["GDN_QKS"] == (0 if want else 2)
    x = make_inputs(B=2, T=3, H=2, HV=4, K=128, V=32, state_dtype=F32)
    _call(cuda_v4, x, config=cfg + (0, 0, "tc-verify"))
    assert compiled[-1][2]["GDN_CHUNK"] == 1 and compiled[-1][1] == cuda_v4.KERNEL
    n = len(compiled)
    with pytest.raises(ValueError, match="chunk=3 is not 0, 1 or 2"):
        _call(cuda_v4, x, config=cfg[:8] + (3,))
    with pytest.raises(ValueError, match="kernel='tc' is not one of decode, tc-verify"):
        _call(cuda_v4, x, config=cfg + (0, 0, "tc"))
    assert len(compiled) == n
    x = make_inputs(B=2, T=3, H=2, HV=4, K=128, V=32, state_dtype=F32)
    shifted = x.q.new_zeros(x.q.numel() + 1)[1:].view_as(x.q).copy_(x.q)     # 2 bytes off
    _call(cuda_v4, dataclasses.replace(x, q=shifted), config=cfg)
    assert compiled[-1][2]["GDN_VEC16"] == 0 and "GDN_CHUNK" not in compiled[-1][2]


def test_v4_ahead_serves_the_token_loop_in_registers(fake_gpu):
    # GDN_AHEAD: T > 1, state in registers, q/k not staged per block, not with the chunk (it
    # has its own staging); element loads keep it; 3 (every token's q/k first) up to T = 8,
    # 1 above.  Elsewhere no GDN_AHEAD define at all.
    compiled, _ = fake_gpu
    for T, cfg, want in ((3, (2, 2, 16, 0, 1, 0, 0, 2, 0, 1), 1),
                         (3, (2, 2, 32, 0, 1, 0, 0, 0, 0, 1), 1),
                         (2, (2, 2, 16, 0, 1, 0, 0, 2, 0, 2), 2),
                         (8, (2, 2, 16, 0, 1, 0, 0, 2, 0, 3), 3),
                         (9, (2, 2, 16, 0, 1, 0, 0, 2, 0, 3), 1),       # q/k of 8 tokens at most
                         (1, (2, 2, 16, 0, 1, 0, 0, 2, 0, 1), None),
                         (3, (2, 2, 16, 0, 1, 0, 0, 1, 0, 1), None),
                         (3, (2, 2, 16, 0, 1, 0, 0, 2, 1, 1), None),
                         (3, (2, 2, 16, 0, 1, 0, 0, 2), None)):
        x = make_inputs(B=2, T=T, H=2, HV=4, K=128, V=32, state_dtype=F32)
        _call(cuda_v4, x, config=cfg)
        assert compiled[-1][2].get("GDN_AHEAD") == want, (T, cfg, compiled[-1][2])
    x = make_inputs(B=2, T=3, H=2, HV=4, K=128, V=32, state_dtype=F32)
    shifted = x.q.new_zeros(x.q.numel() + 1)[1:].view_as(x.q).copy_(x.q)     # 2 bytes off
    _call(cuda_v4, dataclasses.replace(x, q=shifted), config=(2, 2, 16, 0, 1, 0, 0, 2, 0, 1))
    assert compiled[-1][2]["GDN_VEC16"] == 0 and compiled[-1][2]["GDN_AHEAD"] == 1
    n = len(compiled)
    with pytest.raises(ValueError, match="ahead=4 is not 0, 1, 2 or 3"):
        _call(cuda_v4, x, config=(2, 2, 16, 0, 1, 0, 0, 2, 0, 4))
    assert len(compiled) == n                                   # refused before any compile


def test_v4_head_scalars_serve_the_token_loop(fake_gpu):
    # GDN_HSC: T > 1 and the token loop with the state in registers (any ahead, any q/k mode,
    # element loads too); not with the chunk, not at T = 1.  Elsewhere no GDN_HSC define.
    compiled, _ = fake_gpu
    for T, cfg, want in ((3, (2, 2, 16, 0, 1, 0, 0, 2, 0, 3, 1), 1),
                         (3, (2, 2, 16, 0, 1, 0, 0, 1, 0, 0, 1), 1),
                         (8, (4, 1, 16, 0, 1, 0, 0, 2, 0, 2, 1), 1),
                         (1, (2, 2, 16, 0, 1, 0, 0, 2, 0, 0, 1), None),
                         (3, (2, 2, 16, 0, 1, 0, 0, 0, 1, 0, 1), None),
                         (3, (2, 2, 16, 0, 1, 0, 0, 2, 0, 3, 0), None)):
        x = make_inputs(B=2, T=T, H=2, HV=4, K=128, V=32, state_dtype=F32)
        _call(cuda_v4, x, config=cfg)
        assert compiled[-1][2].get("GDN_HSC") == want, (T, cfg, compiled[-1][2])
    x = make_inputs(B=2, T=3, H=2, HV=4, K=128, V=32, state_dtype=F32)
    shifted = x.q.new_zeros(x.q.numel() + 1)[1:].view_as(x.q).copy_(x.q)     # 2 bytes off
    _call(cuda_v4, dataclasses.replace(x, q=shifted), config=(2, 2, 16, 0, 1, 0, 0, 2, 0, 1, 1))
    assert compiled[-1][2]["GDN_VEC16"] == 0 and compiled[-1][2]["GDN_HSC"] == 1
    n = len(compiled)
    with pytest.raises(ValueError, match="head_scalars=2 is not 0 or 1"):
        _call(cuda_v4, x, config=(2, 2, 16, 0, 1, 0, 0, 2, 0, 1, 2))
    assert len(compiled) == n                                   # refused before any compile


def _page_pool(P, HV=8, V=128, K=128, dtype=F32, gap=32):
    """A pool [P, HV, V, K] whose slots are a page apart (a gap after each slot's block)."""
    return paged_pool(P, HV, V, K, dtype=dtype, gap=gap, fill="zeros").state


def _pool_call(x, pool_t, new_t, read, write=None, null_slot=None, l2=False, **kw):
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2:]
    out = torch.empty(B, T, HV, V, dtype=x.v.dtype)
    validate(x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale, out=out,
             new_state=new_t, use_qk_l2norm=l2, state_indices=read, new_state_indices=write,
             null_slot=null_slot)
    pool = Pool(read, read if write is None else write, -1 if null_slot is None else null_slot)
    run(cuda_v4, x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, new_t, l2,
                pool, **kw)
    return pool


def test_v4_pool_marshalling(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=3, H=4, HV=8)
    pool_t = _page_pool(10)
    read = torch.tensor([4, -1, 9], dtype=torch.int32)
    _pool_call(x, pool_t, pool_t, read, null_slot=0)
    defs = compiled[-1][2]
    assert (defs["GDN_POOL"], defs["GDN_IDX64"], defs["GDN_DENSE"]) == (1, 0, 1)
    w, rw, lpr = cuda_v4.table_config(H100, F32, 3, 4, 8, 128, 128, pool=True)[:3]
    assert (defs["GDN_W"], defs["GDN_RW"], defs["GDN_LPR"]) == (w, rw, lpr)
    _, grid, block, _, f = launches[-1]
    assert grid == 3 * 8 * cuda_v4.blocks_per_head(128, w, rw, lpr) and block == 32 * w
    assert f["idx"] == f["new_idx"] == read.data_ptr() and f["state"] == pool_t.data_ptr()
    assert (f["P"], f["PN"], f["null_slot"], f["s_n"]) == (10, 10, 0, pool_t.stride(0))
    # Same signature, new index tensor: no new variant, the new pointers in the block.
    read2 = torch.tensor([1, 2, 3], dtype=torch.int32)
    n = len(compiled)
    _pool_call(x, pool_t, pool_t, read2, null_slot=0)
    assert len(compiled) == n and launches[-1][4]["idx"] == read2.data_ptr() != f["idx"]
    fixed = [n for n in cuda_build.PARAM_FIELDS if n not in cuda_build.HEAD_FIELDS]
    assert {n: launches[-1][4][n] for n in fixed} == {n: f[n] for n in fixed}
    # Separate write indices (int64) into another pool: GDN_POOL 2, bit 1 of GDN_IDX64.
    dest = torch.zeros(6, 8, 128, 128)
    write = torch.tensor([5, 0, 2])
    _pool_call(x, pool_t, dest, read, write)
    defs, g = compiled[-1][2], launches[-1][4]
    assert (defs["GDN_POOL"], defs["GDN_IDX64"]) == (2, 2) and len(compiled) == n + 1
    assert (g["idx"], g["new_idx"], g["new_state"]) == (read.data_ptr(), write.data_ptr(),
                                                      dest.data_ptr())
    assert (g["P"], g["PN"], g["null_slot"], g["ns_n"]) == (10, 6, -1, 128 * 128 * 8)
    # int64 read indices; another null_slot is another launcher (it is in the parameter block).
    _pool_call(x, pool_t, pool_t, read.long(), null_slot=3)
    assert compiled[-1][2]["GDN_IDX64"] == 3 and launches[-1][4]["null_slot"] == 3
    # A strided q: not dense (the slot layout alone does not decide it).
    wide = torch.zeros(3, 1, 4, 256, dtype=x.q.dtype)
    x.q = wide[..., :128]
    _pool_call(x, pool_t, pool_t, read)
    defs = compiled[-1][2]
    # its strides compiled in, the pool's slot stride too (GDN_DENSE=2)
    assert defs["GDN_DENSE"] == 2 and defs["GDN_SC_q_n"] == 4 * 256
    assert (defs["GDN_SC_s_n"], defs["GDN_SC_ns_n"]) == (pool_t.stride(0),) * 2
    # Explicit configs reach pool variants too (staging, q/k sharing).
    _pool_call(x, pool_t, pool_t, read, config=(4, 4, 8, 2, 1, 0, 1, 2))
    assert (compiled[-1][2]["GDN_SMEM"], compiled[-1][2]["GDN_QKS"]) == (1, 2)


def test_v4_pool_and_dense_launchers_stay_apart(fake_gpu):
    x = make_inputs(B=2, H=4, HV=8)
    out = torch.empty(2, 1, 8, 128, dtype=BF16)
    pool_t = _page_pool(4)
    idx = torch.tensor([1, 3], dtype=torch.int32)
    pool = Pool(idx, idx, -1)
    dense = cuda_v4.bind(record(*x.args(), out, x.state, False))
    pooled = cuda_v4.bind(record(x.q, x.k, x.v, pool_t, x.A_log, x.a, x.dt_bias, x.b, x.scale,
                                 out, pool_t, False, pool))
    assert pooled is not dense
    assert callable(dense.with_pointers) and pooled.with_pointers is None    # dense only


def test_v4_supports_pool_problems():
    for B in (1, 64, 4096):
        assert cuda_v4.supports(_problem(B=B, pool=True)) == (True, "")
        assert cuda_v4.supports(_problem(B=B, pool=True, inplace=False)) == (True, "")
    ok, why = cuda_v4.supports(_problem(B=2**28, pool=True))
    assert not ok and "grid" in why


def test_v1_launch_marshalling(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=3, T=2, H=2, HV=6, K=64, V=40, state_dtype=BF16)
    _call(cuda_v1, x, l2=True)
    assert compiled[0][2]["GDN_K"] == 64 and compiled[0][2]["GDN_L2NORM"] == 1
    kern, grid, block, _, f = launches[0]
    assert grid == 3 * 6 and block == 64 and (f["T"], f["H"], f["HV"]) == (2, 2, 6)
    assert f["a"] == x.a.data_ptr() and f["b"] == x.b.data_ptr() and f["v"] == x.v.data_ptr()


def test_host_overhead_of_a_bound_call(fake_gpu):
    """Per-call Python work of a bound launcher (driver call stubbed): pointers only."""
    import time
    compiled, launches = fake_gpu
    x = make_inputs(B=1)
    out = torch.empty(1, 1, 8, 128, dtype=BF16)
    rec = record(*x.args(), out, x.state, False)
    bound = cuda_v4.bind(rec)
    launches.clear()
    t0 = time.perf_counter()
    for _ in range(200):
        bound(rec)
    per_call = (time.perf_counter() - t0) / 200
    assert len(launches) == 200 and per_call < 200e-6          # generous: shared CI machines


# ------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.skipif(cuda_missing() is not None, reason=f"needs a GPU and CuPy: {cuda_missing()}")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mod", [cuda_v1, cuda_v4], ids=["cuda-v1", "cuda-v4"])
@pytest.mark.parametrize("state_dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_graph_capture_and_replay_with_new_data(mod, state_dtype):
    from gdnzoo.reference import reference_outputs
    from tests.helpers import assert_matches
    x = make_inputs(B=4, T=2, state_dtype=state_dtype, device="cuda", seed=1)
    out = torch.empty(4, 2, 8, 128, dtype=BF16, device="cuda")
    ns = torch.empty_like(x.state)
    args = lambda: (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(mod, *args())                                   # compile and load before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(mod, *args())
    # The launcher's parameter buffer is rewritten by a later eager call with other tensors of
    # the same signature: the graph node must keep the values captured with it.
    z = make_inputs(B=4, T=2, state_dtype=state_dtype, device="cuda", seed=9)
    out_z, ns_z = torch.empty_like(out), torch.empty_like(ns)
    run(mod, z.q, z.k, z.v, z.state, z.A_log, z.a, z.dt_bias, z.b, z.scale, out_z, ns_z, True)
    for seed in (2, 3):
        y = make_inputs(B=4, T=2, state_dtype=state_dtype, device="cuda", seed=seed)
        # Every input tensor, A_log and dt_bias included: make_inputs draws them per seed too.
        for name in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"):
            getattr(x, name).copy_(getattr(y, name))
        out.fill_(float("nan"))
        ns.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ro, rs = reference_outputs(y, True)
        assert_matches(out, ns, ro, rs, state_dtype, f"{mod.__name__} graph replay seed {seed}")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mod", [cuda_v1, cuda_v4], ids=["cuda-v1", "cuda-v4"])
def test_strided_views(mod):
    from gdnzoo.reference import reference_outputs
    from tests.helpers import assert_matches
    x = make_inputs(B=3, T=2, state_dtype=F32, device="cuda", seed=4)
    ref_o, ref_s = reference_outputs(x, False)
    qkv = torch.zeros(3, 2, 4 + 4 + 8 + 1, 128, dtype=BF16, device="cuda")   # fused qkv buffer
    q, k, v = qkv[:, :, 0:4], qkv[:, :, 4:8], qkv[:, :, 8:16]
    q.copy_(x.q), k.copy_(x.k), v.copy_(x.v)
    pool = torch.zeros(5, 8, 128, 128, device="cuda")[1:4]                    # offset slab
    pool.copy_(x.state)
    ab = torch.zeros(3, 2, 2, 8, dtype=BF16, device="cuda")
    a, b = ab[:, :, 0], ab[:, :, 1]
    a.copy_(x.a), b.copy_(x.b)
    out = torch.full((3, 2, 8, 2, 128), float("nan"), dtype=BF16, device="cuda")[:, :, :, 1]
    validate(q, k, v, pool, x.A_log, a, x.dt_bias, b, x.scale, out=out, new_state=pool)
    run(mod, q, k, v, pool, x.A_log, a, x.dt_bias, b, x.scale, out, pool, False)
    torch.cuda.synchronize()
    assert_matches(out, pool, ref_o, ref_s, F32, f"{mod.__name__} strided views")


# (W, RW, LPR, HINT, FAST, CHAIN, SMEM, QKS, CHUNK, AHEAD, HSC) beyond the table: FMA chains,
# staging, shared q/k (one warp and eight; with staging), q/k split over a lane pair (in
# registers and staged), the tokens as one chunk (with chains and precise gates), the token loop
# a token ahead, the head's scalars from the block (with shared q/k, ahead, precise gates), each
# at T=1 and T=3 (staging serves T=1 only, the chunk, the loop ahead and the head's scalars
# T > 1: the host turns each off where it does not serve).
V4_EXPLICIT = [(4, 1, 4, 0, 1, 4), (2, 8, 8, 2, 1, 0, 1), (1, 2, 8, 2, 1, 0, 0, 1),
               (8, 2, 16, 3, 1, 0, 0, 1), (4, 4, 8, 2, 1, 0, 1, 1), (1, 2, 16, 0, 1, 0, 0, 2),
               (4, 4, 8, 2, 1, 0, 1, 2), (4, 1, 16, 3, 1, 0, 0, 0, 1),
               (1, 4, 8, 2, 0, 4, 0, 2, 1), (2, 2, 16, 3, 1, 0, 0, 2, 0, 1),
               (1, 2, 16, 3, 1, 0, 0, 2, 0, 2), (2, 1, 16, 3, 1, 0, 0, 2, 0, 3),
               (4, 2, 8, 2, 1, 0, 0, 1, 0, 0, 1), (2, 1, 16, 3, 0, 0, 0, 2, 0, 3, 1)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", V4_EXPLICIT, ids=str)
@pytest.mark.parametrize("state_dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 3])
def test_v4_explicit_configs(cfg, state_dtype, T):
    from gdnzoo.reference import reference_outputs
    from tests.helpers import assert_matches
    for seed, V, l2, inplace in ((1, 128, True, True), (2, 96, False, False)):   # 96: a tail
        x = make_inputs(B=3, T=T, H=4, HV=8, V=V, state_dtype=state_dtype, device="cuda",
                        seed=seed)
        ro, rs = reference_outputs(x, l2)
        out = torch.full((3, T, 8, V), float("nan"), dtype=BF16, device="cuda")
        state = x.state.clone()
        ns = state if inplace else torch.full_like(state, float("nan"))
        run(cuda_v4, x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, l2,
                    config=cfg)
        torch.cuda.synchronize()
        assert_matches(out, ns, ro, rs, state_dtype, f"cuda-v4 {cfg} T={T} V={V} l2={l2}")
        if not inplace:
            assert torch.equal(state, x.state), "destination passing modified state"


@pytest.mark.parametrize("sd", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [32, 64, 128, 256])
def test_v4_table_config_fits_every_head_dim(sd, K):
    # The rows are measured at K=128; every batch size must give a valid shape for each K.
    for B in (1, 4, 8, 16, 64, 512, 1 << 17):
        for inplace, T in ((True, 1), (False, 1), (True, 2), (True, 4), (True, 8)):
            for gpu in tables.launch_tables().every_gpu():
                w, rw, lpr, *_ = cuda_v4.table_config(gpu, sd, B, 4, 8, K, 128, inplace, T)
                assert cuda_v4.valid_config(K, 128, sd, w, rw, lpr) == "", (B, K, w, rw, lpr)


def test_v4_verify_candidates_hold_every_tokens_qk_up_to_8_tokens():
    # ahead 3 keeps T tokens' q and k in registers: a first-stage candidate up to T = 8 only,
    # beside ahead 1 and 2 for every register shape.
    def aheads(T):
        p = types.SimpleNamespace(K=128, V=128, state_dtype=F32, T=T, verify="states")
        return {cuda_v4.full_config(c)[9] for c in cuda_v4.candidates(p)}
    assert aheads(2) == aheads(8) == {0, 1, 2, 3}
    assert aheads(9) == {0, 1, 2}


def test_v4_verify_candidates_take_the_head_scalars_in_every_token_loop():
    # head_scalars 1 beside 0 for every token-loop candidate (each ahead), never with a chunk
    # (the tensor-core verify's fields are those of cuda_v4.cu for the calls it does not serve).
    p = types.SimpleNamespace(K=128, V=128, state_dtype=F32, T=4, verify="states")
    cands = [cuda_v4.full_config(c) for c in cuda_v4.candidates(p)]
    loop = lambda hs: {c[:10] for c in cands                                   # noqa: E731
                       if not c[8] and c[10] == hs and c[11] == "decode"}
    assert loop(1) == loop(0) and {c[9] for c in loop(1)} == {0, 1, 2, 3}
    assert all(c[10] == 0 for c in cands if c[8] in (1, 2))


def test_v4_verify_candidates_take_the_register_gram_up_to_4_tokens():
    # chunk 2 holds every Gram entry in each lane's registers: a first-stage candidate at
    # T = 2..4, chunk 1 up to CHUNK_MAX_T, for every register shape either; a verify search
    # also has the tensor-core verify (kernel tc-verify) up to T = 8.
    def chunks(T, verify="states"):
        p = types.SimpleNamespace(K=128, V=128, state_dtype=F32, T=T, verify=verify)
        cs = [cuda_v4.full_config(c) for c in cuda_v4.candidates(p)]
        return {c[8] for c in cs} | {c[11] for c in cs if c[11] != "decode"}
    assert chunks(2) == chunks(4) == {0, 1, 2, "tc-verify"} and chunks(3, "") == {0, 1, 2}
    assert chunks(5) == chunks(tc_verify.MAX_T) == {0, 1, "tc-verify"}
    assert chunks(cuda_v4.CHUNK_MAX_T) == {0, 1}
    assert chunks(cuda_v4.CHUNK_MAX_T + 1) == chunks(1, "") == {0}
    shapes = lambda T, c: {cuda_v4.full_config(x)[:3] for x in cuda_v4.candidates(      # noqa: E731
        types.SimpleNamespace(K=128, V=128, state_dtype=F32, T=T, verify="states"))
        if cuda_v4.full_config(x)[8] == c}
    assert shapes(4, 2) == shapes(4, 1) and len(shapes(4, 2)) > 10


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_gate_form_variants_compile_with_nvcc():
    """The precomputed gates (g fp32 where a goes, beta in any float dtype) and
    allow_neg_eigval, in cuda_v4.cu and the tensor-core verify."""
    _compile_all([
        (cuda_v4.SOURCE, F32, BF16, F32, BF16, F32, 128, True, dict(_v4(), gates=1)),
        (cuda_v4.SOURCE, BF16, BF16, F32, F32, F32, 128, False, dict(_v4(T=4, LPR=16), gates=1)),
        (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, dict(_v4(FAST=1), neg=1)),
    ])


def test_gate_forms_marshal_g_beta_and_zeros(fake_gpu):
    """A record with the precomputed gates launches the GDN_GATES variant with g and beta in
    a's and b's fields and zeros (fp32, one per head) in A_log's and dt_bias'; allow_neg_eigval
    the GDN_NEG variant; the raw call's variant has neither define."""
    from gdnzoo.reference import gates
    compiled, launches = fake_gpu
    x = make_inputs(B=2, H=4, HV=8)
    out = torch.empty(2, 1, 8, 128, dtype=x.v.dtype)
    g, beta = gates(x.A_log, x.a, x.dt_bias, x.b)
    lg = torch.log(g)
    rec = record(*x.args(), out, x.state, False)
    cuda_v4.run(rec._replace(A_log=None, a=None, dt_bias=None, b=None, g=lg, beta=beta))
    cuda_v4.run(rec._replace(allow_neg_eigval=True))
    cuda_v4.run(rec)
    defs = [c[2] for c in compiled]
    assert defs[0].get("GDN_GATES") == 1 and defs[0]["GDN_A_DT"] == 0 and "GDN_NEG" not in defs[0]
    assert defs[1].get("GDN_NEG") == 1 and "GDN_GATES" not in defs[1]
    assert "GDN_GATES" not in defs[2] and "GDN_NEG" not in defs[2]
    f = launches[0][-1]
    assert f["a"] == lg.data_ptr() and f["b"] == beta.data_ptr()
    zeros = cuda_v4._ZEROS[(lg.device, 8)]
    assert f["A_log"] == f["dt_bias"] == zeros.data_ptr() and not zeros.any()

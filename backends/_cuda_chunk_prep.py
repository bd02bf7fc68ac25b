"""cuda-chunk's prep kernel (``cuda_chunk_prep.cu``): compiled through CuPy's NVRTC like the
other CUDA backends (:mod:`gdnzoo.backends._cuda_build`), launched in place of triton-chunk's
Triton prep kernel into the same workspace.  One launch per call, one CTA of 128 threads per
(chunk slot, group of value heads sharing a k-head: :func:`pick_heads`).  Nothing here imports
cupy at module import time."""
from __future__ import annotations

import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build

SOURCE = Path(__file__).with_name("cuda_chunk_prep.cu")
NAME = "gdn_chunk_prep"
CHUNK = 64
HEAD_DIM = 128
PRECISIONS = ("bf16x3", "bf16")
# PrepParams: 10 pointers, 16 integers, the scale
PARAMS = struct.Struct("<10Q16qd")
# dynamic shared memory of PrepSmem: q and k tiles (their space reused for A/M and T in fp32),
# the stored rows' staging 128 columns a pass (its space the warps' scratch before), four [C]
# vectors and a total
SMEM = 2 * CHUNK * (HEAD_DIM + 8) * 2 + CHUNK * (2 * CHUNK + 8) * 2 + 4 * CHUNK * 4 + 16
# CTAs resident an SM on Hopper: 3 at the kernel's own ~147 registers, 4 when they are capped
# at 128 (GDN_MIN_CTAS 4; a few spills).  The cap pays past one wave of uncapped CTAs; within
# it only the spills show.  The prep alone on an H200 at 3 -> 4 CTAs an SM, "bf16" / "bf16x3"
# (lab/notebook/h200/prep_occupancy_2026-11-29.log): 4/8 heads 1 x 8192 tokens 37.6 -> 33.1 /
# 44.1 -> 38.5 us, 16/32 8 x 1024 149.5 -> 125.9 / 169.2 -> 138.6, 16/64 8 x 1024 272.5 ->
# 222.7 / 289.1 -> 249.8; 4/8 16 x 256 (one wave of 320 CTAs) 19.6 -> 27.0 / 21.3 -> 29.3.
CTAS_PER_SM = 3
CTAS_PER_SM_CAPPED = 4
MAX_HEADS = 4
GROUP_WAVES = 4


def serves(K: int, io_dtype, precision: str, chunk: int):
    """(ok, reason): what the kernel is written for."""
    if K != HEAD_DIM:
        return False, f"its prep kernel is written for K = {HEAD_DIM}, got K={K}"
    if io_dtype != torch.bfloat16:
        return False, f"its prep kernel reads q and k as bfloat16, got {io_dtype}"
    if precision not in PRECISIONS:
        return False, f"its prep kernel stores the workspace of {PRECISIONS}, got {precision!r}"
    if chunk != CHUNK:
        return False, f"its prep kernel is written for chunk={CHUNK}, got {chunk}"
    return True, ""


def pick_heads(gva: int, ctas: int, n_sm: int) -> int:
    """Value heads a CTA (GDN_HEADS) for ``ctas`` CTAs at one head each and GVA = HV / H.  A
    group shares the loads of q and k, their norms and k k^T, q k^T, but runs its heads one
    after the other: one head a CTA up to :data:`GROUP_WAVES` waves of capped CTAs, then a
    group of 3 or 4 where GVA has one.  On an H200 (us, the prep alone, "bf16",
    lab/notebook/h200/prep_occupancy_2026-11-29.log, at 1 / 2 / 3 or 4 heads a CTA): 4/8
    16x256 (1.2 waves) 19.1 / 23.3; 4/8 4x512 14.8 / 19.0; 16/64 2x512 (2.2 waves) 34.7 /
    32.8 / 41.2; 16/32 8x1024 125.9 / 129.4; 16/64 16x256 (9.7 waves) 126.5 / 123.7 / 115.9;
    16/48 8x1024 (12 waves) 182.6 / - / 178.0; 16/64 8x1024 239.8 / 241.4 / 222.7."""
    if ctas <= GROUP_WAVES * CTAS_PER_SM_CAPPED * n_sm:
        return 1
    return max((d for d in range(3, MAX_HEADS + 1) if gva % d == 0), default=1)


def min_ctas(grid: int, n_sm: int) -> int:
    """GDN_MIN_CTAS for a grid of ``grid`` CTAs: the register cap only past one wave of
    uncapped CTAs."""
    return CTAS_PER_SM_CAPPED if grid > CTAS_PER_SM * n_sm else CTAS_PER_SM


def launch(*args, **kw):
    """The prep kernel into the workspace (mats, vecs), with the arguments of triton-chunk's
    ``launch_prep`` (``c`` a resolved Config whose precision and chunk :func:`serves` takes);
    ``heads``: value heads a CTA (None: :func:`pick_heads`)."""
    launcher(*args, **kw)()


def launcher(q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, scale, l2, gates, c, *,
             neg=False, pdl=False, heads=None, flags=None, trigger=False):
    """:func:`launch`'s launch, its kernel compiled and loaded first (a :class:`Prep`).
    ``flags`` (int32, :func:`backends._cuda_chunk_chain.flags_for`): launched beside the
    chain kernel just launched, as its programmatic dependent, setting a flag per chunk slot and
    value head; the chain kernel waits for them, so nothing may compile between the two.
    ``trigger``: each CTA lets the kernel after it (the CUDA chain, launched as its programmatic
    dependent) launch once it starts (compiled with GDN_PDL; launched as a dependent itself only
    with ``pdl``)."""
    prep = Prep(q, k, ga, gb, A_log, dt_bias, cu_seqlens, scale, l2, gates, c, neg=neg, pdl=pdl,
                heads=heads, flags=flags is not None, trigger=trigger)
    return lambda: prep(q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, flags)


# the pointers of PrepParams, written per call
POINTERS = struct.Struct("<10Q")


class Prep:
    """The prep kernel's launch for one call signature (shapes, strides, dtypes, scale and
    form; :func:`launcher`'s arguments without the data): a :class:`cuda_build.Launch` whose
    kernel, grid and parameter block's integers are made once; a call writes the ten pointers
    and launches."""

    __slots__ = ("launch",)

    def __init__(self, q, k, ga, gb, A_log, dt_bias, cu_seqlens, scale, l2, gates, c, *,
                 neg=False, pdl=False, heads=None, flags=False, trigger=False):
        T, H, K = q.shape
        HV, N = ga.shape[1], cu_seqlens.shape[0] - 1
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        slots = T // CHUNK + N
        n_sm = cuda_build.sm_count(dev)
        if heads is None:
            heads = pick_heads(HV // H, slots * HV, n_sm)
        grid = slots * (HV // heads)
        code = cuda_build.DTYPE_CODE
        defs = tuple(sorted(dict(
            GDN_GATES=int(gates), GDN_A_DT=code[ga.dtype], GDN_B_DT=code[gb.dtype],
            GDN_ALOG_DT=code[A_log.dtype], GDN_DTB_DT=code[dt_bias.dtype], GDN_NEG=int(bool(neg)),
            GDN_PDL=int(bool(pdl or trigger)), GDN_STORE3=int(c.precision == "bf16x3"),
            GDN_HEADS=heads, GDN_MIN_CTAS=min_ctas(grid, n_sm),
            GDN_FLAGS=int(bool(flags))).items()))
        # the pointers zero here (written per call); the grid and T change with every prompt
        template = PARAMS.pack(
            *(0,) * 10, N, T, q.stride(0), q.stride(1), k.stride(0), k.stride(1), ga.stride(0),
            ga.stride(1), gb.stride(0), gb.stride(1), A_log.stride(0) if A_log.dim() else 0,
            dt_bias.stride(0) if dt_bias.dim() else 0, H, HV, int(bool(l2)),
            int(cu_seqlens.dtype == torch.int64), float(scale))
        self.launch = cuda_build.Launch(
            cuda_build.get_kernel(SOURCE, NAME, defs, dev, SMEM), grid, 128, dev,
            template=template, head=POINTERS, shared=SMEM, pdl=bool(pdl or flags))

    def __call__(self, q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, flags=None):
        self.launch((q.data_ptr(), k.data_ptr(), ga.data_ptr(), gb.data_ptr(), A_log.data_ptr(),
                     dt_bias.data_ptr(), cu_seqlens.data_ptr(), mats.data_ptr(),
                     vecs.data_ptr(), 0 if flags is None else flags.data_ptr()))

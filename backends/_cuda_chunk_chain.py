"""cuda-chunk's sequential kernel (``cuda_chunk_chain.cu``): launched in place of triton-chunk's
``chunk_state_kernel`` on the same workspace, with its arguments.  One CTA per (sequence, value
head, tile of 16 or 32 state rows: ``block_v``), 128 threads per 16 rows.  Nothing here imports
cupy at module import time."""
from __future__ import annotations

import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _triton_launch as tlaunch

SOURCE = Path(__file__).with_name("cuda_chunk_chain.cu")
NAME = "gdn_chunk_chain"
CHUNK = 64
HEAD_DIM = 128
BLOCK_V = (16, 32)
PRECISIONS = ("bf16x3", "bf16")
STAGES = 2
# ChainParams: 13 pointers, 32 integers
PARAMS = struct.Struct("<13Q32q")
STATE_DTYPES = (torch.float32, torch.bfloat16)


def smem_bytes(block_v: int, precision: str, stages: int = STAGES) -> int:
    """sizeof(ChainSmem): ``stages`` chunk buffers (k, q, workspace rows, v, four factor rows
    and e^G_last) and the three exchanged tiles (state, R, V'), 16-bit (hi and lo parts with
    "bf16x3"), every row padded by 8 elements, and a checkpoint row counter."""
    np_ = 2 if precision == "bf16x3" else 1
    stage = 2 * CHUNK * (HEAD_DIM + 8) * 2 + CHUNK * (2 * np_ * CHUNK + 8) * 2 \
        + CHUNK * (block_v + 8) * 2 + 4 * CHUNK * 4 + 16
    tiles = np_ * block_v * ((HEAD_DIM + 8) + 2 * (CHUNK + 8)) * 2
    return -(-(stages * stage + tiles + 8) // 16) * 16


def serves(K: int, V: int, io_dtype, precision: str, chunk: int, block_v: int):
    """(ok, reason): what the kernel is written for."""
    if K != HEAD_DIM:
        return False, f"its sequential kernel is written for K = {HEAD_DIM}, got K={K}"
    if io_dtype != torch.bfloat16:
        return False, f"its sequential kernel reads q, k, v as bfloat16, got {io_dtype}"
    if precision not in PRECISIONS:
        return False, f"its sequential kernel takes the workspace of {PRECISIONS}, got " \
                      f"{precision!r}"
    if chunk != CHUNK:
        return False, f"its sequential kernel is written for chunk={CHUNK}, got {chunk}"
    if block_v not in BLOCK_V or V % block_v:
        return False, f"its sequential kernel takes tiles of {BLOCK_V} state rows dividing " \
                      f"V={V}, got block_v={block_v}"
    return True, ""


def launch(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, c, *, pool, idx, new_idx,
           init, src, ss, has_init, null_slot=-1, checkpoints=None, checkpoint_every=None,
           k_first=False, pdl=False):
    """The sequential kernel, with triton-chunk's ``launch_state`` arguments as its
    ``_read_slots`` resolved them (``c`` a resolved Config :func:`serves` takes)."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu_seqlens.shape[0] - 1
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    code = cuda_build.DTYPE_CODE
    rg = c.block_v // 16
    smem = smem_bytes(c.block_v, c.precision, STAGES)
    ckpt = new_state if checkpoints is None else checkpoints
    defs = tuple(sorted(dict(
        GDN_RG=rg, GDN_STAGES=STAGES, GDN_STORE3=int(c.precision == "bf16x3"), GDN_POOL=pool,
        GDN_STATE0=int(state is not None), GDN_HAS_INIT=int(has_init),
        GDN_CKPT=int(checkpoints is not None), GDN_PDL=int(bool(pdl)),
        GDN_S_DT=code[src.dtype], GDN_NS_DT=code[new_state.dtype], GDN_C_DT=code[ckpt.dtype],
        GDN_SMEM=smem).items()))
    func = cuda_build.sized_kernel(SOURCE, NAME, defs, dev, smem).func
    params = PARAMS.pack(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), cu_seqlens.data_ptr(), mats.data_ptr(),
        vecs.data_ptr(), out.data_ptr(), src.data_ptr(), new_state.data_ptr(), idx.data_ptr(),
        new_idx.data_ptr(), init.data_ptr(), ckpt.data_ptr(),
        N, T, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), *ss, *tlaunch.state_strides(new_state, k_first),
        *tlaunch.state_strides(ckpt, k_first), src.shape[0], new_state.shape[0],
        int(null_slot), int(checkpoint_every or 1), H, HV, V,
        int(cu_seqlens.dtype == torch.int64), int(idx.dtype == torch.int64),
        int(new_idx.dtype == torch.int64))
    cuda_build.launch_block(func, N * HV * (V // c.block_v), 128 * rg, dev, params, smem, pdl)

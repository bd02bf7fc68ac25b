"""cuda-chunk-bf16's sequential kernel (``cuda_chunk_chain.cu``): the chain of chunk-to-chunk
state updates with "bf16" products on Hopper's warpgroup MMAs, its inputs copied by TMA.  It
reads the workspace the prep kernel wrote (triton-chunk's layout) and takes triton-chunk's
``launch_state`` arguments, so every state form (pools, padding, ``has_initial_state``, K-first,
bf16 states, checkpoints, PDL) is triton-chunk's; outputs and states were bit-identical to
triton-chunk's "bf16" sequential kernel in every form measured on an H200
(lab/notebook/h200/wgmma_chain_2026-11-29/).  Compiled through CuPy's NVRTC for sm_90a only.

One CTA per (sequence, value head, 64 state rows; several sequences taken longest first), in
two forms: up to two waves of CTAs, 288 threads (a producer warp for the TMA copies, the chain
warpgroup with the state in wgmma accumulators, the outputs warpgroup a chunk behind) in 185 KB
of shared memory, one CTA an SM; past two waves, "solo": one warpgroup of 128 threads for the
chain and the outputs in 109 KB, two CTAs an SM (:func:`pick_solo`).  One sequence whose 185 KB
chain leaves half the SMs idle runs the prep kernel beside it on those SMs, chunk by chunk
(:func:`pick_overlap`).  Calls TMA cannot address (a zero-token batch, a base or a stride of q,
k, v or out not a multiple of 16 bytes) run triton-chunk's sequential kernel with
the same products.

With ``x3`` (precision "bf16x3", cuda-chunk's, on the workspace the prep writes with it) the
solo form takes every product in three bf16 passes as triton-chunk's "bf16x3" kernel does (its
errors against float64, not its bits): 133 KB, one CTA an SM (:data:`X3_SMEM`,
:func:`pick_x3`); cut into segments, its outputs and Phi go to fp32 buffers, and a segmented
grid past one wave runs "paired" in 109 KB, two CTAs an SM (:func:`pick_pair`)."""
from __future__ import annotations

import struct
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _tma
from gdnzoo.backends import _triton_launch as tlaunch

SOURCE = Path(__file__).with_name("cuda_chunk_chain.cu")
NAME = "gdn_wgmma_chain"
CC = (9, 0)                      # wgmma and the sm_90a target
ROWS, CHUNK, HEAD_DIM = 64, 64, 128
THREADS = 288
# after the six tensor maps: 11 pointers, then 23 integers; the block is padded to 64 bytes
PARAMS = struct.Struct("<11Q23q")
# a stage: k and q [64, 128], the workspace rows of T^T and M^T and v [64, 64] (bf16), four
# [C] factors and the last gate, rounded up to 1 KB
STAGE = -(-(2 * CHUNK * HEAD_DIM * 2 + 3 * CHUNK * CHUNK * 2 + 4 * CHUNK * 4 + 16) // 1024) * 1024
# two stages, two handover buffers (S0 and R in bf16), two output buffers, the barriers
SMEM = 2 * STAGE + 2 * (ROWS * HEAD_DIM + ROWS * CHUNK) * 2 + 2 * CHUNK * 64 * 2 + 1024
# the "solo" form (GDN_SOLO): one warpgroup for the chain and the outputs, two CTAs an SM; two
# stages of the chain's inputs (k, the T^T rows, v, the factors), one of the outputs' (q, the M^T
# rows), two output buffers, the barriers
SOLO_THREADS = 128
CSTAGE = -(-(CHUNK * HEAD_DIM * 2 + 2 * CHUNK * CHUNK * 2 + 4 * CHUNK * 4 + 16) // 1024) * 1024
SOLO_SMEM = 2 * CSTAGE + CHUNK * HEAD_DIM * 2 + CHUNK * CHUNK * 2 + 2 * CHUNK * 64 * 2 + 1024
# "bf16x3" (GDN_X3): the solo form with the T^T and M^T rows' lo parts in tiles of their own
X3_CSTAGE = CSTAGE + CHUNK * CHUNK * 2
X3_SMEM = 2 * X3_CSTAGE + CHUNK * HEAD_DIM * 2 + 2 * CHUNK * CHUNK * 2 + 2 * CHUNK * 64 * 2 + 1024
# paired (GDN_X3_PAIR, segmented grids past one wave): T^T's lo rows in one tile beside q and
# M^T (not one in each stage), no output buffers (the fp32 outputs are stored plainly): 109 KB,
# two CTAs an SM
X3_PAIR_SMEM = 2 * CSTAGE + CHUNK * HEAD_DIM * 2 + 3 * CHUNK * CHUNK * 2 + 1024


def pick_solo(grid: int, n_sm: int) -> bool:
    """Whether a grid of ``grid`` CTAs runs the "solo" form (two CTAs an SM): past two waves of
    the 185 KB form.  The chain alone on an H200, us, 185 KB / solo
    (lab/notebook/h200/chain_solo_2026-11-30/, same outputs and states bit for bit): 16/32 heads
    8 x 1024 tokens (512 CTAs) 121.6 / 104.0, 16/32 16 x 256 91.6 / 83.1, 16/64 8 x 1024 234.6 /
    193.7, 16/48 64 x 64 296.7 / 246.0; within one wave the single CTA an SM is faster: 4/8 8 x
    1024 (128 CTAs) 32.3 / 36.2, 16/32 1 x 8192 (64) 188.3 / 223.3.  Between one and two waves
    the 185 KB form's second wave holds the shortest sequences (the kernel takes them longest
    first), where the solo form would double up SMs under long ones: whole calls, 4/8 heads
    the bench's ragged mix (160 CTAs) 166.5 us solo against 146.0, 16 x 256 (256 CTAs, all
    alike) 45.1 against 46.0 (lab/notebook/h200/chain_order_2026-11-30/)."""
    return grid > 2 * n_sm


def pick_form(grid: int, n_sm: int, segmented: bool) -> bool:
    """Whether to run the solo form: :func:`pick_solo`, which a segmented grid asks as if twice
    as large (its chains alike: past one wave of the 185 KB form a second wave would double the
    chain's time, where the solo form's one wave of two CTAs an SM takes ~1.9x)."""
    return pick_solo(2 * grid if segmented else grid, n_sm)


def pick_pair(grid: int, n_sm: int) -> bool:
    """Whether the segmented x3 chain runs "paired" (GDN_X3_PAIR: 109 KB, two CTAs an SM): a
    grid past one wave of one CTA an SM.  Within one wave the unpaired form is faster (its T^T lo
    rows two chunks ahead in both stages): whole calls on an H200, us, unpaired / paired, 4/8
    heads 1 x 8192 tokens in 4 segments (112 CTAs) 209.5 / 223.8, 1 x 32768 757.3 / 814.5; past
    one wave the paired form's single wave wins: 8 segments (240 CTAs) 231.2 / 203.1 and 789.6 /
    668.7; 8/16 heads 1 x 8192 in 4 segments (224 CTAs) 398.2 / 348.2
    (lab/notebook/h200/x3_seg2_2026-12-01/)."""
    return grid > n_sm


def x3_form(seg: int, grid: int, n_sm: int):
    """The x3 chain's compile switches and shared memory for ``seg`` segments (0: none) on a
    grid of ``grid`` CTAs: paired (:func:`pick_pair`) or not."""
    if seg and pick_pair(grid, n_sm):
        return {"GDN_X3": 1, "GDN_X3_PAIR": 1}, X3_PAIR_SMEM
    return {"GDN_X3": 1}, X3_SMEM


def pick_overlap(grid: int, n_sm: int, sequences: int) -> bool:
    """Whether the prep kernel runs beside a chain of ``grid`` CTAs of the 185 KB form (one an
    SM) instead of before it: one sequence whose chain leaves at least half the SMs to the
    prep.  The prep then starts as soon as every chain CTA is resident, and a chain CTA waits per
    chunk for the prep's flag (``cuda_chunk_chain.cu``, GDN_OVERLAP).  A whole call on an H200,
    us, prep first / beside (lab/notebook/h200/prep_beside_2026-11-30/, outputs and states bit
    for bit the same): 16/32 heads 1 x 8192 tokens (64 CTAs) 312.4 / 273.1, 1 x 32768 1180 /
    1045, 1 x 2048 88.4 / 84.2, 12/24 1 x 8192 283.1 / 259.9; slower where the prep's chunk
    order (a sequence's after another's) leaves later sequences' chains waiting: 8/16 2 x 4096
    164.6 / 202.5, 4/8 4 x 2048 87.9 / 114.2; and where the prep has fewer SMs than half: 16/48
    1 x 8192 (96 CTAs) 371 / 612."""
    return sequences == 1 and 0 < grid <= n_sm // 2


def pick_x3(N: int, HV: int, V: int, tokens: int, n_sm: int) -> bool:
    """Whether cuda-chunk's "bf16x3" chain runs on warpgroup MMAs (``x3``: one CTA an SM, 64
    state rows a CTA) instead of triton-chunk's Triton chain: where the Triton chain's tiles of
    16 rows would not fit one wave of SMs (it then runs 32-row tiles, whose steps take longer)
    and the sequences hold two chunks or more on average (one-chunk sequences: many short CTAs,
    one an SM).  Whole calls on an H200 after the CUDA prep, us, Triton chain / x3 chain
    (lab/notebook/h200/chain_split_prec_2026-12-01/x3_rule.log, the same errors against float64,
    ~4e-6 on the state): 16/32 heads 1 x 8192 585 / 473, 8 x 1024 473 / 329, 16 x 256 264 /
    222; 16/64 8 x 1024 892 / 623; 16/48 1 x 8192 826 / 530; 4/8 8 x 1024 124 / 90, 16 x 256 70
    / 56, the bench's ragged mix 357 / 228; 2/8 8 x 1024 122 / 88; 8/16 2 x 4096 299 / 244;
    where it does not run: 4/8 1 x 8192 (16-row tiles, one wave) 300 / 390, 4/8 64 x 64 96 /
    107, 16/32 64 x 64 341 / 390."""
    return N * HV * (V // 16) > n_sm and tokens >= 2 * CHUNK * N


def flags_for(mats: torch.Tensor, T: int, HV: int, N: int):
    """The overlap's int32 flags (``(T // CHUNK + N) * HV`` and a count) in the "bf16"
    workspace's unused half of ``mats`` (bf16 rows, ``[T, HV, 2 C]`` used of ``2 T HV 2 C``),
    or None when they do not fit."""
    words = mats.view(torch.int32)
    used = T * HV * CHUNK
    if words.numel() - used < (T // CHUNK + N) * HV + 1:
        return None
    return words[used:]


# segments a sequence at most (triton_chunk.pick_segments): 4 at 4/8 heads fill 112 of 132 SMs
# with the 185 KB form; where that cuts, up to 8 while each keeps 64 chunks, in the solo form
# past one wave (triton_chunk.pick_cuda_segments, pick_form)
MAX_SEGMENTS = 4
MAX_SOLO_SEGMENTS = 8


def serves(cc, K: int, V: int, io_dtype, precision: str, chunk: int):
    """(ok, reason): what the kernel is written for (``cc`` None: not checked)."""
    if cc is not None and tuple(cc) != CC:
        return False, (f"its sequential kernel uses Hopper's warpgroup MMAs (sm_90a): needs "
                       f"compute capability 9.0, got {tuple(cc)}")
    if K != HEAD_DIM:
        return False, f"its sequential kernel is written for K = {HEAD_DIM}, got K={K}"
    if V % ROWS:
        return False, f"its sequential kernel takes the state in {ROWS}-row tiles: V % {ROWS} " \
                      f"must be 0, got V={V}"
    if io_dtype != torch.bfloat16:
        return False, f"its sequential kernel reads q, k and v as bfloat16, got {io_dtype}"
    if precision not in ("bf16", "bf16x3"):
        return False, f"its sequential kernel has 'bf16' and 'bf16x3' products only, got " \
                      f"{precision!r}"
    if chunk != CHUNK:
        return False, f"its sequential kernel is written for chunk={CHUNK}, got {chunk}"
    return True, ""


def tensor_maps(q, k, v, mats, out, w, parts: int = 1) -> bytes:
    """The six tensor maps: k and q [T, H, K], the workspace rows [T, HV, 2 parts C] (``parts``
    2: "bf16x3"'s hi and lo), v, ``out`` and ``w`` [T, HV, V]; boxes of [64 tokens, 1 head, 64
    columns]."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    box = (64, 1, 64)

    def tmap(t, inner, heads):
        return _tma.tensor_map(t.data_ptr(), (inner, heads, t.shape[0]),
                               (t.stride(1) * 2, t.stride(0) * 2), box)
    row = 2 * parts * CHUNK
    rows = _tma.tensor_map(mats.data_ptr(), (row, HV, T), (row * 2, HV * row * 2), box)
    return b"".join((tmap(k, K, H), tmap(q, K, H), rows, tmap(v, V, HV), tmap(out, V, HV),
                     tmap(w, V, HV)))


def launch(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, *, state_indices=None,
           new_state_indices=None, null_slot=-1, has_initial_state=None, k_first=False,
           checkpoints=None, checkpoint_every=None, pdl=False, no_out=False, segments=0,
           seg_w=None, seg_phi=None, solo=None, flags=None, after_prep=False, x3=False):
    """The chain kernel on the workspace (mats: bf16 rows, vecs: the factors) with the
    arguments of triton-chunk's ``launch_state``.  Needs T >= 1 and q, k, v, out that TMA
    can address (:func:`_cuda_build.aligned16`).  ``no_out``: timing only (the outputs
    warpgroup computes nothing).  ``segments`` S > 1: the chains of triton-chunk's segmented
    form (:mod:`backends._triton_chunk_cp`'s cp_chain_kernel: S segments from the state or
    zeros, S - 1 identity chains, K == V): the segments' outputs into ``out`` (bf16; segment
    0's final, the others' before the output pass adds to them), the identity chains' into
    ``seg_w`` (bf16 [T, HV, V]); the final tiles Z into ``new_state`` (fp32 [N, S, HV, V, K])
    and Phi into ``seg_phi`` (bf16 or fp32, that shape); with ``x3`` ``out`` and ``seg_w`` are
    fp32 [T, HV, V] buffers of the segments' outputs (the output pass adds to all of them) and
    Phi is fp32; no checkpoints, no PDL; the pool
    arguments then only say where segment 0's state is read.  ``solo``: the one-warpgroup form
    (None: :func:`pick_solo`).  ``flags`` (:func:`flags_for`; one segment, the 185 KB form):
    the prep kernel is launched next, beside this one (:func:`pick_overlap`).  ``after_prep``:
    launched right after the CUDA prep kernel (launched with ``trigger``) as its programmatic
    dependent, its CTAs starting where the prep's last ones leave SMs free; only its copies of
    the workspace wait for the prep (GDN_PDL 2; also with segments).  ``x3``: "bf16x3" products
    on that precision's workspace (the solo form, no flags)."""
    Chain(q, k, v, cu_seqlens, mats, out, state, new_state, state_indices=state_indices,
          new_state_indices=new_state_indices, null_slot=null_slot,
          has_initial_state=has_initial_state, k_first=k_first, checkpoints=checkpoints,
          checkpoint_every=checkpoint_every, pdl=pdl, no_out=no_out, segments=segments,
          seg_w=seg_w, seg_phi=seg_phi, solo=solo, flags=flags is not None,
          after_prep=after_prep, x3=x3)(
        q, k, v, cu_seqlens, mats, vecs, out, state, new_state, state_indices,
        new_state_indices, has_initial_state, checkpoints, seg_w, seg_phi, flags)


# the parameter block's head, written per call: the six tensor maps, then the 11 pointers
HEAD = struct.Struct("<768s11Q")


class Chain:
    """The chain kernel's launch for one call signature (shapes, strides, dtypes and form:
    :func:`launch`'s arguments, ``flags`` a bool): a :class:`cuda_build.Launch` whose kernel,
    grid and parameter block's integers are made once; a call makes (or finds) the tensor maps,
    writes them and the pointers, and launches."""

    __slots__ = ("launch", "parts", "segmented")

    def __init__(self, q, k, v, cu_seqlens, mats, out, state, new_state, *, state_indices=None,
                 new_state_indices=None, null_slot=-1, has_initial_state=None, k_first=False,
                 checkpoints=None, checkpoint_every=None, pdl=False, no_out=False, segments=0,
                 seg_w=None, seg_phi=None, solo=None, flags=False, after_prep=False, x3=False):
        if x3 and (flags or solo is False):
            raise ValueError("x3: the solo form, no flags")
        T, H, K = q.shape
        HV, V = v.shape[1], v.shape[2]
        N = cu_seqlens.shape[0] - 1
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        pool, idx, new_idx, init, src, ss = tlaunch.chain_slots(
            cu_seqlens, state, new_state, state_indices, new_state_indices, has_initial_state,
            k_first)
        seg = segments if segments > 1 else 0
        if seg and (seg_w is None or seg_phi is None):
            raise ValueError("segments: seg_w and seg_phi are needed")
        # the segmented form's tiles viewed as [.., HV, V, K] states, Phi's in the checkpoints'
        # place
        ns = new_state.view(-1, HV, V, K) if seg else new_state
        ckpt = seg_phi.view(-1, HV, V, K) if seg else ns if checkpoints is None else checkpoints
        code = cuda_build.DTYPE_CODE
        defs = dict(
            GDN_STATE0=int(state is not None), GDN_POOL=pool,
            GDN_HAS_INIT=int(has_initial_state is not None), GDN_CKPT=int(checkpoints is not None),
            GDN_PDL=2 if after_prep else int(bool(pdl)), GDN_S_DT=code[src.dtype],
            GDN_NS_DT=code[ns.dtype], GDN_C_DT=code[ckpt.dtype],
            GDN_CU64=int(cu_seqlens.dtype == torch.int64),
            GDN_IDX64=int(idx.dtype == torch.int64), GDN_NIDX64=int(new_idx.dtype == torch.int64),
            GDN_NO_OUT=int(bool(no_out)), GDN_OVERLAP=int(bool(flags)))
        if seg:
            want = torch.float32 if x3 else torch.bfloat16
            if pdl or checkpoints is not None or K != V or out.dtype != want \
                    or seg_w.dtype != want or (x3 and seg_phi.dtype != torch.float32):
                raise ValueError("segments: K == V, output buffers of bf16 (x3: fp32, and Phi "
                                 "fp32), no checkpoints and no PDL")
            defs["GDN_SEG"] = seg
        grid = (2 * seg - 1 if seg else 1) * N * HV * (V // ROWS)
        if solo is None:        # the prep beside the chain needs the 185 KB form (pick_overlap)
            solo = x3 or (not flags and pick_form(grid, cuda_build.sm_count(dev), bool(seg)))
        if flags and (seg or solo or after_prep):
            raise ValueError("flags: the 185 KB form of one segment only, launched before the "
                             "prep")
        defs["GDN_SOLO"] = int(bool(solo))
        if x3:
            x3_defs, smem = x3_form(seg, grid, cuda_build.sm_count(dev))
            defs.update(x3_defs)
            threads = SOLO_THREADS
        else:
            threads, smem = (SOLO_THREADS, SOLO_SMEM) if solo else (THREADS, SMEM)
        # the maps and pointers zero here (written per call); padded to 64 bytes
        body = bytes(HEAD.size) + PARAMS.pack(
            *(0,) * 11, N, T, out.stride(0), out.stride(1), H, HV, V, *ss,
            *tlaunch.state_strides(ns, k_first), *tlaunch.state_strides(ckpt, k_first),
            src.shape[0], ns.shape[0], null_slot, checkpoint_every or 1)[PARAMS.size - 23 * 8:]
        self.launch = cuda_build.Launch(
            cuda_build.get_kernel(SOURCE, NAME, (("GDN_SMEM", smem), *sorted(defs.items())),
                                  dev, smem), grid, threads, dev,
            template=body + bytes(-len(body) % 64), head=HEAD, shared=smem,
            pdl=bool(pdl or after_prep))
        self.parts, self.segmented = 2 if x3 else 1, bool(seg)

    def __call__(self, q, k, v, cu_seqlens, mats, vecs, out, state, new_state,
                 state_indices=None, new_state_indices=None, has_initial_state=None,
                 checkpoints=None, seg_w=None, seg_phi=None, flags=None):
        _, idx, new_idx, init = tlaunch.prefill_slots(cu_seqlens, state_indices,
                                                      new_state_indices, has_initial_state)
        w = seg_w if self.segmented else out
        ckpt = seg_phi if self.segmented else new_state if checkpoints is None else checkpoints
        # (x3's segmented form stores out and w, fp32, plainly: their maps are made, never used)
        self.launch((tensor_maps(q, k, v, mats, out, w, self.parts), cu_seqlens.data_ptr(),
                     vecs.data_ptr(), out.data_ptr(), w.data_ptr(),
                     (new_state if state is None else state).data_ptr(), new_state.data_ptr(),
                     idx.data_ptr(), new_idx.data_ptr(), init.data_ptr(), ckpt.data_ptr(),
                     0 if flags is None else flags.data_ptr()))

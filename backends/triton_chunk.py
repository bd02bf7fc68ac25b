"""triton-chunk: our Triton chunked (WY) prefill of the Gated Delta Net.

A batch of N sequences packed on one token axis (``cu_seqlens``), each run from its initial
state (or zeros) through the recurrence of every token, its outputs and its final state written.
Two launches (four with segments, below), no host sync (CUDA-graph capturable with new data
and new cu_seqlens values of the same shapes):

1. ``chunk_prep_kernel``, grid ``(T // C + N) * HV``: per (chunk, value head) everything that
   does not depend on the state: the gates, T = (I + A)^-1 of the WY form and M = P T (P the
   chunk's masked, decayed q k^T); stores T^T, M^T and five factors per token into the
   workspace.  A program finds its chunk on the device (a count over cu_seqlens);
   slots past the real chunk count exit.
2. ``chunk_state_kernel``, grid ``N * HV * (V / BV)``: per (sequence, value head, V-tile of BV
   state rows) the state tile in registers through all chunks of the sequence, the outputs of
   each chunk fused into the recurrence, next chunk's operands loaded while the current one
   computes; writes the final state.

The math, the precision of each product and the chunk layout are in
``backends/_triton_chunk_kernel.py``.

Memory.  The workspace holds T^T and M^T and the factors: ``(2 C + 5) * 4`` bytes per token
and value head (:func:`workspace_numel`), 33 MiB at T = 8192, HV = 8 (C = 64), 266 MiB at
HV = 64; written once by the prep kernel and read by the sequential one (each V-tile of a head
reads the same rows, mostly from L2).  Nothing else is allocated per call but the segments'
buffers (through torch's allocator).  Pass ``workspace=`` (:func:`workspace_for` makes one) or
let the module cache one per device: it grows when a call needs more and never frees a buffer
it handed out, so a CUDA graph that captured one stays valid.  Calls that may run at the same
time on different streams must each pass their own workspace.

States: k-last ``[.., HV, V, K]`` or, with ``k_first``, ``[.., HV, K, V]``; fp32 or bf16;
``state`` None is zeros.  Pools: ``state_indices`` [N] picks each sequence's read slot,
``new_state_indices`` its write slot (default the same) of ``new_state`` (the same pool for in
place); a negative index, ``null_slot`` or one past the pool pads: zero outputs, no state read
or written (a real read slot with a padding write slot: outputs, no write).
``has_initial_state`` [N] bool: False starts from zeros without reading the slot (it is still
written).  ``checkpoints``: the state tile is also stored after every ``checkpoint_every``
tokens (at the ends of chunks; each program counts its sequence's first row over cu_seqlens on
the device), for real sequences only; a compile-time flag, off without checkpoints.  Gates: raw
(A_log, a, dt_bias, b; ``allow_neg_eigval``: beta = 2 sigmoid(b)), or FLA's precomputed ``g``
(log-space decay, fp32) and ``beta`` (post-sigmoid).

The launch shape is a :class:`Config`; nothing is autotuned inside a call.  Its defaults, for
K = V = 128 on Hopper, timed side by side on an H200 (lab/notebook/h200/prefill_configs_*.log):

* ``block_v`` from :func:`pick_block_v`: a single long sequence is a chain of chunk updates
  with only N*HV independent recurrences (8 at the contest shape), so the tile is as small as
  the tensor-core products allow (16 rows) while the programs fit in one wave of SMs (1 x 8
  heads: 64 programs); past one wave, 32 rows (64 rows spill: 17-28% slower at 16/64); with
  "bf16" products, 64 rows at 4 warps once even those fill more than one wave (one warpgroup
  on warpgroup MMAs: 1.03x-1.55x faster there).
* ``warps`` from :func:`pick_warps`: 8 at 16 rows (the products split their columns over the
  warps; 168 registers, no spills); at 32 rows 8 while the programs fit one wave of SMs (8-10%
  faster there), else 4 (255 registers, 136 bytes spilled, yet faster than 8 warps once the
  SMs hold two programs each; with "bf16" products always 4).
* ``stages`` and ``v_ahead``: at 16 rows, 3 stages and chunk j+1's v rows loaded by hand
  while chunk j computes; else 2 stages, v loaded where the pipeliner puts it.  Chunk j+1's
  q, k, T^T, M^T and factors (~40 KB) stream into shared memory while chunk j computes
  (75 KB in all at block_v 16, 2 stages), but v, not a product's operand, was loaded late in
  its own iteration: the loop waited on it, 15% of the sequential kernel's stall samples (4/8
  heads 1 x 8192 tokens, Nsight Compute).  The sequential kernel's time at 16 rows (H200,
  medians of 20, lab/notebook/h200/chunk_ablate_2026-11-29b.log), before -> 3 stages with v
  ahead: 324 -> 267 us at 4/8 1 x 8192, 1262 -> 1056 at 1 x 32768, 172 -> 137 at 2 x 4096;
  either change alone was slower (347, 333 us).  At 32 rows v ahead was slower (16/32 8 x
  1024: 344 -> 370 us at 2 stages; 3 stages 668: the shared memory halves the programs an SM).
* ``segments`` from :func:`pick_segments`: 2 where three times the programs still fit one
  wave of SMs and the sequences are long (one sequence at 2/4 heads, Qwen3-Next at tensor
  parallel 8: 300 -> 202 us at 1 x 8192 tokens on an H200, errors unchanged), else 1 (at
  4/8, 192 programs on 132 SMs, two segments took 392 against 334 us, 328 at 4 warps and 2
  stages); with cuda-chunk-bf16's chain up to 4 in one wave of its 185 KB form (one CTA an SM
  at 64 rows), and where that already cuts the sequences up to 8 in its solo form
  (:func:`pick_cuda_segments`).  Each segment after the first runs from zeros beside an
  identity chain, joined by two more launches; buffers of 2 T HV V + 3 S N HV V K elements
  are allocated per call (with cuda-chunk-bf16's chain T HV V, the outputs written in place).
* ``prep_warps`` 4: the prep kernel holds several C x C fp32 tiles; 247 registers, no spills,
  two programs an SM by registers and shared memory (2 warps spill; 8 were slower).
* ``chunk`` 64, ``base`` 8: 7 serial substitution steps on 8 x 8 blocks and three merge
  levels.  The prep kernel's time, base 8 against 16 (H200, each kernel alone, medians of 20
  calls, ``lab/chunk_ablate.py``, lab/notebook/h200/chunk_ablate_2026-11-29.log): 68 against
  80 us at 4/8 heads 1 x 8192 tokens, 266 against 317 at 16/32 8 x 1024, 519 against 610 at
  16/64 8 x 1024, 36 against 42 at 4/8 64 x 64; base 32 was slower (122 and 452 us).
* ``precision`` "bf16x3": ~4e-6 relative error on an fp32 state.  "bf16" was 17-42% faster
  and ~2.5e-3 (FlashInfer's and FLA's chunk kernels: 3.5e-3 to 3.9e-3, same run); opt-in.

Where the time goes (H200, 4/8 heads, 1 x 8192 tokens, fp32 state): the prep kernel 68 us (the
inverse's substitution and merges 35 us of it), the sequential one 267 us, 2.1 us per chunk on
64 programs (before v ahead: 317, 50 of which the outputs' two products); FlashInfer's chunk
kernel takes 122 us of kernel time there (it splits a sequence's chunks over CTAs and
combines them).
"""
from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _cuda_chunk_chain
from gdnzoo.backends import _cuda_chunk_prep
from gdnzoo.backends import _triton_launch as tlaunch

NAME = "triton-chunk"
HEAD_DIMS = (64, 128)                 # tested; any power of two >= 16 compiles
IO_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
PRECISIONS = ("bf16x3", "bf16", "tf32x3", "ieee", "tf32")
# The prep kernel's products (T, M = P T) where the sequential kernel's differ: with "bf16"
# only the state's chain is rounded; T and M are formed as with "bf16x3", stored as bf16.
PREP_PRECISION = {"bf16": "bf16x3"}
CHUNKS = (32, 64, 128)
BASES = (8, 16, 32, 64)
# On CPU the interpreter takes ~0.1-0.3 s per chunk program: cap the tokens x value heads.
CPU_MAX_TOKEN_HEADS = 8192
GRID_LIMIT = 2**31 - 1
MAX_SEGMENTS = 16
# A segment's chunks at least.  Two segments halve a sequence's chain (~2 us a chunk step at
# 16 rows on an H200) for two more launches (~15 us at 1 x 8192 tokens): from about 8 chunks a
# segment they gain (16: a margin on that estimate).  With cuda-chunk-bf16's chain, 4 segments
# of 16 chunks at 4/8 heads 1 x 4096 tokens: chain 30.1 + combine 8.2 + outputs 10.5 us against
# 95.2 for one chain (lab/notebook/h200/wgmma_segments_2026-11-29.log).
SEGMENT_MIN_CHUNKS = 16
# cuda-chunk-bf16's segments in its solo form (pick_cuda_segments): a segment's chunks at least.
# Its chain kernel a chunk takes ~1.45 us in the 185 KB form, ~2.7 in the solo form; the join
# and the output pass grow with the segments.  An H200, whole calls against the one-wave rule
# (lab/notebook/h200/seg_solo_2026-11-30/): 2/8 heads 1 x 32768 tokens 358.0 -> 342.5 us (8
# segments of 64 chunks instead of 4), 4/8 2 x 16384 347.2 -> 341.8 (4 instead of 2); 16/32
# 1 x 8192 265.5 -> 326.2 (2 instead of none: not taken).  Kernels summed, Phi then in fp32
# (lab/notebook/h200/chain_solo_2026-11-30/segments.log): 4/8 1 x 8192, 8 segments of 16
# chunks 118.8 against 4 segments' 112.4.
SOLO_SEGMENT_CHUNKS = 64
# cuda-chunk's x3 chain in segments: this many (one CTA an SM: at 4/8 heads, one sequence, its
# 2 S - 1 chains fill 112 of 132 SMs) or none (fewer were slower than the Triton chain), with at
# least this many chunks a segment (4/8 1 x 2048: 70 us against 80; 1 x 1024: 50 against 45)
X3_MAX_SEGMENTS = 4
X3_SEGMENT_MIN_CHUNKS = 8
# ... or this many in the "paired" form (two CTAs an SM: 2 S - 1 chains in one wave of twice the
# SMs), each of at least this many chunks (measured at 16 and 64: 4/8 1 x 8192 209.5 us in 4
# segments against 203.1 in 8, 1 x 32768 757.3 against 668.7)
X3_PAIR_SEGMENTS = 8
X3_PAIR_MIN_CHUNKS = 16


class Config(NamedTuple):
    """The launch shape.  ``block_v``: state rows per sequential program (0: picked from the
    grid, :func:`pick_block_v`); ``warps``/``stages``: the sequential kernel's num_warps (0:
    :func:`pick_warps`) and pipeline depth of its chunk loop (0: 3 with ``v_ahead``,
    else 2); ``v_ahead``: 1 loads a chunk's v rows one chunk ahead by hand, 0 does not, -1
    (default) does at block_v 16; ``segments``: each sequence's chunks cut into that many
    segments run side by side and joined (:mod:`backends._triton_chunk_cp`; used where K ==
    V, without checkpoints and without PDL, else 1; 0: :func:`pick_segments`);
    ``prep_warps``: the prep
    kernel's num_warps; ``chunk``: tokens per chunk C; ``precision``: of every product with an
    fp32 operand (see the kernels' module; "bf16" rounds the state's chain to bf16: faster,
    ~2.5e-3 relative error on the state instead of ~4e-6); ``base``: the diagonal blocks the
    prep kernel inverts by forward substitution (base - 1 serial steps) before log2(C / base)
    merge levels of two C x C products each; ``prep``: "triton" (the Triton prep kernel) or
    "cuda" (the same workspace from ``backends/cuda_chunk_prep.cu``: cuda-chunk's, K = 128,
    bf16 q/k, chunk 64, precision "bf16x3" or "bf16" only); ``chain``: "triton" (the Triton
    sequential kernel) or "cuda" (``backends/cuda_chunk_chain.cu``, warpgroup MMAs and TMA:
    cuda-chunk-bf16's, compute capability 9.0, K = 128, V a multiple of 64, bf16 q/k/v,
    chunk 64, precision "bf16" (``segments`` auto: its own pick, :func:`pick_cuda_segments`, up
    to 8; ``block_v`` and ``warps`` then steer the Triton combine and output kernels of
    segments and the Triton chain it falls back on where TMA cannot address the tensors) or
    "bf16x3" (its one-CTA-an-SM form, cuda-chunk's; ``segments`` auto:
    :func:`pick_x3_segments`) only), or "auto" (cuda-chunk's: "cuda" where it serves the call
    and :func:`_cuda_chunk_chain.pick_x3` prefers it or it would run segments, else
    "triton")."""
    block_v: int = 0
    warps: int = 0
    stages: int = 0
    prep_warps: int = 4
    chunk: int = 64
    precision: str = "bf16x3"
    base: int = 8
    v_ahead: int = -1
    segments: int = 0
    prep: str = "triton"
    chain: str = "triton"


PREPS = ("triton", "cuda")
CHAINS = ("triton", "cuda", "auto")


def normalize(config) -> Config:
    """A :class:`Config` from None, a Config, a dict of its fields or a tuple in field order."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    try:
        return Config(**config) if isinstance(config, dict) else Config(*config)
    except TypeError as e:
        raise ValueError(f"config: expected a Config, a dict of {Config._fields} or a tuple in "
                         f"that order, got {config!r} ({e})") from None


def pick_block_v(recurrences: int, V: int, n_sm: int, precision: str = "bf16x3") -> int:
    """16 rows when the N*HV recurrences at 16 rows a program fill at most one wave of SMs (a
    long sequence is bound by its chain of chunk updates: small tiles shorten each step),
    else 32; with "bf16" products 64 rows (one warpgroup: Triton emits warpgroup MMAs, 255
    registers, no spills) when even 64-row programs fill more than one wave.  Measured on an
    H200 (lab/notebook/h200/prefill_configs_2026-11-28.log, one run, events): 32 rows with 4
    warps beat 64 with 8 by 17-28% at 64 and more recurrences (the 64-row kernel spills) and
    matched 64 at 8 x 1024 tokens of 4/8.  With "bf16", 64 rows and 4 warps against the rule
    without them (sequential kernel alone, medians of 20,
    lab/notebook/h200/chunk_bf16_rows64_2026-11-29.log): 16/32 heads 8 x 1024 tokens (512
    programs) 220 -> 142 us, 16/64 8 x 1024 428 -> 281, 2/8 16 x 256 33 -> 22, 4/8 64 x 128
    80 -> 57; 4/8 8 x 1024 (128 programs) 55.5 -> 53.8; slower within one wave (4/8 4 x 2048
    73 -> 98, 1 x 8192 174 -> 377); with "bf16x3" 64 rows at 4 warps spill and were slower
    everywhere (16/32 8 x 1024 344 -> 544)."""
    if precision == "bf16" and V % 64 == 0 and recurrences * (V // 64) > n_sm:
        return 64
    if V % 16 == 0 and recurrences * (V // 16) <= n_sm:
        return 16
    return 32 if V % 32 == 0 else min(16, V)


def pick_warps(block_v: int, programs: int, n_sm: int, precision: str = "bf16x3") -> int:
    """The sequential kernel's warps: 8 at 16 rows; at 32 rows with "bf16x3" products 8 while
    its ``programs`` fit one wave of SMs (one program an SM: 254 registers, no spills), else 4
    (255 registers and 136 bytes spilled, but two programs an SM); 4 with other precisions.
    Measured on an H200, each kernel alone, medians of 20
    (lab/notebook/h200/chunk_ablate_2026-11-29d.log), 4 -> 8 warps at 32 rows: 16/32 heads 1
    x 8192 tokens (128 programs) 499 -> 458 us, 1 x 32768 1974 -> 1769, 8/16 2 x 4096 255 ->
    233, 4/8 4 x 2048 132 -> 118; past one wave 16/48 1 x 8192 (192) 649 -> 898, 16/64 8 x
    1024 (2048) 672 -> 930; with "bf16" products 8 warps were slower everywhere (283 -> 306
    us at 16/32 1 x 8192)."""
    if block_v == 16 or (block_v == 32 and precision == "bf16x3" and 0 < programs <= n_sm):
        return 8
    return 4


def pick_segments(programs: int, n_sm: int, tokens: int, N: int, C: int, most: int = 2,
                  min_chunks: int = 0) -> int:
    """The most segments S, up to ``most``, whose chains (2 S - 1 times ``programs``: S real
    chains and S - 1 identity chains) still fit one wave of SMs, once the sequences average
    at least ``min_chunks`` (default :data:`SEGMENT_MIN_CHUNKS`) chunks a segment; else 1.
    ``most``: 2 for the Triton chain (measured there), :data:`_cuda_chunk_chain.MAX_SEGMENTS`
    for cuda-chunk-bf16's.
    Measured on an H200 (one program an SM at block_v 16,
    lab/notebook/h200/chunk_ablate_2026-11-29b.log): 2/4 heads 1 x 8192 tokens (32 programs)
    300 -> 202 us; 4/8 (64 programs, 192 past 132 SMs) 334 -> 392 us."""
    best, least = 1, min_chunks or SEGMENT_MIN_CHUNKS
    for S in range(2, most + 1):
        if (2 * S - 1) * programs <= n_sm and tokens >= S * least * C * max(N, 1):
            best = S
    return best


def pick_cuda_segments(programs: int, n_sm: int, tokens: int, N: int, C: int) -> int:
    """Segments for cuda-chunk-bf16's chain: :func:`pick_segments` within one wave of its 185 KB
    form (up to :data:`_cuda_chunk_chain.MAX_SEGMENTS`); where that already cuts the sequences,
    more, up to ``MAX_SOLO_SEGMENTS``, in one wave of its solo form (two CTAs an SM) while each
    segment still holds :data:`SOLO_SEGMENT_CHUNKS` chunks.  Sequences that one wave does not
    cut (16/32 heads) stay whole: 2 segments in the solo form measured slower there."""
    best = pick_segments(programs, n_sm, tokens, N, C, most=_cuda_chunk_chain.MAX_SEGMENTS)
    if best < 2:
        return best
    for S in range(best + 1, _cuda_chunk_chain.MAX_SOLO_SEGMENTS + 1):
        if (2 * S - 1) * programs <= 2 * n_sm \
                and tokens >= S * SOLO_SEGMENT_CHUNKS * C * max(N, 1):
            best = S
    return best


def pick_x3_segments(N: int, HV: int, V: int, tokens: int, n_sm: int, C: int) -> int:
    """Segments for cuda-chunk's x3 chain (64 state rows a CTA): :data:`X3_PAIR_SEGMENTS` (8)
    where their 15 chains fit one wave of its paired form (two CTAs an SM,
    :func:`_cuda_chunk_chain.pick_pair`) and hold :data:`X3_PAIR_MIN_CHUNKS` chunks a segment or
    more; else four where their 7 chains fit one wave of one CTA an SM and hold
    :data:`X3_SEGMENT_MIN_CHUNKS` chunks a segment or more (:func:`pick_segments`); else one.
    Eight against four, whole calls (lab/notebook/h200/x3_seg2_2026-12-01/): 4/8 heads 1 x 8192
    tokens 203.1 / 209.5 us, 1 x 32768 668.7 / 757.3.  Whole calls on an H200 (every kernel: the
    CUDA prep, the chains, the join and the output pass), us, the Triton chain / the x3 chain in
    1, 2, 3, 4 segments, one CTA an SM, the same errors against float64 (~4e-6 on the state;
    lab/notebook/h200/x3_forms_2026-12-01/segments_all_kernels.log): 4/8 heads 1 x 8192 tokens
    299 / 382, 313, 246, 211; 1 x 32768 1176 / 1506, 1187, 908, 764; 1 x 4096 151 / 193, 162,
    134, 117; 1 x 2048 80 / 102, 92, 77, 70; slower where fewer fit: 1 x 1024 45 / 56, 57, 53,
    50; 8/16 1 x 8192 333 / 391, 380, 466, 401; 4/8 2 x 4096 169 / 205, 198, 238, 218 (the
    output pass reads the segments' fp32 outputs: 42 of 211 us at 4/8 1 x 8192)."""
    if not n_sm:
        return 1
    programs = N * HV * (V // _cuda_chunk_chain.ROWS)
    if pick_segments(programs, 2 * n_sm, tokens, N, C, most=X3_PAIR_SEGMENTS,
                     min_chunks=X3_PAIR_MIN_CHUNKS) == X3_PAIR_SEGMENTS:
        return X3_PAIR_SEGMENTS
    S = pick_segments(programs, n_sm, tokens, N, C, most=X3_MAX_SEGMENTS,
                      min_chunks=X3_SEGMENT_MIN_CHUNKS)
    return S if S == X3_MAX_SEGMENTS else 1


def resolve(config, N: int, HV: int, V: int, device: torch.device, tokens: int = 0) -> Config:
    """``config`` with its zeros filled in for a call of N sequences and ``tokens`` tokens in
    all, and checked (ValueError naming it).  Answers are remembered per call shape (a model's
    layers repeat them; a rejected config is checked again every call)."""
    c = normalize(config)
    try:
        return _resolve_memo(c, N, HV, V, device, tokens)
    except TypeError:                   # an unhashable field value: checked without the memo
        return _resolve(c, N, HV, V, device, tokens)


def _resolve(config, N: int, HV: int, V: int, device: torch.device, tokens: int) -> Config:
    c = normalize(config)
    n_sm = cuda_build.sm_count(device) \
        if device.type == "cuda" and not (c.block_v and c.segments and c.warps) else 0
    bv = c.block_v
    if not bv:
        # the interpreter (no SMs): fewest programs is fastest
        bv = pick_block_v(N * HV, V, n_sm, c.precision) if n_sm else V
    if c.v_ahead not in (-1, 0, 1):
        raise ValueError(f"config: v_ahead must be -1 (auto), 0 or 1, got {c.v_ahead!r}")
    ahead = int(bv == 16) if c.v_ahead == -1 else c.v_ahead
    warps = c.warps or pick_warps(bv, N * HV * (V // bv) if V % bv == 0 else 0, n_sm,
                                  c.precision)
    c = c._replace(block_v=bv, warps=warps, v_ahead=ahead,
                   stages=c.stages or (3 if ahead else 2))
    if bv < 16 or V % bv or bv & (bv - 1):
        raise ValueError(f"config: block_v must be a power of two >= 16 dividing V={V}, got {bv}")
    if c.chunk not in CHUNKS:
        raise ValueError(f"config: chunk must be one of {CHUNKS}, got {c.chunk}")
    if c.base not in BASES or c.base > c.chunk:
        raise ValueError(f"config: base must be one of {BASES} and <= chunk, got {c.base}")
    if c.precision not in PRECISIONS:
        raise ValueError(f"config: precision must be one of {PRECISIONS}, got {c.precision!r}")
    for name in ("warps", "prep_warps"):
        w = getattr(c, name)
        if w not in (1, 2, 4, 8, 16):
            raise ValueError(f"config: {name} must be 1, 2, 4, 8 or 16, got {w}")
    if c.stages < 1:
        raise ValueError(f"config: stages must be >= 1, got {c.stages}")
    if c.prep not in PREPS:
        raise ValueError(f"config: prep must be one of {PREPS}, got {c.prep!r}")
    if c.prep == "cuda":
        if device.type != "cuda":
            raise ValueError("config: prep 'cuda' needs a CUDA device")
        ok, why = _cuda_chunk_prep.serves(_cuda_chunk_prep.HEAD_DIM, torch.bfloat16,
                                          c.precision, c.chunk)
        if not ok:
            raise ValueError(f"config: prep 'cuda': {why}")
    if c.chain not in CHAINS:
        raise ValueError(f"config: chain must be one of {CHAINS}, got {c.chain!r}")
    if c.chain == "auto":
        ok = device.type == "cuda" and _cuda_chunk_chain.serves(
            cuda_build.capability(device), _cuda_chunk_chain.HEAD_DIM, V, torch.bfloat16,
            c.precision, c.chunk)[0]
        n = n_sm or (cuda_build.sm_count(device) if ok else 0)
        cuda = ok and c.segments <= 1 and (c.precision == "bf16" or _cuda_chunk_chain.pick_x3(
            N, HV, V, tokens, n) or (not c.segments and pick_x3_segments(N, HV, V, tokens, n,
                                                                         c.chunk) > 1))
        c = c._replace(chain="cuda" if cuda else "triton")
    if c.chain == "cuda":
        if device.type != "cuda":
            raise ValueError("config: chain 'cuda' needs a CUDA device")
        ok, why = _cuda_chunk_chain.serves(cuda_build.capability(device),
                                           _cuda_chunk_chain.HEAD_DIM, V, torch.bfloat16,
                                           c.precision, c.chunk)
        if not ok:
            raise ValueError(f"config: chain 'cuda': {why}")
        if c.precision == "bf16x3" and not c.segments:     # its one-CTA-an-SM form
            c = c._replace(segments=pick_x3_segments(N, HV, V, tokens, n_sm, c.chunk))
        if not c.segments:
            c = c._replace(segments=pick_cuda_segments(
                N * HV * (V // _cuda_chunk_chain.ROWS), n_sm, tokens, N, c.chunk) if n_sm else 1)
    if not 0 <= c.segments <= MAX_SEGMENTS:
        raise ValueError(f"config: segments must be 0 (auto) to {MAX_SEGMENTS}, "
                         f"got {c.segments}")
    if not c.segments:
        c = c._replace(segments=pick_segments(N * HV * (V // bv), n_sm, tokens, N, c.chunk)
                       if n_sm else 1)
    return c


_resolve_memo = functools.lru_cache(maxsize=1024)(_resolve)   # raises are never remembered


# the Triton kernels' launches: Triton's own path once per signature (a new prompt length
# is no new signature), then raw launches
_LAUNCH = tlaunch.LaunchCache()

VECTORS = 5      # per token and value head: beta, beta rk e^G, scale rq e^G, rk e^(G_last - G), e^G_last


def workspace_numel(T: int, HV: int, config=None) -> int:
    """fp32 elements of the workspace of a call with T tokens and HV value heads: per token
    and head T^T and M^T (C values each, as bf16 hi and lo parts with "bf16x3") and the
    :data:`VECTORS` factors: (2 C + 5) * 4 bytes (532 at C = 64)."""
    return T * HV * (2 * normalize(config).chunk + VECTORS)


def workspace_for(T: int, HV: int, config=None, device="cuda") -> torch.Tensor:
    """A workspace for calls of up to T tokens and HV value heads (pass it as ``workspace=``)."""
    return torch.empty(workspace_numel(T, HV, config), dtype=torch.float32, device=device)


_CACHE: dict = {}             # device -> every buffer handed out, the largest last


def _cached_workspace(need: int, device) -> torch.Tensor:
    bufs = _CACHE.setdefault(str(device), [])
    if not bufs or bufs[-1].numel() < need:
        # Grow geometrically; keep the old buffers alive (a captured graph may point at one).
        size = max(need, 2 * bufs[-1].numel()) if bufs else need
        bufs.append(torch.empty(size, dtype=torch.float32, device=device))
    return bufs[-1]


@functools.lru_cache(maxsize=1024)
def _cached_views(T: int, HV: int, c: Config, device) -> tuple:
    """The cached workspace's (mats, vecs) for a call shape."""
    return _workspace(_cached_workspace(workspace_numel(T, HV, c), device), T, HV, c, device)


def _workspace(workspace, T: int, HV: int, c: Config, device) -> tuple:
    """(mats, vecs): the [T, HV, 2, NP, C] matrix rows (first: 16-byte aligned) and the
    [HV, VECTORS, T] factors, views of one fp32 buffer (the cached one's remembered per call
    shape: a buffer it outgrew stays alive in the cache)."""
    if workspace is None:
        return _cached_views(T, HV, c, device)
    need = workspace_numel(T, HV, c)
    if workspace.dtype != torch.float32 or workspace.device != device \
            or not workspace.is_contiguous() or workspace.numel() < need:
        raise ValueError(f"workspace: expected a contiguous float32 tensor of >= {need} "
                         f"elements on {device}, got {workspace.dtype} "
                         f"{tuple(workspace.shape)} on {workspace.device}")
    flat = workspace.reshape(-1)
    n_mats = T * HV * 2 * c.chunk
    mats = flat[:n_mats]
    if c.precision in ("bf16x3", "bf16"):
        mats = mats.view(torch.bfloat16)
    return mats, flat[n_mats:need]


def available(device):
    return tlaunch.available((8, 0), device)


def supports(problem):
    """The registry's question for a prefill problem."""
    p = problem
    ok, why = serves(H=p.H, HV=p.HV, K=p.K, V=p.V, io_dtype=p.io_dtype,
                     state_dtype=p.state_dtype, device=p.device, tokens=p.T)
    if ok and getattr(p, "pdl", ""):
        return tlaunch.pdl_supports(p)
    return ok, why


def run(call, *, config=None):
    """The backend's entry point: a prefill call record (:mod:`gdnzoo.prefill_contract`)."""
    bind(call, config=config)(call)


def bind(call, *, config=None):
    """A launcher of this call's signature (the dispatcher's, once per signature): its
    :class:`Plan` made now, called with each record; a record whose form the signature does not
    show (q, k, v or out off 16 bytes where the plan's were not, or the reverse; separate write
    slots where they were the read ones; :func:`overlap_allowed` changed) gets a plan of its
    own."""
    plans = {}

    def plan_of(rec):
        key = Plan.form(rec.q, rec.k, rec.v, rec.out, rec.pool)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = Plan(*_args(rec), **_kwargs(rec, config))
        return plan

    def launcher(rec):
        plan_of(rec)(*_args(rec), **_tensors(rec))
    plan_of(call)                            # a config the call cannot take raises here
    return launcher


def _args(c) -> tuple:
    return (c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b, c.cu_seqlens, c.scale, c.out,
            c.new_state, c.use_qk_l2norm)


def _tensors(c) -> dict:
    """A record's optional tensors, as :func:`launch` takes them."""
    pool = c.pool
    return dict(g=c.g, beta=c.beta, state_indices=None if pool is None else pool.read,
                new_state_indices=None if pool is None or pool.same_indices else pool.write,
                has_initial_state=c.has_initial_state, checkpoints=c.checkpoints)


def _kwargs(c, config) -> dict:
    return dict(_tensors(c), null_slot=c.null_slot, k_first=c.problem.k_first,
                checkpoint_every=c.checkpoint_every, config=config, pdl=bool(c.problem.pdl),
                allow_neg_eigval=c.allow_neg_eigval)


def serves(*, H: int, HV: int, K: int, V: int, io_dtype, state_dtype=torch.float32,
           device="cuda", tokens: int = 0):
    """(ok, reason) for a call of these head counts, head sizes, dtypes (``state_dtype`` None:
    no initial state) and device; ``tokens`` (T) only matters on CPU."""
    if H < 1 or HV % H:
        return False, f"HV must be a multiple of H (GVA), got H={H} HV={HV}"
    if K not in HEAD_DIMS or V not in HEAD_DIMS:
        return False, f"K and V must each be one of {HEAD_DIMS}, got K={K} V={V}"
    if io_dtype not in IO_DTYPES:
        return False, f"q, k, v must be bfloat16 or float16, got {io_dtype}"
    if state_dtype is not None and state_dtype not in STATE_DTYPES:
        return False, f"state must be float32 or bfloat16, got {state_dtype}"
    if torch.device(device).type == "cpu":
        if not tlaunch.interpreter_on():
            return False, "CPU tensors need the Triton interpreter (set TRITON_INTERPRET=1)"
        if tokens * HV > CPU_MAX_TOKEN_HEADS:
            return False, (f"on CPU the Triton interpreter is limited to T*HV <= "
                           f"{CPU_MAX_TOKEN_HEADS}, got {tokens * HV}")
    return True, ""


def launch(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, out, new_state,
           use_qk_l2norm, *, g=None, beta=None, state_indices=None, new_state_indices=None,
           null_slot=-1, has_initial_state=None, k_first=False, checkpoints=None,
           checkpoint_every=None, config=None, workspace=None, pdl=False,
           allow_neg_eigval=False):
    """Run the prefill on validated inputs: q, k [T, H, K]; v, out [T, HV, V]; a, b (or g,
    beta) [T, HV]; cu_seqlens [N+1] int32/int64 on the device; state [N or P, HV, V, K] (K-first
    ``[.., HV, K, V]`` with ``k_first``) or None (zeros); ``new_state`` always given (``state``
    itself for in place).  Writes every element of ``out`` and the written state rows.
    ``scale`` None or 0: 1/sqrt(K).  ``config``: a :class:`Config` (dict or tuple accepted).
    ``workspace``: see :func:`workspace_for`.  ``checkpoints`` [R, HV, V, K] (K-first
    ``[R, HV, K, V]``): the state after every ``checkpoint_every`` tokens (a multiple of the
    config's chunk) of each real sequence, packed as :func:`gdnzoo.prefill` says; the row
    offsets are counted on the device.  ``pdl``: both kernels launched with programmatic
    dependent launch, each waiting for the kernel before it before any load (compute
    capability >= 9.0; the CUDA prep beside the CUDA chain, :func:`overlap_allowed`, waits for
    nothing: the chain waits for the producer and then for each chunk's flag).  With or without
    it, the "bf16" CUDA chain after the CUDA prep is the prep's programmatic dependent: its CTAs
    start where the prep's last ones leave SMs, and only its copies of the workspace wait (the
    "bf16x3" one, one CTA an SM, is launched after the prep plainly).
    ``allow_neg_eigval``: with the raw gates beta = 2 sigmoid(b) (the
    precomputed beta is taken as given).  Returns the resolved Config."""
    args = (q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, out, new_state,
            use_qk_l2norm)
    tensors = dict(g=g, beta=beta, state_indices=state_indices,
                   new_state_indices=new_state_indices, has_initial_state=has_initial_state,
                   checkpoints=checkpoints)
    plan = Plan(*args, **tensors, null_slot=null_slot, k_first=k_first,
                checkpoint_every=checkpoint_every, config=config, workspace=workspace, pdl=pdl,
                allow_neg_eigval=allow_neg_eigval)
    plan(*args, **tensors)
    return plan.config


class Plan:
    """:func:`launch` in two parts: what a call's signature decides (shapes, strides, dtypes,
    form, config; checked, so a bad one raises here), made once; then, per call with that
    signature and the data of its own, the launches.  Each launch's compiled kernel, grid and
    fixed parameters are made on the plan's first call and kept (``launches``), so a later
    call only packs its pointers.  Made for what :meth:`form` says of its first call (the
    16-byte alignment of q, k, v and out, the pool's write slots, the overlap allowed)."""

    def __init__(self, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, out, new_state,
                 use_qk_l2norm, *, g=None, beta=None, state_indices=None,
                 new_state_indices=None, null_slot=-1, has_initial_state=None, k_first=False,
                 checkpoints=None, checkpoint_every=None, config=None, workspace=None,
                 pdl=False, allow_neg_eigval=False):
        T, H, K = q.shape
        HV, V = v.shape[1], v.shape[2]
        N = cu_seqlens.shape[0] - 1
        c = resolve(config, N, HV, V, q.device, tokens=T)
        C = c.chunk
        self.scale = float(scale) if scale else 1.0 / math.sqrt(K)
        if c.prep == "cuda":
            ok, why = _cuda_chunk_prep.serves(K, q.dtype, c.precision, C)
            if not ok:
                raise ValueError(f"config: prep 'cuda': {why}")
        if c.chain == "cuda":
            ok, why = _cuda_chunk_chain.serves(None, K, V, q.dtype, c.precision, C)
            if not ok:
                raise ValueError(f"config: chain 'cuda': {why}")
        if checkpoints is not None and checkpoint_every % C:
            raise ValueError(f"config: chunk={C} must divide checkpoint_every={checkpoint_every} "
                             f"(checkpoints are stored at chunk ends)")
        self.T, self.N, self.config, self.launches = T, N, c, {}
        self.neg = allow_neg_eigval and g is None
        self.l2, self.null_slot, self.k_first = bool(use_qk_l2norm), null_slot, k_first
        self.checkpoint_every = checkpoint_every
        if N < 1:
            return
        if c.segments > 1 and (K != V or checkpoints is not None or pdl):
            c = self.config = c._replace(segments=1)
        n_slots = T // C + N
        grid = (2 * c.segments - 1) * N * HV * (V // c.block_v)
        if max(n_slots * HV, grid) > GRID_LIMIT:
            raise ValueError(f"q: (T // {C} + N) * HV and (2 segments - 1) * N * HV * V / block_v "
                             f"must be <= {GRID_LIMIT}, got {n_slots * HV} and {grid}")
        # at least one token: an empty workspace could be a null pointer, which Triton may refuse
        self.mats, self.vecs = _workspace(workspace, max(T, 1), HV, c, q.device)
        # PDL left at its default without it (the kernels compile as they did before PDL);
        # launch_pdl: Triton's launcher launches with programmatic dependent launch
        self.pdl, self.pdl_kw = pdl, (dict(PDL=1, launch_pdl=True) if pdl else {})
        # the CUDA kernels copy q, k (and the chain v, out) in 16-byte pieces: views off that
        # grain take the Triton kernels, which write the same workspace and compute the same chain
        self.cuda_prep = T > 0 and c.prep == "cuda" and cuda_build.aligned16(q, k)
        if c.chain == "cuda" and not (T > 0 and cuda_build.aligned16(q, k, v, out)):
            c = self.config = c._replace(chain="triton")
        both_cuda, self.flags = self.cuda_prep and c.chain == "cuda", None
        x3 = c.precision == "bf16x3"
        if both_cuda and not x3 and c.segments <= 1 and _cuda_chunk_chain.pick_overlap(
                N * HV * (V // _cuda_chunk_chain.ROWS), cuda_build.sm_count(q.device), N) \
                and overlap_allowed():
            self.flags = _cuda_chunk_chain.flags_for(self.mats, T, HV, N)
        # else the "bf16" CUDA chain right after the CUDA prep, as its programmatic dependent;
        # the x3 chain (one CTA an SM) after it plainly: as a dependent its whole calls read 3-8%
        # slower dense and 10-20% in a pool on an H200 (lab/notebook/h200/x3_forms_2026-12-01/)
        self.after = both_cuda and self.flags is None and not x3

    @staticmethod
    def form(q, k, v, out, pool) -> tuple:
        """What a plan is made for beyond the call's signature (which holds the strides): the
        data pointers of q and k, and of v and out, on 16 bytes or not, (a pool) whether the
        write slots are the read ones, and :func:`overlap_allowed` (read per call, as the
        environment may change)."""
        return ((q.data_ptr() | k.data_ptr()) % 16, (v.data_ptr() | out.data_ptr()) % 16,
                pool is not None and pool.same_indices, overlap_allowed())

    def __call__(self, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, out, new_state,
                 use_qk_l2norm, *, g=None, beta=None, state_indices=None,
                 new_state_indices=None, has_initial_state=None, checkpoints=None):
        """Launch on these tensors (the signature's; ``scale`` and ``use_qk_l2norm`` are the
        plan's)."""
        if self.N < 1:
            return
        c, go, T, mats, vecs = self.config, self.launches, self.T, self.mats, self.vecs
        gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(A_log, a, dt_bias, b, g, beta)
        slots = dict(state_indices=state_indices, new_state_indices=new_state_indices,
                     null_slot=self.null_slot, has_initial_state=has_initial_state,
                     k_first=self.k_first)
        flags = self.flags
        if self.cuda_prep:
            prep = go.get("prep")
            if prep is None:
                # with flags (launched after the chain, beside it) compiled before the chain
                # starts waiting for it
                prep = go["prep"] = _cuda_chunk_prep.Prep(
                    q, k, ga, gb, A_log, dt_bias, cu_seqlens, self.scale, self.l2, gates, c,
                    neg=self.neg, pdl=self.pdl, flags=flags is not None, trigger=self.after)
            if flags is None:
                prep(q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs)
        elif T > 0:
            launch_prep(q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, self.scale,
                        self.l2, gates, c, neg=self.neg, pdl_kw=self.pdl_kw, launches=go)
        if c.segments > 1:
            launch_segments(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, c, **slots,
                            after_prep=self.after, launches=go)
        elif c.chain == "cuda":
            # with flags: one CTA an SM on at most half of them, the prep launched next beside it
            chain = go.get("chain")
            if chain is None:
                chain = go["chain"] = _cuda_chunk_chain.Chain(
                    q, k, v, cu_seqlens, mats, out, state, new_state, **slots,
                    checkpoints=checkpoints, checkpoint_every=self.checkpoint_every,
                    pdl=self.pdl, flags=flags is not None, after_prep=self.after,
                    x3=c.precision == "bf16x3")
            chain(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, state_indices,
                  new_state_indices, has_initial_state, checkpoints, flags=flags)
        else:
            launch_state(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, c, **slots,
                         checkpoints=checkpoints, checkpoint_every=self.checkpoint_every,
                         pdl_kw=self.pdl_kw, launches=go)
        if flags is not None:
            go["prep"](q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, flags)


def _launch(launches, name, kernel, grid0: int, args: tuple, **kw) -> None:
    """One Triton launch: through a plan's bound launch ``name`` (made on its first call)
    where ``launches`` (the plan's) is given, else (or when a tool replaced the cache) through
    the cache."""
    if launches is None or _LAUNCH.__class__ is not tlaunch.LaunchCache:
        _LAUNCH(kernel, grid0, args, **kw)
        return
    bound = launches.get(name)
    if bound is None:
        bound = launches[name] = tlaunch.Bound(_LAUNCH, kernel, **kw)
    bound(grid0, args)


def overlap_allowed() -> bool:
    """False when ``GDNZOO_PREFILL_OVERLAP=0``, under compute-sanitizer (its injection's
    ``NV_SANITIZER_INJECTION_*`` variables) or with an MPS share of the SMs
    (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``): the CUDA prep kernel then always runs before the
    CUDA chain kernel, never beside it (:func:`_cuda_chunk_chain.pick_overlap`).  Beside it, the
    chain kernel's CTAs wait for the prep's, which must find SMs the chain leaves free: tools
    that run one kernel at a time (compute-sanitizer, ncu) never run them, nor may a share of
    the SMs smaller than the device's count (or other streams' chains holding the rest); the
    chain kernel then traps after ~9 s of polls rather than hang."""
    env = os.environ
    return env.get("GDNZOO_PREFILL_OVERLAP", "1") != "0" \
        and "NV_SANITIZER_INJECTION_PORT_BASE" not in env \
        and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def launch_prep(q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, scale, l2, gates, c, *,
                neg=False, pdl_kw=None, launches=None):
    """The prep kernel of :func:`launch` alone (the gates as
    :func:`_triton_launch.prefill_gates` gives them; ``c`` a resolved Config), into the
    workspace (mats, vecs): one program per (chunk slot, value head).  ``launches``: a
    :class:`Plan`'s."""
    from gdnzoo.backends._triton_chunk_kernel import chunk_prep_kernel
    T, H, K = q.shape
    HV, N = ga.shape[1], cu_seqlens.shape[0] - 1
    _launch(launches, "prep", chunk_prep_kernel, (T // c.chunk + N) * HV,
            (q, k, ga, gb, A_log, dt_bias, cu_seqlens, mats, vecs, scale, N, T, q.stride(0),
             q.stride(1), k.stride(0), k.stride(1), ga.stride(0), ga.stride(1), gb.stride(0),
             gb.stride(1), A_log.stride(0), dt_bias.stride(0),
             H, HV, K, c.chunk, c.base, l2, gates, PREP_PRECISION.get(c.precision, c.precision),
             c.precision), num_warps=c.prep_warps, num_stages=1, **(pdl_kw or {}),
            **(dict(NEG=1) if neg else {}))


def launch_state(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, c, *,
                 state_indices=None, new_state_indices=None, null_slot=-1,
                 has_initial_state=None, k_first=False, checkpoints=None, checkpoint_every=None,
                 pdl_kw=None, launches=None):
    """The sequential kernel of :func:`launch` alone, on the workspace the prep kernel wrote:
    one program per (sequence, value head, V-tile of ``c.block_v`` rows).  ``launches``: a
    :class:`Plan`'s."""
    from gdnzoo.backends._triton_chunk_kernel import chunk_state_kernel
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu_seqlens.shape[0] - 1
    pool, idx, new_idx, init, src, ss = tlaunch.chain_slots(
        cu_seqlens, state, new_state, state_indices, new_state_indices, has_initial_state, k_first)
    sn = tlaunch.state_strides(new_state, k_first)
    # Without checkpoints CKPT is left at its default: the kernel compiles as it did before.
    ck = {} if checkpoints is None else dict(CKPT=1)
    ckpt = new_state if checkpoints is None else checkpoints
    _launch(launches, "state", chunk_state_kernel, N * HV * (V // c.block_v), (
        q, k, v, cu_seqlens, mats, vecs, out, src, new_state, idx, new_idx, init, T,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), *ss, *sn, src.shape[0], new_state.shape[0], null_slot,
        ckpt, *tlaunch.state_strides(ckpt, k_first), checkpoint_every or 0,
        H, HV, K, V, c.chunk, c.block_v, c.precision, pool, int(state is not None),
        int(has_initial_state is not None), c.stages), num_warps=c.warps, num_stages=c.stages,
        **ck, **(dict(V_AHEAD=1) if c.v_ahead else {}), **(pdl_kw or {}))


def launch_segments(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, c, *,
                    state_indices=None, new_state_indices=None, null_slot=-1,
                    has_initial_state=None, k_first=False, after_prep=False, launches=None):
    """The sequential part of :func:`launch` with each sequence cut into ``c.segments``
    segments (K == V): the chains, the join of the segments' states, the outputs (three
    launches, :mod:`backends._triton_chunk_cp`).  Allocates buffers of 2 T HV V elements (the
    chains' outputs: bf16 where the precision is "bf16" and the outputs are bf16, whose
    products round them to bf16 anyway but for one rounding of a segment's own outputs
    before the join adds to them; else fp32) and of 3 segments N HV V K elements (the
    segments' final tiles in fp32; their start states, bf16 with "bf16" products).  The "bf16"
    CUDA chains write the segments' outputs into ``out`` itself (the output pass completes
    those past segment 0 in place) and only w into a buffer (T HV V), Phi in bf16 (the join's
    "bf16" products round it so); the "bf16x3" (x3) ones write o, w and Phi in fp32 as the
    Triton chains do.
    ``after_prep``: the CUDA chains launched as the CUDA prep's programmatic dependent.
    ``launches``: a :class:`Plan`'s."""
    from gdnzoo.backends._triton_chunk_cp import (cp_chain_kernel, cp_combine_kernel,
                                                  cp_out_kernel)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N, S, C, bv = cu_seqlens.shape[0] - 1, c.segments, c.chunk, c.block_v
    pool, idx, new_idx, init, src, ss = tlaunch.chain_slots(
        cu_seqlens, state, new_state, state_indices, new_state_indices, has_initial_state, k_first)
    dev = q.device
    low = c.precision == "bf16" and out.dtype == torch.bfloat16
    cuda = c.chain == "cuda"
    x3 = cuda and c.precision == "bf16x3"
    # the chains' outputs o then w (the "bf16" CUDA chains write o into ``out``: w alone), their
    # final tiles Z then Phi (the "bf16" CUDA chains' Phi in bf16: their products in the join
    # round it so; the x3 CUDA chains', as the Triton chains', fp32)
    inplace = cuda and not x3
    obuf = torch.empty(1 if inplace else 2, max(T, 1), HV, V,
                       dtype=torch.bfloat16 if low else torch.float32, device=dev)
    fbuf = torch.empty(1 if inplace else 2, N, S, HV, V, K, dtype=torch.float32, device=dev)
    zbuf, wbuf = fbuf[0], obuf[-1]
    phibuf = torch.empty_like(zbuf, dtype=torch.bfloat16) if inplace else fbuf[1]
    # the segments' start states, read only as the outputs' product operand: in bf16 where
    # that product rounds them to bf16 ("bf16"), half the bytes each output program reads
    starts = torch.empty(N, S, HV, V, K, dtype=torch.bfloat16 if c.precision == "bf16"
                         else torch.float32, device=dev)
    P, PN = src.shape[0], new_state.shape[0]
    if cuda:
        o = obuf[0] if x3 else out
        chain = None if launches is None else launches.get("chain")
        if chain is None:
            chain = _cuda_chunk_chain.Chain(
                q, k, v, cu_seqlens, mats, o, state, zbuf, state_indices=state_indices,
                new_state_indices=new_state_indices, null_slot=null_slot,
                has_initial_state=has_initial_state, k_first=k_first, segments=S, seg_w=wbuf,
                seg_phi=phibuf, after_prep=after_prep, x3=x3)
            if launches is not None:
                launches["chain"] = chain
        chain(q, k, v, cu_seqlens, mats, vecs, o, state, zbuf, state_indices, new_state_indices,
              has_initial_state, seg_w=wbuf, seg_phi=phibuf)
    else:
        zero_row = torch.zeros(V, dtype=v.dtype, device=dev)      # the identity chains' v
        _launch(launches, "chain", cp_chain_kernel, (2 * S - 1) * N * HV * (V // bv),
                (q, k, v, zero_row, cu_seqlens, mats, vecs, obuf, src, fbuf, idx, new_idx, init,
                 N, T, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                 v.stride(1), *ss, P, PN, null_slot, H, HV, K, V, C, bv, c.precision, S, pool,
                 int(state is not None), int(has_initial_state is not None), c.stages,
                 c.v_ahead), num_warps=c.warps, num_stages=c.stages)
    _launch(launches, "combine", cp_combine_kernel, N * HV * (V // bv),
            (cu_seqlens, zbuf, phibuf, starts, new_state, idx, new_idx, N, T, P, PN, null_slot,
             *tlaunch.state_strides(new_state, k_first), H, HV, K, V, bv, c.precision, S, pool),
            num_warps=c.warps)
    if T > 0:
        _launch(launches, "out", cp_out_kernel, (T // C + N) * HV,
                (cu_seqlens, obuf[0], wbuf, starts, out, N, T, out.stride(0), out.stride(1), HV,
                 K, V, C, c.precision, S, int(inplace)), num_warps=4)

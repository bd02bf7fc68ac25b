"""The host side of cuda-v4's K-first decode, ``cuda_v4_kfirst.cu``: which calls it serves, its
launch shape, and its variant.  Not a backend: :class:`gdnzoo.backends.cuda_v4.Bound` builds it
for every call whose state is K-first (``state_layout="k-first"``: [.., HV, K, V] a head, V
contiguous), with the cuda-v4 parameter block (GdnParams: the state's ``s_v`` field holds the
stride of a K row), -D constants and compiled-in strides.

It serves T >= 1 tokens, a dense state or a pool (padding, separate write slots), fp32 and bf16
states, raw or precomputed gates, ``allow_neg_eigval`` and PDL (both levels wait before any
global access: the state's loads do not start early), and the speculative verify's forms as
cuda-v4's k-last kernel serves them (the same GDN_POOL, GDN_INTER and GDN_UPDATE switches):
K-first intermediate states (rows n or ``intermediate_indices``), the final store or a
deferred commit, and vLLM's per-token slots with ``num_accepted_tokens``.

The launch shape: ``warps`` a block, which split the K rows, and ``lanes`` of a warp along K;
the other 32 / lanes lanes of a warp read a row side by side, one 16-byte vector each (4 fp32 or
8 bf16 values: at 4 lanes, whole 128-byte lines), so a block owns (32 / lanes) * vec columns of
a head and a lane K / (warps * lanes) rows of them.  :func:`shape` picks it by the number of
(sequence, head) pairs, with the cache hint; a config's ``warps``, ``lanes_per_row`` and ``hint``
give them explicitly.  Large one-token states take the kernel's staged form instead (GDN_STAGED:
a block a head, its whole tile copied into shared memory; :func:`pick_staged`), unless a config
gives the shape.
"""
from __future__ import annotations

from pathlib import Path

from gdnzoo.backends import _cuda_build as cuda_build

SOURCE = Path(__file__).with_name("cuda_v4_kfirst.cu")
KERNEL = "gdn_decode_v4_kfirst"
LANES = (2, 4, 8, 16)            # lanes along K: 16 keeps a row's run of a warp >= 32 bytes
MAX_ELEMS = 128                  # state values a lane (registers)
MAX_WARPS = 8
MAX_GRID_X = 2**31 - 1


def vec_elems(state_size: int, vec16: bool) -> int:
    return 16 // state_size if vec16 else 1


def columns(lanes: int, vec: int) -> int:
    """Columns of a head a block owns."""
    return 32 // lanes * vec


def refusal(K, V, state_size, warps, lanes, vec16) -> str:
    """Why launch shape (warps, lanes) cannot serve K, V ("" when it can)."""
    vec = vec_elems(state_size, vec16)
    if lanes not in LANES or not 1 <= warps <= MAX_WARPS or K % (warps * lanes):
        return (f"lanes along K must be one of {LANES} and warps 1 to {MAX_WARPS}, "
                f"warps x lanes dividing K={K}, got {warps} x {lanes}")
    if K // (warps * lanes) * vec > MAX_ELEMS:
        return (f"{warps} warps x {lanes} lanes along K leave {K // (warps * lanes) * vec} "
                f"state values a lane (at most {MAX_ELEMS})")
    if V % columns(lanes, vec):
        return f"blocks of {columns(lanes, vec)} columns must divide V={V}"
    return ""


SMALL_BYTES = 16 << 20           # states up to this size: the latency-bound shape


def shape(state_size: int, BHV: int, K: int, V: int, inplace: bool = True,
          vec16: bool = True) -> tuple:
    """(warps, lanes, hint) of a call with BHV (sequence, head) pairs.  Measured on an H200 at
    16/32 and 4/8 heads, K = V = 128, B = 1 to 256 (lab/kfirst_cuda.py,
    lab/notebook/h200/kfirst_cuda_2026-11-29.log): states up to SMALL_BYTES (B <= 8 of 16/32
    fp32, <= 16 of bf16) are bound by latency, and 2 warps of 8 lanes along K (8 rows a lane)
    were fastest; larger ones by bandwidth: 4 warps, a bf16 state's 4 lanes along K reading
    whole 128-byte lines of a row (8 rows a lane), an fp32 state's 2 lanes two lines (16 rows
    a lane; the former 4 lanes, 8 warps of them from 2048 pairs, read 0-5% slower at 16/32 and
    4/8 heads, B = 16 to 256, and a sweep of every shape found none more than 4% faster:
    lab/notebook/h200/kfirst_lanes_2026-11-30/).  Cache hint 3 (.nc
    loads, streaming stores) but for large states written to another tensor, where the plain
    loads and stores (0) were faster by 1-5%.  Fewer columns a block where V asks; at most
    MAX_ELEMS values a lane."""
    vec = vec_elems(state_size, vec16)
    small = BHV * K * V * state_size <= SMALL_BYTES
    lanes = 8 if small else 2 if state_size == 4 else 4
    warps = 2 if small else 4
    while V % columns(lanes, vec) and lanes < LANES[-1]:
        lanes *= 2                                      # fewer columns a block
    while K % (warps * lanes):
        warps //= 2
    while warps < MAX_WARPS and K % (2 * warps * lanes) == 0 and \
            K // (warps * lanes) * vec > MAX_ELEMS:
        warps *= 2
    return max(warps, 1), lanes, 3 if inplace or small else 0


# GDN_STAGED (cuda_v4_kfirst.cu): a (sequence, head) a block, its tile staged in shared memory
STAGED_WARPS, STAGED_LANES = 8, 4            # 256 threads; LK only satisfies the file's checks
STAGED_BYTES = 64 << 20


def staged_smem(state_size: int) -> int:
    """GDN_STAGED's dynamic shared memory: the tile, raw k and q, the row groups' partial sums,
    the warps' sums, the mbarrier."""
    return 128 * 128 * state_size + 2 * 128 * 4 + 2 * 4 * 128 * 4 + 16 * 4 + 16


def pick_staged(state_size: int, BHV: int, K: int, V: int, T: int, inplace: bool,
                row_stride: int, verify: bool) -> bool:
    """Whether a call runs GDN_STAGED: one token, no verify form, K = V = 128, the heads' K rows
    contiguous (``row_stride`` V: a tile is one run of memory), states of STAGED_BYTES or more,
    bf16 or in place.  On an H200, 16/32 heads, the kernel's time over cuda-v4 on a k-last state
    (graph replays, lab/notebook/h200/kfirst_staged_2026-12-01/), register tile / staged: bf16
    in place B = 64 1.056 / 1.021, B = 256 1.054 / 0.991; bf16 to another tensor 1.138 / 1.005,
    1.118 / 0.981; fp32 in place 1.030 / 1.014, 1.022 / 0.995; slower staged: fp32 to another
    tensor (B = 64 1.007 / 1.018, 256 1.009 / 1.019), and below STAGED_BYTES, where fewer
    blocks than an SM holds wait on their whole tile (B = 16: bf16 1.065 / 1.101, fp32 1.035 /
    1.074; B = 1 1.8x)."""
    return (T == 1 and not verify and K == V == 128 and row_stride == V
            and BHV * K * V * state_size >= STAGED_BYTES and (state_size == 2 or inplace))


def serves(K: int, V: int, state_size: int) -> str:
    """Why a K-first call cannot be served by this kernel ("" when it can): with 16-byte
    vectors (the element-load variant has more shapes still)."""
    why = refusal(K, V, state_size, *shape(state_size, 1, K, V)[:2], True)
    return f"K-first state: {why}" if why else ""


def launch(bound, vec16: bool, warps: int, lanes: int, hint: int, fast_gates: int,
           staged: bool = False):
    """The :class:`gdnzoo.backends._cuda_build.Launch` of a K-first
    :class:`gdnzoo.backends.cuda_v4.Bound` (its signature's shapes, dtypes, pool switches,
    strides and parameter values) at this launch shape, or (``staged``, 16-byte vectors; see
    :func:`pick_staged`) GDN_STAGED's; ValueError naming the config when the shape cannot serve
    it."""
    B, T, H, K, HV, V = bound.shape
    sd, io, ad, bd, dd = bound.dtypes
    size = cuda_build.ELEM_SIZE[sd]
    smem = 0
    if staged:
        warps, lanes, smem = STAGED_WARPS, STAGED_LANES, staged_smem(size)
    why = refusal(K, V, size, warps, lanes, vec16)
    if why:
        raise ValueError(f"cuda-v4: launch config invalid for a K-first state: {why}")
    blocks = B * HV if staged else B * HV * (V // columns(lanes, vec_elems(size, vec16)))
    if blocks > MAX_GRID_X:
        raise ValueError(f"cuda-v4: grid of {blocks} blocks exceeds {MAX_GRID_X}")
    extra = {n: v for n, v in (("pdl", int(bound.pdl > 0)), ("staged", int(staged))) if v}
    defs = cuda_build.defines(sd, io, ad, bd, dd, K, bound.l2, v=V, t=T, hv=HV, gva=HV // H,
                              w=warps, lk=lanes, vec16=int(vec16), hint=hint if vec16 else 0,
                              fastgate=fast_gates, dense=1 if bound.dense else 2,
                              **bound.switches, **bound.form, **extra)
    kern = cuda_build.get_kernel(SOURCE, KERNEL, tuple(sorted(defs + bound.stride_defs)),
                                 bound.dev, smem)
    return cuda_build.Launch(kern, blocks, 32 * warps, bound.dev,
                             template=cuda_build.params_template(bound.values),
                             pdl=bound.pdl > 0, shared=smem)

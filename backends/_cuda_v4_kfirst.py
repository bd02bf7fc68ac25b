"""The host side of cuda-v4's K-first decode, ``cuda_v4_kfirst.cu``: which calls it serves, its
launch shape, and its variant.  Not a backend: :class:`gdnzoo.backends.cuda_v4.Bound` builds it
for every call whose state is K-first (``state_layout="k-first"``: [.., HV, K, V] a head, V
contiguous), with the cuda-v4 parameter block (GdnParams: the state's ``s_v`` field holds the
stride of a K row), -D constants and compiled-in strides.

It serves T >= 1 tokens, a dense state or a pool (padding, separate write slots), fp32 and bf16
states, raw or precomputed gates, ``allow_neg_eigval`` and PDL (both levels wait before any
global access: the state's loads do not start early).  Not the speculative verify's forms.

The launch shape: ``warps`` a block and ``lanes`` along K (the lanes that share a column group's
K rows); a warp owns (32 / lanes) * vec columns of a head (vec: one 16-byte vector of a row, 4
fp32 or 8 bf16 values), a lane K / lanes rows of them.  :func:`shape` picks it by the number of
(sequence, head) pairs; a config's ``warps`` and ``lanes_per_row`` give it explicitly.
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
    """Columns of a head a warp owns."""
    return 32 // lanes * vec


def refusal(K, V, state_size, warps, lanes, vec16) -> str:
    """Why launch shape (warps, lanes) cannot serve K, V ("" when it can)."""
    vec = vec_elems(state_size, vec16)
    if lanes not in LANES or K % lanes:
        return f"lanes along K must be one of {LANES} and divide K={K}, got {lanes}"
    if K // lanes * vec > MAX_ELEMS:
        return (f"{lanes} lanes along K leave {K // lanes * vec} state values a lane "
                f"(at most {MAX_ELEMS})")
    if not 1 <= warps <= MAX_WARPS or V % (warps * columns(lanes, vec)):
        return (f"{warps} warps of {columns(lanes, vec)} columns must divide V={V} "
                f"(1 to {MAX_WARPS} warps)")
    return ""


def shape(state_size: int, BHV: int, K: int, V: int, vec16: bool = True) -> tuple:
    """(warps, lanes) of a call with BHV (sequence, head) pairs: the fewest lanes along K
    whose rows fit a lane's registers (the shortest butterfly), one warp a block; at most
    as many warps a block as V allows."""
    vec = vec_elems(state_size, vec16)
    lanes = next((n for n in LANES if K % n == 0 and K // n * vec <= 64), LANES[-1])
    while V % columns(lanes, vec) and lanes < LANES[-1]:
        lanes *= 2                                      # fewer columns a warp
    return 1, lanes


def serves(K: int, V: int, state_size: int, verify: bool) -> str:
    """Why a K-first call cannot be served by this kernel ("" when it can): with 16-byte
    vectors (the element-load variant has more shapes still)."""
    if verify:
        return ("its K-first kernel has no speculative-verify stores (fla-recurrent serves a "
                "K-first verify)")
    why = refusal(K, V, state_size, *shape(state_size, 1, K, V), True)
    return f"K-first state: {why}" if why else ""


def launch(bound, vec16: bool, warps: int, lanes: int, hint: int, fast_gates: int):
    """The :class:`gdnzoo.backends._cuda_build.Launch` of a K-first
    :class:`gdnzoo.backends.cuda_v4.Bound` (its signature's shapes, dtypes, pool switches,
    strides and parameter values) at this launch shape; ValueError naming the config when the
    shape cannot serve it."""
    B, T, H, K, HV, V = bound.shape
    sd, io, ad, bd, dd = bound.dtypes
    size = cuda_build.ELEM_SIZE[sd]
    why = refusal(K, V, size, warps, lanes, vec16)
    if why:
        raise ValueError(f"cuda-v4: launch config invalid for a K-first state: {why}")
    blocks = B * HV * (V // (warps * columns(lanes, vec_elems(size, vec16))))
    if blocks > MAX_GRID_X:
        raise ValueError(f"cuda-v4: grid of {blocks} blocks exceeds {MAX_GRID_X}")
    extra = {n: v for n, v in (("pdl", int(bound.pdl > 0)),) if v}
    defs = cuda_build.defines(sd, io, ad, bd, dd, K, bound.l2, v=V, t=T, hv=HV, gva=HV // H,
                              w=warps, lk=lanes, vec16=int(vec16), hint=hint if vec16 else 0,
                              fastgate=fast_gates, dense=1 if bound.dense else 2,
                              **bound.switches, **bound.form, **extra)
    kern = cuda_build.get_kernel(SOURCE, KERNEL, tuple(sorted(defs + bound.stride_defs)),
                                 bound.dev)
    return cuda_build.Launch(kern, blocks, 32 * warps, bound.dev,
                             template=cuda_build.params_template(bound.values),
                             pdl=bound.pdl > 0)

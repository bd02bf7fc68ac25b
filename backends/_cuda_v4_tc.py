"""The host side of cuda-v4's tensor-core verify, ``cuda_v4_tc.cu`` (launch rows with
``kernel: tc-verify``, :data:`gdnzoo.backends.cuda_v4.CONFIG`): which calls it serves, its launch
shape, and its parameter block.  Not a backend: :class:`gdnzoo.backends.cuda_v4.Bound` builds it
where a row names it, and every call it cannot serve runs cuda_v4.cu with the row's other fields.

It serves the speculative-verify forms that store every token's state (intermediate states,
with or without the final state, on a dense state or a pool; per-token slots with or without
accepted counts) with K = V = 128, T <= 8, bf16 q, k, v and 16-byte-aligned tensors, without
programmatic dependent launch: 8 state rows a block, the cuda-v4 parameter block (GdnParams),
-D constants and compiled-in strides.  ``cuda_v4_tc.cu`` explains the algebra and the block.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cuda_build

SOURCE = Path(__file__).with_name("cuda_v4_tc.cu")
KERNEL = "gdn_verify_tc"
ROWS = 8                         # state rows a block
MAX_T = 8                        # tokens: the MMA's N
MAX_GRID_X = 2**31 - 1

# Its parameter block is GdnParams with two values moved to fields their form leaves unused:
# the compute warps read dt_bias at once, so it comes on the block's first two constant-cache
# lines (gdn_common.cuh orders the fields by first read), not from its own field on the third.
#   intermediate states: ``accepted`` (no counts in these forms) holds dt_bias;
#   per-token slots:     ``new_state`` holds dt_bias (``accepted`` is what the loader reads
#                        first) and ``inter`` (no intermediate states) holds new_state.
# The kernel names them TC_DT_BIAS and TC_NEW_STATE; every other field keeps its meaning.


def threads(state_dtype, T: int) -> int:
    """Threads a block (the kernel's NT): 8 compute warps and the loader, and a flags warp
    where the loader makes the Gram entries (every case but an fp32 state up to T = 4)."""
    return 288 if state_dtype == torch.float32 and T <= 4 else 320


def grid(B: int, HV: int, V: int) -> int:
    return B * HV * V // ROWS


def refusal(K, V, T, io_dtype, switches, vec16, pdl, grid) -> str:
    """Why the kernel cannot serve a call ("" when it can): ``switches`` are the call's
    GDN_POOL / GDN_INTER values (:func:`gdnzoo.backends.cuda_v4.verify_mode`)."""
    if switches.get("inter", 0) not in (1, 2) and switches.get("pool", 0) not in (3, 4):
        return "not a verify call that stores every token's state (intermediate states or " \
               "per-token slots)"
    if (K, V) != (128, 128) or not 1 <= T <= MAX_T:
        return f"K = V = 128 and T <= {MAX_T} only (K={K}, V={V}, T={T})"
    if io_dtype != torch.bfloat16:
        return f"bf16 q, k, v only (got {io_dtype})"
    if not vec16:
        return "tensors not 16-byte aligned"
    if pdl:
        return "no programmatic dependent launch"
    if grid > MAX_GRID_X:
        return f"grid of {grid} blocks"
    return ""


def bind(bound, vec16, fast_gates, element_loads):
    """The tensor-core launch of a :class:`gdnzoo.backends.cuda_v4.Bound` (its signature's
    shapes, dtypes, switches, strides and parameter values), or None where the kernel cannot
    serve its calls: ``(launch, call)``, ``call`` taking the arguments of ``Bound.launch``.
    ``element_loads``: the bound's own launch, for calls whose pointers are not 16-byte aligned
    (cuda_v4.cu's element-load variant)."""
    B, T, H, K, HV, V = bound.shape
    sd, io, ad, bd, dd = bound.dtypes
    blocks = grid(B, HV, V)
    if refusal(K, V, T, io, bound.switches, vec16, bound.pdl, blocks):
        return None
    defs = cuda_build.defines(sd, io, ad, bd, dd, K, bound.l2, v=V, t=T, hv=HV, gva=HV // H,
                              fastgate=fast_gates, dense=1 if bound.dense else 2,
                              **bound.switches, **bound.form)
    kern = cuda_build.get_kernel(SOURCE, KERNEL, tuple(sorted(defs + bound.stride_defs)),
                                 bound.dev)
    block = threads(sd, T)
    # The kernel's __launch_bounds__ (its NT); the CPU tests' recorded kernels carry none.
    if getattr(kern, "max_threads", block) != block:
        raise RuntimeError(f"cuda-v4: {SOURCE.name} is built for {kern.max_threads} threads a "
                           f"block, this module launches {block}")
    launch = cuda_build.Launch(kern, blocks, block, bound.dev,
                               template=cuda_build.params_template(bound.values))
    return launch, _caller(launch, bound.switches.get("pool", 0) >= 3, element_loads)


def _caller(launch, slots, element_loads):
    """A call of ``launch`` with the pointers of ``Bound.launch``, placed as the note above
    says; misaligned pointers go to ``element_loads``."""
    head, at = cuda_build.HEAD, cuda_build.HEAD_OFFSET

    def call(q, k, v, state, A_log, a, dt_bias, b, out, new_state, idx=0, new_idx=0, inter=0,
             inter_idx=0, accepted=0):
        qp, kp, sp, np_ = q.data_ptr(), k.data_ptr(), state.data_ptr(), new_state.data_ptr()
        if (qp | kp | sp | np_ | inter) & 15:
            element_loads(q, k, v, state, A_log, a, dt_bias, b, out, new_state, idx, new_idx,
                          inter, inter_idx, accepted)
            return
        dtb = dt_bias.data_ptr()
        # What the fields ``accepted``, ``new_state`` and ``inter`` carry for this kernel.
        if slots:
            accepted_field, new_state_field, inter_field = accepted, dtb, np_
        else:
            accepted_field, new_state_field, inter_field = dtb, np_, inter
        try:
            buf, _, argv = launch._tls.b
        except AttributeError:
            buf, _, argv = launch.buffers()
        head.pack_into(buf, at, sp, idx, accepted_field, qp, kp, v.data_ptr(), a.data_ptr(),
                       b.data_ptr(), A_log.data_ptr(), new_state_field, out.data_ptr(), dtb,
                       inter_idx, new_idx, inter_field)
        cuda_build.launch_raw(launch.func, launch.grid, launch.block, launch.dev, argv)
    return call

"""cuda-chunk-bf16's segmented form with the chains' outputs written into ``out`` itself (the
output pass completing segments past the first in place, segment 0's programs idle) and Phi in
bf16 ("tree") against the data flow before (every segment's outputs into a bf16 buffer that
the output pass reads, Phi in fp32: "before", the same kernels given those buffers), whole
calls side by side.  On a GPU:

    python3 -m lab.seg_out_ab --cells "4,8:1x8192;2,8:1x32768"

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps), outputs and states compared bit for bit with the first variant's, the first's
errors against float64. Cells as ``lab.prefill_gpu.lens_of`` reads them ("H,HV:NxL"); only cells
whose sequences the product cuts into segments exercise the change.
"""
from __future__ import annotations

import torch

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from lab.harness import patch
from lab.prefill_gpu import ab_cells


def before_segments(q, k, v, cu_seqlens, mats, vecs, out, state, new_state, c, *,
                    state_indices=None, new_state_indices=None, null_slot=-1,
                    has_initial_state=None, k_first=False, after_prep=False):
    """The CUDA chains' segmented launches with the buffers of before: outputs and w into one
    bf16 [2, T, HV, V] buffer, Z and Phi into one fp32 [2, N, S, HV, V, K] buffer."""
    from gdnzoo.backends._triton_chunk_cp import cp_combine_kernel, cp_out_kernel
    assert c.chain == "cuda", "the A/B is of the CUDA chain's segments"
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N, S, C, bv = cu_seqlens.shape[0] - 1, c.segments, c.chunk, c.block_v
    pool, idx, new_idx, _, src, _ = tlaunch.chain_slots(
        cu_seqlens, state, new_state, state_indices, new_state_indices, has_initial_state, k_first)
    dev = q.device
    obuf = torch.empty(2, T, HV, V, dtype=torch.bfloat16, device=dev)
    fbuf = torch.empty(2, N, S, HV, V, K, dtype=torch.float32, device=dev)
    starts = torch.empty(N, S, HV, V, K, dtype=torch.bfloat16, device=dev)
    chain.launch(q, k, v, cu_seqlens, mats, vecs, obuf[0], state, fbuf[0],
                 state_indices=state_indices, new_state_indices=new_state_indices,
                 null_slot=null_slot, has_initial_state=has_initial_state, k_first=k_first,
                 segments=S, seg_w=obuf[1], seg_phi=fbuf[1], after_prep=after_prep)
    tc._LAUNCH(cp_combine_kernel, N * HV * (V // bv),
               (cu_seqlens, fbuf[0], fbuf[1], starts, new_state, idx, new_idx,
                N, T, src.shape[0], new_state.shape[0], null_slot,
                *tlaunch.state_strides(new_state, k_first), H, HV, K, V, bv, c.precision, S,
                pool), num_warps=c.warps)
    tc._LAUNCH(cp_out_kernel, (T // C + N) * HV, (cu_seqlens, obuf[0], obuf[1], starts, out,
               N, T, out.stride(0), out.stride(1), HV, K, V, C, c.precision, S, 0),
               num_warps=4)


def main():
    ab_cells(__doc__, lambda a: {"tree": patch(tc),
                                 "before": patch(tc, launch_segments=before_segments)})


if __name__ == "__main__":
    main()

"""cuda-chunk-bf16: cuda-chunk's CUDA prep kernel, then a sequential kernel on Hopper's
warpgroup MMAs and TMA (``backends/cuda_chunk_chain.cu``), both with precision "bf16".

The sequential kernel computes what triton-chunk-bf16's computes (every product of the state's
chain with bf16 operands, fp32 accumulation, the state kept in fp32): outputs and states were
bit-identical to it in every form measured on an H200, so the precision is triton-chunk-bf16's
(~2.5e-3 relative state error at 8k tokens against float64, FlashInfer's ~3.9e-3), and it is
named only, never the automatic choice.  On an H200, the sequential kernel alone: 181 against
Triton's 280 us at 16/32 heads, 1 x 8192 tokens; 116 against 143 at 8 x 1024
(lab/notebook/h200/wgmma_chain_2026-11-29/).  Where a wave of SMs has room (4/8 heads, one
long sequence) each sequence is cut into segments as triton-chunk's are, this kernel running
the segments' chains and identity chains side by side (bit-identical to triton-chunk-bf16's
segments): at 4/8 heads, 1 x 8192 tokens, 4 segments, the chain kernel 53 against 182 us
(lab/notebook/h200/wgmma_segments_2026-11-29.log).  One sequence too long for segments but
whose chain leaves half the SMs idle (16/32 heads) runs the prep kernel beside the chain kernel
on them, the chain waiting for each chunk's flag: 312 -> 273 us at 16/32, 1 x 8192
(lab/notebook/h200/prep_beside_2026-11-30/).  The whole call beside FlashInfer's
kernel: bench/results/h200/prefill_cuda_chunk_bf16/.

Serves K = 128, V a multiple of 64, bf16 q/k/v on a compute capability 9.0 GPU with CuPy;
refuses the rest with the reason (triton-chunk-bf16 serves them).  Tensors TMA cannot address
(see :mod:`backends._cuda_chunk_chain`) run triton-chunk-bf16's sequential kernel.
"""
from gdnzoo.backends import _cuda_chunk_chain as _chain
from gdnzoo.backends import cuda_chunk as _cuda_chunk
from gdnzoo.backends import triton_chunk as _tc

NAME = "cuda-chunk-bf16"
available = _cuda_chunk.available


def supports(problem):
    """cuda-chunk's answer, then what the sequential kernel is written for."""
    ok, why = _cuda_chunk.supports(problem)
    if not ok:
        return ok, why
    return _chain.serves(problem.cc, problem.K, problem.V, problem.io_dtype, "bf16",
                         _chain.CHUNK)


def bind(call, *, config=None):
    """triton-chunk's launcher with ``prep`` and ``chain`` "cuda" and precision "bf16"."""
    return _tc.bind(call, config=_tc.normalize(config)._replace(prep="cuda", chain="cuda",
                                                                precision="bf16"))


def run(call, *, config=None):
    bind(call, config=config)(call)

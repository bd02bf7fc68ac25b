"""cuda-chunk: triton-chunk with its prep kernel in CUDA (``backends/cuda_chunk_prep.cu``).

The prep kernel (per chunk and value head: the gates, k k^T and q k^T, T = (I + A)^-1 of the WY
form, M = P T) is written with warp-level tensor-core MMAs (mma.sync, ldmatrix, cp.async): the
diagonal 16 x 16 blocks of T by forward substitution, the blocks below by block substitution
with bf16x3 products.  It writes triton-chunk's workspace, which triton-chunk's sequential
kernel reads unchanged, so outputs, states, pools, checkpoints, K-first states, PDL and the
precision ("bf16x3": ~4e-6 relative state error) are triton-chunk's.  Against the Triton prep
kernel on an H200 (lab/chunk_prep_cuda.py): the workspaces agree to ~5e-7 relative and the
prep takes 1.3x-1.65x less time (165 against 265 us at 16/32 1 x 8192 tokens).

On compute capability 9.0 its chain is "auto" (``_cuda_chunk_chain.pick_x3``): where the Triton
chain would take 32-row tiles and the sequences hold two chunks or more on average, the
sequential kernel on warpgroup MMAs (``backends/cuda_chunk_chain.cu``, GDN_X3) with the same
"bf16x3" products, every operand split into bf16 hi and lo parts, launched after the prep
plainly (as its programmatic dependent it read 3-8% slower, 10-20% in a pool): the same errors
against float64 (~4e-6 on the state), whole calls 1.2x-1.6x faster on an H200 (16/32 heads 8 x
1024 tokens 473 -> 329 us; lab/notebook/h200/chain_split_prec_2026-12-01/), in a pool
1.2x-1.6x and with checkpoints 1.24x-1.83x (lab/notebook/h200/x3_forms_2026-12-01/).  One
sequence of few heads (4/8, 2/8: where four segments' chains fit one wave,
``triton_chunk.pick_x3_segments``) runs it cut into four segments, its outputs and Phi in fp32
for triton-chunk's join and output pass: 4/8 1 x 8192 tokens 299 -> 211 us, 1 x 32768 1176 ->
764, the same errors; eight segments where their chains fit one wave of two CTAs an SM (the
segmented kernel "paired" in 109 KB, ``_cuda_chunk_chain.pick_pair``) and hold 16 chunks each:
4/8 1 x 8192 209.5 -> 203.1 us, 1 x 32768 757.3 -> 668.7 (lab/notebook/h200/x3_seg2_2026-12-01/).

Serves K = 128, bf16 q/k on a CUDA GPU (compute capability >= 8.0) with CuPy; refuses the rest
with the reason (triton-chunk serves them).  The kernel copies q and k in 16-byte pieces: views
whose base or strides are off that grain (legal: only the last axis must be contiguous) take
the Triton prep kernel.
"""
from gdnzoo.backends import _cuda_build
from gdnzoo.backends import _cuda_chunk_prep as _prep
from gdnzoo.backends import triton_chunk as _tc

NAME = "cuda-chunk"


def available(device):
    ok, why = _tc.available(device)
    return (ok, why) if not ok else _cuda_build.available(device)


def supports(problem):
    """triton-chunk's answer, then what the CUDA prep kernel is written for."""
    ok, why = _tc.supports(problem)
    if not ok:
        return ok, why
    if problem.device == "cpu":
        return False, "its prep kernel is CUDA C++: it needs a CUDA GPU"
    return _prep.serves(problem.K, problem.io_dtype, "bf16x3", _prep.CHUNK)


def bind(call, *, config=None):
    """triton-chunk's launcher with ``prep`` "cuda" and, unless ``config`` names one,
    ``chain`` "auto" (the rest of ``config`` as given)."""
    c = _tc.normalize(config)
    named = config is not None and (not isinstance(config, dict) or "chain" in config)
    return _tc.bind(call, config=c._replace(prep="cuda", chain=c.chain if named else "auto"))


def run(call, *, config=None):
    bind(call, config=config)(call)

"""triton-chunk-bf16: triton-chunk's two kernels with precision "bf16".

Every product of the sequential kernel takes its fp32 operands (the state, R, V') rounded to
bf16, one tensor-core product each instead of bf16x3's three; T and M are still formed as
with bf16x3 by the prep kernel and stored as bf16; accumulation and the state stay fp32.
The state's relative error is then ~2.5e-3 at 8k tokens (H200, against float64), the
precision of FlashInfer's and FLA's chunk kernels (3.5e-3 to 3.9e-3 in the same runs), where
triton-chunk's is ~4e-6; it was 17-42% faster in lab/notebook/h200/prefill_configs_*.log.
Named only: the automatic choice never picks it.  CUDA only: Triton's CPU interpreter
truncates fp32 -> bf16 where GPUs round to nearest, so its errors there are not the kernel's.
"""
from gdnzoo.backends import triton_chunk as _tc

NAME = "triton-chunk-bf16"
available = _tc.available
supports = _tc.supports


def bind(call, *, config=None):
    """triton-chunk's launcher with ``precision`` "bf16" (the rest of ``config`` as given)."""
    return _tc.bind(call, config=_tc.normalize(config)._replace(precision="bf16"))


def run(call, *, config=None):
    bind(call, config=config)(call)

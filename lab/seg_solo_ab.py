"""cuda-chunk-bf16's segment count: the tree's rule (where one wave of the 185 KB form already
cuts the sequences, up to 8 segments in the solo form while each keeps 64 chunks:
triton_chunk.pick_cuda_segments) against the one-wave rule before it ("one-wave": up to 4
segments within one wave of the 185 KB form, or none), whole calls side by side.  On a GPU:

    python3 -m lab.seg_solo_ab --cells "2,8:1x32768;16,32:1x8192"

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps) and its outputs and states against the first variant's (other segment counts
round otherwise: the differences are printed), the first's errors against float64.  Cells as
``lab.prefill_gpu.lens_of`` reads them.
"""
from __future__ import annotations

from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import triton_chunk as tc
from lab.harness import patch
from lab.prefill_gpu import ab_cells


def one_wave(programs, n_sm, tokens, N, C):
    return tc.pick_segments(programs, n_sm, tokens, N, C, most=chain.MAX_SEGMENTS)


def rule(**attrs):
    """A variant: ``attrs`` set on triton_chunk, its memo of resolved configs cleared."""
    def setup():
        undo = patch(tc, **attrs)()
        tc._resolve_memo.cache_clear()
        return lambda: (undo(), tc._resolve_memo.cache_clear())
    return setup


def main():
    ab_cells(__doc__, lambda a: {"tree": rule(), "one-wave": rule(pick_cuda_segments=one_wave)},
             cells="2,8:1x32768")


if __name__ == "__main__":
    main()

"""cuda-chunk-bf16's segmented chains of one sequence with the CUDA prep beside them (the chains
launched first, the prep as their programmatic dependent taking the chunks in the segments'
turn; `_cuda_chunk_chain.pick_seg_overlap`) against the prep first, whole calls side by side.
On a GPU:

    python3 -m lab.seg_beside_ab --cells "4,8:1x8192;2,8:1x8192;4,8:1x32768"

Variants: "first" (the prep before the chains, as before), "beside" (the chains in the solo
form, two prep CTAs beside each), "beside-185" (the chains in the 185 KB form, the prep on the
SMs they leave), and with --segments S each of them at S segments (0: the product's pick; the
beside variants need (2 S - 1) * HV * V / 64 <= the SMs, else they run as "first").  Per cell
and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel; median of
--reps) and its outputs and states against the first variant's (bit for bit at the same
segment count), the first's errors against float64.
"""
from __future__ import annotations

from gdnzoo.backends import triton_chunk as tc
from lab.harness import patch
from lab.prefill_gpu import ab_cells


def variant(beside, solo=True, segments=0):
    def setup():
        undo = patch(tc, SEG_BESIDE=beside, SEG_BESIDE_SOLO=solo)()
        undo_s = None
        if segments:
            real = tc.pick_cuda_segments
            undo_s = patch(tc, pick_cuda_segments=lambda p, n, t, N, C: segments
                           if real(p, n, t, N, C) > 1 else 1)()
        tc._resolve_memo.cache_clear()

        def undo_all():
            undo()
            if undo_s:
                undo_s()
            tc._resolve_memo.cache_clear()
        return undo_all
    return setup


def variants(a):
    out = {"first": variant(False), "beside": variant(True), "beside-185": variant(True, False)}
    for S in a.segments:
        out[f"first-{S}"] = variant(False, segments=S)
        out[f"beside-{S}"] = variant(True, segments=S)
        out[f"beside-185-{S}"] = variant(True, False, S)
    return out


def main():
    ab_cells(__doc__, variants, cells="4,8:1x8192",
             more_args=lambda ap: ap.add_argument(
                 "--segments", type=lambda s: [int(x) for x in s.split(",") if x], default=[]))


if __name__ == "__main__":
    main()

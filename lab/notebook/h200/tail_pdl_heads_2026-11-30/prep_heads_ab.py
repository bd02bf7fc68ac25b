"""cuda-chunk's prep kernel with several value heads a CTA where GVA allows (``heads``: the
group's size forced, as ``_cuda_chunk_prep.pick_heads`` picks only past four waves of CTAs and
only groups of 3 or 4), and the segmented form's join and output pass with and without their
programmatic dependent launch (``triton_chunk.TAIL_PDL``), whole calls side by side.  On a GPU:

    python3 -m lab.prep_heads_ab --cells "4,8:1x8192;4,8:16x256" --heads 2,4

Per cell and round, each variant in turn: a call's GPU span (CUDA events behind a sleep kernel;
median of --reps) and its outputs and states against the first variant's, the first's errors
against float64 (lab.harness.side_by_side).
"""
from __future__ import annotations

from gdnzoo.backends import _cuda_chunk_prep as prep
from gdnzoo.backends import triton_chunk as tc
from lab.harness import patch
from lab.prefill_gpu import ab_cells


def heads(n):
    real = prep.pick_heads

    def pick(gva, ctas, n_sm):
        return n if gva % n == 0 else real(gva, ctas, n_sm)
    return patch(prep, pick_heads=pick)


def variants(a):
    out = {"tree": patch(tc), "no-tail-pdl": patch(tc, TAIL_PDL=False)}
    for n in a.heads:
        out[f"heads-{n}"] = heads(n)
    return out


def main():
    ab_cells(__doc__, variants, cells="4,8:1x8192",
             more_args=lambda ap: ap.add_argument(
                 "--heads", type=lambda s: [int(x) for x in s.split(",") if x], default=[2]))


if __name__ == "__main__":
    main()

"""A/B of cuda-v4's bf16 verify rows on the H200 where the 2026-11-30 tune (states form only)
left cells over the 15% floor bar or slower in another form (bf16 T=4 B=16 states+update:
8.61 us on the H100's row, 9.95 on the tuned one): the table row, the H100's rows and the
tune's best second-stage shapes, in the verify bench's three forms (lab/verify_ab.py: gated
per form against the float64 reference, R interleaved rounds beside the same-run floor).
Run from the checkout's root:

    python3 lab/notebook/h200/verify/ab-rows/ab_rows.py bf16 4,8 4,16 5
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from lab.verify_ab import main  # noqa: E402

CANDS = {  # B -> shapes besides the row: (warps, row_groups, lanes_per_row, hint, fast_gates,
           # -, -, qk_mode, chunk, ahead, head_scalars)
    4: [(8, 1, 16, 3, 1, 0, 0, 2, 0, 3, 1), (8, 2, 16, 3, 1, 0, 0, 2, 0, 3, 1),   # the H100's
        (1, 1, 8, 3, 1, 0, 0, 2, 0, 1, 1), (2, 2, 16, 3, 1, 0, 0, 2, 0, 3, 1),
        (4, 1, 8, 3, 1, 0, 0, 2, 0, 1, 1), (2, 2, 16, 0, 1, 0, 0, 2, 0, 3, 1)],
    16: [(4, 4, 16, 3, 1, 0, 0, 2, 0, 3, 0), (4, 2, 8, 3, 0, 0, 0, 2, 0, 0, 0),   # the H100's
         (4, 2, 16, 3, 1, 0, 0, 2, 0, 3, 1), (2, 2, 8, 2, 1, 0, 0, 2, 0, 1, 1),
         (4, 4, 16, 2, 1, 0, 0, 2, 0, 1, 1), (2, 2, 16, 3, 1, 0, 0, 2, 0, 3, 1),
         (4, 2, 8, 2, 1, 0, 0, 2, 0, 1, 1)],
}

main(lambda B, T: CANDS[B])

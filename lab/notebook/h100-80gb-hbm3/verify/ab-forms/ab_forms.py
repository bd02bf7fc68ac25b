"""A/B of cuda-v4 launch shapes in the verify bench's three forms (its inputs, pool, indices,
gate and kernel clock): each shape is put in place of the table row, gated per form against
the float64 reference, then timed in R interleaved rounds beside the same-run floor
(lab/verify_ab.py; forms_ab.log is this script's output, run from the checkout's root):

    python3 lab/notebook/h100-80gb-hbm3/verify/ab-forms/ab_forms.py fp32,bf16 2,4,8 1,4 5
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from lab.verify_ab import main  # noqa: E402

CANDS = {  # (sd, T, B) -> extra shapes, besides the row
    1: [(8, 1, 16, 3, 1, 0, 0, 0, 2, 0), (4, 1, 16, 3, 1, 0, 0, 0, 2, 0), (2, 1, 16, 3, 1, 0, 0, 0, 2, 0),
        (4, 1, 16, 3, 1, 0, 0, 2, 0, 3), (4, 1, 16, 3, 1, 0, 0, 2, 0, 1), (2, 1, 16, 3, 1, 0, 0, 2, 0, 3),
        (1, 1, 16, 3, 1, 0, 0, 2, 0, 1), (4, 2, 16, 3, 1, 0, 0, 0, 2, 0)],
    4: [(4, 2, 16, 3, 1, 0, 0, 2, 0, 3), (8, 2, 16, 3, 1, 0, 0, 2, 0, 3), (4, 2, 8, 3, 1, 0, 0, 2, 0, 3),
        (4, 1, 8, 3, 1, 0, 0, 2, 0, 3), (2, 2, 8, 0, 1, 0, 0, 2, 0, 3), (4, 2, 16, 3, 1, 0, 0, 0, 2, 0),
        (4, 2, 8, 3, 1, 0, 0, 2, 0, 1)],
}

main(lambda B, T: CANDS[B])

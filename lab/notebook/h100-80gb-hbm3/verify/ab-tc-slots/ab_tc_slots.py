"""A/B of cuda-v4's tensor-core verify (backends/cuda_v4_tc.cu, launch rows with chunk 3) now
that it serves per-token slots too, in the verify bench's three forms (lab/verify_ab.py): per
cell the table row, "loop" (the row with chunk 0: the token loop of its other fields, what a
chunk 3 row ran for the slots form before) and "tc" (the row with chunk 3).  From the
checkout's root:

    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-slots/ab_tc_slots.py fp32,bf16 2,4,8 1,2 3
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from gdnzoo.backends import cuda_v4  # noqa: E402
from lab.verify_ab import main  # noqa: E402


def loop_and_tc(row):
    """The row's token loop (chunk 0) and the row with chunk 3, its other fields unchanged."""
    c = cuda_v4.full_config(row)
    return {"loop": c[:8] + (0,) + c[9:], "tc": c[:8] + (3,) + c[9:]}


if __name__ == "__main__":
    main(lambda B, T: [], extra=loop_and_tc)

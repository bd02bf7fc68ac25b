"""A/B of the B = 1 verify rows against one-chunk launch shapes in the verify bench's three forms
(lab/verify_ab.py), from the checkout's root:

    CHUNK=1 python3 lab/notebook/h100-80gb-hbm3/verify/ab-b1/ab_chunk.py bf16,fp32 8 1 3
    CHUNK=3 python3 lab/notebook/h100-80gb-hbm3/verify/ab-b1/ab_chunk.py fp32,bf16 8,4 1 3

The first is chunk1_ab.log; the second, chunk3_ab.log, needs
../experiments-notkept/chunk3_block_solve.patch applied (the current cuda_v4.py refuses 3).
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from lab.verify_ab import main  # noqa: E402

CHUNK = int(os.environ.get("CHUNK", "3"))
SHAPES = {1: [(4, 1, 16), (8, 1, 16), (2, 1, 16), (4, 2, 16), (8, 1, 32), (4, 1, 8)],
          3: [(4, 1, 16), (8, 1, 16), (2, 1, 16), (4, 2, 16), (8, 1, 32), (4, 1, 32), (4, 1, 8),
              (2, 2, 8)]}[CHUNK]

main(lambda B, T: [(w, rw, lpr, 3, 1, 0, 0, 0, CHUNK) for w, rw, lpr in SHAPES])

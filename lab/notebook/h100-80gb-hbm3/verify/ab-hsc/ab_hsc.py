"""A/B of cuda-v4 with the head's per-token scalars from the block (config field head_scalars)
against the H100 verify rows, in the verify bench's three forms (lab/verify_ab.py), from the
checkout's root:

    HSC_RUN=1 python3 lab/notebook/h100-80gb-hbm3/verify/ab-hsc/ab_hsc.py fp32,bf16 8,4,2 1,4 3
    python3 lab/notebook/h100-80gb-hbm3/verify/ab-hsc/ab_hsc.py fp32,bf16 8,4 1,4 3

The first is run 1 (hsc_ab.log), the second run 2 (hsc2_ab.log).  Run 2 also timed
head_scalars 2 (the q/k rows left in shared memory for the token loop:
../experiments-notkept/head_scalars2_qk_rows.patch, not kept; the current cuda_v4.py refuses
the value 2, so run 2's candidates need that patch and its host side: q/k mode 0, ahead 3 as 1).
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from lab.verify_ab import main  # noqa: E402

RUN = int(os.environ.get("HSC_RUN", "2"))


def CANDS_RUN1(B, T):
    """Run 1: shapes beside the row, each with head_scalars 1."""
    shapes = [(4, 1, 16), (8, 1, 16), (2, 1, 16), (4, 1, 32), (8, 1, 32)] if B == 1 else \
        [(4, 2, 16), (8, 2, 16), (4, 1, 16), (8, 1, 16), (4, 1, 32), (8, 1, 32)]
    return [(w, rw, lpr, 3, 1, 0, 0, 2 if lpr <= 16 else 0, 0, 3, 1) for w, rw, lpr in shapes]


def CANDS(B, T):
    """Shapes beside the row: HSC 2 (q/k rows from the block too) and the HSC 1 leaders of the
    first A/B (hsc_ab.log)."""
    s2 = [(4, 1, 16), (8, 1, 16), (2, 1, 16), (4, 1, 32), (8, 1, 32)] if B == 1 else \
        [(4, 2, 16), (8, 2, 16), (4, 1, 16), (8, 1, 16), (4, 1, 32)]
    s1 = [(8, 1, 32, 0), (4, 1, 16, 2)] if B == 1 else [(8, 2, 16, 2), (8, 1, 16, 2)]
    return [(w, rw, lpr, 3, 1, 0, 0, 0, 0, 1, 2) for w, rw, lpr in s2] + \
        [(w, rw, lpr, 3, 1, 0, 0, q, 0, 3, 1) for w, rw, lpr, q in s1]


def extra(row):
    """A token-loop row also with head_scalars 1 (and, run 2, with 2)."""
    if row[8]:
        return {}
    return {"row+hs": row[:10] + (1,), **({"row+hs2": row[:7] + (0, 0, 1, 2)} if RUN == 2 else {})}


main(CANDS_RUN1 if RUN == 1 else CANDS, extra)

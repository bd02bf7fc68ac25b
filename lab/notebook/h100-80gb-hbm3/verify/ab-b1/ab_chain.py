"""A/B of the B = 1 verify rows with their dot-product slices as fused multiply-add chains
(config field chain 2 and 4) in the verify bench's three forms (lab/verify_ab.py), from the
checkout's root:

    python3 lab/notebook/h100-80gb-hbm3/verify/ab-b1/ab_chain.py fp32,bf16 8,4 1 5
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from lab.verify_ab import main  # noqa: E402


def extra(row):
    """The row with chains of 2 and of 4."""
    return {f"row+chain{c}": row[:5] + (c,) + row[6:] for c in (2, 4)}


main(lambda B, T: [], extra)

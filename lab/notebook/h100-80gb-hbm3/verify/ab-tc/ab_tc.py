"""A/B of cuda-v4's tensor-core verify (launch rows with chunk 3, backends/cuda_v4_tc.cu)
against the H100 verify rows, in the verify bench's three forms (lab/verify_ab.py; the slots
form, which the tensor-core kernel does not serve, runs the row's token loop in both), from the
checkout's root:

    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc/ab_tc.py fp32,bf16 2,4,8 1,2,4 3
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from gdnzoo.backends import cuda_v4  # noqa: E402
from lab.verify_ab import main  # noqa: E402


def with_tc(row):
    """The row with chunk 3: its other fields stay, the fallback of the calls tc cannot serve."""
    c = cuda_v4.full_config(row)
    return {"tc": c[:8] + (3,) + c[9:]}


if __name__ == "__main__":
    main(lambda B, T: [], extra=with_tc)

"""A/B of versions of cuda-v4's tensor-core verify (backends/cuda_v4_tc.cu) at the table row
with chunk 3, in the verify bench's three forms through lab/verify_ab.py (its gate and timing):
each NAME=PATH source is compiled in place of the backend's for the calls of that name; "row"
is the table row with the checkout's source.  From the checkout's root:

    git show 19f90a8:backends/cuda_v4_tc.cu > /tmp/tc_old.cu
    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-coef/ab_src.py bf16,fp32 4,8 1 3 \\
        old=/tmp/tc_old.cu new=backends/cuda_v4_tc.cu
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
from gdnzoo.backends import cuda_v4  # noqa: E402
from lab import verify_ab as va  # noqa: E402

SOURCES = {n: Path(p).resolve() for n, p in (a.split("=", 1) for a in sys.argv[5:])}
BACKEND_SOURCE = cuda_v4.TC_SOURCE


def with_sources(row):
    """One entry a source, each the row with chunk 3."""
    c = cuda_v4.full_config(row)
    return {name: c[:8] + (3,) + c[9:] for name in SOURCES}


BACKEND_THREADS = cuda_v4.tc_threads


def threads_rule(text):
    """The threads a block of a source (its NT): 288 before the loader made the Gram entries."""
    return BACKEND_THREADS if "LOADER_GRAM" in text else (lambda sd, T: 288)


def use(name, cfg):
    cuda_v4.TC_SOURCE = SOURCES.get(name, BACKEND_SOURCE)
    cuda_v4.tc_threads = threads_rule(Path(cuda_v4.TC_SOURCE).read_text())
    va._use(cfg)


if __name__ == "__main__":
    del sys.argv[5:]
    try:
        va.main(lambda B, T: [], extra=with_sources, use=use)
    finally:
        cuda_v4.TC_SOURCE, cuda_v4.tc_threads = BACKEND_SOURCE, BACKEND_THREADS

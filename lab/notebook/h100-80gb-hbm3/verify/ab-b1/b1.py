"""What diag.py and timeline.py share: the B = 1 verify cells of the contest geometry in the
verify bench's convention (lab/verify_ab.py), each with its table row, and a launch of a row with
diag_patch.py's switches defined (``use``)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout
import torch  # noqa: E402

from bench import clocks, shapes  # noqa: E402
from bench import pool as serving  # noqa: E402
from bench import verify as vb  # noqa: E402
from gdnzoo.backends import _cuda_build as cb, cuda_v4  # noqa: E402
from lab import verify_ab as va  # noqa: E402

XDEFS = []                       # diag_patch.py switches of the next build, each -D<name>=1
_options = cb.nvrtc_options
cb.nvrtc_options = lambda defs, arch: _options(defs, arch) + [f"-D{d}=1" for d in XDEFS]
ROW = cuda_v4.table_config


def use(cfg, xd=()):
    """Every cuda-v4 launch from now on takes ``cfg``, built with the switches ``xd``."""
    XDEFS[:] = xd
    va._use(cfg)
    cb._kernels.clear()          # the loaded-kernel memo keys on the defines, not on XDEFS


def cells(sds, ts):
    """(sd, T, ctx, row) for each state dtype and token count at B = 1."""
    G, l2, gpu = va.G, clocks.l2_bytes(), torch.cuda.get_device_name()
    for sd in sds:
        dt = shapes.DTYPES[sd]
        P = vb.pool_slots([(1, T) for T in ts], G.HV, G.V, G.K, dt.itemsize, l2)
        sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
        for T in ts:
            ctx = vb.make_ctx(1, T, sd, sp, G, l2, "cuda", 0)
            yield sd, T, ctx, cuda_v4.full_config(ROW(gpu, dt, 1, G.H, G.HV, G.K, G.V, True, T,
                                                      True, True))

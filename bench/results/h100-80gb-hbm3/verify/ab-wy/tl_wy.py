"""clock64 timeline of wy.cu per warp (B = 1, states form), SM cycles between its marks:
0 start, 1 slot known, 2 Gram summed (second barrier), 3 the head's coefficients in registers,
4 the state in registers, 5 the row's y gathered (after the sums' barrier), 6 w_t, 7 end.
python3 bench/results/h100-80gb-hbm3/verify/ab-wy/tl_wy.py bf16 8"""
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import clocks, shapes  # noqa: E402
from bench import pool as serving  # noqa: E402
from bench import verify as vb  # noqa: E402
from lab import verify_ab as va  # noqa: E402
import wy  # noqa: E402

cu = ctypes.CDLL("libcuda.so.1")


def read_xt(module, nw):
    ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    assert cu.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(module),
                                   b"wy_xt") == 0
    a = np.zeros(4096 * 8, dtype=np.uint64)
    torch.cuda.synchronize()
    assert cu.cuMemcpyDtoH_v2(a.ctypes.data_as(ctypes.c_void_p), ptr, ctypes.c_size_t(a.nbytes)) == 0
    return a.reshape(4096, 8)[:nw].astype(np.int64)


extra = [tuple(x.split("=")) for x in sys.argv[3:]]
extra = [(k, int(v)) for k, v in extra]
G, l2 = va.G, clocks.l2_bytes()
for sd in sys.argv[1].split(","):
    dt = shapes.DTYPES[sd]
    ts = [int(t) for t in sys.argv[2].split(",")]
    P = vb.pool_slots([(1, T) for T in ts], G.HV, G.V, G.K, dt.itemsize, l2)
    sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
    for T in ts:
        ctx = vb.make_ctx(1, T, sd, sp, G, l2, "cuda", 0)
        for name, ex in [("plain", extra), ("xtime", extra + [("WY_XTIME", 1)])]:
            call = wy.make_call(ctx, "states", tuple(ex))
            chk = vb.check_entry(vb.Entry(call, ""), ctx, "states")
            for _ in range(20):
                ctx.ix.advance(); call(ctx.ix.index)
            torch.cuda.synchronize()
            busy, _, m = serving._timed(call, ctx.ix, 200, 5.0)
            line = f"{sd} T={T} {name} ok={chk['ok']} kernel {statistics.median(busy):.3f} us"
            if name == "xtime":
                ctx.ix.advance(); call(ctx.ix.index); torch.cuda.synchronize()
                xt = read_xt(call.kern.module, 128 * 8)
                d = [int(np.median(xt[:, i + 1] - xt[:, i])) for i in range(7)]
                line += f" | deltas {d} total {int(np.median(xt[:, 7] - xt[:, 0]))}"
                for wi in range(8):
                    sub = xt[wi::8]
                    line += f"\n    warp {wi}: " + str([int(np.median(sub[:, i + 1] - sub[:, i])) for i in range(7)])
            print(line, flush=True)

"""In-kernel clock64 timeline of the B=1 verify rows (diagnostic, patched copy): per warp, the
load phase (kernel start to the state in registers), each token, the late stores, in cycles."""
import ctypes, statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
import numpy as np, torch
from lab import verify_ab as va
from gdnzoo.backends import _cuda_build as cb, cuda_v4
from bench import clocks, shapes
from bench import pool as serving
from bench import verify as vb

XDEFS = []
_o = cb.nvrtc_options
cb.nvrtc_options = lambda defs, arch: _o(defs, arch) + [f"-D{d}=1" for d in XDEFS]
cu = ctypes.CDLL("libcuda.so.1")

def read_xt(module):
    ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    r = cu.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(module), b"gdn_xt")
    assert r == 0, r
    a = np.zeros(4096 * 12, dtype=np.uint64)
    torch.cuda.synchronize()
    r = cu.cuMemcpyDtoH_v2(a.ctypes.data_as(ctypes.c_void_p), ptr, ctypes.c_size_t(a.nbytes))
    assert r == 0, r
    return a.reshape(4096, 12)

G = va.G; l2 = clocks.l2_bytes(); gpu = torch.cuda.get_device_name(); orig = cuda_v4.table_config
for sd, T in [("bf16", 8), ("fp32", 8), ("bf16", 4)]:
    dt = shapes.DTYPES[sd]
    P = vb.pool_slots([(1, T)], G.HV, G.V, G.K, dt.itemsize, l2)
    sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
    ctx = vb.make_ctx(1, T, sd, sp, G, l2, "cuda", 0)
    row = cuda_v4.full_config(orig(gpu, dt, 1, G.H, G.HV, G.K, G.V, True, T, True, True))
    nw = 1024 // (32 // row[2]) // row[1]
    for name, xd in [("row", []), ("nostore", ["GDN_XNOSTORE"]), ("late", ["GDN_XLATE"]), ("nobfly", ["GDN_XNOBFLY"])]:
        XDEFS[:] = xd + ["GDN_XTIME"]
        va._use(row); cb._kernels.clear()
        e = vb.entry_call("cuda-v4", "states", ctx)
        for _ in range(20):
            ctx.ix.advance(); e.call(ctx.ix.index)
        torch.cuda.synchronize()
        busy, _, m = serving._timed(e.call, ctx.ix, 200, 5.0)
        ctx.ix.advance(); e.call(ctx.ix.index); torch.cuda.synchronize()
        (k,) = list(cb._kernels.values())
        xt = read_xt(k.module)[:nw].astype(np.int64)
        load = xt[:, 1] - xt[:, 0]
        tok = [xt[:, 2 + t] - xt[:, 1 + t] for t in range(T - 1)] + [xt[:, T + 1] - xt[:, T]]
        late = xt[:, T + 2] - xt[:, T + 1]
        tot = xt[:, T + 2] - xt[:, 0]
        med = lambda a: int(np.median(a))
        print(f"{sd} T={T} {name:8s} kernel {statistics.median(busy):.3f} us | warps {nw} cycles: load {med(load)} "
              f"tokens {[med(a) for a in tok]} late {med(late)} total {med(tot)} (max {int(tot.max())})", flush=True)

"""Launcher of the wy.cu and wy2.cu prototypes over a verify-bench cell (bench/verify.py CellCtx)."""
import ctypes
from pathlib import Path

import torch

from gdnzoo.backends import _cuda_build as cb

HERE = Path(__file__).parent
THREADS = {"wy": 256, "wy2": 288}                   # wy2: 8 compute warps and the loader
_SPEC = [("idx k q v a b A_log dt_bias inter_idx", "p"), ("qk_n qk_t v_n v_t ab_n ab_t", "l"),
         ("P null_slot", "i"), ("state", "p"), ("s_n", "l"), ("inter out", "p"), ("S", "i"),
         ("scale", "f"), ("never", "i")]
_T = {"p": ctypes.c_void_p, "l": ctypes.c_longlong, "f": ctypes.c_float, "i": ctypes.c_int}


_SPEC2 = [("idx qkv ab A_log dt_bias inter_idx state", "p"), ("s_n", "l"), ("P null_slot", "i"),
          ("inter out", "p"), ("S", "i"), ("scale", "f")]


class WyParams(ctypes.Structure):
    _fields_ = [(n, _T[k]) for names, k in _SPEC for n in names.split()]


class Wy2Params(ctypes.Structure):
    _fields_ = [(n, _T[k]) for names, k in _SPEC2 for n in names.split()]


def kernel(T, sd, update, extra=(), which="wy"):
    defs = tuple(sorted({"WY_T": T, "WY_HV": 8, "WY_GVA": 2, **({"WY_ROW": 2048} if which == "wy2" else {}),
                         "WY_SD": 0 if sd == "fp32" else 1, "WY_UPD": int(update),
                         **dict(extra)}.items()))
    return cb.get_kernel(HERE / f"{which}.cu", "wy_verify", defs, torch.cuda.current_device())


def make_call(ctx, form, extra=(), which="wy"):
    assert form in ("states", "states+update")
    x, st = ctx.x, ctx.pool.state
    kern = kernel(ctx.T, ctx.sd, form == "states+update", extra, which)
    dev = torch.cuda.current_device()
    B = ctx.B
    # What wy.cu compiles in: the contest geometry, int32 indices and slot counts.
    assert tuple(x.q.shape[2:]) == (4, 128) and tuple(x.v.shape[2:]) == (8, 128)
    assert st.shape[0] < 2**31 and ctx.inter.shape[0] < 2**31
    assert x.q.stride(2) == 128 and x.k.stride() == x.q.stride() and x.q.stride(3) == 1
    assert x.a.stride() == x.b.stride() and x.v.stride(2) == 128
    if which == "wy2":   # the packed views wy2.cu compiles in: q | k | v rows of 2048, a | b of 16
        e = 2
        assert x.q.stride()[:2] == (ctx.T * 2048, 2048) and x.k.data_ptr() == x.q.data_ptr() + 512 * e
        assert x.v.data_ptr() == x.q.data_ptr() + 1024 * e and x.v.stride()[:2] == x.q.stride()[:2]
        assert x.a.stride()[:2] == (ctx.T * 16, 16) and x.b.data_ptr() == x.a.data_ptr() + 8 * e
        prm = Wy2Params(qkv=x.q.data_ptr(), ab=x.a.data_ptr(), A_log=x.A_log.data_ptr(),
                        dt_bias=x.dt_bias.data_ptr(), state=st.data_ptr(), s_n=st.stride(0),
                        P=st.shape[0], null_slot=0, inter=ctx.inter.data_ptr(),
                        out=x.out.data_ptr(), S=ctx.inter.shape[0], scale=float(x.scale))
    else:
        prm = WyParams(q=x.q.data_ptr(), k=x.k.data_ptr(), v=x.v.data_ptr(), a=x.a.data_ptr(),
                       b=x.b.data_ptr(), A_log=x.A_log.data_ptr(), dt_bias=x.dt_bias.data_ptr(),
                       state=st.data_ptr(), inter=ctx.inter.data_ptr(), out=x.out.data_ptr(),
                       qk_n=x.q.stride(0), qk_t=x.q.stride(1), v_n=x.v.stride(0), v_t=x.v.stride(1),
                       ab_n=x.a.stride(0), ab_t=x.a.stride(1), s_n=st.stride(0), P=st.shape[0],
                       S=ctx.inter.shape[0], null_slot=0, scale=float(x.scale))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(prm))
    assert x.A_log.dtype == torch.float32 and x.dt_bias.dtype == torch.float32
    assert x.out.is_contiguous() and ctx.inter.is_contiguous()

    def call(ix):
        prm.idx = ix.slots.data_ptr()
        prm.inter_idx = ix.rows.data_ptr()
        cb.launch_raw(kern.func, B * 8 * 16, THREADS[which], dev, ctypes.addressof(argv))
        return x.out
    call.kern = kern
    call._keep = (prm, argv)
    return call

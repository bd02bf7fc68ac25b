"""clock64 timeline per warp (B = 1, states form), SM cycles between the kernel's marks.
wy.cu: 0 start, 1 slot known, 2 Gram summed (second barrier), 3 the head's coefficients in
registers, 4 the state in registers, 5 the row's y gathered (after the sums' barrier), 6 w_t,
7 end.  wy2.cu, compute warps: 0 start, 1 Gram summed, 2 coefficients and k in registers,
3 past the loader's barrier, 4 the state in registers, 5 y gathered, 6 w_t, 7 end; its loader
warp (last line): 0 start, 1 slot known, 2 the state rows in shared memory.  wy2's "fine" marks
(compute warps, program order): start, every input in, gates, gate products, Gram summed, norms,
L and N stored, L and N in registers, bv, k unpacked, past the barrier, state in registers, y,
w_t, end.
python3 lab/notebook/h100-80gb-hbm3/verify/ab-wy/tl_wy.py bf16 8 [wy|wy2] [NAME=VALUE ...]"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import pool as serving  # noqa: E402
from bench import verify as vb  # noqa: E402
from lab import verify_ab as va  # noqa: E402
from lab.clock_marks import read_u64  # noqa: E402
import wy  # noqa: E402


def read_xt(module, nw):
    a = read_u64(module, "wy_xt")
    nm = 16 if a.size >= 4608 * 16 else 8
    return a.reshape(-1, nm)[:nw].astype(np.int64)


which = sys.argv[3] if len(sys.argv) > 3 and "=" not in sys.argv[3] else "wy"
NWB = 9 if which == "wy2" else 8                   # warps a block
extra = [tuple(x.split("=")) for x in sys.argv[3:] if "=" in x]
extra = [(k, int(v)) for k, v in extra]
for sd in sys.argv[1].split(","):
    for _, T, ctx in va.contexts(sd, [(1, int(t)) for t in sys.argv[2].split(",")]):
        for name, ex in [("plain", extra), ("xtime", extra + [("WY_XTIME", 1)])]:
            call = wy.make_call(ctx, "states", tuple(ex), which)
            chk = vb.check_entry(vb.Entry(call, ""), ctx, "states")
            for _ in range(20):
                ctx.ix.advance(); call(ctx.ix.index)
            torch.cuda.synchronize()
            busy, _, m = serving._timed(call, ctx.ix, 200, 5.0)
            line = f"{which} {sd} T={T} {name} ok={chk['ok']} kernel {statistics.median(busy):.3f} us"
            if name == "xtime":
                ctx.ix.advance(); call(ctx.ix.index); torch.cuda.synchronize()
                xt = read_xt(call.kern.module, 128 * NWB)
                cw = np.concatenate([xt[wi::NWB] for wi in range(8)])
                if xt.shape[1] == 16:   # wy2's finer marks, in program order
                    order = [0, 14, 12, 13, 1, 8, 9, 10, 11, 2, 3, 4, 5, 6, 7]
                    f = [int(np.median(cw[:, order[i + 1]] - cw[:, order[i]])) for i in range(14)]
                    line += f" | fine {f}"
                    xt = xt[:, :8]
                    cw = cw[:, :8]
                d = [int(np.median(cw[:, i + 1] - cw[:, i])) for i in range(7)]
                line += f" | deltas {d} total {int(np.median(cw[:, 7] - cw[:, 0]))}"
                for wi in range(NWB):
                    sub = xt[wi::NWB]
                    nd = 2 if wi == 8 else 7
                    line += (f"\n    {'loader' if wi == 8 else 'warp'} {wi}: "
                             + str([int(np.median(sub[:, i + 1] - sub[:, i])) for i in range(nd)]))
                if NWB == 9:   # when the loader arrived, from the compute warps' start
                    ld = xt[8::9]
                    line += (f"\n    loader's state in smem at {int(np.median(ld[:, 2] - ld[:, 0]))}, "
                             f"compute warps past the barrier at {int(np.median(cw[:, 3] - cw[:, 0]))}")
            print(line, flush=True)

"""clock64 timeline of versions of backends/cuda_v4_tc.cu at B = 1 (states form, the contest
geometry), in SM cycles from the compute warps' start (medians over the 128 blocks' warps), and
each version's kernel time (CUPTI median of 200 calls; a patched copy runs slower than the plain
source).  A source whose file name contains "xt" is a copy with xt_patch.py's marks.  From the
checkout's root, with a GPU:

    git show 4368003:backends/cuda_v4_tc.cu > /tmp/tc_old.cu
    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-fence/xt_patch.py /tmp/tc_old.cu /tmp/xt_old.cu
    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-fence/xt_patch.py backends/cuda_v4_tc.cu /tmp/xt_new.cu
    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-fence/tl_tc.py bf16,fp32 8,4 \\
        xt_old=/tmp/xt_old.cu xt_new=/tmp/xt_new.cu

Marks: gram-part (the Gram partials stored, first barrier), gram-sum (summed, second barrier),
coef (the coefficients in registers), past-bar1 (past the loader's barrier), state-regs (the
state in registers), sums (past the sums' barrier), w (the last w_t in the old kernel; token
0's store issued in the new), end (the last store issued); the loader's "issued" (its copies
issued: the slot known) and "arrive" (the state rows in shared memory)."""
import statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd()))
import numpy as np, torch
from gdnzoo.backends import cuda_v4
from gdnzoo.backends import _cuda_build as cb
from gdnzoo.bench import shapes
from gdnzoo.bench import pool as serving
from gdnzoo.bench import verify as vb
from lab import verify_ab as va
from lab.clock_marks import read_u64

def read_xt(module, nrow):
    return read_u64(module, "tc_xt").reshape(-1, 10)[:nrow].astype(np.int64)

srcs = dict(a.split("=") for a in sys.argv[3:])
G, gpu = va.G, torch.cuda.get_device_name()
orig_src, orig_tab = cuda_v4.TC_SOURCE, cuda_v4.table_config
NAMES = ["gram-part", "gram-sum", "coef", "past-bar1", "state-regs", "sums", "w", "end"]
for sd in sys.argv[1].split(","):
    dt = shapes.DTYPES[sd]
    for _, T, ctx in va.contexts(sd, [(1, int(t)) for t in sys.argv[2].split(",")]):
        row = cuda_v4.full_config(orig_tab(gpu, dt, 1, G.H, G.HV, G.K, G.V, True, T, True, True))
        row = row[:8] + (3,) + row[9:]
        for name, path in srcs.items():
            cuda_v4.TC_SOURCE = Path(path).resolve()
            va._use(row)
            e = vb.entry_call("cuda-v4", "states", ctx)
            chk = vb.check_entry(e, ctx, "states")
            for _ in range(20):
                ctx.ix.advance(); e.call(ctx.ix.index)
            torch.cuda.synchronize()
            busy, _, m = serving._timed(e.call, ctx.ix, 200, 5.0)
            ctx.ix.advance(); e.call(ctx.ix.index); torch.cuda.synchronize()
            kern = [k for key, k in cb._kernels.items() if key[1] == str(cuda_v4.TC_SOURCE)]
            line = f"{sd} T={T} {name:6s} ok={chk['ok']} kernel {statistics.median(busy):.3f} us"
            names = NAMES
            if Path(path).read_text().startswith("// xt marks: coef"):   # xt_patch.py --coef
                names = NAMES[:5] + ["pairs", "syncwarp"] + NAMES[7:]
            if "xt" in Path(path).name and kern:
                xt = read_xt(kern[-1].module, 128 * 9)
                cw = np.concatenate([xt[w::9] for w in range(8)])
                ld = xt[8::9]
                med = lambda a: int(np.median(a))
                line += " | compute " + " ".join(f"{names[i - 1]} {med(cw[:, i] - cw[:, 0])}" for i in range(1, 9))
                line += f" | max end {int((cw[:, 8] - cw[:, 0]).max())}"
                line += f" | loader (from its start) issued {med(ld[:, 1] - ld[:, 0]) if ld[:, 1].any() else '-'} arrive {med(ld[:, 2] - ld[:, 0])}"
                line += f" | loader start - compute start {med(ld[:, 0] - xt[0::9, 0])}"
                if "tc_gt" in Path(path).read_text():
                    gt = read_u64(kern[-1].module, "tc_gt").reshape(-1, 2)[:128 * 9].astype(np.int64)
                    gt = np.concatenate([gt[w::9] for w in range(8)])
                    e = gt[:, 1] - gt[:, 0].min()
                    line += (f" | gt span {int(gt[:, 1].max() - gt[:, 0].min())} ns, start spread "
                             f"{int(gt[:, 0].max() - gt[:, 0].min())} ns, warp median {med(gt[:, 1] - gt[:, 0])} ns, "
                             f"end p50/p90/max {med(e)}/{int(np.percentile(e, 90))}/{int(e.max())} ns, "
                             f"GHz {np.median((cw[:, 8] - cw[:, 0]) / np.maximum(gt[:, 1] - gt[:, 0], 1)):.2f}")
            print(line, flush=True)
cuda_v4.TC_SOURCE, cuda_v4.table_config = orig_src, orig_tab

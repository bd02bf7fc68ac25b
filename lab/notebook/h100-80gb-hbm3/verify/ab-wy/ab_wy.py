"""Gate and time the wy.cu and wy2.cu prototypes and cuda-v4's tensor-core verify (the row with
chunk 3) beside the cuda-v4 table row and the verify floor at
B = 1 (states, states+update): python3 lab/notebook/h100-80gb-hbm3/verify/ab-wy/ab_wy.py fp32,bf16 4,8 [rounds] [B]"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from bench import clocks, shapes  # noqa: E402
from bench import pool as serving  # noqa: E402
from bench import verify as vb  # noqa: E402
from gdnzoo.backends import cuda_v4  # noqa: E402
from lab import verify_ab as va  # noqa: E402
import wy  # noqa: E402

FORMS = ("states", "states+update")


def main():
    sds = sys.argv[1].split(",")
    ts = [int(t) for t in sys.argv[2].split(",")]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    bs = [int(b) for b in sys.argv[4].split(",")] if len(sys.argv) > 4 else [1]
    G, l2, gpu = va.G, clocks.l2_bytes(), torch.cuda.get_device_name()
    orig = cuda_v4.table_config
    t0 = time.time()
    for sd in sds:
        dt = shapes.DTYPES[sd]
        cells = [(B, T) for T in ts for B in bs]
        P = vb.pool_slots(cells, G.HV, G.V, G.K, dt.itemsize, l2)
        sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
        for B, T in cells:
            ctx = vb.make_ctx(B, T, sd, sp, G, l2, "cuda", 0)
            row = cuda_v4.full_config(orig(gpu, dt, B, G.H, G.HV, G.K, G.V, True, T, True, True))
            for form in FORMS:
                calls = {}
                va._use(row)
                e = vb.entry_call("cuda-v4", form, ctx)
                chk = vb.check_entry(e, ctx, form)
                assert chk["ok"], chk
                calls["row"] = e.call
                for which in ("wy", "wy2"):
                    wc = wy.make_call(ctx, form, which=which)
                    chk = vb.check_entry(vb.Entry(wc, ""), ctx, form)
                    k = wc.kern
                    print(f"  {which} {sd} B={B} T={T} {form}: ok={chk['ok']} {chk['reason']} "
                          f"out {chk['max_abs_err_out']:.2e} state {chk['max_abs_err_state']:.2e} "
                          f"regs {k.num_regs} local {k.local_bytes}", flush=True)
                    if chk["ok"]:
                        calls[which] = wc
                # cuda-v4's tensor-core verify: the row with chunk 3 (backends/cuda_v4_tc.cu)
                tc = row[:8] + (3,) + row[9:]
                va._use(tc)
                e = vb.entry_call("cuda-v4", form, ctx)
                chk = vb.check_entry(e, ctx, form)
                served = [b.tc is not None and b.tc in b.launches.values()
                          for b in cuda_v4._binds.values()]
                print(f"  tc {sd} B={B} T={T} {form}: ok={chk['ok']} {chk['reason']} "
                      f"tensor-core kernel bound: {served}", flush=True)
                if chk["ok"]:
                    calls["tc"] = e.call
                va.time_rounds(ctx, form, calls, rounds,
                               lambda name: va._use(tc if name == "tc" else row),
                               f"{sd} B={B} T={T} {form:13s} [{time.time() - t0:.0f}s]")
                print(f"  after timing: launches "
                      f"{[(sorted(b.launches), b.tc is not None) for b in cuda_v4._binds.values()]}",
                      flush=True)
            del ctx
        del sp
        torch.cuda.empty_cache()
    cuda_v4.table_config = orig


if __name__ == "__main__":
    main()

"""A/B of versions of cuda-v4's tensor-core verify (backends/cuda_v4_tc.cu) at the table row
with chunk 3, in the verify bench's three forms (lab/verify_ab.py's convention and timing): each
NAME=PATH source is compiled in place of the backend's and gated against the float64 reference
first; "row" is the table row with the checkout's source.  From the checkout's root:

    git show 19f90a8:backends/cuda_v4_tc.cu > /tmp/tc_old.cu
    python3 bench/results/h100-80gb-hbm3/verify/ab-tc-coef/ab_src.py bf16,fp32 4,8 1 3 \\
        old=/tmp/tc_old.cu new=backends/cuda_v4_tc.cu
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))     # the checkout, for lab/
import torch  # noqa: E402

from gdnzoo.backends import cuda_v4  # noqa: E402
from gdnzoo.bench import clocks, shapes  # noqa: E402
from gdnzoo.bench import pool as serving  # noqa: E402
from gdnzoo.bench import verify as vb  # noqa: E402
from lab import verify_ab as va  # noqa: E402


def main():
    sds, ts = sys.argv[1].split(","), [int(x) for x in sys.argv[2].split(",")]
    bs, rounds = [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
    srcs = {n: Path(p).resolve() for n, p in (a.split("=", 1) for a in sys.argv[5:])}
    G, gpu, orig, orig_src = va.G, torch.cuda.get_device_name(), cuda_v4.table_config, \
        cuda_v4.TC_SOURCE
    t0 = time.time()
    try:
        for sd in sds:
            dt, l2 = shapes.DTYPES[sd], clocks.l2_bytes()
            cells = [(B, T) for T in ts for B in bs]
            P = vb.pool_slots(cells, G.HV, G.V, G.K, dt.itemsize, l2)
            sp = serving.StatePool(P, G.HV, G.V, G.K, dt, "cuda")
            for B, T in cells:
                ctx = vb.make_ctx(B, T, sd, sp, G, l2, "cuda", 0)
                row = cuda_v4.full_config(orig(gpu, dt, B, G.H, G.HV, G.K, G.V, True, T, True,
                                               True))
                tc = row[:8] + (3,) + row[9:]

                def prepare(name, row=row, tc=tc):
                    cuda_v4.TC_SOURCE = srcs.get(name, orig_src)
                    va._use(tc if name in srcs else row)

                for form in vb.FORMS:
                    calls = {}
                    for name in ["row", *srcs]:
                        prepare(name)
                        e = vb.entry_call("cuda-v4", form, ctx)
                        chk = vb.check_entry(e, ctx, form)
                        if not chk["ok"]:
                            print("  FAIL", sd, B, T, form, name, chk["reason"], flush=True)
                            continue
                        calls[name] = e.call
                    va.time_rounds(ctx, form, calls, rounds, prepare,
                                   f"{sd} B={B} T={T} {form:13s} [{time.time() - t0:.0f}s]")
                del ctx
            del sp
            torch.cuda.empty_cache()
    finally:
        cuda_v4.table_config, cuda_v4.TC_SOURCE = orig, orig_src


if __name__ == "__main__":
    main()

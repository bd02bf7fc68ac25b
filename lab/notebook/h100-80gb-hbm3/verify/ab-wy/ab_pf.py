"""The B = 1 verify rows with and without GDN_XPF (pf_patch.py), three forms, interleaved
rounds beside the floor: python3 lab/notebook/h100-80gb-hbm3/verify/ab-wy/ab_pf.py (after pf_patch.py) fp32,bf16 4,8 [rounds]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "lab/notebook/h100-80gb-hbm3/verify/ab-b1"))
from b1 import cells, use, va  # noqa: E402
from bench import verify as vb  # noqa: E402

rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
XD = {"row": [], "pf": ["GDN_XPF"]}
for sd, T, ctx, row in cells(sys.argv[1].split(","), [int(t) for t in sys.argv[2].split(",")]):
    for form in vb.FORMS:
        calls = {}
        for name, xd in XD.items():
            use(row, xd)
            e = vb.entry_call("cuda-v4", form, ctx)
            chk = vb.check_entry(e, ctx, form)
            assert chk["ok"], (name, chk)
            calls[name] = e.call
        va.time_rounds(ctx, form, calls, rounds, lambda name: use(row, XD[name]),
                       f"{sd} T={T} {form:13s}")

"""triton-chunk's two launches at one geometry, called a few times, for a profiler to read
(``ncu -k regex:chunk_ --launch-skip 4 --launch-count 2 python3 -m lab.chunk_profile ...``:
the first two calls compile and warm up).  From the repository root:

    python -m lab.chunk_profile --geom 4/8 --seqs 1x8192 --config '{"precision": "bf16"}'
"""
from __future__ import annotations

import argparse
import json

import torch

from lab import prefill_gpu as pg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--geom", default="4/8", help="H/HV")
    p.add_argument("--seqs", default="1x8192", help="N x L")
    p.add_argument("--config", default="{}", help="triton-chunk config as JSON")
    p.add_argument("--calls", type=int, default=4)
    a = p.parse_args(argv)
    H, HV = (int(s) for s in a.geom.split("/"))
    N, L = (int(s) for s in a.seqs.split("x"))
    x = pg.make([L] * N, H, HV, seed=0)
    call = pg.ours(x, True, config=json.loads(a.config) or None)
    for _ in range(a.calls):
        call()
    torch.cuda.synchronize()
    print(f"{a.geom} {a.seqs} {a.config}: {a.calls} calls done")


if __name__ == "__main__":
    main()

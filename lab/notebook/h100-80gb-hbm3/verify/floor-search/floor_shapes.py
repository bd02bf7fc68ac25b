"""Every verify-floor launch shape at B = 1, interleaved with 60 calls each (twice), beside three
of the bench's own searches (which shape each kept): is the floor's pick noise?  From the
checkout's root, with a GPU and CuPy:
    python3 lab/notebook/h100-80gb-hbm3/verify/floor-search/floor_shapes.py fp32,bf16 8
floor_shapes.log ran before the two-round search (bench/floor.py, pick_fastest), floor_shapes_after.log
after it (fp32 only)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd()))
import torch
from gdnzoo.bench import clocks, floor
from gdnzoo.bench import verify as vb
from lab import verify_ab as va
sms = torch.cuda.get_device_properties(0).multi_processor_count
for sd in sys.argv[1].split(","):
    for _, T, ctx in va.contexts(sd, [(1, int(sys.argv[2]))]):
        for form in ("states", "states+update", "slots"):
            tg = vb.floor_target(ctx, form)
            cfgs, _ = floor.search_configs(tg.n4, sms, probe=tg, seqs=1,
                                           check=lambda v, b: floor.launchable(v, b, form=form),
                                           make=floor._verify_launcher)
            for rep in range(2):
                per, _ = clocks.interleaved_kernel_times(
                    [floor._verify_launcher(tg, c) for c in cfgs], 60, prepare=tg.prepare)
                med = sorted((clocks.summarize(s)["median"], c) for s, c in zip(per, cfgs))
                picks = [floor.verify_floor_times(tg, iters=100)["config"].split(", ")[1:3]
                         for _ in range(3)]
                print(f"{sd} T={T} {form} rep{rep}: "
                      + " | ".join(f"{c[0]}x{c[1]}x{c[2]} {m:.3f}" for m, c in med[:6])
                      + f" ... worst {med[-1][0]:.3f} ({len(cfgs)} shapes); search picks {picks}",
                      flush=True)

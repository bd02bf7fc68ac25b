"""Probe: kernel-clock step with CUPTI's own timestamps vs a small session clock vs torch.profiler."""
import collections, json, math, os, sys, time
import torch
from gdnzoo.bench import clocks
from cupti import cupti

print("cupti.get_timestamp()", cupti.get_timestamp(), "time_ns", time.time_ns(),
      "log2", round(math.log2(cupti.get_timestamp()), 3))
x = torch.zeros(1, device="cuda")
src = torch.randn(1 << 20, device="cuda")      # 4 MiB
dst = torch.empty_like(src)
cases = {"add1": lambda i: x.add_(1.0), "copy4MiB": lambda i: dst.copy_(src)}

def coarse(cupti_mod):
    return cupti_mod.get_timestamp, " (coarse: forced)"

res = {}
for name, fn in cases.items():
    for meth in ("fine", "coarse", "torchprof"):
        if meth == "torchprof":
            t = clocks._kernel_times_torch_profiler(fn, 300, 0); note = "torch.profiler"
        else:
            orig = clocks._fine_timestamps
            if meth == "coarse":
                clocks._fine_timestamps = coarse
            try:
                t, note = clocks.kernel_times(fn, 300)
            finally:
                clocks._fine_timestamps = orig
        ns = [round(v * 1000) for v in t]
        g = 0
        for v in ns: g = math.gcd(g, v)
        ctr = collections.Counter(ns).most_common(6)
        res[f"{name}/{meth}"] = dict(median=clocks.summarize(t)["median"], gcd_ns=g,
                                     distinct=len(set(ns)), top=ctr, note=note)
        print(f"{name:9s} {meth:9s} median {clocks.summarize(t)['median']:.3f} us  gcd {g} ns  "
              f"distinct {len(set(ns))}  top {ctr[:4]}  {note}", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "clk.json"), "w"), indent=1)

"""GPU check of the CUDA backends (cuda-v1, cuda-v4).  Run from the repo root:

    python3 bench/gpu_cuda.py            # writes $OUT (default /tmp/out)/gpu_cuda.{json,log}

1. correctness of both kernels vs the float64 reference (PASS/FAIL counts, failures listed);
2. accuracy of the precise and fast gates (relative error of g over a in [-30, 30]);
3. host time of an eager gdnzoo.decode(algo=...) call at B=1 and of its parts;
4. registers / local memory of every compiled cuda-v4 variant.
Launch shapes are measured by ``python3 -m gdnzoo.bench.gpu_tune`` (kernel clock).  Each part
catches its own errors.  Prints a short summary last.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from gdnzoo import cuda_build
from gdnzoo.backends import cuda_v1, cuda_v4
from gdnzoo.compare import check_close, relative_error, strict_tol
from gdnzoo.inputs import make_inputs
from gdnzoo.reference import reference_outputs

OUT = Path(os.environ.get("OUT", "/tmp/out"))
F32, BF16 = torch.float32, torch.bfloat16
DT = {"fp32": F32, "bf16": BF16}
LOG = []
RESULTS = {"correctness": [], "timing": [], "host": [], "resources": []}


def log(*a):
    s = " ".join(str(x) for x in a)
    LOG.append(s)
    print(s, flush=True)


# ------------------------------------------------------------------------------ correctness

def verdict(out, st, ro, rs, sd):
    if not (torch.isfinite(out.float()).all() and torch.isfinite(st.float()).all()):
        return "NaN/Inf (unwritten element?)"
    es, eo = relative_error(st, rs), relative_error(out, ro)
    if es > strict_tol("state", sd) or eo > strict_tol("out"):
        return f"rel err state {es:.1e} out {eo:.1e}"
    for name, a, r in (("out", out, ro), ("state", st, rs)):
        ok, ma, mr, nb = check_close(a, r)
        if not ok:
            return f"{name}: {nb} elements beyond SPEC tolerance (max abs {ma:.1e})"
    return None


def run_case(mod, x, l2, inplace, misalign=False):
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2:]
    state = x.state.clone()
    if misalign:        # a 1-element offset view: forces cuda-v4's element-load variant
        buf = torch.empty(state.numel() + 1, dtype=state.dtype, device="cuda")
        state = buf[1:].view(state.shape)
        state.copy_(x.state)
    out = torch.full((B, T, HV, V), float("nan"), dtype=x.v.dtype, device="cuda")
    ns = state if inplace else torch.full_like(state, float("nan"))
    before = state.clone()
    mod.run(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, l2)
    torch.cuda.synchronize()
    if not inplace and not torch.equal(state, before):
        return out, ns, "destination-passing modified state"
    return out, ns, None


def correctness():
    cases = []
    for B in (1, 4, 16, 64, 512):
        for sd in ("fp32", "bf16"):
            for T in (1, 2, 4):
                for l2 in (False, True):
                    cases.append(dict(B=B, T=T, H=4, HV=8, K=128, V=128, sd=sd, l2=l2))
    for H, HV in ((8, 16), (16, 32), (16, 64)):
        for B in (1, 16):
            for sd in ("fp32", "bf16"):
                for T, l2 in ((1, False), (2, True)):
                    cases.append(dict(B=B, T=T, H=H, HV=HV, K=128, V=128, sd=sd, l2=l2))
    for K, V in ((64, 64), (32, 96), (256, 256)):
        for sd in ("fp32", "bf16"):
            cases.append(dict(B=3, T=2, H=2, HV=4, K=K, V=V, sd=sd, l2=True))
    counts = {"cuda-v1": [0, 0], "cuda-v4": [0, 0]}
    for i, c in enumerate(cases):
        x = make_inputs(B=c["B"], T=c["T"], H=c["H"], HV=c["HV"], K=c["K"], V=c["V"],
                        state_dtype=DT[c["sd"]], device="cuda", seed=i)
        ro, rs = reference_outputs(x, c["l2"])
        for name, mod in (("cuda-v1", cuda_v1), ("cuda-v4", cuda_v4)):
            ok, why = mod.supports(_problem(x, c["l2"]))
            if not ok:
                continue
            modes = [(True, False), (False, False)] + ([(True, True)] if name == "cuda-v4" and c["B"] <= 16 else [])
            for inplace, mis in modes:
                try:
                    out, ns, err = run_case(mod, x, c["l2"], inplace, mis)
                    err = err or verdict(out, ns, ro, rs, DT[c["sd"]])
                except Exception as e:
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                counts[name][err is not None] += 1
                row = dict(c, backend=name, inplace=inplace, misaligned=mis, error=err)
                RESULTS["correctness"].append(row)
                if err:
                    log("FAIL", row)
    for name, mod in (("cuda-v1", cuda_v1), ("cuda-v4", cuda_v4)):
        for sd in ("fp32", "bf16"):
            try:
                err = graph_check(mod, DT[sd])
            except Exception as e:
                err = f"{type(e).__name__}: {str(e)[:200]}"
            counts[name][err is not None] += 1
            RESULTS["correctness"].append(dict(backend=name, sd=sd, graph=True, error=err))
            if err:
                log("FAIL graph", name, sd, err)
    return counts


def _problem(x, l2):
    from gdnzoo.contract import validate
    return validate(*x.args(), use_qk_l2norm=l2)[0]


def graph_check(mod, sd):
    """Capture one call in a CUDA graph, replay it on new data copied into the same tensors."""
    x = make_inputs(B=4, T=2, state_dtype=sd, device="cuda", seed=100)
    out = torch.empty(4, 2, 8, 128, dtype=BF16, device="cuda")
    ns = torch.empty_like(x.state)
    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mod.run(*args)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mod.run(*args)
    # An eager call with other tensors of the same signature rewrites the launcher's parameter
    # buffer; the captured node must keep its own copy.
    z = make_inputs(B=4, T=2, state_dtype=sd, device="cuda", seed=102)
    mod.run(*z.args(), torch.empty_like(out), torch.empty_like(ns), True)
    y = make_inputs(B=4, T=2, state_dtype=sd, device="cuda", seed=101)
    for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b"):   # every seeded input
        getattr(x, n).copy_(getattr(y, n))
    out.fill_(float("nan")), ns.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return verdict(out, ns, *reference_outputs(y, True), sd)


def gate_accuracy():
    """Max relative error of cuda-v4's decay g, accurate and fast-intrinsic gates: with k = 0
    the update is new_state = g * state exactly, so g is read back per (sequence, head)."""
    B, HV = 64, 8
    x = make_inputs(B=B, T=1, H=4, HV=HV, state_dtype=F32, device="cuda", seed=5)
    x.k.zero_()
    x.a.copy_(torch.linspace(-30, 30, B * HV, device="cuda").view(B, 1, HV))
    A = x.A_log.double().exp()
    xa = x.a.double()[:, 0] + x.dt_bias.double()
    g_ref = torch.exp(-A * torch.nn.functional.softplus(xa, beta=1.0, threshold=20.0))
    res = {}
    for fast in (0, 1):
        out = torch.empty(B, 1, HV, 128, dtype=BF16, device="cuda")
        ns = torch.empty_like(x.state)
        w, rw, lpr, hint = cuda_v4.pick_config(B * HV, F32)[:4]
        cuda_v4.run(*x.args(), out, ns, False, config=(w, rw, lpr, hint, fast))
        torch.cuda.synchronize()
        s64 = x.state.double()
        g = (ns.double() * s64).sum((2, 3)) / (s64 * s64).sum((2, 3))
        res[f"fastgate={fast}"] = float(((g - g_ref).abs() / g_ref.clamp_min(1e-30)).max())
    log("gate accuracy (max rel err of g over a in [-30, 30]):", res)
    return res


# ------------------------------------------------------------------------------------ host

def host_time():
    import gdnzoo
    x = make_inputs(B=1, device="cuda", seed=3)
    out = torch.empty(1, 1, 8, 128, dtype=BF16, device="cuda")
    rows = []

    def clock(name, fn, n=2000, batches=7):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            ts.append((time.perf_counter() - t0) * 1e6 / n)
            torch.cuda.synchronize()          # between batches, outside the clock
        rows.append(dict(what=name, us=statistics.median(ts), lo=min(ts), hi=max(ts)))

    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale)
    for name in ("cuda-v4", "cuda-v1"):
        clock(f"gdnzoo.decode(algo={name}) eager", lambda: gdnzoo.decode(*args, out=out, algo=name))
    f = gdnzoo.get("cuda-v4")
    clock("gdnzoo.get('cuda-v4')(...)", lambda: f(*args, out=out))
    from gdnzoo.contract import validate
    clock("validate() alone", lambda: validate(*args, out=out, new_state=x.state))
    clock("cuda_v4.run() (signature key + launch)", lambda: cuda_v4.run(*args, out, x.state, False))
    bound = cuda_v4.bind(*args, out, x.state, False)
    clock("cuda_v4.bind(...) result (pointers + launch)", lambda: bound(*args, out, x.state, False))
    lau = bound.vec16
    buf, _, argv = lau.buffers()
    cuda_build.PTRS.pack_into(buf, 0, *cuda_build.data_ptrs(x.q, x.k, x.v, x.state, x.A_log, x.a,
                                                            x.dt_bias, x.b, out, x.state))
    clock("cuda_build.launch_raw() (stream + cuLaunchKernel)",
          lambda: cuda_build.launch_raw(lau.func, lau.grid, lau.block, lau.dev, argv))
    import cupy_backends.cuda.api.driver as drv
    st = cuda_build.current_stream(lau.dev)
    clock("driver.launchKernel alone",
          lambda: drv.launchKernel(lau.func, lau.grid, 1, 1, lau.block, 1, 1, 0, st, argv, 0))
    return rows


# ------------------------------------------------------------------------------------ main

def part(name, fn, *a):
    t0 = time.time()
    try:
        r = fn(*a)
        log(f"[{name}] done in {time.time() - t0:.1f}s")
        return r
    except Exception:
        log(f"[{name}] ERROR\n{traceback.format_exc()}")
        return None


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    import cupy
    env = dict(gpu=torch.cuda.get_device_name(), cc=torch.cuda.get_device_capability(),
               torch=torch.__version__, cuda=torch.version.cuda, cupy=cupy.__version__,
               python=sys.version.split()[0])
    log("env", env)
    counts = part("correctness", correctness)
    RESULTS["gate_accuracy"] = part("gate accuracy", gate_accuracy)
    host = part("host", host_time) or []
    RESULTS["host"] = host
    for (dev, src, name, defs), k in cuda_build._kernels.items():
        RESULTS["resources"].append(dict(kernel=name, defs=dict(defs), arch=k.arch,
                                         regs=k.num_regs, local_bytes=k.local_bytes,
                                         smem=k.static_smem))
    (OUT / "gpu_cuda.json").write_text(json.dumps(dict(env=env, **RESULTS), indent=1, default=str))
    (OUT / "gpu_cuda.log").write_text("\n".join(LOG))

    print("\n==== cuda backends on", env["gpu"], "====")
    if counts:
        print("correctness:", ", ".join(f"{k} PASS {v[0]} FAIL {v[1]}" for k, v in counts.items()))
    v4res = [r for r in RESULTS["resources"] if r["kernel"] == cuda_v4.KERNEL]
    print(f"resources (cuda-v4, {len(v4res)} variants): regs {min((r['regs'] for r in v4res), default=0)}"
          f"..{max((r['regs'] for r in v4res), default=0)}, variants with local memory: "
          f"{sum(r['local_bytes'] > 0 for r in v4res)}")
    print("gate accuracy:", RESULTS.get("gate_accuracy"))
    for r in host:
        print(f"host  {r['what']:45} {r['us']:7.2f} us  [{r['lo']:.2f}, {r['hi']:.2f}]")


if __name__ == "__main__":
    main()

"""GPU check and launch-shape sweep for the Triton backends fla-recurrent and fla-tma.

Run from the repository root after ``pip install -e .``:  ``python3 bench/gpu_triton.py``
(``--smoke`` runs a tiny correctness pass through the Triton interpreter on CPU, no timing).

1. correctness of both kernels against the float64 reference (contest shape: B x state dtype x
   mode x T x l2norm; other geometries, K/V 64 and 256, strided views, 2^32 state elements);
2. fla-tma config sweep (fla-recurrent's launch shapes: ``python3 -m gdnzoo.bench.gpu_tune``);
3. eager host time per call at B=1 (gdnzoo.decode, the backend's run, Triton's own launch).
Kernel time: CUDA events around replays of a CUDA graph of N in-place calls that rotate over
distinct state sets totalling >= 256 MB (5x the H100's 50 MB L2), so state reads and writes
miss L2; no synchronization inside the timed region.  A graph of N empty kernels measured the
same way gives the per-launch overhead of this method.  Results: $OUT (default /tmp/out).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import traceback

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from gdnzoo.compare import check_close  # noqa: E402
from gdnzoo.inputs import make_inputs  # noqa: E402
from gdnzoo.bench.clocks import graph_times  # noqa: E402
from gdnzoo.compare import relative_error  # noqa: E402
from gdnzoo.reference import reference_outputs  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/out")
DEV = "cpu" if SMOKE else "cuda"
ROT_BYTES = 256 << 20
SWEEP_B = [1, 4, 8, 16, 32, 48, 64, 128, 256, 512]
TMA_CFGS = [(8, 1, 1, 1, False), (8, 2, 1, 2, False), (16, 2, 2, 2, False), (16, 4, 2, 3, False),
            (32, 2, 4, 2, False), (32, 4, 4, 3, False), (16, 8, 4, 4, False), (64, 2, 8, 2, False),
            (16, 2, 4, 2, True), (32, 4, 4, 3, True)]
DEADLINE = [float("inf")]      # sweeps stop starting new B values past it (4-minute budget)
RESULTS = {"correctness": [], "tma": [], "host": [], "overhead": {}, "compile": {},
           "errors": []}


def log(*a):
    print(*a, flush=True)


def guarded(name, fn):
    t0 = time.time()
    try:
        fn()
    except Exception as e:                                   # one part failing must not stop the rest
        RESULTS["errors"].append(f"{name}: {e!r}")
        log(f"[{name}] FAILED: {e!r}")
        traceback.print_exc()
    log(f"[{name}] {time.time() - t0:.1f}s")


def mods():
    from gdnzoo.backends import triton_recurrent, triton_tma
    return {"fla-recurrent": triton_recurrent, "fla-tma": triton_tma}


# ---------------------------------------------------------------- 1. correctness
def check_case(mod, name, B, T, H, HV, K, V, sd, l2, inplace, seed):
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, device=DEV, seed=seed)
    ro, rs = reference_outputs(x, l2)
    out = torch.full((B, T, HV, V), float("nan"), dtype=x.v.dtype, device=DEV)
    st = x.state.clone()
    ns = st if inplace else torch.full_like(st, float("nan"))
    mod.run(x.q, x.k, x.v, st, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, l2)
    mod.run(x.q, x.k, x.v, x.state.clone(), x.A_log, x.a, x.dt_bias, x.b, x.scale,
            torch.empty_like(out), torch.empty_like(st), l2)     # second call: the cached path
    ok_o, ma_o, _, _ = check_close(out, ro)
    ok_s, ma_s, _, _ = check_close(ns, rs)
    e_s, e_o = relative_error(ns, rs), relative_error(out, ro)
    tight = e_s < (1e-4 if sd == torch.float32 else 8e-3) and e_o < 1e-2
    if not inplace:
        tight = tight and torch.equal(st, x.state)
    return dict(backend=name, B=B, T=T, H=H, HV=HV, K=K, V=V,
                state="fp32" if sd == torch.float32 else "bf16", l2=l2,
                mode="inplace" if inplace else "dest", pass_=bool(ok_o and ok_s and tight),
                spec_rule=bool(ok_o and ok_s), rel_state=e_s, rel_out=e_o, max_abs_out=ma_o,
                max_abs_state=ma_s)


def correctness():
    cases = []
    Bs = [1, 2] if SMOKE else [1, 4, 16, 64, 512]
    i = 0
    for B in Bs:
        for sd in (torch.float32, torch.bfloat16):
            for inplace in (True, False):
                for T in ((1, 2) if SMOKE else (1, 2, 4)):
                    for l2 in (False, True):
                        i += 1
                        cases.append((B, T, 4, 8, 128, 128, sd, l2, inplace, i))
    for j, (H, HV) in enumerate([(8, 16), (16, 32), (16, 64)]):
        for B in ([1] if SMOKE else [1, 16, 64]):
            for sd in (torch.float32, torch.bfloat16):
                T, l2, inplace = 1 + (j + B) % 3, bool(B % 2), sd == torch.float32
                cases.append((B, T, H, HV, 128, 128, sd, l2, inplace, 500 + j * 7 + B))
    for K, V in [(64, 64), (64, 128), (256, 128), (128, 256), (256, 256)]:
        cases.append((3, 2, 2, 4, K, V, torch.float32, True, False, 900 + K + V))
        cases.append((3, 1, 2, 4, K, V, torch.bfloat16, False, True, 901 + K + V))
    for name, mod in mods().items():
        ok, why = mod.available()
        if not ok:
            RESULTS["errors"].append(f"{name} unavailable: {why}")
            continue
        for c in cases:
            try:
                r = check_case(mod, name, *c)
            except Exception as e:
                r = dict(backend=name, case=str(c[:9]), pass_=False, error=repr(e))
            RESULTS["correctness"].append(r)
            if not r["pass_"]:
                log("FAIL", r)
    if not SMOKE:
        for name, mod in mods().items():
            try:
                RESULTS["correctness"].append(big_grid(mod, name))
            except Exception as e:
                RESULTS["correctness"].append(dict(backend=name, case="2^32 elements",
                                                   pass_=False, error=repr(e)))
        for name, mod in mods().items():
            try:
                RESULTS["correctness"].append(views_case(mod, name))
            except Exception as e:
                RESULTS["correctness"].append(dict(backend=name, case="views", pass_=False,
                                                   error=repr(e)))


def big_grid(mod, name):
    """B*HV = 2^20 heads, 2^32 bf16 state elements (8 GiB): offsets past int32."""
    B, HV, K, V = 2**17, 8, 64, 64
    x = make_inputs(B=1, T=1, H=4, HV=HV, K=K, V=V, state_dtype=torch.bfloat16, device=DEV, seed=77)
    state = torch.zeros(B, HV, V, K, dtype=torch.bfloat16, device=DEV)
    for n in (0, B - 1):
        state[n] = x.state[0]
    rep = lambda t: t.expand(B, *t.shape[1:]).contiguous()  # noqa: E731
    out = torch.full((B, 1, HV, V), float("nan"), dtype=torch.bfloat16, device=DEV)
    mod.run(rep(x.q), rep(x.k), rep(x.v), state, x.A_log, rep(x.a), x.dt_bias, rep(x.b),
            x.scale, out, state, False)
    ro, rs = reference_outputs(x, False)
    ok = all(check_close(out[n:n + 1], ro)[0] and check_close(state[n:n + 1], rs)[0]
             for n in (0, B - 1)) and bool(torch.isfinite(out.float()).all())
    del state
    torch.cuda.empty_cache()
    return dict(backend=name, case="B=2^17 HV=8 K=V=64 bf16 (2^32 elements)", pass_=ok)


def views_case(mod, name):
    B, T, H, HV, K, V = 16, 2, 4, 8, 128, 128
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, device=DEV, seed=88)
    ro, rs = reference_outputs(x, True)
    qk = torch.cat([x.q, x.k], dim=2)                                   # one fused buffer
    q, k = qk[:, :, :H], qk[:, :, H:]
    v = x.v.transpose(1, 2).contiguous().transpose(1, 2)                  # T-major strides
    ab = torch.stack([x.a, x.b], -1)
    pool = torch.zeros(B + 3, HV, V, K, device=DEV)
    pool[2:B + 2] = x.state
    state = pool[2:B + 2]
    out = torch.full((B, T, HV, V + 8), float("nan"), dtype=torch.bfloat16, device=DEV)[..., :V]
    mod.run(q, k, v, state, x.A_log, ab[..., 0], x.dt_bias, ab[..., 1], x.scale, out, state, True)
    ok = check_close(out, ro)[0] and check_close(state, rs)[0] and relative_error(state, rs) < 1e-4
    return dict(backend=name, case="strided views (fused qk, T-major v, a/b interleaved, pool)",
                pass_=bool(ok))


# ---------------------------------------------------------------- 2./3. timing
class Rotation:
    """State sets in place + shared small inputs for one (B, state dtype)."""

    def __init__(self, B, sd):
        self.x = make_inputs(B=B, T=1, H=4, HV=8, K=128, V=128, state_dtype=sd, device=DEV, seed=B)
        set_bytes = self.x.state.numel() * self.x.state.element_size()
        self.nsets = max(2, math.ceil(ROT_BYTES / set_bytes))
        self.states = [self.x.state.clone() for _ in range(self.nsets)]
        self.out = torch.empty(B, 1, 8, 128, dtype=torch.bfloat16, device=DEV)
        self.calls = max(self.nsets, 200)

    def args(self, i):
        x = self.x
        s = self.states[i % self.nsets]
        return (x.q, x.k, x.v, s, x.A_log, x.a, x.dt_bias, x.b, x.scale, self.out, s, False)


def graph_time_us(fn_i, calls, reps=15):
    """(median, min, max) per-call time of a CUDA graph holding ``calls`` calls fn_i(0..calls-1);
    the graph clock of ``gdnzoo bench``."""
    per = sorted(graph_times(fn_i, calls, reps, warmup=min(calls, 3)))
    return statistics.median(per), per[0], per[-1]


def launch_overhead():
    import triton

    @triton.jit
    def empty_kernel(p):
        pass

    buf = torch.empty(16, device=DEV)
    med, lo, hi = graph_time_us(lambda i: empty_kernel[(1,)](buf), 500)
    RESULTS["overhead"] = dict(empty_kernel_graph_us=med, min=lo, max=hi)


def sweep_tma():
    from gdnzoo.backends._triton_launch import ScratchAllocator
    m = mods()["fla-tma"]
    ok, why = m.available()
    if not ok:
        RESULTS["errors"].append(f"fla-tma unavailable: {why}")
        return
    for sd in (torch.float32, torch.bfloat16):
        sdn = "fp32" if sd == torch.float32 else "bf16"
        for B in SWEEP_B:
            if time.time() > DEADLINE[0]:
                RESULTS["errors"].append(f"time budget: tma sweep skipped {sdn} B={B}")
                continue
            rot = Rotation(B, sd)
            for cfg in TMA_CFGS:
                cfg = m.fit_config(cfg, B * 8, 128, 128, sd.itemsize)
                alloc = ScratchAllocator(torch.cuda.current_device())
                try:
                    med, lo, hi = graph_time_us(
                        lambda i, c=cfg: m.launch(*rot.args(i), config=c, allocator=alloc), rot.calls)
                    RESULTS["tma"].append(dict(backend="fla-tma", state=sdn, B=B, BV=cfg[0],
                                               tiles=cfg[1], num_warps=cfg[2], num_stages=cfg[3],
                                               ws=cfg[4], us=med, min=lo, max=hi))
                except Exception as e:
                    RESULTS["errors"].append(f"tma {sdn} B={B} {cfg}: {e!r}")
            del rot
            torch.cuda.empty_cache()


def compile_report():
    """What the compiler made of each kernel on this GPU (facts for the write-up)."""
    from gdnzoo.backends import triton_recurrent_kernel as rk, triton_tma_kernel as tk
    rep = {}
    for fn, tag in ((rk.gdn_recurrent_kernel, "fla-recurrent"), (tk.gdn_tma_kernel, "fla-tma")):
        for key, ck in list(fn.device_caches[0][0].items())[:40]:
            ttg, ptx = ck.asm.get("ttgir", ""), ck.asm.get("ptx", "")
            rep.setdefault(tag, []).append(dict(
                num_warps=ck.metadata.num_warps, num_stages=ck.metadata.num_stages,
                shared=ck.metadata.shared, scratch=ck.metadata.global_scratch_size,
                tma_loads=ttg.count("async_tma_copy_global_to_local"),
                warp_specialize_ops=ttg.count("ttg.warp_specialize"),
                ld_global_v4=ptx.count("ld.global.v4") + ptx.count("ld.global.nc.v4"),
                cp_async_bulk_tensor=ptx.count("cp.async.bulk.tensor"),
                regs=getattr(ck, "n_regs", None), spills=getattr(ck, "n_spills", None)))
    RESULTS["compile"] = rep


# ---------------------------------------------------------------- 4. host time
def host_times():
    import gdnzoo
    x = make_inputs(B=1, T=1, H=4, HV=8, K=128, V=128, device=DEV, seed=1)
    out = torch.empty(1, 1, 8, 128, dtype=torch.bfloat16, device=DEV)

    def clock(fn, n=3000, batch=100):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        per = []
        for _ in range(n // batch):
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            per.append((time.perf_counter() - t0) * 1e6 / batch)
            torch.cuda.synchronize()                  # outside the timed batch
        per.sort()
        return statistics.median(per), per[0], per[-1]

    for name, mod in mods().items():
        a = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b)
        for what, fn in (
                ("gdnzoo.decode", lambda: gdnzoo.decode(*a, x.scale, out=out, algo=name)),
                ("backend run", lambda: mod.run(*a, x.scale, out, x.state, False)),
                ("triton kernel[grid] path", lambda: mod.launch(*a, x.scale, out, x.state, False))):
            try:
                med, lo, hi = clock(fn)
                RESULTS["host"].append(dict(backend=name, what=what, us=med, min=lo, max=hi))
            except Exception as e:
                RESULTS["errors"].append(f"host {name} {what}: {e!r}")


# ---------------------------------------------------------------- report
def environment():
    import triton
    env = dict(torch=torch.__version__, triton=triton.__version__, python=sys.version.split()[0])
    if not SMOKE:
        env.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   cc=".".join(map(str, torch.cuda.get_device_capability())))
    return env


def report():
    os.makedirs(OUT, exist_ok=True)
    RESULTS["env"] = environment()
    with open(os.path.join(OUT, "gpu_triton.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    rows = RESULTS["tma"]
    if rows:
        keys = sorted({k for r in rows for k in r})
        with open(os.path.join(OUT, "gpu_triton_sweep.csv"), "w") as f:
            f.write(",".join(keys) + "\n")
            for r in rows:
                f.write(",".join(str(r.get(k, "")) for k in keys) + "\n")
    log("\n==== gdnzoo Triton backends:", RESULTS["env"])
    for name in ("fla-recurrent", "fla-tma"):
        rs = [r for r in RESULTS["correctness"] if r["backend"] == name]
        bad = [r for r in rs if not r["pass_"]]
        log(f"correctness {name}: PASS {len(rs) - len(bad)} FAIL {len(bad)}"
            + (f"  first fail: {bad[0]}" if bad else ""))
    if RESULTS["overhead"]:
        log(f"empty kernel, same graph method: {RESULTS['overhead']['empty_kernel_graph_us']:.2f} us/call")
    log("fla-tma best per B (graph time, us/call, cold L2):  state  B  | BV/tiles/nw/ns/ws  us"
        "  (fla-recurrent shapes: python3 -m gdnzoo.bench.gpu_tune)")
    for sdn in ("fp32", "bf16"):
        for B in SWEEP_B:
            tma = [r for r in RESULTS["tma"] if r["state"] == sdn and r["B"] == B]
            if tma:
                t = min(tma, key=lambda r: r["us"])
                log(f"  {sdn} {B:4d} | {t['BV']}/{t['tiles']}/{t['num_warps']}/{t['num_stages']}/"
                    f"{int(t['ws'])} {t['us']:7.2f}")
    for r in RESULTS["host"]:
        log(f"host B=1 {r['backend']:13s} {r['what']:26s} median {r['us']:6.1f} us [{r['min']:.1f}-{r['max']:.1f}]")
    for tag, lst in RESULTS["compile"].items():
        if lst:
            f = lst[0]
            log(f"compile {tag}: {len(lst)} variants; first: {f}")
    log(f"errors: {len(RESULTS['errors'])}" + "".join(f"\n  {e}" for e in RESULTS["errors"][:8]))
    log(f"full results: {OUT}/gpu_triton.json, gpu_triton_sweep.csv")


def main():
    t0 = time.time()
    DEADLINE[0] = t0 + 200
    guarded("correctness", correctness)
    if not SMOKE:
        guarded("launch overhead", launch_overhead)
        guarded("host time", host_times)
        guarded("sweep fla-tma", sweep_tma)
        guarded("compile report", compile_report)
    log(f"total {time.time() - t0:.0f}s")
    report()


if __name__ == "__main__":
    main()

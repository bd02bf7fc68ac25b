"""cuda-chunk-bf16 with its prep kernel on the same SMs as a multi-wave chain (written in the
nineteenth session after its device time ran out; not run yet).  On a GPU:

    python3 -m lab.coresident_ab --cells "16,32:1024x8;16,64:1024x8;4,8:1024x8" --rounds 3

The product runs the prep kernel, then the chain kernel; where the chain takes more than a wave
of CTAs (8 x 1024 tokens at 16/32 heads: 512 CTAs of the solo form) the two take about half the
call each, and the chain, latency-bound, leaves most of an SM's issue slots idle.  Here the
chain (the solo form with ``lab/notebook/h200/coresident_2026-11-30/edits.py``'s "cores":
GDN_OVERLAP 2) is launched first with its shared memory raised to 116 KB, so one chain CTA an
SM and two prep CTAs (52 KB) beside it always fit (the prep can never be locked out, so the
chain's waits end); the prep kernel, with its per-(chunk, head) flags (GDN_FLAGS), runs on a
second stream that joins the first; the host clears the flags first.  Per cell and round, the
product's call and this one in turn: a call's GPU span (CUDA events behind a sleep kernel,
median of --reps), outputs and states compared bit for bit with the product's, its errors
against float64.  Dense inputs, fp32 state, no checkpoints.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
from pathlib import Path

import torch

import gdnzoo
from gdnzoo.backends import _cuda_build as cb
from gdnzoo.backends import _cuda_chunk_chain as chain
from gdnzoo.backends import _cuda_chunk_prep as prep
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends import triton_chunk as tc
from lab.harness import event_times_us
from lab.prefill_gpu import make, oracle
from lab.source_edits import edited, load

EDITS = Path(__file__).resolve().parent / "notebook/h200/coresident_2026-11-30/edits.py"
CHAIN_SMEM = 116 * 1024          # > 228 KB / 2 - 1 KB: one chain CTA an SM, two preps beside
K_SCALE = 128 ** -0.5            # the product's default scale at K = 128


def chain_launcher(source, x, mats, vecs, flags):
    """The edited chain kernel (solo form, GDN_OVERLAP 2) on a dense fp32 state, as a closure."""
    q, k, v, cu, out = x["q"], x["k"], x["v"], x["cu"], x["out"]
    state, ns = x["state"], x["new_state"]
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu.shape[0] - 1
    dev = q.device.index
    pool, idx, new_idx, init, src, ss = tlaunch.chain_slots(cu, state, ns, None, None, None,
                                                            False)
    code = cb.DTYPE_CODE
    defs = dict(GDN_STATE0=1, GDN_POOL=pool, GDN_HAS_INIT=0, GDN_CKPT=0, GDN_PDL=0,
                GDN_S_DT=code[src.dtype], GDN_NS_DT=code[ns.dtype], GDN_C_DT=code[ns.dtype],
                GDN_CU64=int(cu.dtype == torch.int64), GDN_IDX64=int(idx.dtype == torch.int64),
                GDN_NIDX64=int(new_idx.dtype == torch.int64), GDN_NO_OUT=0, GDN_OVERLAP=2,
                GDN_SOLO=1)
    func = cb.get_kernel(source, chain.NAME, (("GDN_SMEM", CHAIN_SMEM), *sorted(defs.items())),
                         dev, CHAIN_SMEM).func
    grid = N * HV * (V // chain.ROWS)
    body = chain.tensor_maps(q, k, v, mats, out) + chain.PARAMS.pack(
        cu.data_ptr(), vecs.data_ptr(), out.data_ptr(), src.data_ptr(), ns.data_ptr(),
        idx.data_ptr(), new_idx.data_ptr(), init.data_ptr(), ns.data_ptr(), flags.data_ptr(),
        N, T, out.stride(0), out.stride(1), H, HV, V, *ss, *tlaunch.state_strides(ns, False),
        *tlaunch.state_strides(ns, False), src.shape[0], ns.shape[0], -1, 1)
    params = ctypes.create_string_buffer(body + bytes(-len(body) % 64))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))

    def go(params=params, argv=argv):
        cb.launch_raw(func, grid, chain.SOLO_THREADS, dev, ctypes.addressof(argv), CHAIN_SMEM)
    return go


def coresident_call(x, source, side):
    """One call: flags cleared, the chain on this stream, the prep on ``side``, joined."""
    q, k, cu = x["q"], x["k"], x["cu"]
    T, HV, V = q.shape[0], x["v"].shape[1], x["v"].shape[2]
    N = cu.shape[0] - 1
    c = tc.resolve(dict(precision="bf16", prep="cuda", chain="cuda", segments=1), N, HV, V,
                   q.device, tokens=T)
    ws = tc.workspace_for(T, HV, c, q.device)
    mats, vecs = tc._workspace(ws, T, HV, c, q.device)
    flags = chain.flags_for(mats, T, HV, N)
    assert flags is not None, "the flags do not fit the workspace's unused half"
    n_flags = (T // chain.CHUNK + N) * HV + 1
    gates, ga, gb, A_log, dt_bias = tlaunch.prefill_gates(x["A_log"], x["a"], x["dt_bias"],
                                                          x["b"], None, None)
    prep_go = prep.launcher(q, k, ga, gb, A_log, dt_bias, cu, mats, vecs, K_SCALE, True, gates,
                            c, flags=flags)
    chain_go = chain_launcher(source, x, mats, vecs, flags)

    def call():
        main = torch.cuda.current_stream()
        flags[:n_flags].zero_()
        start = torch.cuda.Event()
        start.record(main)
        chain_go()
        side.wait_event(start)
        with torch.cuda.stream(side):
            prep_go()
        done = torch.cuda.Event()
        done.record(side)
        main.wait_event(done)
        return x["out"], x["new_state"]
    return call



def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="16,32:1024x8", help="H,HV:LxN; several with ';'")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    source = edited(chain.SOURCE, load(str(EDITS)), "cores")
    side = torch.cuda.Stream()
    for cell in a.cells.split(";"):
        heads, mix = cell.split(":")
        H, HV = map(int, heads.split(","))
        L, n = map(int, mix.split("x"))
        x = make([L] * n, H, HV, seed=0)
        o64, s64 = oracle(x, True)

        def product():
            return gdnzoo.prefill(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"],
                                  x["dt_bias"], x["b"], x["cu"], out=x["out"],
                                  new_state=x["new_state"], use_qk_l2norm=True,
                                  algo="cuda-chunk-bf16")
        want = [t.clone() for t in product()]
        cores = coresident_call(x, source, side)
        got = [t.clone() for t in cores()]
        torch.cuda.synchronize()
        same = all(torch.equal(g, w) for g, w in zip(got, want))
        print(f"{cell}: bit for bit as the product's: {same}; errors vs float64 out "
              f"{rel(got[0], o64):.3e} state {rel(got[1], s64):.3e}", flush=True)
        spans = {"product": [], "coresident": []}
        for _ in range(a.rounds):
            for name, fn in (("product", product), ("coresident", cores)):
                spans[name].append(statistics.median(event_times_us(fn, a.reps,
                                                                    ahead=400_000)))
        med = {n: statistics.median(v) for n, v in spans.items()}
        print(f"{cell}: product {med['product']:.1f} us, coresident {med['coresident']:.1f} us "
              f"({med['product'] / med['coresident']:.2f}x); rounds " + "; ".join(
                  f"{n} " + " ".join(f"{t:.1f}" for t in v) for n, v in spans.items()),
              flush=True)


if __name__ == "__main__":
    main()

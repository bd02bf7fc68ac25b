"""How the verify floor's time answers to a later or a spread store phase, at B = 1 (states form,
the bench's cell and index rotation): the floor's streaming kernel (one float4 a thread, 256
threads x 128 blocks) with DELAY SM cycles spun after its value arrives before the first store
and GAP cycles spun between its T stores (GAP -1: a block barrier between them instead, so that
the block stores token by token with no spin).  CUPTI medians of interleaved rounds.  From the
checkout's root, with a GPU and CuPy:

    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-ld/floor_delay.py fp32 8 0x0,200x0,400x0,0x40,0x80
"""
import statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd()))
import numpy as np, torch, cupy
from gdnzoo.bench import floor, clocks
from gdnzoo.bench import verify as vb
from lab import verify_ab as va

SRC = r"""
__device__ __forceinline__ void spin_from(long long t0, int n) {
    if (n <= 0) return;
    long long c;
    do { asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory"); } while (c - t0 < n);
}
template <int DELAY, int GAP>
__global__ void __launch_bounds__(256) fl_delay(const float4* __restrict__ pool, float4* __restrict__ inter,
        const int* __restrict__ idx, const int* __restrict__ rows, long long page4, long long row4,
        long long step4, long long n4, int T, float alpha, float beta) {
    const long long slot = idx[0];
    if (slot < 0) return;
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (GAP >= 0 && k >= n4) return;
    const bool in = k < n4;
    float4 v = in ? pool[slot * page4 + k] : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 t = v;
    t.x = t.x * alpha + beta; t.y = t.y * alpha + beta; t.z = t.z * alpha + beta; t.w = t.w * alpha + beta;
    long long t0;
    asm volatile("{\n\t.reg .f32 d;\n\tmov.f32 d, %1;\n\tmov.u64 %0, %%clock64;\n\t}" : "=l"(t0) : "f"(t.x) : "memory");
    spin_from(t0, DELAY);
    float4* out = inter + (long long)rows[0] * row4 + k;
    for (int d = 0; d < 16; ++d) {
        if (d >= T) break;
        if (in) out[d * step4] = t;
        if (GAP > 0) { long long c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory"); spin_from(c, GAP); }
        if (GAP < 0) __syncthreads();
    }
}
"""
variants = [tuple(int(x) for x in s.split("x", 1)) for s in sys.argv[3].split(",")]
names = [f"fl_delay<{d}, {g}>" for d, g in variants]
mod = cupy.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
for sd in sys.argv[1].split(","):
    for _, T, ctx in va.contexts(sd, [(1, int(t)) for t in sys.argv[2].split(",")]):
        tgt = vb.floor_target(ctx, "states")
        p = lambda x: np.uint64(0 if x is None else x.data_ptr())
        args = (p(tgt.buf), p(tgt.inter), p(tgt.index), p(tgt.rows), np.int64(tgt.page4),
                np.int64(tgt.row4), np.int64(tgt.step4), np.int64(tgt.n4), np.int32(tgt.T),
                np.float32(1.0), np.float32(0.0))
        grid = int((tgt.n4 + 255) // 256)
        def launcher(fn):
            def launch(i):
                with floor._stream():
                    fn((grid,), (256,), args)
            return launch
        ls = [launcher(mod.get_function(n)) for n in names]
        acc = {n: [] for n in names}
        for r in range(4):
            for n, l in zip(names, ls):
                s, m = clocks.kernel_times(l, 100, prepare=tgt.prepare)
                acc[n].extend(s)
        base = statistics.median(acc[names[0]])
        print(f"{sd} T={T} B=1 states, 256 x {grid}, {m}: " + " | ".join(
            f"delay {d} gap {g}: {statistics.median(acc[n]):.3f} ({statistics.median(acc[n]) - base:+.3f})"
            for (d, g), n in zip(variants, names)), flush=True)

"""clock64 and globaltimer timeline of the verify floor (bench/floor.py's stream_verify) at
B = 1, beside tl_tc.py's of cuda_v4_tc.cu: per warp (its lane 0), SM cycles from its start to its
indices loaded, its first float4 arrived and its last store issued; and the globaltimer (ns) of
every warp's start and end, whose span (first start to last end) reads against the kernel
clock.  From the checkout's root, with a GPU and CuPy:

    python3 lab/notebook/h100-80gb-hbm3/verify/ab-tc-ld/floor_tl.py fp32,bf16 8 1x128x256,1x256x128
"""
import re, statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd()))
import numpy as np, torch, cupy
from gdnzoo.bench import floor, clocks
from gdnzoo.bench import verify as vb
from lab import verify_ab as va

MARKS = r"""
__device__ unsigned long long fl_xt[8192][6];
__device__ __forceinline__ unsigned long long fl_clk() {
    unsigned long long c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory"); return c; }
__device__ __forceinline__ unsigned long long fl_gt() {
    unsigned long long c; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c) :: "memory"); return c; }
__device__ __forceinline__ void fl_dep(float x) {
    unsigned d; asm volatile("mov.b32 %0, %1;" : "=r"(d) : "f"(x) : "memory"); if (d == 0x7fffffffu) fl_xt[8191][5] = 1; }
"""
src = floor._VERIFY_SRC
# marks in stream_verify FORM 0/1: start, indices loaded, first value, end
src = src.replace("    const long long n = blockIdx.y;\n",
                  "    const long long n = blockIdx.y;\n    unsigned long long x0 = fl_clk(), g0 = fl_gt(), x1 = 0;\n", 1)
src = src.replace("        const long long slot = idx[n];\n        if (slot < 0) return;\n        float4* at",
                  "        const long long slot = idx[n];\n        if (slot < 0) return;\n"
                  "        { unsigned d; asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(d) : \"r\"((int)slot) : \"memory\"); if (d == 0x7fffffffu) fl_xt[8191][5] = 1; }\n"
                  "        x1 = fl_clk();\n        float4* at", 1)
src = src.replace("        stream_each<VPT>(at, n4, alpha, beta,\n                         Steps<FORM == 1>{inter + (long long)rows[n] * row4, at, step4, T});\n",
                  "        stream_each<VPT>(at, n4, alpha, beta,\n                         Steps<FORM == 1>{inter + (long long)rows[n] * row4, at, step4, T});\n"
                  "        if ((threadIdx.x & 31) == 0) { const unsigned b = (blockIdx.x + gridDim.x * blockIdx.y) * (blockDim.x / 32) + threadIdx.x / 32;\n"
                  "            fl_xt[b][0] = x0; fl_xt[b][1] = x1; fl_xt[b][2] = fl_arr; fl_xt[b][3] = fl_clk(); fl_xt[b][4] = g0; fl_xt[b][5] = fl_gt(); }\n", 1)
assert src.count("fl_clk()") == 3, src
# the first value's arrival: inside stream_part, after the loads, before ready()
base = floor._SRC.replace("        const float add = ready(beta);\n",
                          "        fl_dep(v[0].x); fl_arr = fl_clk();\n        const float add = ready(beta);\n", 1)
base = base.replace("template <int VPT, class Store, class Ready, class Part>",
                    MARKS + "template <int VPT, class Store, class Ready, class Part>", 1)
base = base.replace("fl_arr = fl_clk();", "fl_arr_t = fl_clk();")
base = base.replace("                                            const Part& part) {",
                    "                                            const Part& part, unsigned long long& fl_arr_t) {", 1)
base = base.replace("    stream_part<VPT>(src, n4, alpha, beta, store, now, Whole{});",
                    "    stream_part<VPT>(src, n4, alpha, beta, store, now, Whole{}, fl_arr_t);")
base = base.replace("                                            float beta, const Store& store) {\n    Now now;",
                    "                                            float beta, const Store& store, unsigned long long& fl_arr_t) {\n    Now now;")
src = src.replace("float4* at = pool + slot * page4;\n        stream_each<VPT>(at, n4, alpha, beta,\n                         Steps",
                  "float4* at = pool + slot * page4;\n        unsigned long long fl_arr = 0;\n        stream_each<VPT>(at, n4, alpha, beta, Steps", 1)
src = src.replace("Steps<FORM == 1>{inter + (long long)rows[n] * row4, at, step4, T});\n        if ((threadIdx.x & 31) == 0)",
                  "Steps<FORM == 1>{inter + (long long)rows[n] * row4, at, step4, T}, fl_arr);\n        if ((threadIdx.x & 31) == 0)", 1)
# the other forms' calls of stream_each get a dummy
src = re.sub(r"stream_each<VPT>\(([^;]*)\);", lambda m: m.group(0) if "fl_arr" in m.group(1) else
             f"unsigned long long fl_d = 0; stream_each<VPT>({m.group(1)}, fl_d);", src)
# keep only what the verify kernel needs of _SRC (stream_part, Now, Whole, stream_each, To)
base = base[:base.index("template <int VPT>\n__device__ __forceinline__ void stream_rmw")]

shapes_ = [tuple(int(x) for x in s.split("x")) for s in sys.argv[3].split(",")]
keys = sorted({(v, b) for v, b, _ in shapes_})
G = va.G
for sd in sys.argv[1].split(","):
    for _, T, ctx in va.contexts(sd, [(1, int(t)) for t in sys.argv[2].split(",")]):
        for form in ("states", "states+update"):
            f = floor.VERIFY_FORMS.index(form)
            names = [f"stream_verify<{f}, {v}, {b}>" for v, b in keys]
            mod = cupy.RawModule(code=base + src, options=("-std=c++17",), name_expressions=names)
            tgt = vb.floor_target(ctx, form)
            for vpt, blk, grid in shapes_:
                fn = mod.get_function(f"stream_verify<{f}, {vpt}, {blk}>")
                p = lambda x: np.uint64(0 if x is None else x.data_ptr())
                args = (p(tgt.buf), p(tgt.inter), p(tgt.index), p(tgt.rows), p(tgt.counts),
                        np.int64(tgt.ld), np.int32(tgt.T), np.int64(tgt.page4), np.int64(tgt.row4),
                        np.int64(tgt.step4), np.int64(tgt.n4), np.float32(1.0), np.float32(0.0))
                def launch(i):
                    with floor._stream():
                        fn((grid, 1), (blk,), args)
                samples, _ = clocks.kernel_times(launch, 200, prepare=tgt.prepare)
                tgt.prepare(0); launch(0); torch.cuda.synchronize()
                ptr = mod.get_global("fl_xt")
                a = cupy.ndarray((8192, 6), dtype=cupy.uint64, memptr=ptr).get()[:grid * blk // 32].astype(np.int64)
                med = lambda x: int(np.median(x))
                st = a[:, 4] - a[:, 4].min()
                print(f"{sd} T={T} {form:13s} floor x{vpt}/{blk}/{grid} kernel "
                      f"{statistics.median(samples):.3f} us | idx {med(a[:,1]-a[:,0])} "
                      f"arrive {med(a[:,2]-a[:,0])} end {med(a[:,3]-a[:,0])} max end {int((a[:,3]-a[:,0]).max())} "
                      f"| gt start spread {int(st.max())} ns, span {int(a[:,5].max()-a[:,4].min())} ns, "
                      f"warp median {med(a[:,5]-a[:,4])} ns, end p50/p90/max {med(a[:,5]-a[:,4].min())}/"
                      f"{int(np.percentile(a[:,5]-a[:,4].min(), 90))}/{int(a[:,5].max()-a[:,4].min())} ns, "
                      f"GHz {np.median((a[:,3]-a[:,0])/np.maximum(a[:,5]-a[:,4], 1)):.2f}",
                      flush=True)

"""Insert clock64 marks into a copy of backends/cuda_v4_tc.cu (a diagnostic build for tl_tc.py;
NVRTC finds gdn_common.cuh in backends/ wherever the copy is):
    python3 xt_patch.py IN.cu OUT.cu [--coef]
Compute warps: 0 start, 1 Gram partials stored (barrier), 2 Gram summed (barrier), 3 the
coefficients in registers, 4 past the loader's barrier, 5 the state in registers, 6 the sums
(barrier; a version that sums the state's dot products within the warp: those sums made), 7 the last w_t (kernels before the scheduling fence) or token 0's store issued (with
it), 8 end (the last store issued).  Loader: 0 start, 1 its copies issued, 2 before its arrive.
Also tc_gt: each compute warp's globaltimer (ns) at its start and its end.
Each mark that reads a value first waits for it (a mov of the value the compiler cannot drop).
--coef splits the coefficients instead: 6 the pairs' L and N made (before their shared stores),
7 past the warp's __syncwarp after them (tl_tc.py names the columns "pairs" and "syncwarp")."""
import sys
COEF = "--coef" in sys.argv[3:]
src = open(sys.argv[1]).read()
def ins(anchor, text, after=True, nth=0, need=True):
    global src
    i = -1
    for _ in range(nth + 1):
        i = src.find(anchor, i + 1)
    if i < 0:
        assert not need, anchor
        return
    j = i + len(anchor) if after else i
    src = src[:j] + text + src[j:]
CLK = '{ unsigned long long c_; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c_) :: "memory"); xt_[I] = c_; }'
def clk(i): return CLK.replace("[I]", f"[{i}]")
DEP = '{ unsigned d_; asm volatile("mov.b32 %0, %1;" : "=r"(d_) : "f"(X) : "memory"); if (d_ == 0x7fffffffu) xt_[9] = 1; }'
def dep(x): return DEP.replace("(X)", f"({x})")
ins('extern "C" __global__', '__device__ unsigned long long tc_xt[4096][10], tc_gt[4096][2];\n', after=False)
ins('gdn_verify_tc(const GdnParams p) {\n', '    unsigned long long xt_[10] = {}, gt_;\n    ' + clk(0) + '\n    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt_) :: "memory");\n')
ins('asm volatile("cp.async.commit_group;" ::: "memory");\n', '            ' + clk(1) + '\n', need=False)
ins('        asm volatile("bar.arrive 3, %0;"', '        ' + clk(1) + '\n', after=False, need=False)   # the slot published (no loader copies)
ins('        asm volatile("bar.arrive 1, %0;"', '        ' + clk(2) + '\n', after=False)
ins('        return;\n    }\n\n    // ---- the compute warps', '        if (lane == 0) for (int i_ = 0; i_ < 10; ++i_) tc_xt[blockIdx.x * (NW + 1) + w][i_] = xt_[i_];\n', after=False)
ins('    bar_sync(2, 32 * NW);\n', '    ' + clk(1) + '\n', nth=0)
ins('    bar_sync(2, 32 * NW);\n', '    ' + clk(2) + '\n', nth=1)
ins('    bar_sync(1, NT);\n', '    ' + dep('Lr[T - 1][0]') + dep('Nr[T - 1]') + dep('kf[T - 1][0]') + '\n    ' + clk(3) + '\n', after=False)
ins('    bar_sync(1, NT);\n', '    ' + clk(4) + '\n')
MMA_STATE = "mma16816(d1, sx.x" in src       # the state's dot products by MMA (else within the warp)
ins('    const long long o_t = GDN_STRIDE(o_t, HV * V);\n', '    ' + dep('s[0]') + (dep('SD == GDN_BF16 ? __uint_as_float(sx.x) : sm[0]') if MMA_STATE else '') + '\n    ' + clk(5) + '\n')
if COEF:
    ins('        // Lane t < T: rk_t, ye_t', '        ' + dep('l[NP - 1]') + dep('nq[NP - 1]') + dep('l[0]') + '\n        ' + clk(6) + '\n', after=False)
    ins('        __syncwarp();\n    }\n', '    ' + clk(7) + '\n')
    src = "// xt marks: coef\n" + src
else:
    if MMA_STATE:
        ins('    bar_sync(2, 32 * NW);\n', '    ' + clk(6) + '\n', nth=2)
    else:                                # the warp's sums made: y_t's inputs
        ins('    const float ylv = bv - yetv * sum;\n', '    ' + dep('ylv') + '\n    ' + clk(6) + '\n')
    ins('    for (int t = 0; t < T; ++t) wr[t] = rkr[t] * u[t];\n', '    ' + dep('wr[T - 1]') + '\n    ' + clk(7) + '\n', need=False)
    ins('        sched_fence(fence);\n', '        if (t == 0) ' + clk(7) + '\n', need=False)
k = src.rstrip().rfind('}')
src = src[:k] + '    ' + clk(8) + '\n    if (lane == 0) for (int i_ = 0; i_ < 10; ++i_) tc_xt[blockIdx.x * (NW + 1) + w][i_] = xt_[i_];\n' \
    + '    if (lane == 0) { unsigned long long g_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_) :: "memory"); tc_gt[blockIdx.x * (NW + 1) + w][0] = gt_; tc_gt[blockIdx.x * (NW + 1) + w][1] = g_; }\n}\n'
open(sys.argv[2], 'w').write(src)

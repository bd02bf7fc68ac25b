"""fla-recurrent: our Triton kernel in the style of FLA's fused recurrent kernel.

One launch per call; one program per (sequence, v-head, V-tile of BV rows) holding its
[BV, K] state tile in registers across all T tokens, LPR lanes per row; raw gates (softplus /
exp / sigmoid) computed in the kernel; the k-last state read and written where it lies (no
transpose, no copy).  The launch shape (BV, num_warps, num_stages, LPR, and DENSE: compile-time
strides for contiguous inputs) comes from a small per-GPU table indexed by B*HV (one for T=1 in
place, one for destination passing, and per least T for several tokens per call), measured with
``python3 -m gdnzoo.bench.gpu_tune``; nothing is autotuned inside a call.
"""
from __future__ import annotations

from gdnzoo import cuda_build
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.registry import for_gpu

HEAD_DIMS = (64, 128, 256)
# On CPU the interpreter runs each program in numpy: ~5-20 ms per program and token.
CPU_MAX_PROGRAM_TOKENS = 512
GRID_LIMIT = 2**31 - 1

# GPU name substring -> state dtype -> rows (max B*HV inclusive or None, BV, num_warps,
# num_stages[, LPR lanes per row; default all of a row's 16-byte vectors up to 32 lanes[, DENSE:
# 1 = constant strides when every tensor is contiguous, default 0 = the strides passed]]).
# "default" serves GPUs without a row.  Small B*HV takes small tiles so that enough programs
# cover the SMs (B=1 at HV=8 on the H100: 8 heads x 32 tiles of 4 rows).
LAUNCH_TABLE = {
    # Measured on an NVIDIA H100 80GB HBM3 (2026-11-22, torch 2.11, triton 3.6, contest
    # geometry HV=8): the fastest shape per batch size on the CUPTI kernel clock with state
    # read and written cold, from `python3 -m gdnzoo.bench.gpu_tune --backends fla-recurrent`
    # (bench/results/h100-80gb-hbm3/gpu_tune.csv).  From B=4 to 16 one 128-thread program
    # per 32 rows with 4 lanes a row (a thread streams 128 bytes of its row) reads at the floor.
    # Re-tuned with DENSE as a candidate (gpu_tune_fla_recurrent_dense.*): rows changed where
    # the winner read >= 1% faster than the committed row in the confirm sessions (fp32 B=1
    # 2.05 vs 2.14 us, bf16 B=1 1.89 vs 1.98, bf16 B=4 2.26 vs 2.37, B=8 3.04 vs 3.20, B=48
    # 9.95 vs 10.08), every one of them DENSE.
    "H100": {
        "fp32": [(8, 2, 1, 1, 32, 1), (32, 32, 4, 1, 4, 1), (64, 32, 4, 1, 4), (128, 64, 8, 1, 4),
                 (256, 32, 2, 1, 16, 1), (384, 8, 1, 1, 32, 1), (1024, 16, 2, 1, 16),
                 (2048, 2, 1, 1, 16), (None, 16, 8, 1, 16)],
        "bf16": [(8, 4, 1, 1, 8, 1), (32, 32, 4, 1, 4, 1), (64, 64, 4, 1, 4, 1),
                 (128, 16, 4, 1, 16, 1), (256, 64, 4, 1, 4, 1), (384, 32, 4, 1, 8, 1),
                 (512, 16, 4, 1, 16), (None, 32, 2, 1, 16)],
    },
    # NVIDIA H200 (also matches GH200), 2026-11-22, same tune (bench/results/h200/gpu_tune_*):
    # the "default" rows it ran with before read 1.06-1.41x the floor; a row changed where the
    # winner read >= 1% faster than them in the confirm sessions (fp32 B=16 5.44 vs 6.69 us,
    # B=512 128.9 vs 136.1; bf16 B=32 5.63 vs 6.40).
    # Re-tuned there with DENSE as a candidate (bench/results/h200/gpu_tune_fla_recurrent_dense*):
    # fp32 B=1 1.95 vs 2.05 us, bf16 B=1 1.73 vs 1.82, bf16 B=8 2.78 vs 2.94 in the confirm.
    "H200": {
        "fp32": [(8, 8, 4, 1, 16, 1), (32, 32, 4, 1, 4, 1), (64, 8, 4, 1, 16, 1),
                 (128, 64, 8, 1, 4, 1), (1024, 8, 1, 1, 32, 1), (None, 16, 4, 1, 16)],
        "bf16": [(8, 16, 8, 1, 16, 1), (32, 32, 4, 1, 4, 1), (64, 8, 1, 1, 8, 1),
                 (128, 16, 4, 1, 16, 1), (256, 64, 4, 1, 4, 1), (384, 16, 2, 1, 8, 1),
                 (512, 8, 1, 1, 8, 1), (2048, 16, 2, 1, 16, 1), (None, 16, 1, 1, 16)],
    },
    "default": {
        "fp32": [(64, 8, 1, 1), (512, 16, 2, 1), (None, 32, 4, 1)],
        "bf16": [(64, 8, 1, 1), (512, 16, 2, 1), (None, 32, 4, 1)],
    },
}
# Destination passing (new_state a distinct tensor), same format; a GPU or dtype without a row
# here takes LAUNCH_TABLE's.  From `python3 -m gdnzoo.bench.gpu_tune --backends fla-recurrent
# --mode dest` on the H100 (bench/results/h100-80gb-hbm3/gpu_tune_fla_recurrent_dest.*): the
# rows that differ from LAUNCH_TABLE read 1-4% faster than it in dest-mode bench-length sessions
# (fp32 B=16 6.91 vs 7.14 us, bf16 B=4 2.59 vs 2.66, B=8 3.27 vs 3.42, B=16 4.54 vs 4.70).
# Re-tuned with DENSE as a candidate (gpu_tune_fla_recurrent_dense_dest.*), as LAUNCH_TABLE:
# fp32 B=1 2.05 vs 2.14 us, B=4 3.01 vs 3.14, bf16 B=8 3.10 vs 3.27, B=32 7.01 vs 7.26.
DEST_LAUNCH_TABLE = {
    "H100": {
        "fp32": [(8, 4, 1, 1, 16, 1), (32, 8, 4, 1, 16, 1), (64, 8, 2, 1, 8, 1),
                 (128, 16, 4, 1, 8, 1), (512, 8, 1, 1, 32, 1), (1024, 16, 2, 1, 16),
                 (2048, 2, 1, 1, 16), (None, 16, 8, 1, 16)],
        "bf16": [(8, 8, 4, 1, 16, 1), (32, 4, 1, 1, 8, 1), (64, 8, 4, 1, 16, 1),
                 (128, 16, 4, 1, 16, 1), (256, 32, 2, 1, 16, 1), (384, 16, 4, 1, 16),
                 (512, 32, 2, 1, 16, 1), (None, 32, 2, 1, 16)],
    },
    "H200": {       # `gpu_tune --backends fla-recurrent --mode dest` on the H200, as above
        "fp32": [(8, 2, 1, 1, 16, 1), (32, 4, 1, 1, 16, 1), (64, 8, 4, 1, 16, 1),
                 (128, 4, 1, 1, 16, 1), (1024, 8, 1, 1, 32, 1), (None, 16, 4, 1, 16)],
        "bf16": [(8, 16, 4, 1, 8, 1), (32, 8, 4, 1, 16, 1), (64, 8, 1, 1, 8, 1),
                 (128, 16, 4, 1, 8, 1), (256, 16, 1, 1, 16, 1), (512, 8, 1, 1, 8, 1),
                 (2048, 32, 2, 1, 16), (None, 16, 1, 1, 16)],
    },
}
# Several tokens per call (either mode), by the least T each table serves, same format.  From
# `gpu_tune --backends fla-recurrent --tokens T` at T=4 (gpu_tune_t4_*.*), where the T=1 rows
# read up to 2.7x the floor (fp32 B=512 204.8 vs 297.2 us, bf16 B=512 149.6 vs 195.9, bf16 B=32
# 11.9 vs 18.4), and at T=2 (gpu_tune_t2_*.*, against rows taken from the T=1 and T=4 tables,
# ab_multi_token_t2.log: e.g. fp32 B=4 3.71 vs 4.03 us for the T=1 row, bf16 B=16 5.76 vs 5.95).
# The T=4 rows serve T=3 too, as cuda-v4's do; at T=3 the two tables' rows differ in 4 of 20
# cells and read within 2.5% of each other (ab_multi_token_t3.log).
MULTI_TOKEN_LAUNCH_TABLE = {
    # Re-tuned at T=2 and T=4 with DENSE as a candidate, in place (gpu_tune_fla_recurrent_dense_t2.*,
    # _t4.*): rows changed where the winner read >= 1% faster than the committed row (T=2 fp32
    # B=1 2.43 vs 2.66 us, bf16 B=48 13.12 vs 13.44, B=512 118.9 vs 122.1; T=4 fp32 B=1 3.14
    # vs 3.33, B=128 57.12 vs 58.11), all to DENSE shapes.
    "H100": {
        2: {"fp32": [(8, 8, 4, 1, 16, 1), (32, 32, 4, 1, 4), (128, 32, 2, 1, 4), (256, 4, 1, 1, 8),
                     (384, 8, 2, 1, 16, 1), (512, 8, 1, 1, 16), (1024, 16, 2, 1, 16),
                     (None, 32, 4, 1, 16)],
            "bf16": [(8, 4, 1, 1, 8, 1), (32, 32, 4, 1, 4), (64, 32, 4, 1, 4, 1), (128, 32, 2, 1, 4),
                     (256, 16, 1, 1, 8, 1), (384, 8, 1, 1, 16, 1), (512, 16, 1, 1, 8),
                     (None, 16, 1, 1, 8, 1)]},
        3: {"fp32": [(8, 4, 2, 1, 16, 1), (32, 4, 1, 1, 8, 1), (128, 32, 2, 1, 4), (256, 4, 1, 1, 8, 1),
                     (384, 8, 1, 1, 16), (1024, 8, 1, 1, 16, 1), (None, 32, 4, 1, 16)],
            "bf16": [(8, 2, 1, 1, 16, 1), (32, 32, 4, 1, 4), (64, 32, 4, 1, 4, 1), (128, 16, 1, 1, 8, 1),
                     (256, 16, 1, 1, 8), (384, 8, 1, 1, 4, 1), (1024, 16, 1, 1, 8),
                     (None, 16, 1, 1, 8, 1)]},
    },
    # H200, tuned the same way (bench/results/h200/gpu_tune_fla_recurrent_t{2,4}.*) against
    # its T=1 rows, which read up to 2.2x the floor at T=2 (bf16 B=32 11.17 vs 7.87 us, fp32
    # B=512 165.3 vs 136.9) and lost to fla-upstream from B=32 up.
    "H200": {
        2: {"fp32": [(8, 2, 1, 1, 16), (32, 32, 4, 1, 4), (128, 32, 2, 1, 4), (384, 4, 1, 1, 8),
                     (1024, 8, 1, 1, 16), (None, 16, 1, 1, 16)],
            "bf16": [(8, 16, 4, 1, 8), (32, 32, 4, 1, 4), (64, 64, 8, 1, 4), (128, 32, 2, 1, 4),
                     (256, 16, 1, 1, 8), (384, 32, 2, 1, 8), (None, 16, 1, 1, 8)]},
        3: {"fp32": [(8, 2, 1, 1, 16), (32, 4, 1, 1, 16), (128, 32, 2, 1, 4), (256, 16, 1, 1, 8),
                     (None, 8, 1, 1, 16)],
            "bf16": [(8, 16, 4, 1, 8), (32, 32, 4, 1, 4), (64, 32, 2, 1, 4), (256, 16, 1, 1, 8),
                     (384, 32, 2, 1, 8), (None, 16, 1, 1, 8)]},
    },
}


def vec_elems(state_dtype: str) -> int:
    """State elements in one 16-byte vector (a thread's unit along K)."""
    return 4 if state_dtype == "fp32" else 8


def default_lpr(state_dtype: str, K: int) -> int:
    """Lanes per row when a table row names none: all of a row's vectors, at most 32 (the
    thread map Triton picks by itself for a [BV, K] tile)."""
    return min(32, K // vec_elems(state_dtype))


def fit_lpr(state_dtype: str, K: int, lpr: int) -> int:
    """``lpr`` lowered until its lanes' vectors divide K (the table is measured at K=128)."""
    while lpr > 1 and K % (lpr * vec_elems(state_dtype)):
        lpr //= 2
    return lpr


def lookup_config(gpu: str, state_dtype: str, BHV: int, K: int, V: int,
                  table=None, dest=False, T=1) -> tuple[int, int, int, int, int]:
    """(BV, num_warps, num_stages, LPR, DENSE) for this GPU, state dtype and B*HV, fitted to K, V;
    ``T`` > 1: MULTI_TOKEN_LAUNCH_TABLE's row, else with ``dest`` (destination passing)
    DEST_LAUNCH_TABLE's, where they have one for this GPU and dtype; else LAUNCH_TABLE's."""
    rows = None
    if table is None:
        table = LAUNCH_TABLE
        if T > 1:
            per_t = for_gpu(MULTI_TOKEN_LAUNCH_TABLE, gpu, {})
            least = max((t for t in per_t if t <= T), default=None)
            rows = None if least is None else per_t[least].get(state_dtype)
        elif dest:
            rows = for_gpu(DEST_LAUNCH_TABLE, gpu, {}).get(state_dtype)
    if rows is None:
        rows = for_gpu(table, gpu, table["default"]).get(state_dtype,
                                                         table["default"][state_dtype])
    BV, nw, ns, *rest = next(row[1:] for row in rows if row[0] is None or BHV <= row[0])
    lpr = fit_lpr(state_dtype, K, rest[0] if rest else default_lpr(state_dtype, K))
    dense = int(rest[1]) if len(rest) > 1 else 0
    BV = min(BV, V)
    # Keep the fp32 tile at <= 64 registers a thread: more warps first, then a smaller tile.
    while BV * K > 64 * 32 * nw and nw < 8:
        nw *= 2
    while BV * K > 64 * 32 * nw and BV > 1:
        BV //= 2
    while BHV * (V // BV) > GRID_LIMIT and BV < V:
        BV *= 2
    return BV, nw, ns, lpr, dense


def available():
    return tlaunch.available((8, 0))


def supports(problem):
    return tlaunch.common_supports(problem, HEAD_DIMS, CPU_MAX_PROGRAM_TOKENS, GRID_LIMIT)


def launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           config=None):
    """Launch with an explicit (BV, num_warps, num_stages[, LPR[, DENSE]]), or the table's when
    None.  DENSE 1 takes the strides from the shapes when every tensor is contiguous (else the
    strides passed are used all the same)."""
    from gdnzoo.backends.triton_recurrent_kernel import gdn_recurrent_kernel
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.get_device()
    sd = "fp32" if state.element_size() == 4 else "bf16"
    if config is None:
        if dev < 0:
            config = (V, 1, 1)                    # interpreter: fewest programs is fastest
        else:
            config = lookup_config(tlaunch.gpu_name(dev), sd, B * HV, K, V,
                                   dest=new_state is not state, T=T)
    BV, nw, ns, *rest = config
    lpr = rest[0] if rest else default_lpr(sd, K)
    dense = len(rest) > 1 and bool(rest[1]) and cuda_build.dense(q, k, v, state, A_log, a,
                                                                 dt_bias, b, out, new_state)
    grid0 = B * HV * (V // BV)
    if V % BV or grid0 > GRID_LIMIT:
        raise ValueError(f"fla-recurrent: BV={BV} must divide V={V} and B*HV*V/BV <= {GRID_LIMIT}")
    if lpr not in (1, 2, 4, 8, 16, 32) or K % (lpr * vec_elems(sd)):
        raise ValueError(f"fla-recurrent: LPR={lpr} lanes x {vec_elems(sd)} elements must "
                         f"divide K={K}")
    tail = (tlaunch.loop_count(T), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *a.stride(), *b.stride(),
            A_log.stride(0), dt_bias.stride(0), *out.stride()[:3], *state.stride()[:3],
            *new_state.stride()[:3], H, HV, K, V, BV, bool(use_qk_l2norm), lpr, vec_elems(sd),
            T if dense else 0)
    return gdn_recurrent_kernel[(grid0,)](q, k, v, a, b, A_log, dt_bias, out, state, new_state,
                                          float(scale), *tail, num_warps=nw, num_stages=ns), \
        grid0, tail


def _first_call(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, key):
    compiled, grid0, tail = launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                                   l2)
    ptrs, _ = tlaunch.Dispatcher.pointers(q, k, v, state, A_log, a, dt_bias, b, out, new_state)
    return tlaunch.fast_launch(compiled, grid0, ptrs, scale, tail, q.get_device())


_DISPATCH = tlaunch.Dispatcher(_first_call)
run = _DISPATCH.run
bind = _DISPATCH.bind

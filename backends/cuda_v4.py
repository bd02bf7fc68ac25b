"""cuda-v4: the latency-optimized CUDA C++ kernel (``cuda_v4.cu``), launched through CuPy.

Each head's V rows are split over several blocks of several warps; the launch shape (warps per
block W, row groups per warp RW, lanes per row LPR, cache hints, gate precision, dot-product
chains, shared-memory staging, q and k shared per block or split over a lane pair) comes from
:data:`CONFIG_TABLE` (in place), :data:`DEST_TABLE` (destination passing) or
:data:`MULTI_TOKEN_TABLE` (T >= 2 tokens per call) by B*HV and state dtype.  Shapes, GVA ratio
and launch shape are compile-time constants of the kernel (one NVRTC variant per signature,
cached on disk).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from gdnzoo import cuda_build
from gdnzoo.registry import for_gpu

SOURCE = Path(__file__).with_name("cuda_v4.cu")
KERNEL = "gdn_decode_v4"
HEAD_DIMS = (32, 64, 128, 256)   # K: whole 16-byte vectors per lane, lane groups dividing 32
MAX_GRID_X = 2**31 - 1
MAX_WARPS = 8
FASTGATE = 1                     # gates of an explicit 4-field config: 1 fast intrinsics, 0 precise

# (largest B*HV, W warps per block, RW row groups per warp, LPR lanes per row, HINT, FAST[,
# CHAIN[, SMEM[, QKS]]]) by state dtype, first match wins.  A row group is 32/LPR rows (one
# 16-byte load per lane per LPR*16 bytes of row); rows per block = W*RW*32/LPR; blocks per head =
# ceil(V / rows per block).  HINT bit 0: state loads ld.global.nc.L1::no_allocate; bit 1: state
# stores st.global.cs.  FAST 1: gates with fast intrinsics (relative error of g ~1e-5,
# bench/gpu_cuda.py measures it).  CHAIN c > 0: dot-product slices as chains of c fused
# multiply-adds (default 0: balanced trees).  SMEM 1: the state staged through shared memory
# (cp.async) and updated one row group at a time.  QKS 1: q and k read once per block into
# shared memory (one 16-byte load per thread instead of K/(LPR*VEC) small loads per lane, which
# is what makes the 4-lanes-per-row shapes pay: two shuffle rounds per dot product, not four);
# QKS 2: the two rows of a lane pair split the q and k loads (one reads q, the other k) and swap
# them with shuffles: half the q/k load instructions, no barrier (LPR <= 16).
# Measured on an NVIDIA H100 80GB HBM3 (2026-11-22, contest geometry HV=8, K=V=128): the fastest
# shape per batch size on the CUPTI kernel clock with state read and written cold, from
# `python3 -m gdnzoo.bench.gpu_tune --backends cuda-v4` (bench/results/h100-80gb-hbm3/
# gpu_tune_cuda_v4_qks.csv), then the tune's winner against the previous table's row in
# bench-length sessions, alternated (ab_cuda_v4_qks_confirm.log): a row changed only where the
# winner read at least 1% faster there (0.8% at fp32 B*HV 129-256, 11.87 vs 11.97 us).  Two rows
# changed after the tune with QKS 2 as a candidate (gpu_tune_qks2_{fp32,bf16}.*) and a 6-round
# confirm (ab_cuda_v4_qks2.log): bf16 B*HV 257-384 (staged, q/k split) 9.57 vs 9.82 us, and
# fp32 B*HV <= 8 2.02 vs 2.05 (a shape, not QKS).  Loads with HINT bit 0 (.nc) are safe in place
# too: each state element is read once, by the thread that later writes it.
CONFIG_TABLE = {
    torch.float32: ((8, 2, 2, 16, 3, 1), (32, 4, 1, 4, 3, 1, 0, 0, 1), (64, 4, 1, 16, 0, 1, 0, 0, 1),
                    (128, 1, 8, 16, 2, 1, 4), (256, 1, 8, 16, 2, 1), (384, 2, 8, 8, 2, 0, 0, 1),
                    (512, 1, 4, 16, 3, 1, 4), (1024, 1, 1, 16, 3, 1), (2048, 1, 2, 32, 3, 0),
                    (None, 1, 1, 16, 3, 0)),
    torch.bfloat16: ((8, 4, 2, 16, 0, 1, 32), (32, 8, 2, 16, 0, 1), (64, 4, 2, 4, 0, 1, 0, 0, 1),
                     (128, 8, 4, 16, 0, 1), (256, 1, 4, 8, 3, 1), (384, 4, 4, 8, 2, 1, 0, 1, 2),
                     (512, 2, 8, 8, 0, 1, 0, 1, 1), (2048, 4, 2, 16, 2, 0), (None, 1, 2, 16, 3, 0)),
}
# Destination passing (new_state a distinct tensor: reads and writes go to different lines) by
# the same rules, from `gpu_tune --backends cuda-v4 --mode dest` (gpu_tune_cuda_v4_dest.*) and
# the in-place row against the dest winner in dest-mode bench-length sessions
# (ab_cuda_v4_dest_confirm.log): the rows that differ read 1.6-7% faster there (bf16 B=8 3.07
# vs 3.30 us, B=256 46.00 vs 47.31), or 0.8% at fp32 B*HV > 2048 (179.4 vs 180.8 us, in the tune
# too; fla-upstream reads ~181 there); the others are the in-place rows.  A dest re-tune with the
# q/k split as a candidate (gpu_tune_qks2_dest_*.*; the split won no dest cell) changed five rows
# by 1-5%: bf16 B*HV 193-256 6.94 vs 7.33 us, 65-128 4.38 vs 4.45, 33-64 3.04 vs 3.07, fp32
# 193-256 11.71 vs 12.16, 65-128 7.04 vs 7.17.
DEST_TABLE = {
    torch.float32: ((8, 2, 2, 16, 3, 1), (32, 4, 1, 4, 3, 1, 0, 0, 1), (64, 4, 1, 16, 0, 1, 0, 0, 1),
                    (128, 4, 2, 32, 3, 1, 0, 0, 1), (256, 2, 8, 16, 3, 1), (384, 2, 8, 8, 2, 0, 0, 1),
                    (512, 1, 4, 16, 3, 1, 4), (1024, 1, 1, 16, 3, 1), (2048, 1, 2, 32, 3, 0),
                    (None, 8, 1, 16, 0, 0, 0, 0, 1)),
    torch.bfloat16: ((8, 4, 2, 16, 0, 1, 32), (32, 8, 2, 16, 0, 1), (64, 4, 2, 4, 3, 1, 0, 0, 1),
                     (128, 4, 2, 16, 2, 1, 0, 0, 1), (256, 1, 8, 16, 3, 1, 0, 0, 1),
                     (384, 2, 4, 8, 0, 1, 0, 1, 1),
                     (512, 4, 4, 8, 2, 0, 0, 1, 1), (1024, 2, 2, 8, 3, 1, 0, 0, 1),
                     (2048, 1, 2, 16, 3, 1, 0, 0, 1), (None, 1, 2, 16, 3, 0)),
}

# Several tokens per call (either mode), by the least T each table serves: each token's work
# (q/k loads, gates, the norms' reductions) is shared by a warp's rows, so more rows per warp pay,
# and the T=1 rows read up to 2x the floor at T=4.  From `gpu_tune --backends cuda-v4 --tokens T`
# at T=4 (gpu_tune_t4_*.*) and T=2 (gpu_tune_t2_*.*; its confirm stage against rows taken from
# the T=1 and T=4 tables, ab_multi_token_t2.log), a row changed where the winner read >= 1%
# faster in bench-length sessions: at T=4 e.g. fp32 B=512 198.9 vs 290.5 us (the T=1 row),
# bf16 B=512 137.5 vs 183.6, B=1 3.01 vs 3.84; at T=2 bf16 B=256 52.6 vs 56.7 (the T=4 row),
# fp32 B=16 7.65 vs 8.18.  The T=4 rows serve T=3 too: there they read faster than the T=2 rows
# in 16 of 20 cells (3 ties), up to 18% (fp32 B=512 189.4 vs 231.3 us; ab_multi_token_t3.log),
# slower in one (fp32 B=4, 3.90 vs 3.81).  Re-tuned at T=2 and T=4 with QKS 2 as a candidate
# (gpu_tune_qks2_t{2,4}_*.*): the q/k split halves each token's q/k load instructions and won
# most changed rows, e.g. T=4 fp32 B=32 15.36 vs 16.10 us, B=256 98.1 vs 100.6, T=2 fp32 B=16
# 7.33 vs 7.62, B=32 12.77 vs 13.31, bf16 B=32 9.12 vs 9.41.  At T=8 the T=4 bf16 rows read
# 2.4-2.8x the floor and lost to fla-recurrent at B=64 and 512 (multi_token_t8_bench.log), so
# bf16 has rows tuned at T=8 for T >= 8 (gpu_tune_qks2_t8_bf16.*: B=64 30.1 vs 33.8 us, B=256
# 112.0 vs 120.7); a None entry means the next smaller T's rows.  Staging serves T=1 only, so no
# row stages.
MULTI_TOKEN_TABLE = {
    2: {torch.float32: ((8, 4, 2, 16, 3, 1), (32, 4, 1, 4, 0, 1, 0, 0, 1), (64, 4, 2, 8, 3, 1, 0, 0, 2),
                        (128, 4, 2, 16, 2, 0, 0, 0, 2), (256, 1, 4, 8, 3, 0, 0, 0, 2),
                        (384, 2, 4, 16, 3, 1), (512, 1, 4, 16, 3, 1, 4),
                        (1024, 4, 2, 16, 3, 0, 0, 0, 1), (None, 2, 2, 16, 3, 0, 0, 0, 1)),
        torch.bfloat16: ((8, 4, 2, 16, 0, 1, 32), (32, 8, 2, 16, 0, 1), (64, 4, 2, 4, 0, 1, 0, 0, 1),
                         (128, 4, 2, 8, 0, 1), (256, 2, 2, 8, 2, 1, 0, 0, 2), (384, 2, 2, 8, 2, 1, 0, 0, 2),
                         (1024, 1, 2, 8, 2, 0), (2048, 1, 4, 8, 3, 0, 0, 0, 1),
                         (None, 4, 4, 16, 3, 0))},
    3: {torch.float32: ((8, 4, 1, 16, 3, 1), (32, 4, 1, 4, 0, 1), (64, 4, 2, 8, 3, 1, 0, 0, 2),
                        (128, 2, 2, 8, 2, 1, 0, 0, 1), (256, 1, 4, 8, 3, 1, 0, 0, 2),
                        (384, 2, 4, 16, 3, 1), (2048, 1, 4, 8, 3, 1, 0, 0, 2),
                        (None, 2, 8, 16, 3, 0, 0, 0, 1)),
        torch.bfloat16: ((8, 4, 1, 8, 3, 1), (64, 8, 1, 8, 3, 1), (128, 4, 4, 8, 0, 1, 0, 0, 2),
                         (256, 4, 2, 8, 2, 1), (384, 4, 2, 4, 2, 1), (512, 1, 4, 16, 2, 1),
                         (2048, 2, 4, 8, 3, 1), (None, 1, 4, 16, 3, 1))},
    8: {torch.float32: None,      # the T >= 3 rows: at T=8 they beat both peers in every cell
        torch.bfloat16: ((8, 4, 1, 8, 3, 1), (64, 8, 1, 8, 3, 1), (128, 4, 4, 8, 0, 1, 0, 0, 2),
                         (256, 2, 8, 8, 2, 1), (384, 4, 2, 4, 2, 1), (512, 4, 4, 8, 3, 1, 0, 0, 2),
                         (1024, 1, 4, 8, 3, 1, 0, 0, 2), (2048, 1, 2, 4, 3, 1, 0, 0, 1),
                         (None, 1, 2, 4, 0, 1, 0, 0, 1))},
}

# Other GPUs' own rows, by a substring of the GPU name (as torch reports it), same formats:
# "inplace" and "dest" at T=1, "tokens" like MULTI_TOKEN_TABLE; a GPU without an entry takes the
# H100 tables above.  H200 (also matches GH200): on an NVIDIA H200 (2026-11-22, `gpu_tune
# --backends cuda-v4 --v4-hints 0,3 [--mode dest] [--tokens 2|4|8]`, bench/results/h200/
# gpu_tune_cuda_v4_*) the H100 rows read 1.25-1.29x the floor at the largest batches (T=1 fp32
# B=512 160.0 vs 127.2 us, bf16 80.7 vs 64.9; T=2 fp32 158.4 vs 134.1; T=4 bf16 127.2 vs
# 117.8); a row changed where the tune's winner read >= 1% faster than the H100 row in its
# confirm sessions.  bf16 T >= 8: tuned at T=8 against the T=4 rows (B=32 16.70 vs 17.41 us,
# B=512 210.2 vs 216.2; the staged candidate's row runs in registers at T > 1, so SMEM is 0).
GPU_TABLES = {
    "H200": {
        "inplace": {
            torch.float32: ((8, 8, 1, 16, 3, 1), (32, 4, 1, 16, 0, 1), (64, 4, 1, 16, 0, 1, 0, 0, 1),
                            (128, 2, 2, 16, 2, 1, 0, 0, 1), (256, 1, 8, 16, 2, 1),
                            (384, 4, 1, 16, 0, 1, 0, 0, 1), (1024, 4, 1, 16, 2, 1, 0, 0, 1),
                            (2048, 2, 1, 16, 3, 0, 0, 0, 1), (None, 4, 1, 16, 3, 1, 0, 0, 1)),
            torch.bfloat16: ((8, 4, 2, 16, 0, 1, 32), (32, 8, 2, 16, 0, 1), (64, 4, 2, 4, 0, 1, 0, 0, 1),
                             (128, 8, 4, 16, 0, 1), (256, 1, 4, 8, 3, 1), (384, 4, 4, 8, 2, 1, 0, 1, 2),
                             (2048, 2, 2, 8, 2, 1), (None, 1, 4, 16, 3, 1, 0, 0, 2)),
        },
        "dest": {
            torch.float32: ((8, 8, 1, 16, 0, 1), (32, 2, 2, 16, 3, 1), (64, 4, 1, 16, 0, 1, 0, 0, 1),
                            (128, 4, 2, 32, 3, 1, 0, 0, 1), (256, 2, 8, 16, 3, 1),
                            (384, 2, 8, 8, 2, 0, 0, 1), (512, 1, 4, 16, 3, 1, 4),
                            (1024, 4, 1, 16, 3, 1, 0, 0, 1), (2048, 4, 1, 16, 3, 1),
                            (None, 1, 2, 16, 0, 0, 0, 0, 1)),
            torch.bfloat16: ((8, 4, 2, 16, 0, 1, 32), (32, 8, 2, 16, 0, 1), (64, 4, 1, 8, 3, 1),
                             (128, 8, 2, 16, 2, 0), (256, 1, 4, 8, 3, 1), (384, 2, 2, 8, 0, 1),
                             (512, 2, 2, 8, 2, 0), (1024, 4, 4, 16, 3, 1, 0, 0, 2),
                             (2048, 2, 4, 16, 3, 1, 0, 0, 2), (None, 2, 4, 16, 3, 0, 0, 0, 2)),
        },
        "tokens": {
            2: {torch.float32: ((8, 4, 2, 16, 2, 1, 0, 0, 2), (32, 2, 2, 16, 0, 1, 0, 0, 2),
                                (64, 4, 2, 8, 3, 1, 0, 0, 2), (128, 4, 2, 16, 2, 0, 0, 0, 2),
                                (256, 1, 4, 8, 3, 0, 0, 0, 2), (384, 2, 4, 16, 3, 0, 0, 0, 2),
                                (512, 1, 4, 8, 3, 1, 0, 0, 2), (1024, 1, 4, 16, 3, 0, 0, 0, 2),
                                (2048, 1, 4, 16, 3, 1, 0, 0, 2), (None, 1, 4, 16, 3, 0, 0, 0, 2)),
                torch.bfloat16: ((8, 4, 2, 16, 0, 1, 32), (32, 8, 2, 16, 0, 1),
                                 (64, 4, 2, 4, 0, 1, 0, 0, 1), (128, 4, 2, 8, 0, 1),
                                 (384, 2, 2, 8, 2, 1, 0, 0, 2), (1024, 1, 2, 8, 2, 0),
                                 (None, 1, 4, 8, 3, 0, 0, 0, 1))},
            3: {torch.float32: ((8, 4, 1, 16, 3, 1), (32, 4, 1, 4, 0, 1), (64, 4, 2, 8, 3, 1, 0, 0, 2),
                                (128, 2, 2, 8, 2, 1, 0, 0, 1), (256, 1, 4, 8, 3, 1, 0, 0, 2),
                                (384, 1, 2, 8, 2, 1, 0, 0, 2), (2048, 1, 4, 8, 3, 1, 0, 0, 2),
                                (None, 1, 4, 8, 3, 0, 0, 0, 2)),
                torch.bfloat16: ((8, 4, 1, 8, 3, 1), (64, 8, 1, 8, 3, 1), (128, 4, 4, 8, 0, 1, 0, 0, 2),
                                 (256, 4, 2, 8, 2, 1), (512, 2, 4, 8, 3, 1, 0, 0, 2),
                                 (2048, 1, 4, 8, 3, 1, 0, 0, 2), (None, 2, 4, 8, 3, 1, 0, 0, 2))},
            8: {torch.float32: None,
                torch.bfloat16: ((8, 4, 1, 8, 3, 1), (64, 8, 1, 8, 3, 1), (128, 4, 4, 8, 0, 1, 0, 0, 2),
                                 (256, 2, 8, 8, 2, 1), (512, 2, 4, 8, 3, 1, 0, 0, 2),
                                 (2048, 1, 4, 8, 3, 1, 0, 0, 2), (None, 1, 2, 4, 0, 1, 0, 0, 1))},
        },
    },
}

_binds: dict = {}                # signature -> Bound


def available():
    if importlib.util.find_spec("cupy") is None:
        return False, "needs CuPy (pip install cupy-cuda13x or cupy-cuda12x)"
    return True, "CUDA C++ compiled with CuPy's NVRTC at first use"


def vec_elems(state_dtype, vec16=True):
    return 16 // cuda_build.ELEM_SIZE[state_dtype] if vec16 else 1


def valid_config(K, V, state_dtype, w, rw, lpr, vec16=True):
    """Why launch shape (W, RW, LPR) cannot serve K, V, or '' when it can."""
    vec = vec_elems(state_dtype, vec16)
    if lpr not in (1, 2, 4, 8, 16, 32) or K % (lpr * vec):
        return f"LPR={lpr} lanes x {vec} elements must divide K={K}"
    if rw < 1 or rw * (32 // lpr) > 32:
        return f"RW={rw} row groups of {32 // lpr} rows exceed a warp's 32 rows"
    if not 1 <= w <= MAX_WARPS:
        return f"W={w} warps per block not in 1..{MAX_WARPS}"
    return ""


def full_config(cfg):
    """(W, RW, LPR, HINT, FAST, CHAIN, SMEM, QKS) from a table row or an explicit config of 4
    to 8 fields (FAST defaults to FASTGATE, CHAIN to 0: tree sums, SMEM to 0: registers only,
    QKS to 0: q and k read by every lane)."""
    cfg = tuple(cfg)
    fast = cfg[4] if len(cfg) > 4 else FASTGATE
    return (*cfg[:4], fast, *(cfg[i] if len(cfg) > i else 0 for i in (5, 6, 7)))


SMEM_STATIC_MAX = 48 * 1024      # bytes of static shared memory a kernel may declare


def smem_bytes(K, state_dtype, w, rw, lpr):
    """Shared memory of GDN_SMEM=1: each warp's row groups, one 16-byte vector per lane."""
    return w * rw * (K // (lpr * vec_elems(state_dtype))) * 32 * 16


def effective_qks(qks, vec16, lpr):
    """The q/k mode a variant is built with: both sharing modes need 16-byte vectors, and the
    lane-pair split (2) a second row in the pair (LPR <= 16); otherwise 0, every lane reads its
    own slices."""
    if not vec16 or qks not in (1, 2) or (qks == 2 and lpr > 16):
        return 0
    return int(qks)


def qks_bytes(K, io_dtype, T):
    """Shared memory of GDN_QKS=1: q and k rows of one token (two tokens' when T > 1)."""
    return (2 if T > 1 else 1) * 2 * K * cuda_build.ELEM_SIZE[io_dtype]


def table_rows(state_dtype, dest=False, T=1, gpu=""):
    """The launch-table rows of this state dtype, mode, token count and GPU name (the GPU's own
    tables in :data:`GPU_TABLES` where it has them): for T >= 2 those of the largest least-T key
    <= T that has rows for the dtype, else the T=1 table of the mode."""
    own = for_gpu(GPU_TABLES, gpu, {})
    if T > 1:
        multi = own.get("tokens") or MULTI_TOKEN_TABLE
        for least in sorted((t for t in multi if t <= T), reverse=True):
            if multi[least][state_dtype] is not None:
                return multi[least][state_dtype]
    return (own.get("dest" if dest else "inplace") or {}).get(state_dtype) \
        or (DEST_TABLE if dest else CONFIG_TABLE)[state_dtype]


def pick_config(BHV, state_dtype, dest=False, T=1, gpu=""):
    """The table's (W, RW, LPR, HINT, FAST, CHAIN, SMEM, QKS) for B*HV heads of this state
    dtype, in place or (``dest``) destination passing, T tokens per call, on this GPU."""
    for hi, *cfg in table_rows(state_dtype, dest, T, gpu):
        if hi is None or BHV <= hi:
            return full_config(cfg)
    raise AssertionError("CONFIG_TABLE needs a last row with no upper bound")


def table_config(BHV, state_dtype, K, dest=False, T=1, gpu=""):
    """The table's config fitted to K: the table is measured at K=128, and narrower rows take
    fewer lanes per row."""
    w, rw, lpr, *rest = pick_config(BHV, state_dtype, dest, T, gpu)
    while lpr > 1 and K % (lpr * vec_elems(state_dtype)):
        lpr //= 2
    while rw > 1 and rw * (32 // lpr) > 32:       # a warp owns at most 32 rows
        rw //= 2
    return (w, rw, lpr, *rest)


def blocks_per_head(V, w, rw, lpr):
    return -(-V // (w * rw * (32 // lpr)))


def supports(problem):
    if problem.device != "cuda":
        return False, f"runs on CUDA GPUs only, got device {problem.device}"
    if problem.cc is not None and tuple(problem.cc) < (8, 0):
        return False, f"needs compute capability >= 8.0 (bf16 conversions), got {problem.cc}"
    if problem.K not in HEAD_DIMS:
        return False, (f"K in {HEAD_DIMS} (each row is split into 16-byte vectors over a "
                       f"power-of-two lane group), got K={problem.K}")
    grid = max(problem.B * problem.HV * blocks_per_head(problem.V, w, rw, 32)  # the largest grid
               for w, rw, *_ in (pick_config(problem.B * problem.HV, problem.state_dtype, dest,
                                             problem.T, gpu)
                                 for dest in (False, True) for gpu in ("", *GPU_TABLES)))
    if grid > MAX_GRID_X:
        return False, f"grid of {grid} blocks exceeds {MAX_GRID_X} (B*HV={problem.B * problem.HV})"
    return True, ""


class Bound:
    """cuda-v4 for one signature: a Launch for 16-byte-aligned pointers and one (built on first
    need) for the element-load variant; per call only the pointers are looked at."""

    def __init__(self, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, config):
        # Only plain values are kept: a bound launcher must not keep the first call's tensors alive.
        self.values = cuda_build.param_values(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                              new_state)
        self.dtypes = (state.dtype, q.dtype, a.dtype, b.dtype, dt_bias.dtype)
        self.shape = (*q.shape, v.shape[2], v.shape[3])         # B, T, H, K, HV, V
        self.l2, self.config, self.dev = bool(l2), config, q.get_device()
        self.dest = new_state is not state        # which table: bind() keys on it
        es, eio = state.element_size(), q.element_size()
        f = self.values
        st = (f[28] | f[29] | f[30] | f[31] | f[32] | f[33]) * es   # state/new_state strides
        io = (f[10] | f[11] | f[12] | f[13] | f[14] | f[15]) * eio  # q/k strides
        self.strides_aligned = (st | io) & 15 == 0
        self.dense = cuda_build.dense(q, k, v, state, A_log, a, dt_bias, b, out, new_state)
        self.launches = {}
        if self.strides_aligned:
            self.vec16 = self.make(True)

    def make(self, vec16):
        B, T, H, K, HV, V = self.shape
        sd, io, ad, bd, dd = self.dtypes
        config = self.config
        if config is None:
            w, rw, lpr, hint, fast, chain, smem, qks = table_config(
                B * HV, sd, K, self.dest, T, torch.cuda.get_device_name(self.dev))
        else:
            w, rw, lpr, hint, fast, chain, smem, qks = full_config(config)
        if not vec16:
            lpr, hint = min(32, K), 0                  # element loads: one element per lane
        why = valid_config(K, V, sd, w, rw, lpr, vec16)
        if why:
            raise ValueError(f"cuda-v4: launch config invalid: {why}")
        qks = effective_qks(qks, vec16, lpr)
        # staging: 16-byte vectors, T = 1, within static shared memory
        smem = int(bool(smem) and vec16 and T == 1 and smem_bytes(K, sd, w, rw, lpr)
                   + (qks == 1) * qks_bytes(K, io, T) <= SMEM_STATIC_MAX)
        defs = cuda_build.defines(sd, io, ad, bd, dd, K, self.l2, v=V, t=T, hv=HV, gva=HV // H,
                                  w=w, rw=rw, lpr=lpr, vec16=int(vec16), hint=hint,
                                  fastgate=fast, dense=int(self.dense), chain=chain, smem=smem,
                                  qks=qks)
        kern = cuda_build.get_kernel(SOURCE, KERNEL, defs, self.dev)
        bph = blocks_per_head(V, w, rw, lpr)
        launch = cuda_build.Launch(kern, B * HV * bph, 32 * w, self.dev, self.values)
        self.launches[vec16] = launch
        return launch

    def __call__(self, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2):
        qp, kp, sp, np_ = q.data_ptr(), k.data_ptr(), state.data_ptr(), new_state.data_ptr()
        if self.strides_aligned and (qp | kp | sp | np_) & 15 == 0:
            launch = self.vec16
        else:
            launch = self.launches.get(False) or self.make(False)
        try:
            buf, _, argv = launch._tls.b
        except AttributeError:
            buf, _, argv = launch.buffers()
        cuda_build.PTRS.pack_into(buf, 0, qp, kp, v.data_ptr(), a.data_ptr(), b.data_ptr(),
                                  A_log.data_ptr(), dt_bias.data_ptr(), sp, np_, out.data_ptr())
        cuda_build.launch_raw(launch.func, launch.grid, launch.block, launch.dev, argv)


def bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, config=None):
    """A launcher for every call with these shapes, strides, dtypes, scale and mode (in place
    or destination passing: each has its own table)."""
    key = (cuda_build.signature_key(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                                    use_qk_l2norm), config)
    bound = _binds.get(key)
    if bound is None:
        if len(_binds) >= 4096:
            _binds.clear()
        bound = _binds[key] = Bound(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                                    use_qk_l2norm, config)
    return bound


def run(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm, config=None):
    """Backend entry point; ``config=(W, RW, LPR, HINT[, FAST[, CHAIN[, SMEM[, QKS]]]])``
    overrides the table (CHAIN: 0 tree sums, c > 0 chains of c fused multiply-adds; SMEM 1: the
    state staged through shared memory with cp.async, T = 1 only; QKS 1: q and k read once per
    block into shared memory, 2: split over a lane pair and swapped by shuffles)."""
    bind(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
         config)(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm)

"""fla-recurrent: our Triton kernel in the style of FLA's fused recurrent kernel.

One launch per call; one program per (sequence, v-head, V-tile of BV rows) holding its
[BV, K] state tile in registers across all T tokens; raw gates (softplus / exp / sigmoid)
computed in the kernel; the k-last state read and written where it lies (no transpose, no
copy).  The launch shape (BV, num_warps, num_stages) comes from a small per-GPU table indexed
by B*HV, measured with ``bench/gpu_triton.py``; nothing is autotuned inside a call.
"""
from __future__ import annotations

from gdnzoo.backends import _triton_launch as tlaunch

HEAD_DIMS = (64, 128, 256)
# On CPU the interpreter runs each program in numpy: ~5-20 ms per program and token.
CPU_MAX_PROGRAM_TOKENS = 512
GRID_LIMIT = 2**31 - 1

# GPU name substring -> state dtype -> rows (max B*HV inclusive or None, BV, num_warps,
# num_stages).  "default" serves GPUs without a row.  Small B*HV takes small tiles so that
# enough programs cover the SMs (B=1 at HV=8 on the H100: 8 heads x 64 tiles of 2 rows).
LAUNCH_TABLE = {
    # Measured on an NVIDIA H100 80GB HBM3 (2026-11-22, torch 2.11, triton 3.6, contest
    # geometry HV=8): the fastest shape per batch size on the CUPTI kernel clock with state read
    # and written cold, from `python3 -m gdnzoo.bench.gpu_tune`
    # (bench/results/h100-80gb-hbm3/gpu_tune.csv).
    "H100": {
        "fp32": [(32, 2, 1, 1), (64, 4, 1, 1), (256, 16, 1, 1), (384, 4, 1, 1), (2048, 2, 1, 1),
                 (None, 32, 8, 1)],
        "bf16": [(8, 2, 1, 1), (128, 32, 8, 1), (256, 4, 1, 1), (512, 32, 8, 1), (None, 8, 1, 1)],
    },
    "default": {
        "fp32": [(64, 8, 1, 1), (512, 16, 2, 1), (None, 32, 4, 1)],
        "bf16": [(64, 8, 1, 1), (512, 16, 2, 1), (None, 32, 4, 1)],
    },
}


def lookup_config(gpu: str, state_dtype: str, BHV: int, K: int, V: int,
                  table=None) -> tuple[int, int, int]:
    """(BV, num_warps, num_stages) for this GPU, state dtype and B*HV, fitted to K and V."""
    table = LAUNCH_TABLE if table is None else table
    per_gpu = next((rows for name, rows in table.items() if name != "default" and name in gpu),
                   table["default"])
    rows = per_gpu.get(state_dtype, table["default"][state_dtype])
    BV, nw, ns = next((bv, w, s) for hi, bv, w, s in rows if hi is None or BHV <= hi)
    BV = min(BV, V)
    # Keep the fp32 tile at <= 64 registers a thread: more warps first, then a smaller tile.
    while BV * K > 64 * 32 * nw and nw < 8:
        nw *= 2
    while BV * K > 64 * 32 * nw and BV > 1:
        BV //= 2
    while BHV * (V // BV) > GRID_LIMIT and BV < V:
        BV *= 2
    return BV, nw, ns


def available():
    return tlaunch.available((8, 0))


def supports(problem):
    return tlaunch.common_supports(problem, HEAD_DIMS, CPU_MAX_PROGRAM_TOKENS, GRID_LIMIT)


def launch(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           config=None):
    """Launch with an explicit (BV, num_warps, num_stages), or the table's when None."""
    from gdnzoo.backends.triton_recurrent_kernel import gdn_recurrent_kernel
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.get_device()
    if config is None:
        if dev < 0:
            config = (V, 1, 1)                    # interpreter: fewest programs is fastest
        else:
            sd = "fp32" if state.element_size() == 4 else "bf16"
            config = lookup_config(tlaunch.gpu_name(dev), sd, B * HV, K, V)
    BV, nw, ns = config
    grid0 = B * HV * (V // BV)
    if V % BV or grid0 > GRID_LIMIT:
        raise ValueError(f"fla-recurrent: BV={BV} must divide V={V} and B*HV*V/BV <= {GRID_LIMIT}")
    tail = (tlaunch.loop_count(T), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *a.stride(), *b.stride(),
            A_log.stride(0), dt_bias.stride(0), *out.stride()[:3], *state.stride()[:3],
            *new_state.stride()[:3], H, HV, K, V, BV, bool(use_qk_l2norm))
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

"""The one signature of gdnzoo and its single validation function.

Every backend is called only after :func:`validate` has accepted the inputs, so a
backend never sees a wrong rank, shape, dtype, device or layout.  Validation runs
before any kernel: a rejected call leaves ``state`` untouched.

Shapes::

    q, k      [B, T, H,  K]   fp16 | bf16          K axis contiguous
    v         [B, T, HV, V]   same dtype as q       V axis contiguous
    state     [B, HV, V, K]   fp32 | bf16           K axis contiguous ("k-last"), or a pool
                                                    [P, HV, V, K] with state_indices [B]
    A_log     [HV]            fp32
    a, b      [B, T, HV]      fp16 | bf16
    dt_bias   [HV]            fp32 | bf16
    out       [B, T, HV, V]   dtype of v
    new_state [B, HV, V, K]   dtype of state; None or ``state`` means in place (a pool:
                              [P', HV, V, K], written at new_state_indices)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gdnzoo import pool as pools

IO_DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)
DT_BIAS_DTYPES = (torch.float32, torch.bfloat16)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
               torch.float64: "fp64"}


def dtype_name(dt) -> str:
    return DTYPE_NAMES.get(dt, str(dt).replace("torch.", ""))


@dataclass(frozen=True)
class Problem:
    """What a backend needs to know to decide whether it can serve a call."""
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    state_dtype: torch.dtype
    io_dtype: torch.dtype
    device: str                 # "cpu" | "cuda"
    use_qk_l2norm: bool = False
    inplace: bool = True
    cc: tuple | None = None     # compute capability of the device, None on CPU
    pool: bool = False          # state is a pool read through state_indices (gdnzoo.pool)

    @property
    def state_name(self) -> str:
        return dtype_name(self.state_dtype)

    def describe(self) -> str:
        return (f"B={self.B} T={self.T} H={self.H} HV={self.HV} K={self.K} V={self.V} "
                f"state={self.state_name} io={dtype_name(self.io_dtype)} device={self.device} "
                f"l2norm={self.use_qk_l2norm} {'in-place' if self.inplace else 'dest-passing'}"
                f"{' pool' if self.pool else ''}")


def _fmt_dt(dts) -> str:
    return " or ".join(dtype_name(d) for d in dts)


def _need_tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _need_rank(name, x, rank, layout):
    if x.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got rank {x.dim()} "
                         f"with shape {tuple(x.shape)}")


def _need_shape(name, x, shape, layout):
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} {layout}, got {tuple(x.shape)}")


def _need_dtype(name, x, allowed):
    if x.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {_fmt_dt(allowed)}, got {dtype_name(x.dtype)}")


def _need_last_contiguous(name, x, axis_name):
    if x.numel() > 0 and x.stride(-1) != 1:
        raise ValueError(f"{name}: expected the {axis_name} axis (last) contiguous (stride 1), "
                         f"got strides {tuple(x.stride())}")


def resolve_scale(scale, K: int) -> float:
    """None or 0 means 1/sqrt(K); negative or non-finite is an error."""
    if scale is None:
        return 1.0 / math.sqrt(K)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"scale: expected a scalar, got a tensor of shape {tuple(scale.shape)}")
        scale = scale.item()
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}") from None
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"scale: expected a finite value >= 0 (0 or None means 1/sqrt(K)), got {s}")
    return 1.0 / math.sqrt(K) if s == 0.0 else s


def validate(q, k, v, state, A_log, a, dt_bias, b, scale=None, *, out=None, new_state=None,
             use_qk_l2norm=False, state_indices=None, new_state_indices=None,
             null_slot=None) -> tuple[Problem, float]:
    """Check every argument of :func:`gdnzoo.decode`; return the problem and the resolved scale.

    Raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (rank, shape, device, layout,
    value) naming the argument, what was expected and what came.
    """
    named = dict(q=q, k=k, v=v, state=state, A_log=A_log, a=a, dt_bias=dt_bias, b=b)
    for n, x in named.items():
        _need_tensor(n, x)
    if out is not None:
        _need_tensor("out", out)
    if new_state is not None:
        _need_tensor("new_state", new_state)

    _need_rank("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    _need_rank("k", k, 4, "[B, T, H, K]")
    _need_shape("k", k, (B, T, H, K), "[B, T, H, K] (same as q)")
    _need_rank("v", v, 4, "[B, T, HV, V]")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [B={B}, T={T}, HV, V] (B, T as q), got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if B < 1 or T < 1 or H < 1 or K < 1 or HV < 1 or V < 1:
        raise ValueError(f"q/v: every dimension must be >= 1, got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if HV % H != 0:
        raise ValueError(f"v: expected HV divisible by H (HV % H == 0), got HV={HV}, H={H}")
    pooled = state_indices is not None
    if pooled:
        pools.validate(B, HV, V, K, q.device, state, new_state, state_indices,
                       new_state_indices, null_slot)
    else:
        pools.no_pool_args(new_state_indices, null_slot)
        _need_rank("state", state, 4, "[B, HV, V, K]")
        _need_shape("state", state, (B, HV, V, K), "[B, HV, V, K]")
    _need_rank("A_log", A_log, 1, "[HV]")
    _need_shape("A_log", A_log, (HV,), "[HV]")
    _need_rank("a", a, 3, "[B, T, HV]")
    _need_shape("a", a, (B, T, HV), "[B, T, HV]")
    _need_rank("dt_bias", dt_bias, 1, "[HV]")
    _need_shape("dt_bias", dt_bias, (HV,), "[HV]")
    _need_rank("b", b, 3, "[B, T, HV]")
    _need_shape("b", b, (B, T, HV), "[B, T, HV]")

    _need_dtype("q", q, IO_DTYPES)
    for n in ("k", "v"):
        if named[n].dtype != q.dtype:
            raise TypeError(f"{n}: expected dtype {dtype_name(q.dtype)} (same as q), "
                            f"got {dtype_name(named[n].dtype)}")
    _need_dtype("a", a, IO_DTYPES)
    _need_dtype("b", b, IO_DTYPES)
    _need_dtype("A_log", A_log, (torch.float32,))
    _need_dtype("dt_bias", dt_bias, DT_BIAS_DTYPES)
    _need_dtype("state", state, STATE_DTYPES)

    if out is not None:
        _need_rank("out", out, 4, "[B, T, HV, V]")
        _need_shape("out", out, (B, T, HV, V), "[B, T, HV, V]")
        if out.dtype != v.dtype:
            raise TypeError(f"out: expected dtype {dtype_name(v.dtype)} (same as v), "
                            f"got {dtype_name(out.dtype)}")
    inplace = new_state is None or new_state is state
    if not inplace:
        if not pooled:
            _need_rank("new_state", new_state, 4, "[B, HV, V, K]")
            _need_shape("new_state", new_state, (B, HV, V, K), "[B, HV, V, K]")
        if new_state.dtype != state.dtype:
            raise TypeError(f"new_state: expected dtype {dtype_name(state.dtype)} (same as state), "
                            f"got {dtype_name(new_state.dtype)}")

    dev = q.device
    tensors = dict(named, out=out, new_state=None if inplace else new_state)
    for n, x in tensors.items():
        if x is not None and x.device != dev:
            raise ValueError(f"{n}: expected device {dev} (the device of q), got {x.device}")

    _need_last_contiguous("q", q, "K")
    _need_last_contiguous("k", k, "K")
    _need_last_contiguous("v", v, "V")
    _need_last_contiguous("state", state, "K")
    if out is not None:
        _need_last_contiguous("out", out, "V")
    if not inplace:
        _need_last_contiguous("new_state", new_state, "K")
    check_aliasing(state, out, new_state)

    s = resolve_scale(scale, K)
    if not isinstance(use_qk_l2norm, bool):
        raise TypeError(f"use_qk_l2norm: expected bool, got {type(use_qk_l2norm).__name__}")
    cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    p = Problem(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state.dtype, io_dtype=q.dtype,
                device=dev.type, use_qk_l2norm=use_qk_l2norm, inplace=inplace, cc=cc,
                pool=pooled)
    return p, s


def check_aliasing(state, out, new_state):
    """Data-dependent checks that a cached signature cannot cover: run on every call."""
    if new_state is not None and new_state is not state and _overlaps(new_state, state):
        raise ValueError("new_state: expected a tensor distinct from state or state itself, "
                         "got a different view that overlaps state's memory")
    if out is not None and _overlaps(out, state):
        raise ValueError("out: expected memory disjoint from state, got an overlapping tensor")


def _sig(t):
    return (t.size(), t.stride(), t.dtype, t.get_device())


def signature(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
              state_indices=None, new_state_indices=None, null_slot=None):
    """Everything :func:`validate` decides from, except data pointers, as a hashable key.

    Two calls with equal signatures get the same verdict, so a cached ``(Problem, scale)``
    may be reused; :func:`check_aliasing` still runs per call.  Raises ``TypeError`` for
    non-tensors (the caller then runs the full :func:`validate` for its message).
    """
    return (_sig(q), _sig(k), _sig(v), _sig(state), _sig(A_log), _sig(a), _sig(dt_bias), _sig(b),
            None if out is None else _sig(out),
            0 if new_state is None else (1 if new_state is state else _sig(new_state)),
            scale, use_qk_l2norm,
            None if state_indices is None else
            (_sig(state_indices), None if new_state_indices is None else _sig(new_state_indices),
             null_slot))


def byte_span(x) -> int:
    """Bytes from ``x``'s first to one past its last element (0 when empty): fixed by shape,
    strides and dtype, so a memoized signature can check overlaps from data pointers alone."""
    if x.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(x.shape, x.stride())) + 1) * x.element_size()


def _span(x):
    start = x.data_ptr()
    return start, start + byte_span(x)


def _overlaps(x, y) -> bool:
    if x.numel() == 0 or y.numel() == 0:
        return False
    if x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _span(x), _span(y)
    return a0 < b1 and b0 < a1

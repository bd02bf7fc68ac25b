"""The commit's contract (:func:`gdnzoo.commit`): keep the accepted step of a verify call
(:mod:`gdnzoo.verify`).

After a verify with ``update_state=False``, the engine knows how many draft tokens were
accepted; ``commit`` copies ``intermediate_states[row n, accepted_steps[n]]`` into sequence n's
pool slot.  Its backends are registered under ``operations.commit`` in ``registry.yaml``: on a
CUDA device ``triton-commit``, one Triton launch that reads the step, row and slot indices
itself (no host sync: CUDA-graph capturable); ``pt-reference`` runs
:func:`gdnzoo.reference.reference_commit` (one host sync).
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import torch

from gdnzoo import pool as pools
from gdnzoo.checks import ProblemBase, dtype_name, need_tensor, overlaps
from gdnzoo.operation import COMMIT

PUBLIC_DOC = """Keep the accepted step of a verify call (``update_state=False``): copy
``intermediate_states[intermediate_indices[n], accepted_steps[n]]`` into slot
``state_indices[n]`` of the pool ``state`` (``state_indices`` None: row n of a dense
[B, HV, V, K] state; ``intermediate_indices`` None: row n).  A negative step or one >=
T_max, a row that is negative or >= S, and a padded slot (negative, ``null_slot``, >= P)
copy nothing.  One launch on the GPU, no host sync: CUDA-graph capturable.  ``algo`` names a
commit backend (``gdnzoo.list_backends(op="commit")``).  Returns ``state``.
"""


@dataclass(frozen=True)
class Problem(ProblemBase):
    """What a backend needs to know to decide whether it can serve a commit call."""
    B: int
    S: int
    T: int                      # T_max: the intermediate states' steps
    HV: int
    K: int
    V: int
    state_dtype: torch.dtype
    device: str
    cc: tuple | None = None
    pool: bool = False
    inplace = True
    op = "commit"

    def describe(self) -> str:
        return (f"B={self.B} S={self.S} T_max={self.T} HV={self.HV} K={self.K} V={self.V} "
                f"state={self.state_name} device={self.device}{' pool' if self.pool else ''}")


def _state(state, B, HV, V, K, pooled):
    if pooled:
        pools.pool_tensor("state", state, HV, V, K)
        return
    if state.dim() != 4 or tuple(state.shape) != (B, HV, V, K):
        raise ValueError(f"state: expected shape ({B}, {HV}, {V}, {K}) [B, HV, V, K] "
                         f"(state_indices=None), got {tuple(state.shape)}")
    if tuple(state.stride()[1:]) != (V * K, K, 1) or (B > 1 and state.stride(0) < HV * V * K):
        raise ValueError(f"state: expected each [HV, V, K] row contiguous and rows apart, got "
                         f"strides {tuple(state.stride())}")


def validate(intermediate_states, intermediate_indices, accepted_steps, state, state_indices,
             null_slot):
    """Check commit's arguments; raise naming the argument.  Returns the null slot (-1:
    none)."""
    for name, x in (("intermediate_states", intermediate_states),
                    ("accepted_steps", accepted_steps), ("state", state)):
        need_tensor(name, x, name == "state")
    x = intermediate_states
    if x.dim() != 5:
        raise ValueError(f"intermediate_states: expected rank 5 [S, T_max, HV, V, K], got "
                         f"shape {tuple(x.shape)}")
    S, T_max, HV, V, K = x.shape
    if tuple(x.stride()[2:]) != (V * K, K, 1):
        raise ValueError(f"intermediate_states: expected each [HV, V, K] block contiguous, got "
                         f"strides {tuple(x.stride())}")
    dev = x.device
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"intermediate_states: expected a tensor on cpu or cuda, got {dev}")
    if accepted_steps.dim() != 1:
        raise ValueError(f"accepted_steps: expected shape [B], got {tuple(accepted_steps.shape)}")
    B = accepted_steps.shape[0]
    pools.index_tensor("accepted_steps", accepted_steps, B, dev, device_of="intermediate_states")
    for name, t in (("intermediate_indices", intermediate_indices),
                    ("state_indices", state_indices)):
        if isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] != B:
            raise ValueError(f"{name}: expected {B} entries (one per entry of accepted_steps), "
                             f"got {t.shape[0]}")
    if intermediate_indices is not None:
        pools.index_tensor("intermediate_indices", intermediate_indices, B, dev,
                           device_of="intermediate_states")
    if state_indices is not None:
        pools.index_tensor("state_indices", state_indices, B, dev,
                           device_of="intermediate_states")
    elif null_slot is not None:
        raise ValueError("null_slot: only with state_indices (a state pool); got "
                         "state_indices=None")
    if state.device != dev:
        raise ValueError(f"state: expected device {dev} (the device of intermediate_states), "
                         f"got {state.device}")
    if state.dtype != x.dtype:
        raise TypeError(f"state: expected dtype {dtype_name(x.dtype)} (same as "
                        f"intermediate_states), got {dtype_name(state.dtype)}")
    _state(state, B, HV, V, K, state_indices is not None)
    null_slot = pools.null_slot_value(null_slot, state.shape[0])
    for name, y in (("intermediate_states", x), ("accepted_steps", accepted_steps),
                    ("intermediate_indices", intermediate_indices),
                    ("state_indices", state_indices)):
        if y is not None and overlaps(state, y):
            raise ValueError(f"state: expected memory disjoint from {name} (state is written), "
                             f"got overlapping byte ranges")
    return null_slot


def check_on_host(intermediate_indices, accepted_steps, state_indices, null_slot, S, T_max, P):
    """The debug check (``GDNZOO_CHECK_INDICES=1``): raise naming the first slot that two
    committed sequences would both write, or an index past its tensor."""
    B = accepted_steps.shape[0]
    steps = accepted_steps.tolist()
    rows = list(range(B)) if intermediate_indices is None else intermediate_indices.tolist()
    slots = list(range(B)) if state_indices is None else state_indices.tolist()
    seen = {}
    for n in range(B):
        if steps[n] < 0 or rows[n] < 0 or slots[n] < 0 or slots[n] == null_slot:
            continue
        for name, val, lim in (("accepted_steps", steps[n], T_max),
                               ("intermediate_indices", rows[n], S),
                               ("state_indices", slots[n], P)):
            if val >= lim:
                raise ValueError(f"{name}[{n}] = {val}: expected < {lim} "
                                 f"({pools.CHECK_ENV} is set)")
        if slots[n] in seen:
            raise ValueError(f"state_indices[{n}] = {slots[n]}: slot also committed by "
                             f"sequence {seen[slots[n]]} ({pools.CHECK_ENV} is set)")
        seen[slots[n]] = n


def verdict(args, env_pdl=None) -> tuple[Problem, None]:
    """:func:`validate` of commit's positional ``args`` as (problem, no scale)."""
    inter, rows, steps, state, slots, null, _ = args
    validate(inter, rows, steps, state, slots, null)
    S, T_max, HV, V, K = inter.shape
    dev = inter.device
    cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    return Problem(B=steps.shape[0], S=S, T=T_max, HV=HV, K=K, V=V, state_dtype=state.dtype,
                   device=dev.type, cc=cc, pool=slots is not None), None


class Call(namedtuple("CommitCall", COMMIT.names + ("problem",))):
    """What a commit backend receives: commit's arguments by name (``null_slot`` an int, -1
    for none; ``algo`` the serving backend), then the :class:`Problem`."""
    __slots__ = ()
    op = "commit"


def record(args, problem, scale, algo) -> Call:
    """The call record of commit's positional ``args`` (validated as ``problem``); with
    ``GDNZOO_CHECK_INDICES=1`` the indices are checked on the host first."""
    inter, rows, steps, state, slots, null, _ = args
    null = -1 if null is None else null
    if pools.checking():
        check_on_host(rows, steps, slots, null, *inter.shape[:2], state.shape[0])
    return Call(inter, rows, steps, state, slots, null, algo, problem)

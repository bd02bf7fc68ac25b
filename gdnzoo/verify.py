"""Speculative-decode verify: a decode call of T draft tokens that keeps the state after each.

Engines verify T = 2-8 draft tokens per step and keep only an accepted prefix, so the state
after every token must survive the call.  Three forms, each one decode call of T tokens:

* **Intermediate states** (SGLang, FlashInfer): ``intermediate_states`` [S, T_max, HV, V, K]
  (the state's dtype, each [HV, V, K] block contiguous, T <= T_max) receives the state after
  token t of sequence n at ``[intermediate_indices[n], t]``; ``intermediate_indices`` [B]
  (int32/int64) defaults to row n.  An intermediate index that is negative or >= S writes no
  intermediate state for that sequence; neither does a padded sequence (:mod:`gdnzoo.pool`).
* **Deferred commit** (``update_state=False``): the final state is not written anywhere (the
  state or pool stays bit-identical); :func:`gdnzoo.commit` later copies the accepted step's
  intermediate state into the pool.
* **Per-token slots** (vLLM): ``state_indices`` of shape [B, T] (a pool); the state after token
  t of sequence n goes to slot ``state_indices[n, t]`` of ``new_state`` (default the pool
  itself), and the initial state is read from column ``num_accepted_tokens[n] - 1``
  (``num_accepted_tokens`` [B], default 1: column 0).  A count outside 1..T pads the sequence
  (a negative index does too, or ``null_slot``, or one >= P: zeros out, nothing written); a
  padded or out-of-range column t skips only token t's write.

Nothing here syncs with the device; ``GDNZOO_CHECK_INDICES=1`` checks these indices on the host
too (counts outside 1..T, intermediate rows >= S or shared by two sequences, per-token write
slots that two sequences share).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from gdnzoo import pool as pools
from gdnzoo.checks import block


class Verify(NamedTuple):
    """The verify arguments of one call, as backends receive them (validated)."""
    states: torch.Tensor | None     # intermediate_states [S, T_max, HV, V, K], or None
    indices: torch.Tensor | None    # intermediate_indices [B], or None: row n
    update: bool                    # write the final state (False: commit later)
    per_token: bool                 # state_indices is [B, T]: token t's state to column t
    accepted: torch.Tensor | None   # num_accepted_tokens [B] (per_token), or None: 1

    @property
    def form(self) -> str:
        """"slots" (per-token slots) or "states" (intermediate states, deferred commit)."""
        return "slots" if self.per_token else "states"


def problem_form(verify: Verify | None) -> str:
    """:attr:`gdnzoo.contract.Problem.verify`: "", "slots", "states" or "states+update"."""
    if verify is None:
        return ""
    return verify.form + ("+update" if verify.update and not verify.per_token else "")


def layout(verify: Verify | None, B: int, T: int) -> str:
    """:attr:`gdnzoo.contract.Problem.intermediate`: "" (no intermediate states), "rows"
    (sequence n at row n of a contiguous [B, T, HV, V, K] buffer) or "indexed"."""
    if verify is None or verify.states is None:
        return ""
    x = verify.states
    rows = verify.indices is None and x.shape[:2] == (B, T) and x.is_contiguous()
    return "rows" if rows else "indexed"


def requested(state_indices, intermediate_states, intermediate_indices, update_state,
              num_accepted_tokens) -> bool:
    """Whether a call is a verify call (any verify argument away from its default)."""
    return (intermediate_states is not None or intermediate_indices is not None
            or update_state is not True or num_accepted_tokens is not None
            or (isinstance(state_indices, torch.Tensor) and state_indices.dim() == 2))


def _need_bool(name, x):
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected bool, got {type(x).__name__}")


def _intermediate(x, T, HV, V, K, state, kfirst=False):
    """intermediate_states [S, T_max, HV, V, K] (K-first: [S, T_max, HV, K, V]): a written
    tensor of the state's dtype."""
    (_, R, C), names, _ = block(HV, V, K, kfirst)
    r, c = names.split(", ")[1:]
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"intermediate_states: expected a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError("intermediate_states: expected a dense (strided) tensor")
    if x.requires_grad:
        raise ValueError("intermediate_states: expected a tensor that does not require grad")
    if x.dim() != 5 or tuple(x.shape[2:]) != (HV, R, C) or x.shape[0] < 1:
        raise ValueError(f"intermediate_states: expected shape [S, T_max, HV={HV}, {r}={R}, "
                         f"{c}={C}] with S >= 1, got {tuple(x.shape)}")
    if x.shape[1] < T:
        raise ValueError(f"intermediate_states: expected T_max >= T={T} (one state per "
                         f"token), got T_max={x.shape[1]}")
    if x.dtype != state.dtype:
        raise TypeError(f"intermediate_states: expected dtype {state.dtype} (same as state), "
                        f"got {x.dtype}")
    if x.device != state.device:
        raise ValueError(f"intermediate_states: expected device {state.device} (the device "
                         f"of state), got {x.device}")
    if tuple(x.stride()[2:]) != (R * C, C, 1):
        raise ValueError(f"intermediate_states: expected each [{names}] block contiguous "
                         f"(strides (*, *, {R * C}, {C}, 1)), got {tuple(x.stride())}")
    slot = HV * V * K
    if x.shape[1] > 1 and x.stride(1) < slot:
        raise ValueError(f"intermediate_states: expected stride(1) >= HV*V*K = {slot}, got "
                         f"{x.stride(1)}: steps would overlap")
    if x.shape[0] > 1 and x.stride(0) < x.stride(1) * (x.shape[1] - 1) + slot:
        raise ValueError(f"intermediate_states: expected stride(0) >= "
                         f"{x.stride(1) * (x.shape[1] - 1) + slot} (a row of T_max states), "
                         f"got {x.stride(0)}: rows would overlap")


def validate(B, T, HV, V, K, device, state, new_state, state_indices, new_state_indices,
             intermediate_states, intermediate_indices, update_state,
             num_accepted_tokens, kfirst=False) -> Verify | None:
    """Check the verify arguments (after the pool's); None when the call is no verify call.
    Raises naming the argument."""
    _need_bool("update_state", update_state)
    per_token = isinstance(state_indices, torch.Tensor) and state_indices.dim() == 2
    if not requested(state_indices, intermediate_states, intermediate_indices, update_state,
                     num_accepted_tokens):
        return None
    if intermediate_states is None and intermediate_indices is not None:
        raise ValueError("intermediate_indices: only with intermediate_states; got "
                         "intermediate_states=None")
    if num_accepted_tokens is not None and not per_token:
        raise ValueError("num_accepted_tokens: only with per-token slots (state_indices of "
                         "shape [B, T]); got " + ("state_indices=None" if state_indices is None
                                                  else f"state_indices of shape "
                                                       f"{tuple(state_indices.shape)}"))
    if per_token:
        if intermediate_states is not None:
            raise ValueError("intermediate_states: not with per-token slots (state_indices of "
                             "shape [B, T] already keeps every token's state)")
        if not update_state:
            raise ValueError("update_state: per-token slots (state_indices [B, T]) write every "
                             "token's state; update_state=False is for intermediate_states")
        if num_accepted_tokens is not None:
            pools.index_tensor("num_accepted_tokens", num_accepted_tokens, B, device)
    if not update_state and new_state is not None and new_state is not state:
        raise ValueError("new_state: update_state=False writes no state; pass new_state=None")
    if intermediate_states is not None:
        _intermediate(intermediate_states, T, HV, V, K, state, kfirst)
        if intermediate_indices is not None:
            pools.index_tensor("intermediate_indices", intermediate_indices, B, device)
        elif intermediate_states.shape[0] < B:
            raise ValueError(f"intermediate_states: expected at least B={B} rows (sequence n "
                             f"stores at row n when intermediate_indices is None), got "
                             f"S={intermediate_states.shape[0]}")
    return Verify(intermediate_states, intermediate_indices, update_state, per_token,
                  num_accepted_tokens)


def read_columns(verify: Verify, T: int):
    """Per-token slots: ([B] int64 column of the read slot, [B] bool: the count is in 1..T)."""
    if verify.accepted is None:
        return None, None
    acc = verify.accepted.long()
    ok = (acc >= 1) & (acc <= T)
    return torch.where(ok, acc - 1, 0), ok


def check_on_host(verify: Verify, pool, T: int, P: int, PN: int):
    """The debug check (``GDNZOO_CHECK_INDICES=1``) of a verify call's indices: copies them to
    the host (a sync) and raises ValueError naming the first bad one."""
    env = pools.CHECK_ENV
    if verify.states is not None and verify.indices is not None:
        S, seen = verify.states.shape[0], {}
        for n, i in enumerate(verify.indices.tolist()):
            if i >= S:
                raise ValueError(f"intermediate_indices[{n}] = {i}: row out of range for "
                                 f"{S} rows ({env} is set)")
            if i >= 0 and i in seen:
                raise ValueError(f"intermediate_indices[{n}] = {i}: row also written by "
                                 f"sequence {seen[i]} ({env} is set)")
            seen[i] = n
    if not verify.per_token:
        return
    acc = [1] * pool.read.shape[0] if verify.accepted is None else verify.accepted.tolist()
    for n, c in enumerate(acc):
        if not 1 <= c <= T:
            raise ValueError(f"num_accepted_tokens[{n}] = {c}: expected a count in 1..T={T} "
                             f"({env} is set)")
    rows = pool.read.tolist()
    pad = lambda s: s < 0 or s == pool.null_slot      # noqa: E731
    # A sequence reads a slot it also writes (its column num_accepted - 1), so a slot that
    # one sequence reads and another writes is a slot both write: one check covers both.
    writers = {}
    for n, row in enumerate(rows):
        r = row[acc[n] - 1]
        if r >= P:
            raise ValueError(f"state_indices[{n}, {acc[n] - 1}] = {r}: slot out of range for "
                             f"a pool of {P} slots ({env} is set)")
        if pad(r):
            continue
        for t, w in enumerate(row[:T]):
            if pad(w):
                continue
            if w >= PN:
                raise ValueError(f"state_indices[{n}, {t}] = {w}: slot out of range for a "
                                 f"pool of {PN} slots ({env} is set)")
            if w in writers and writers[w] != n:
                raise ValueError(f"state_indices[{n}, {t}] = {w}: slot also written by "
                                 f"sequence {writers[w]} ({env} is set)")
            writers[w] = n

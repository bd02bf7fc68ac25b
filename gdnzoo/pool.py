"""State pools: the serving engines' layout, where every sequence's state lives in a slot.

``decode(..., state_indices=idx)`` reads sequence n's state from ``state[idx[n]]`` of a pool
``state`` [P, HV, V, K] and writes its new state to ``new_state[new_state_indices[n]]`` (by
default the same pool and the same slot).  Each slot's [HV, V, K] block is contiguous; the
pool's ``stride(0)`` may exceed HV*V*K (engines put other per-sequence data in the same page).

**Padding.** A negative index is padding, and so is ``null_slot`` when one is given (vLLM's
block 0 is ``null_slot=0``).  A padded sequence gets zeros in ``out``; no state is read or
written for it.  An index >= P is never dereferenced: it is treated as padding.  A sequence
whose read slot is real but whose write slot is padding (or >= P) gets its output, and its new
state is not written anywhere.

Nothing here synchronizes with the device on the default path, so a pool call stays
CUDA-graph capturable with the index tensor's contents changing between replays.  Setting
``GDNZOO_CHECK_INDICES=1`` checks the indices on the host before every pool call (a device
sync) and raises naming the first bad one: an index >= P, a write slot that two real sequences
share, or, when reading and writing one pool, a write slot that another real sequence reads
(both would race).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

from gdnzoo.checks import block

INDEX_DTYPES = (torch.int32, torch.int64)
CHECK_ENV = "GDNZOO_CHECK_INDICES"


class Pool(NamedTuple):
    """The pool arguments of one call, as backends receive them (validated)."""
    read: torch.Tensor          # [B] int32 | int64: the slot sequence n reads
    write: torch.Tensor         # [B]: the slot it writes (``read`` itself by default)
    null_slot: int              # a slot that is padding too; -1 when none

    @property
    def same_indices(self) -> bool:
        return self.write is self.read


def index_tensor(name, x, B, device, T=None, device_of="q"):
    """A contiguous [B] (with ``T``: [B, T]) int32/int64 tensor on ``device`` (the device of
    ``device_of``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of int32 or int64 slot indices, "
                        f"got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout "
                        f"{str(x.layout).replace('torch.', '')}")
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name}: expected dtype int32 or int64, got {str(x.dtype).replace('torch.', '')}")
    shape = (B,) if T is None else (B, T)
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} {'[B]' if T is None else '[B, T]'}, "
                         f"got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of {device_of}), got "
                         f"{x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {tuple(x.stride())}")


def pool_tensor(name, x, HV, V, K, kfirst=False):
    """A pool [P, HV, V, K] (K-first: [P, HV, K, V]) whose slots are contiguous blocks at least
    a slot apart."""
    (_, R, C), names, _ = block(HV, V, K, kfirst)
    r, c = names.split(", ")[1:]
    if x.dim() != 4 or tuple(x.shape[1:]) != (HV, R, C) or x.shape[0] < 1:
        raise ValueError(f"{name}: expected a pool of shape [P, HV={HV}, {r}={R}, {c}={C}] "
                         f"with P >= 1 (state_indices given), got {tuple(x.shape)}")
    slot = HV * V * K
    if tuple(x.stride()[1:]) != (R * C, C, 1):
        raise ValueError(f"{name}: expected each slot's [{names}] block contiguous ({c} axis "
                         f"last, strides (*, {R * C}, {C}, 1)), got strides {tuple(x.stride())}")
    if x.shape[0] > 1 and x.stride(0) < slot:
        raise ValueError(f"{name}: expected stride(0) >= HV*V*K = {slot} (one slot), got "
                         f"{x.stride(0)}: slots would overlap")


def validate(B, HV, V, K, device, state, new_state, state_indices, new_state_indices,
             null_slot, T=1, kfirst=False) -> Pool:
    """Check the pool arguments (``state_indices`` is not None); raise naming the argument.
    ``state_indices`` of rank 2 is verify's per-token slots [B, T] (:mod:`gdnzoo.verify`)."""
    per_token = isinstance(state_indices, torch.Tensor) and state_indices.dim() == 2
    index_tensor("state_indices", state_indices, B, device, T if per_token else None)
    pool_tensor("state", state, HV, V, K, kfirst)
    if new_state_indices is None:
        new_state_indices = state_indices
    elif per_token:
        raise ValueError("new_state_indices: not with per-token slots (state_indices of shape "
                         "[B, T] names every token's write slot)")
    else:
        index_tensor("new_state_indices", new_state_indices, B, device)
    if new_state is not None and new_state is not state:
        pool_tensor("new_state", new_state, HV, V, K, kfirst)
    return Pool(state_indices, new_state_indices, null_slot_value(null_slot, state.shape[0]))


def null_slot_value(null_slot, P: int) -> int:
    """``null_slot`` checked against a pool of P slots: the slot, or -1 for None."""
    if null_slot is None:
        return -1
    if isinstance(null_slot, bool) or not isinstance(null_slot, int):
        raise TypeError(f"null_slot: expected an int slot index or None, got "
                        f"{type(null_slot).__name__}")
    if not 0 <= null_slot < P:
        raise ValueError(f"null_slot: expected a slot in [0, P={P}), got {null_slot}")
    return null_slot


def no_pool_args(new_state_indices, null_slot):
    """Pool-only arguments given without ``state_indices``: raise naming them."""
    if new_state_indices is not None:
        raise ValueError("new_state_indices: only with state_indices (a state pool); got "
                         "state_indices=None")
    if null_slot is not None:
        raise ValueError("null_slot: only with state_indices (a state pool); got "
                         "state_indices=None")


def live(pool: Pool, P: int, PN: int):
    """([B] bool: sequence n reads a real slot, [B] bool: and writes a real slot), on the
    device, without a sync."""
    rd = real_slots(pool.read, P, pool.null_slot)
    return rd, rd & real_slots(pool.write, PN, pool.null_slot)


def real_slots(s, n: int, null_slot: int):
    """[..] bool, on the device: the slot indices ``s`` that address one of ``n`` slots (not
    negative, not ``null_slot`` (-1: none), not >= n)."""
    ok = (s >= 0) & (s < n)
    return ok & (s != null_slot) if null_slot >= 0 else ok


def checking() -> bool:
    """Whether the host index check is on (read on every pool call)."""
    return os.environ.get(CHECK_ENV, "0") not in ("", "0")


def check_on_host(pool: Pool, P: int, PN: int, same_pool: bool):
    """The debug check (``GDNZOO_CHECK_INDICES=1``): copies the indices to the host (a sync)
    and raises ValueError naming the first bad one."""
    read = pool.read.tolist()
    write = read if pool.same_indices else pool.write.tolist()
    pad = lambda s: s < 0 or s == pool.null_slot      # noqa: E731
    for name, idx, n_slots in (("state_indices", read, P), ("new_state_indices", write, PN)):
        for n, s in enumerate(idx):
            if s >= n_slots:
                raise ValueError(f"{name}[{n}] = {s}: slot out of range for a pool of "
                                 f"{n_slots} slots ({CHECK_ENV} is set)")
    writers = {}
    readers = {s: n for n, s in enumerate(read) if not pad(s)}
    for n, (r, w) in enumerate(zip(read, write)):
        if pad(r) or pad(w):
            continue
        if w in writers:
            raise ValueError(f"new_state_indices[{n}] = {w}: slot also written by sequence "
                             f"{writers[w]} ({CHECK_ENV} is set)")
        writers[w] = n
        if same_pool and readers.get(w, n) != n:
            raise ValueError(f"new_state_indices[{n}] = {w}: slot read by sequence "
                             f"{readers[w]} in the same pool ({CHECK_ENV} is set)")


def gathered(state, pool: Pool, P: int, PN: int):
    """For backends that decode a dense batch: (the read slots as a dense [B, HV, V, K] copy,
    rows of padded sequences zero; read mask; write mask)."""
    rd, wr = live(pool, P, PN)
    idx = torch.where(rd, pool.read, 0).long()
    dense = torch.where(rd[:, None, None, None], state.index_select(0, idx), 0)
    return dense, rd, wr


def scatter(new_state, dense_new, pool: Pool, wr):
    """Write the rows of ``dense_new`` whose mask ``wr`` is set to their write slots (one host
    sync: the masked rows are selected on the host)."""
    rows = wr.nonzero().flatten()
    if rows.numel():
        new_state.index_copy_(0, pool.write.index_select(0, rows).long(),
                              dense_new.index_select(0, rows))

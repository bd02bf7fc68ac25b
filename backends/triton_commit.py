"""triton-commit: :func:`gdnzoo.commit` in one Triton launch that copies each sequence's
accepted intermediate state into its pool slot.

One program per (sequence, chunk of BLOCK elements of the slot's [HV, V, K] block, contiguous
in both tensors).  Each program loads the sequence's step, row and slot itself, so the indices
may change between CUDA-graph replays; a skipped sequence (negative step or one >= T_max, row
outside [0, S), padded slot) returns before touching memory.  Offsets are 64-bit.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def commit_kernel(inter, rows, steps, state, slots, S, T_max, P, null_slot, si_s, si_t, ss_b,
                  SLOT: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                  SLOTS: tl.constexpr):
    NB: tl.constexpr = (SLOT + BLOCK - 1) // BLOCK
    pid = tl.program_id(0).to(tl.int64)
    n = pid // NB
    c = pid % NB
    step = tl.load(steps + n).to(tl.int64)
    row = n
    if ROWS:
        row = tl.load(rows + n).to(tl.int64)
    slot = n
    if SLOTS:
        slot = tl.load(slots + n).to(tl.int64)
    ok = (step >= 0) & (step < T_max) & (row >= 0) & (row < S) & (slot >= 0) & (slot < P)
    ok = ok & (slot != null_slot)
    if ok:
        offs = c * BLOCK + tl.arange(0, BLOCK)
        mask = offs < SLOT
        x = tl.load(inter + row * si_s + step * si_t + offs, mask=mask)
        tl.store(state + slot * ss_b + offs, x, mask=mask)


def block_size(slot: int, elem_bytes: int) -> int:
    """16 KiB per program (fewer bytes when a slot is smaller)."""
    return min(triton.next_power_of_2(slot), 16384 // elem_bytes)


def available(device):
    """The Triton backends' answer (any compute capability: plain loads and stores)."""
    from gdnzoo.backends._triton_launch import available as triton_available
    return triton_available((0, 0), device)


def supports(problem):
    return True, ""


def run(call, *, config=None):
    c = call
    if c.accepted_steps.shape[0]:
        launch(c.intermediate_states, c.intermediate_indices, c.accepted_steps, c.state,
               c.state_indices, c.null_slot)


def launch(inter, rows, steps, state, slots, null_slot):
    S, T_max, HV, V, K = inter.shape
    B = steps.shape[0]
    slot = HV * V * K
    block = block_size(slot, inter.element_size())
    grid = (B * triton.cdiv(slot, block),)
    args = [inter, steps if rows is None else rows, steps, state,
            steps if slots is None else slots, S, T_max, state.shape[0], null_slot,
            inter.stride(0), inter.stride(1), state.stride(0)]
    commit_kernel[grid](*args, SLOT=slot, BLOCK=block, ROWS=rows is not None,
                        SLOTS=slots is not None, num_warps=4)

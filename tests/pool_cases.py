"""Pool-convention inputs for the tests: a page-strided pool, random distinct slots, padding."""
from __future__ import annotations

import dataclasses

import torch

from gdnzoo.inputs import make_inputs
from gdnzoo.pool import Pool


@dataclasses.dataclass
class PoolCase:
    x: object                   # Inputs whose .state is the pool (a page-strided view)
    buf: torch.Tensor           # the pool's whole storage, page gaps included
    idx: torch.Tensor           # state_indices
    new_idx: torch.Tensor | None
    null_slot: int | None
    dest: torch.Tensor | None   # another pool to write into (None: in place)
    dest_buf: torch.Tensor | None

    def kwargs(self):
        return dict(state_indices=self.idx, new_state_indices=self.new_idx,
                    null_slot=self.null_slot, new_state=self.dest)

    def pool(self):
        return Pool(self.idx, self.idx if self.new_idx is None else self.new_idx,
                    -1 if self.null_slot is None else self.null_slot)


def paged(P, HV, V, K, dtype, device, gen, extra=None):
    """A pool [P, HV, V, K] inside one buffer with a page stride larger than a slot (its gaps
    filled with random values too, so a stray write shows)."""
    slot = HV * V * K
    page = slot + (slot // 32 if extra is None else extra)
    buf = (torch.randn(P * page, generator=gen) * 0.05).to(dtype).to(device)
    return buf, buf.as_strided((P, HV, V, K), (page, V * K, K, 1))


def make_case(B=4, T=1, H=4, HV=8, K=128, V=128, state_dtype=torch.float32, device="cpu",
              seed=0, P=None, pad=None, separate_write=False, other_pool=False,
              index_dtype=torch.int32, out_of_range=False):
    """``pad``: None, "neg" (index -1 at sequence 1) or "null" (null_slot=0, sequence 1 reads
    slot 0 and another a negative index).  ``separate_write``: new_state_indices are other
    free slots.  ``other_pool``: write into a second pool.  ``out_of_range``: one index >= P."""
    gen = torch.Generator().manual_seed(seed)
    P = P or 3 * B + 4
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, device=device,
                    seed=seed)
    buf, pool = paged(P, HV, V, K, state_dtype, device, gen)
    slots = torch.randperm(P - 1, generator=gen)[:2 * B] + 1     # never slot 0
    idx = slots[:B].clone()
    new_idx = slots[B:2 * B].clone() if separate_write else None
    null_slot = None
    if pad == "neg" and B > 1:
        idx[1] = -1
    elif pad == "null" and B > 1:
        null_slot, idx[1] = 0, 0
        if B > 2:
            idx[2] = -7
    if out_of_range and B > 0:
        idx[B - 1] = P + 5
    dest = dest_buf = None
    if other_pool:
        dest_buf, dest = paged(P + 3, HV, V, K, state_dtype, device, gen, extra=64)
    x.state = pool
    to = dict(dtype=index_dtype, device=device)
    return PoolCase(x, buf, idx.to(**to), None if new_idx is None else new_idx.to(**to),
                    null_slot, dest, dest_buf)

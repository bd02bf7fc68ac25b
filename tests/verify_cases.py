"""Speculative-verify inputs for the tests: a page-strided pool (or a dense state), an
intermediate buffer with gaps between its blocks, per-token slots, padding; and the check of
one verify call against the float64 reference, with what must have been written derived
here from the rules (independently of the reference's code)."""
from __future__ import annotations

import dataclasses

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.inputs import make_inputs
from gdnzoo.pool import Pool
from gdnzoo.reference import reference_verify_outputs
from gdnzoo.verify import Verify
from pool_cases import paged


@dataclasses.dataclass
class VerifyCase:
    x: object                       # Inputs; .state is the pool (or the dense state)
    buf: torch.Tensor               # the state's whole storage (page gaps included)
    form: str                       # "states" | "slots"
    idx: torch.Tensor | None        # state_indices ([B] or [B, T]); None: dense state
    null_slot: int | None
    update: bool
    inter: torch.Tensor | None      # intermediate_states (a view of inter_buf)
    inter_buf: torch.Tensor | None
    inter_idx: torch.Tensor | None
    accepted: torch.Tensor | None

    def kwargs(self):
        kw = dict(state_indices=self.idx, null_slot=self.null_slot)
        if self.form == "slots":
            kw["num_accepted_tokens"] = self.accepted
        else:
            kw.update(intermediate_states=self.inter, intermediate_indices=self.inter_idx,
                      update_state=self.update)
        return kw

    def pool(self):
        if self.idx is None:
            return None
        return Pool(self.idx, self.idx, -1 if self.null_slot is None else self.null_slot)

    def verify(self):
        return Verify(self.inter, self.inter_idx, self.update, self.form == "slots",
                      self.accepted)


def make_verify_case(form="states", B=3, T=2, H=2, HV=4, K=128, V=128,
                     state_dtype=torch.float32, device="cpu", seed=0, pad=None, update=False,
                     dense=False, index_dtype=torch.int32, rows="indexed", accepted="random"):
    """``form``: "states" (intermediate_states; ``update``: also the final state) or "slots"
    (vLLM's [B, T] state_indices with num_accepted_tokens).  ``dense``: a dense [B, HV, V, K]
    state (states form only).  ``rows``: "indexed" (intermediate_indices a permutation of
    spare rows) or "default" (row n).  ``pad``: None, "neg" (sequence 1 reads index -1),
    "null" (null_slot=0 and sequence 1 reads slot 0), "past" (sequence 1 reads an index >=
    P), "acc" (slots: sequence 1's count is outside 1..T), "row" (sequence 1's intermediate
    row is -1, the last sequence's is >= S), "col" (slots: sequence 0 writes no token 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, device=device,
                    seed=seed)
    to = dict(dtype=index_dtype, device=device)
    idx = null = acc = inter = inter_buf = inter_idx = None
    if dense:
        buf = x.state.view(-1)
    else:
        P = B * (T + 1) + 4
        buf, x.state = paged(P, HV, V, K, state_dtype, device, gen)
        slots = torch.randperm(P - 1, generator=gen)[:B * T] + 1          # never slot 0
        idx = slots[:B].clone() if form == "states" else slots.view(B, T).clone()
        col = lambda n: 0 if acc is None else int(acc[n]) - 1       # noqa: E731
        if form == "slots":
            acc = torch.randint(1, T + 1, (B,), generator=gen)
            if accepted != "random":
                acc.fill_(accepted)
        if B > 1:
            at = (1,) if idx.dim() == 1 else (1, col(1))
            if pad == "neg":
                idx[at] = -1
            elif pad == "null":
                null, idx[at] = 0, 0
            elif pad == "past":
                idx[at] = P + 3
            elif pad == "acc":
                acc[1] = T + 1 if seed % 2 else 0
        if pad == "col" and T > 1:
            idx[0, 1 if col(0) != 1 else 0] = -1
        idx = idx.to(**to)
        acc = None if acc is None else acc.to(**to)
    if form == "states":
        slot = HV * V * K
        T_max, S = T + 1, B + 2
        s1 = slot + 64
        s0 = T_max * s1 + 96
        inter_buf = (torch.randn(S * s0, generator=gen) * 0.05).to(state_dtype).to(device)
        inter = inter_buf.as_strided((S, T_max, HV, V, K), (s0, s1, V * K, K, 1))
        if rows == "indexed":
            inter_idx = torch.randperm(S, generator=gen)[:B]
            if pad == "row" and B > 1:
                inter_idx[1] = -1
                inter_idx[B - 1] = S + 2
            inter_idx = inter_idx.to(**to)
    return VerifyCase(x, buf, form, idx, null, update, inter, inter_buf, inter_idx, acc)


def expected_writes(case):
    """(padded sequences, {state slot: (sequence, token or None)}, [(row, token, sequence)])
    that the rules say a verify call writes."""
    x, B, T = case.x, case.x.q.shape[0], case.x.q.shape[1]
    P = x.state.shape[0]
    null = -1 if case.null_slot is None else case.null_slot
    pad = lambda s: s < 0 or s >= P or s == null        # noqa: E731
    acc = [1] * B if case.accepted is None else case.accepted.tolist()
    idx = None if case.idx is None else case.idx.tolist()
    padded, slots, inter = set(), {}, []
    for n in range(B):
        if idx is None:
            r = n
        elif case.form == "slots":
            r = idx[n][acc[n] - 1] if 1 <= acc[n] <= T else -1
        else:
            r = idx[n]
        if idx is not None and pad(r):
            padded.add(n)
            continue
        if case.form == "slots":
            for t in range(T):
                if not pad(idx[n][t]):
                    slots[idx[n][t]] = (n, t)
            continue
        if case.update:
            slots[r] = (n, None)
        if case.inter is not None:
            row = n if case.inter_idx is None else case.inter_idx.tolist()[n]
            if 0 <= row < case.inter.shape[0]:
                inter += [(row, t, n) for t in range(T)]
    return padded, slots, inter


def _blocks_mask(buf, view, blocks):
    """A mask over ``buf`` set outside the [HV, V, K] blocks of ``view`` at ``blocks``
    (index tuples of view's leading dimensions)."""
    keep = torch.ones_like(buf, dtype=torch.bool)
    size = view.shape[-3] * view.shape[-2] * view.shape[-1]
    base = view.storage_offset() - buf.storage_offset()
    for blk in blocks:
        start = base + sum(i * s for i, s in zip(blk, view.stride()))
        keep[start:start + size] = False
    return keep


def check_verify_call(name, case, l2, what):
    """Run a verify call through backend ``name`` (None: automatic) on a NaN-filled out and
    assert: out, every written state and intermediate state against the float64 reference;
    padded rows zero; everything else of the state and intermediate storage bit-identical;
    the inputs untouched."""
    x = case.x
    ref_out, ref_state, ref_inter = reference_verify_outputs(x, case.verify(), l2, case.pool())
    buf0 = case.buf.clone()
    ibuf0 = None if case.inter_buf is None else case.inter_buf.clone()
    inputs0 = [t.clone() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)]
    idx0 = [None if t is None else t.clone() for t in (case.idx, case.inter_idx, case.accepted)]
    out = torch.full(ref_out.shape, float("nan"), dtype=x.v.dtype, device=x.q.device)
    gdnzoo.decode(*x.args(), out=out, use_qk_l2norm=l2, algo=name, **case.kwargs())
    if x.q.is_cuda:
        torch.cuda.synchronize()
    padded, slots, inter = expected_writes(case)
    rows = sorted(slots)
    j = gate.judge(out, x.state[rows], ref_out, ref_state[rows], state_dtype=x.state.dtype)
    assert j.ok, f"{what}: out or state: {j.reason}"
    for n in padded:
        assert torch.equal(out[n], torch.zeros_like(out[n])), f"{what}: padded row {n} not 0"
    keep = _blocks_mask(case.buf, x.state, [(s,) for s in rows])
    assert torch.equal(case.buf[keep], buf0[keep]), f"{what}: state written outside its slots"
    if case.inter is not None:
        blocks = [(r, t) for r, t, _ in inter]
        if blocks:
            got = torch.stack([case.inter[b] for b in blocks])
            ref = torch.stack([ref_inter[b] for b in blocks])
            j = gate.judge(out, got, ref_out, ref, state_dtype=x.state.dtype)
            assert j.ok, f"{what}: intermediate states: {j.reason}"
        keep = _blocks_mask(case.inter_buf, case.inter, blocks)
        assert torch.equal(case.inter_buf[keep], ibuf0[keep]), \
            f"{what}: intermediate_states written outside the stored steps"
    for t, t0 in zip((x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias), inputs0):
        assert torch.equal(t, t0), f"{what}: an input was modified"
    for t, t0 in zip((case.idx, case.inter_idx, case.accepted), idx0):
        assert t is None or torch.equal(t, t0), f"{what}: an index tensor was modified"

"""The check of one speculative-verify call (inputs: gdnzoo.inputs.make_verify_case) against
the float64 reference, with what must have been written derived here from the rules
(independently of the reference's code)."""
from __future__ import annotations

import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.reference import reference_verify_outputs


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

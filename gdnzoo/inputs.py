"""Seeded, realistic inputs for any geometry, and the contest batch mix: the one input factory
of the tests, the bench and the tuner.

Magnitudes follow what Qwen3-Next layers produce: q and k rows of roughly unit norm, a small
state, A = exp(A_log) in [1, 16], dt_bias the inverse softplus of dt in [1e-3, 1e-1], so the
decay g sits mostly in (0.5, 1) and beta = sigmoid(b) spreads over (0, 1).

Besides dense inputs (:func:`make_inputs`): state pools with a page stride larger than the slot
and gaps (:func:`paged_pool`, :func:`distinct_slots`, :func:`make_pool_case` with padding
indices), speculative-verify buffers (:func:`intermediate_buffer`, :func:`accepted_counts`,
:func:`make_verify_case`), the engines' packed ``mixed_qkv`` with a and b as strided views of one
[B, 2*HV] tensor (:func:`packed`), and the Problem a backend's ``supports`` sees
(:func:`make_problem`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

# FlashInfer-Bench contest `gdn_decode_qk4_v8_d128_k_last`: 54 workloads.
CONTEST_BATCH_MIX = [1] * 10 + [4] * 8 + [8] * 7 + [16] * 7 + [32] * 7 + [48] * 7 + [64] * 8
CONTEST_GEOMETRY = dict(H=4, HV=8, K=128, V=128)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    state: torch.Tensor
    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    scale: float

    op = "decode"

    def args(self):
        """Positional arguments of gdnzoo.decode, in order."""
        return (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias, self.b,
                self.scale)

    @staticmethod
    def inputs() -> tuple:
        """The names of the tensors a call only reads (a gate checks they stay unchanged)."""
        return ("q", "k", "v", "A_log", "a", "dt_bias", "b")

    def reference(self, use_qk_l2norm=False, compute_dtype=torch.float64):
        """The oracle's (out, new_state) of these inputs (:mod:`gdnzoo.reference`)."""
        from gdnzoo.reference import reference_outputs
        return reference_outputs(self, use_qk_l2norm, compute_dtype)

    def clone(self) -> "Inputs":
        return Inputs(*(x.clone() if isinstance(x, torch.Tensor) else x for x in
                        (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias,
                         self.b, self.scale)))


def make_inputs(B=1, T=1, H=4, HV=8, K=128, V=128, *, state_dtype=torch.float32,
                io_dtype=torch.bfloat16, dt_bias_dtype=torch.float32, device="cpu", seed=0,
                scale=None) -> Inputs:
    """Generate one set of inputs; the same seed gives the same tensors on any device."""
    if isinstance(state_dtype, str):
        state_dtype = DTYPES[state_dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def unif(*shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float32)

    q = randn(B, T, H, K, std=1.0 / math.sqrt(K))
    k = randn(B, T, H, K, std=1.0 / math.sqrt(K))
    v = randn(B, T, HV, V, std=0.5)
    state = randn(B, HV, V, K, std=0.05)
    A_log = torch.log(unif(HV, lo=1.0, hi=16.0))
    dt = torch.exp(unif(HV, lo=math.log(1e-3), hi=math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))          # inverse softplus
    a = randn(B, T, HV, std=1.0)
    b = randn(B, T, HV, std=1.5)
    cast = dict(device=device)
    return Inputs(
        q=q.to(io_dtype).to(**cast), k=k.to(io_dtype).to(**cast), v=v.to(io_dtype).to(**cast),
        state=state.to(state_dtype).to(**cast), A_log=A_log.to(**cast),
        a=a.to(io_dtype).to(**cast), dt_bias=dt_bias.to(dt_bias_dtype).to(**cast),
        b=b.to(io_dtype).to(**cast),
        scale=(1.0 / math.sqrt(K)) if scale is None else scale)


def contest_workloads(seed=0, device="cpu", state_dtype=torch.float32):
    """The 54-workload batch mix at the contest geometry, one seed per workload."""
    for i, B in enumerate(CONTEST_BATCH_MIX):
        yield i, B, make_inputs(B=B, T=1, **CONTEST_GEOMETRY, state_dtype=state_dtype,
                                device=device, seed=seed * 1000 + i)


# ----------------------------------------------------------------------------- problems

def make_problem(**kw):
    """A :class:`gdnzoo.contract.Problem` (what a backend's ``supports`` sees) at the contest
    geometry on an sm_90 GPU, B = T = 1, fp32 state, bf16 activations; ``kw`` overrides any
    field (``pool=True``, ``verify="states"``, ``pdl="wait"``, ...)."""
    from gdnzoo.contract import Problem
    base = dict(B=1, T=1, **CONTEST_GEOMETRY, state_dtype=torch.float32, io_dtype=torch.bfloat16,
                device="cuda", cc=(9, 0))
    return Problem(**{**base, **kw})


# ----------------------------------------------------------------------------- state pools

PAGE_EXTRA = 32         # vLLM's page: a slot and 1/32 of a slot of other per-sequence data


def page_elems(HV, V, K) -> int:
    """Elements from one slot of a pool to the next in vLLM's layout: HV*V*K*(1 + 1/32)."""
    slot = HV * V * K
    return slot + slot // PAGE_EXTRA


@dataclass
class PagedPool:
    """A state pool [P, HV, V, K] whose slots are ``page`` elements apart inside one flat
    storage ``buf`` (the gaps after each slot and any guard pages included)."""
    buf: torch.Tensor
    state: torch.Tensor
    page: int
    slot: int

    @property
    def P(self) -> int:
        return self.state.shape[0]

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()


def paged_pool(P, HV, V, K, *, dtype=torch.float32, device="cpu", gap=None, guard=0, offset=0,
               fill="randn", std=0.05, gen=None) -> PagedPool:
    """A pool of P slots, each followed by a gap of ``gap`` elements (default 1/32 slot: vLLM's
    page), ``guard`` whole pages before and after it and ``offset`` elements before everything
    (so a write to slot -1 or P, or a misaligned pool, shows).  ``fill``: "randn" (the whole
    storage, gaps included, N(0, std) drawn by ``gen`` on its device, then cast and moved),
    "normal" (the same drawn in place on the device by a generator there: no temporary for a
    pool of GiBs), "slots" (the slots N(0, std) drawn as [P, HV, V, K], the gaps NaN) or
    "zeros".  ``dtype`` may be a name ("fp32")."""
    dtype = DTYPES.get(dtype, dtype)
    slot = HV * V * K
    page = slot + (slot // PAGE_EXTRA if gap is None else gap)
    total = offset + (P + 2 * guard) * page
    gen = gen if gen is not None else torch.Generator().manual_seed(0)
    if fill == "randn":
        buf = (torch.randn(total, generator=gen, device=gen.device) * std).to(dtype).to(device)
    elif fill == "normal":
        buf = torch.empty(total, dtype=dtype, device=device).normal_(0.0, std, generator=gen)
    elif fill in ("slots", "zeros"):
        buf = torch.full((total,), float("nan") if fill == "slots" else 0.0, dtype=dtype,
                         device=device)
    else:
        raise ValueError(f"paged_pool: fill must be randn, normal, slots or zeros, got {fill!r}")
    state = buf.as_strided((P, HV, V, K), (page, V * K, K, 1), offset + guard * page)
    if fill == "slots":
        state.copy_(torch.randn(P, HV, V, K, generator=gen, device=gen.device) * std)
    return PagedPool(buf, state, page, slot)


def distinct_slots(P, n, gen, *, low=1, exclude=()) -> torch.Tensor:
    """``n`` distinct random slots in [low, P) (int64, on the CPU), none of ``exclude``: slot 0
    (a null slot) is left out by default."""
    pick = torch.randperm(P - low, generator=gen) + low
    if exclude:
        pick = torch.tensor([s for s in pick.tolist() if s not in set(exclude)], dtype=pick.dtype)
    if len(pick) < n:
        raise ValueError(f"distinct_slots: {n} slots asked, {len(pick)} in [{low}, {P})")
    return pick[:n]


@dataclass
class PoolCase:
    """Decode inputs over a state pool, as a serving engine passes them."""
    x: Inputs                       # x.state is the pool (a page-strided view of buf)
    buf: torch.Tensor               # the pool's whole storage, page gaps included
    idx: torch.Tensor               # state_indices
    new_idx: torch.Tensor | None
    null_slot: int | None
    dest: torch.Tensor | None       # another pool to write into (None: in place)
    dest_buf: torch.Tensor | None

    def kwargs(self):
        return dict(state_indices=self.idx, new_state_indices=self.new_idx,
                    null_slot=self.null_slot, new_state=self.dest)

    def pool(self):
        from gdnzoo.pool import Pool
        return Pool(self.idx, self.idx if self.new_idx is None else self.new_idx,
                    -1 if self.null_slot is None else self.null_slot)


def make_pool_case(B=4, T=1, H=4, HV=8, K=128, V=128, state_dtype=torch.float32, device="cpu",
                   seed=0, P=None, pad=None, separate_write=False, other_pool=False,
                   index_dtype=torch.int32, out_of_range=False) -> PoolCase:
    """Inputs of :func:`make_inputs` over a pool of P (default 3B + 4) page-strided slots with
    random values in the page gaps, read at B random distinct slots (never slot 0).  ``pad``:
    None, "neg" (index -1 at sequence 1) or "null" (null_slot=0, sequence 1 reads slot 0 and
    another a negative index).  ``separate_write``: new_state_indices are other free slots.
    ``other_pool``: write into a second pool (gap 64).  ``out_of_range``: one index >= P."""
    gen = torch.Generator().manual_seed(seed)
    P = P or 3 * B + 4
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, device=device,
                    seed=seed)
    pool = paged_pool(P, HV, V, K, dtype=state_dtype, device=device, gen=gen)
    slots = distinct_slots(P, 2 * B, gen)
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
    dest = None
    if other_pool:
        dest = paged_pool(P + 3, HV, V, K, dtype=state_dtype, device=device, gap=64, gen=gen)
    x.state = pool.state
    to = dict(dtype=index_dtype, device=device)
    return PoolCase(x, pool.buf, idx.to(**to), None if new_idx is None else new_idx.to(**to),
                    null_slot, None if dest is None else dest.state,
                    None if dest is None else dest.buf)


# ----------------------------------------------------------------------------- speculative verify

def intermediate_buffer(S, T_max, HV, V, K, *, dtype=torch.float32, device="cpu", step_gap=0,
                        row_gap=0, fill="randn", std=0.05, gen=None) -> tuple:
    """(storage, view): ``intermediate_states`` [S, T_max, HV, V, K] with ``step_gap`` elements
    after each [HV, V, K] block and ``row_gap`` after each row of T_max blocks; ``fill`` and
    ``gen`` as :func:`paged_pool`'s ("randn" or "normal")."""
    dtype = DTYPES.get(dtype, dtype)
    s1 = HV * V * K + step_gap
    s0 = T_max * s1 + row_gap
    gen = gen if gen is not None else torch.Generator().manual_seed(0)
    if fill == "randn":
        buf = (torch.randn(S * s0, generator=gen, device=gen.device) * std).to(dtype).to(device)
    elif fill == "normal":
        buf = torch.empty(S * s0, dtype=dtype, device=device).normal_(0.0, std, generator=gen)
    else:
        raise ValueError(f"intermediate_buffer: fill must be randn or normal, got {fill!r}")
    return buf, buf.as_strided((S, T_max, HV, V, K), (s0, s1, V * K, K, 1))


def accepted_counts(B, T, gen, dtype=torch.int64) -> torch.Tensor:
    """``num_accepted_tokens``: B random counts in 1..T (on the CPU)."""
    return torch.randint(1, T + 1, (B,), generator=gen, dtype=dtype)


@dataclass
class VerifyCase:
    """Speculative-verify inputs: a pool (or a dense state), and the buffers of one form."""
    x: Inputs                       # .state is the pool (or the dense state)
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
        from gdnzoo.pool import Pool
        if self.idx is None:
            return None
        return Pool(self.idx, self.idx, -1 if self.null_slot is None else self.null_slot)

    def verify(self):
        from gdnzoo.verify import Verify
        return Verify(self.inter, self.inter_idx, self.update, self.form == "slots",
                      self.accepted)


def make_verify_case(form="states", B=3, T=2, H=2, HV=4, K=128, V=128,
                     state_dtype=torch.float32, device="cpu", seed=0, pad=None, update=False,
                     dense=False, index_dtype=torch.int32, rows="indexed",
                     accepted="random") -> VerifyCase:
    """``form``: "states" (intermediate_states; ``update``: also the final state) or "slots"
    (vLLM's [B, T] state_indices with num_accepted_tokens).  ``dense``: a dense [B, HV, V, K]
    state (states form only).  ``rows``: "indexed" (intermediate_indices a permutation of
    spare rows) or "default" (row n).  ``pad``: None, "neg" (sequence 1 reads index -1),
    "null" (null_slot=0 and sequence 1 reads slot 0), "past" (sequence 1 reads an index >=
    P), "acc" (slots: sequence 1's count is outside 1..T), "row" (sequence 1's intermediate
    row is -1, the last sequence's is >= S), "col" (slots: sequence 0 writes no token 1).
    The intermediate buffer has gaps between its blocks and rows."""
    gen = torch.Generator().manual_seed(seed)
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype, device=device,
                    seed=seed)
    to = dict(dtype=index_dtype, device=device)
    idx = null = acc = inter = inter_buf = inter_idx = None
    if dense:
        buf = x.state.view(-1)
    else:
        P = B * (T + 1) + 4
        pool = paged_pool(P, HV, V, K, dtype=state_dtype, device=device, gen=gen)
        buf, x.state = pool.buf, pool.state
        slots = distinct_slots(P, B * T, gen)
        idx = slots[:B].clone() if form == "states" else slots.view(B, T).clone()
        col = lambda n: 0 if acc is None else int(acc[n]) - 1       # noqa: E731
        if form == "slots":
            acc = accepted_counts(B, T, gen)
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
        S = B + 2
        inter_buf, inter = intermediate_buffer(S, T + 1, HV, V, K, dtype=state_dtype,
                                               device=device, step_gap=64, row_gap=96, gen=gen)
        if rows == "indexed":
            inter_idx = torch.randperm(S, generator=gen)[:B]
            if pad == "row" and B > 1:
                inter_idx[1] = -1
                inter_idx[B - 1] = S + 2
            inter_idx = inter_idx.to(**to)
    return VerifyCase(x, buf, form, idx, null, update, inter, inter_buf, inter_idx, acc)


# ----------------------------------------------------------------------------- packed mixed_qkv

@dataclass
class Packed:
    """One call's activations as serving engines pass them: q, k, v views of the rows of one
    ``mixed`` [N, 2*H*K + HV*V] (N = B*T tokens, sequence-major; a view of ``rows``, whose row
    may be longer), a and b strided views of one ``ab`` [N, 2*HV]: [B, T, ...] as gdnzoo.decode
    takes them, ``a2``, ``b2`` [N, HV] as the engines do."""
    rows: torch.Tensor
    mixed: torch.Tensor
    ab: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    a2: torch.Tensor
    b2: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    scale: float
    lead: int = 0

    def args(self, state):
        """gdnzoo.decode's positional arguments with ``state``."""
        return (self.q, self.k, self.v, state, self.A_log, self.a, self.dt_bias, self.b,
                self.scale)

    def dense(self) -> tuple:
        """(q, k, v, a, b) made contiguous (the inputs of peers that take no strided views)."""
        return tuple(t.contiguous() for t in (self.q, self.k, self.v, self.a, self.b))

    def to(self, device) -> "Packed":
        return _packed_views(self.rows.to(device), self.ab.to(device), self.q.shape[:2],
                             self.q.shape[2:], self.v.shape[2:], self.A_log.to(device),
                             self.dt_bias.to(device), self.scale, self.lead)


def _packed_views(rows, ab, BT, HK, HVV, A_log, dt_bias, scale, lead) -> Packed:
    (B, T), (H, K), (HV, V) = BT, HK, HVV
    D = 2 * H * K + HV * V
    mixed = rows[:, lead:lead + D]
    m = mixed.view(B, T, D)
    g = ab.view(B, T, 2 * HV)
    return Packed(rows, mixed, ab, m[:, :, :H * K].unflatten(2, (H, K)),
                  m[:, :, H * K:2 * H * K].unflatten(2, (H, K)),
                  m[:, :, 2 * H * K:].unflatten(2, (HV, V)), g[:, :, :HV], g[:, :, HV:],
                  ab[:, :HV], ab[:, HV:], A_log, dt_bias, scale, lead)


def packed(x: Inputs, *, lead=0, trail=0, gen=None) -> Packed:
    """``x``'s activations packed as engines pass them (:class:`Packed`).  ``lead``, ``trail``:
    elements of other data before and after each row of ``mixed`` (random, drawn by ``gen`` on
    the CPU): a row stride larger than a row and a nonzero storage offset."""
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2:]
    N, HK = B * T, H * K
    parts = [x.q.reshape(N, HK), x.k.reshape(N, HK), x.v.reshape(N, HV * V)]
    if lead or trail:
        gen = gen if gen is not None else torch.Generator().manual_seed(0)
        rows = torch.randn(N, lead + 2 * HK + HV * V + trail, generator=gen).to(x.q.dtype)
        rows = rows.to(x.q.device)
        rows[:, lead:lead + 2 * HK + HV * V] = torch.cat(parts, dim=1)
    else:
        rows = torch.cat(parts, dim=1).contiguous()
    ab = torch.cat([x.a.reshape(N, HV), x.b.reshape(N, HV)], dim=1).contiguous()
    return _packed_views(rows, ab, (B, T), (H, K), (HV, V), x.A_log, x.dt_bias, x.scale, lead)
# ---------------------------------------------------------------------------- prefill

@dataclass
class PrefillInputs:
    """The arguments of :func:`gdnzoo.prefill`: N sequences packed on one token axis."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    state: torch.Tensor | None
    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    cu_seqlens: torch.Tensor
    scale: float

    op = "prefill"

    def args(self):
        """Positional arguments of gdnzoo.prefill, in order."""
        return (self.q, self.k, self.v, self.state, self.A_log, self.a, self.dt_bias, self.b,
                self.cu_seqlens, self.scale)

    @staticmethod
    def inputs() -> tuple:
        """The names of the tensors a call only reads (a gate checks they stay unchanged)."""
        return ("q", "k", "v", "A_log", "a", "dt_bias", "b", "cu_seqlens")

    def reference(self, use_qk_l2norm=False, compute_dtype=torch.float64):
        """The oracle's (out, final states) of these inputs (:mod:`gdnzoo.prefill_reference`)."""
        from gdnzoo.prefill_reference import reference_outputs
        return reference_outputs(self, use_qk_l2norm, compute_dtype)

    @property
    def lengths(self) -> list:
        cu = self.cu_seqlens.tolist()
        return [e - s for s, e in zip(cu, cu[1:])]

    def clone(self) -> "PrefillInputs":
        return PrefillInputs(*(x.clone() if isinstance(x, torch.Tensor) else x for x in
                               self.args()))


def make_prefill_inputs(lengths=(64,), H=4, HV=8, K=128, V=128, *, state_dtype=torch.float32,
                        io_dtype=torch.bfloat16, dt_bias_dtype=torch.float32, device="cpu",
                        seed=0, scale=None, state=True, index_dtype=torch.int32):
    """Prefill inputs for sequences of the given ``lengths`` (zero allowed), with the decode
    inputs' magnitudes (:func:`make_inputs`); ``state=False`` gives ``state=None`` (zeros).
    The same seed gives the same tensors on any device."""
    T, N = int(sum(lengths)), len(lengths)
    x = make_inputs(B=1, T=max(T, 1), H=H, HV=HV, K=K, V=V, state_dtype=state_dtype,
                    io_dtype=io_dtype, dt_bias_dtype=dt_bias_dtype, seed=seed, scale=scale)
    s = make_inputs(B=max(N, 1), T=1, H=H, HV=HV, K=K, V=V, state_dtype=state_dtype,
                    io_dtype=io_dtype, seed=seed + 1).state[:N]
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=index_dtype)

    def tok(t):
        return t[0, :T].contiguous().to(device)
    return PrefillInputs(q=tok(x.q), k=tok(x.k), v=tok(x.v),
                         state=s.contiguous().to(device) if state else None,
                         A_log=x.A_log.to(device), a=tok(x.a), dt_bias=x.dt_bias.to(device),
                         b=tok(x.b), cu_seqlens=cu.to(device), scale=x.scale)


# The contest's prefill definition `gdn_prefill_qk4_v8_d128_k_last`: its 100 workloads are
# captured tensors that are not available offline; this mix stands in for them (one long
# prompt, a few medium ones, many short ones, ragged mixes with a zero-length sequence).
CONTEST_PREFILL_MIX = ([[8192]] + [[1024] * 8] + [[256] * 16] + [[64] * 64]
                       + [[2048, 1, 700, 0, 63, 65, 1500]] + [[s] for s in (1, 17, 64, 65, 130)]
                       + [[3000, 5000], [128] * 4 + [4096]])


def contest_prefill_workloads(seed=0, device="cpu", state=True):
    """The prefill workload mix at the contest geometry (H=4, HV=8, K=V=128, fp32 state,
    int64 cu_seqlens), one seed per workload."""
    for i, lengths in enumerate(CONTEST_PREFILL_MIX):
        yield i, lengths, make_prefill_inputs(lengths, **CONTEST_GEOMETRY, device=device,
                                              seed=seed * 1000 + i, state=state,
                                              index_dtype=torch.int64)

"""The engines' prefill adapters (vllm.chunked_prefill, sglang.extend) against the engines' own
sequence around their chunk kernel: gather the sequences' states from the pool, (vLLM) zero the
rows without an initial state, run the chunk kernel on the dense states, scatter the final
states back.  The chunk kernel here is gdnzoo's dense prefill on the same backend (standing in
for FlashInfer's, which needs a Hopper GPU: lab/engine_prefill_gpu.py runs the real one).

Inputs are laid out as the engines pass them (vLLM: q, k, v contiguous from its fused post-conv
prep, q and k already L2-normalized; SGLang: q, k, v strided views of one conv-output row
tensor, normalized in the kernel), with g (log decay) and beta fp32 [1, T, HV], the pool
page-strided with random values in the page gaps.  Checked: the output and every named slot
bit-identical to the engine's sequence (same backend: the adapter computes the same thing, one
call instead of four steps), zeros for padded sequences, the rest of the pool's storage (page
gaps included) bit-identical to before; and the adapter against the float64 oracle.  Bad inputs
raise naming the engine's arguments, cold and right after a valid call, nothing touched.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gdnzoo import gate, registry
import gdnzoo
from gdnzoo.inputs import make_prefill_inputs, paged_pool
from gdnzoo.integrations import sglang as sg, vllm as vl
from gdnzoo.pool import Pool
from gdnzoo.prefill_reference import reference_prefill
from conftest import DEVICE
from test_bad_inputs import memo  # noqa: F401  (the dispatch memo emptied, both layers)
from test_trust import _cold_and_warm, _not_tensor

BACKENDS = ["pt-reference", "triton-chunk"]
H, HV, K, V = 2, 4, 64, 64                       # GVA 2: two value heads per q/k head
P = 12                                            # pool slots
# Per sequence: its length, its slot (None: the engine's padding), has_initial_state.
# Zero-length sequences, a padded one of each length kind, and a real slot 0 for SGLang.
LAYOUT = [(5, 3, True), (0, 7, True), (9, None, True), (3, 9, False), (0, None, False),
          (7, 0, True), (4, 5, False)]


# ------------------------------------------------------------------ the engines' own sequences

def dense_prefill(algo):
    """The chunk kernel as the engines call it, on dense fp32 states [N, HV, V, K] updated in
    place: gdnzoo's dense prefill on ``algo`` (for FlashInfer's chunk_gated_delta_rule)."""
    def run(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm):
        o, final = gdnzoo.prefill(q, k, v, initial_state, None, None, None, None, cu_seqlens,
                                  g=g, beta=beta, use_qk_l2norm=use_qk_l2norm, algo=algo)
        return o, final
    return run


def vllm_sequence(q, k, v, g, beta, ssm_state, prefill_state_indices, prefill_has_initial_state,
                  cu_seqlens, kernel):
    """vLLM's prefill branch: gather, zero the rows without an initial state, the chunk kernel
    on fp32 states (its FlashInfer wrapper casts the state to fp32), scatter in the pool's
    dtype.  q, k arrive L2-normalized (use_qk_l2norm_in_kernel=False)."""
    initial_state = ssm_state[prefill_state_indices]
    initial_state[~prefill_has_initial_state, ...] = 0
    o, final = kernel(q[0], k[0], v[0], g[0], beta[0], initial_state.float(), cu_seqlens, False)
    ssm_state[prefill_state_indices] = final.to(ssm_state.dtype)
    return o.unsqueeze(0)


def sglang_sequence(q, k, v, g, beta, ssm_states, cache_indices, query_start_loc, kernel):
    """SGLang's FlashInfer extend: negative (padding) indices read the pool's last slot, the
    chunk kernel runs on fp32 states, only the valid sequences' final states are copied back.
    SGLang's kernels L2-normalize q and k (its Triton kernel inside, as here)."""
    safe = torch.where(cache_indices >= 0, cache_indices, ssm_states.shape[0] - 1).long()
    initial_state = ssm_states[safe].float()
    o, final = kernel(q[0], k[0], v[0], g[0], beta[0], initial_state, query_start_loc, True)
    valid = cache_indices >= 0
    ssm_states.index_copy_(0, safe[valid], final[valid].to(ssm_states.dtype))
    return o.unsqueeze(0)


# ------------------------------------------------------------------ inputs in the engines' layout

@dataclasses.dataclass
class Case:
    engine: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    buf: torch.Tensor            # the pool's whole storage, page gaps included
    pool: torch.Tensor           # [P, HV, V, K], a page-strided view of buf
    idx: torch.Tensor
    init: torch.Tensor
    cu: torch.Tensor
    lengths: list
    storage: list                # every input's storage (nothing of it may change)

    def padded(self, n):
        s = int(self.idx[n])
        return s < 0 or (self.engine == "vllm" and s == 0)

    def named(self):
        return sorted(int(self.idx[n]) for n in range(len(self.idx)) if not self.padded(n))

    def rows(self, padded):
        """Token rows of the sequences that are (not) padded."""
        cu = self.cu.tolist()
        return [t for n in range(len(self.lengths)) if self.padded(n) == padded
                for t in range(cu[n], cu[n + 1])]

    def named_mask(self):
        """[len(buf)] bool: the named slots' blocks in the pool's storage."""
        m = torch.zeros_like(self.buf, dtype=torch.bool)
        page, block = self.pool.stride(0), self.pool[0].numel()
        base = self.pool.storage_offset() - self.buf.storage_offset()
        for s in self.named():
            m[base + s * page:base + s * page + block] = True
        return m


def make_case(engine, state_dtype=torch.float32, seed=0, layout=LAYOUT):
    lengths = [n for n, _, _ in layout]
    x = make_prefill_inputs(lengths, H=H, HV=HV, K=K, V=V, seed=seed, device=DEVICE)
    T = x.q.shape[0]
    g = (-x.A_log.float().exp() * F.softplus(x.a.float() + x.dt_bias.float()))[None]
    beta = x.b.float().sigmoid()[None]
    gen = torch.Generator().manual_seed(seed + 500)
    if engine == "vllm":                 # fused_post_conv_prep: contiguous, q and k normalized
        q, k = (F.normalize(t.float(), dim=-1, eps=1e-6).to(t.dtype)[None] for t in (x.q, x.k))
        v = x.v[None].clone()
        storage = [q, k, v]
        pad = [0, -1]                    # the null block, PAD_SLOT_ID
    else:                                # views of the conv output's rows (16 elements more)
        W = 2 * H * K + HV * V
        rows = torch.randn(T, W + 16, generator=gen).to(x.q.dtype).to(DEVICE)
        rows[:, :H * K] = x.q.reshape(T, -1)
        rows[:, H * K:2 * H * K] = x.k.reshape(T, -1)
        rows[:, 2 * H * K:W] = x.v.reshape(T, -1)
        q = rows[None, :, :H * K].unflatten(2, (H, K))
        k = rows[None, :, H * K:2 * H * K].unflatten(2, (H, K))
        v = rows[None, :, 2 * H * K:W].unflatten(2, (HV, V))
        storage = [rows]
        pad = [-1, -2]
    pp = paged_pool(P, HV, V, K, dtype=state_dtype, device=DEVICE, gen=gen)
    slots, p = [], 0
    for _, s, _ in layout:
        slots.append(pad[p % 2] if s is None else s)
        p += s is None
    idx = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    init = torch.tensor([i for _, _, i in layout], dtype=torch.bool, device=DEVICE)
    return Case(engine, q, k, v, g, beta, pp.buf, pp.state, idx, init, x.cu_seqlens, lengths,
                storage + [g, beta, idx, init, x.cu_seqlens])


def run_adapter(c, algo, **kw):
    if c.engine == "vllm":
        return vl.chunked_prefill(c.q, c.k, c.v, c.g, c.beta, c.pool, c.idx, c.init, c.cu,
                                  algo=algo, **kw)
    o, state, h = sg.extend(c.q, c.k, c.v, c.g, c.beta, ssm_states=c.pool, cache_indices=c.idx,
                            query_start_loc=c.cu, algo=algo, **kw)
    assert state is None and h is None
    return o


def run_engine(c, algo, pool):
    kernel = dense_prefill(algo)
    if c.engine == "vllm":
        return vllm_sequence(c.q, c.k, c.v, c.g, c.beta, pool, c.idx.long(), c.init, c.cu,
                             kernel)
    return sglang_sequence(c.q, c.k, c.v, c.g, c.beta, pool, c.idx, c.cu, kernel)


def _available(algo):
    ok, why = registry.availability(algo, DEVICE, "prefill")
    if not ok:
        pytest.skip(f"{algo} unavailable here: {why}")


def _bits(xs):
    return [x.detach().contiguous().view(torch.uint8).clone() for x in xs]


# ------------------------------------------------------------------ against the engines' sequence

INTERPRETED = DEVICE == "cpu"       # Triton kernels run in Triton's interpreter


def assert_same_states(ours, engines, algo):
    """Bit-identical, except where Triton's interpreter casts: it rounds fp32 to bf16 toward
    zero (its cast passes no rounding mode), where the GPU rounds to nearest even as torch's
    .to() does, so a bf16 slot written by a Triton kernel here may lie one bf16 step (the
    truncated neighbour) from the engine's; never further."""
    if torch.equal(ours, engines):
        return
    assert INTERPRETED and algo.startswith("triton") and ours.dtype == torch.bfloat16, \
        f"{algo}: a named slot differs from the engine's, max {(ours.float() - engines.float()).abs().max()}"
    steps = ours.view(torch.int16).int() - engines.view(torch.int16).int()
    toward_zero = (steps.abs() <= 1) & (ours.float().abs() <= engines.float().abs())
    assert toward_zero.all(), f"{algo}: bf16 slots further than one truncation step apart"

def check_against_engine(c, algo, engine_pool_prep=None, **kw):
    """The adapter on c's pool, the engine's sequence on a copy of it: the outputs and the
    named slots bit-identical, padded rows zeros, everything else untouched."""
    buf_before = c.buf.clone()
    inputs_before = _bits(c.storage)
    eng_buf = c.buf.clone()
    eng_pool = eng_buf.as_strided(c.pool.shape, c.pool.stride(),
                                  c.pool.storage_offset() - c.buf.storage_offset())
    if engine_pool_prep is not None:
        engine_pool_prep(eng_pool)
    o_eng = run_engine(c, algo, eng_pool)
    o = run_adapter(c, algo, **kw)
    assert o.shape == (1, c.q.shape[1], HV, V) and o.dtype == c.q.dtype
    real, padded = c.rows(False), c.rows(True)
    assert torch.equal(o[0, real], o_eng[0, real]), \
        f"{algo}: out differs from the engine's, max {(o[0, real].float() - o_eng[0, real].float()).abs().max()}"
    assert torch.count_nonzero(o[0, padded]) == 0, "a padded sequence's rows are not zeros"
    named = c.named()
    assert_same_states(c.pool[named], eng_pool[named], algo)
    keep = ~c.named_mask()
    assert torch.equal(c.buf[keep], buf_before[keep]), "the pool changed outside the named slots"
    assert all(torch.equal(a, b) for a, b in zip(inputs_before, _bits(c.storage))), \
        "an input changed"
    return o


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("algo", BACKENDS)
def test_vllm_chunked_prefill_equals_vllms_sequence(algo, state_dtype):
    """Mixed has_initial_state (the False slots NaN: not read), the null block and -1 as
    padding, zero-length sequences."""
    _available(algo)
    c = make_case("vllm", state_dtype, seed=1)
    for _, s, i in LAYOUT:
        if s is not None and not i:
            c.pool[s] = float("nan")
    check_against_engine(c, algo)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("algo", BACKENDS)
def test_sglang_extend_equals_sglangs_sequence(algo, state_dtype):
    """SGLang reads every slot (it zeroes a slot when it allocates it): -1 and -2 pad, slot 0
    is a real slot, zero-length sequences."""
    _available(algo)
    check_against_engine(make_case("sglang", state_dtype, seed=2), algo)


@pytest.mark.parametrize("algo", BACKENDS)
def test_sglang_extend_has_initial_state_saves_the_zeroing(algo):
    """With has_initial_state, a new sequence's stale slot (NaN here) is not read: the result
    is SGLang's with the slot zeroed at allocation."""
    _available(algo)
    c = make_case("sglang", seed=3)
    fresh = [s for _, s, i in LAYOUT if s is not None and not i]
    c.pool[fresh] = float("nan")

    def allocate(pool):
        pool[fresh] = 0
    check_against_engine(c, algo, allocate, has_initial_state=c.init)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapters_match_the_float64_oracle(engine):
    """The adapter (pt-reference) against gdnzoo's float64 prefill reference on the same
    pool, gates given precomputed as the engines compute them."""
    c = make_case(engine, seed=4)
    ref_pool = c.pool.double()
    null = 0 if engine == "vllm" else -1
    init = c.init if engine == "vllm" else None
    T = c.q.shape[1]
    ref_out = torch.empty(T, HV, V, dtype=torch.float64, device=DEVICE)
    reference_prefill(c.q[0], c.k[0], c.v[0], c.pool.double().clone(), None, None, None, None,
                      c.cu, K ** -0.5, ref_out, ref_pool, engine == "sglang",
                      Pool(c.idx, c.idx, null), init, compute_dtype=torch.float64,
                      g=c.g[0].double(), beta=c.beta[0].double())
    o = run_adapter(c, "pt-reference")
    named = c.named()
    j = gate.judge(o[0], c.pool[named], ref_out, ref_pool[named], state_dtype=c.pool.dtype)
    assert j.ok, j.reason


def test_vllm_core_attn_out_is_written_in_place():
    """core_attn_out [>= T, HV, V]: its first T rows written, o a view of them, the rest
    untouched."""
    c = make_case("vllm", seed=5)
    T = c.q.shape[1]
    buf = torch.full((T + 3, HV, V), float("nan"), dtype=c.q.dtype, device=DEVICE)
    o = vl.chunked_prefill(c.q, c.k, c.v, c.g, c.beta, c.pool, c.idx, c.init, c.cu,
                           core_attn_out=buf, algo="pt-reference")
    assert o.data_ptr() == buf.data_ptr() and o.shape == (1, T, HV, V)
    assert not o.isnan().any() and buf[T:].isnan().all()


# ------------------------------------------------------------------ bad inputs: the engines' names

def _vllm_call(c, **change):
    args = dict(q=c.q, k=c.k, v=c.v, g=c.g, beta=c.beta, ssm_state=c.pool,
                prefill_state_indices=c.idx, prefill_has_initial_state=c.init, cu_seqlens=c.cu,
                algo="pt-reference")
    bad = dict(args, **change)
    return lambda: vl.chunked_prefill(**bad), lambda: vl.chunked_prefill(**args)


def _sglang_call(c, **change):
    args = dict(q=c.q, k=c.k, v=c.v, g=c.g, beta=c.beta, ssm_states=c.pool,
                cache_indices=c.idx, query_start_loc=c.cu, algo="pt-reference")
    bad = dict(args, **change)
    return lambda: sg.extend(**bad), lambda: sg.extend(**args)


CALLS = {"vllm": _vllm_call, "sglang": _sglang_call}
TENSORS = {"vllm": vl.PREFILL_TENSORS, "sglang": sg.EXTEND_TENSORS}


def _storages(c):
    return [c.buf] + c.storage


@pytest.mark.parametrize("what", ["list", "numpy"])
@pytest.mark.parametrize("engine,name", [(e, n) for e in TENSORS for n in TENSORS[e]])
def test_prefill_adapter_non_tensor_names_the_argument(engine, name, what, memo):
    c = make_case(engine, seed=6)
    like = getattr(c, {"ssm_state": "pool", "ssm_states": "pool", "prefill_state_indices": "idx",
                       "cache_indices": "idx", "prefill_has_initial_state": "init",
                       "has_initial_state": "init", "cu_seqlens": "cu", "query_start_loc": "cu",
                       "core_attn_out": "v"}.get(name, name))
    bad, good = CALLS[engine](c, **{name: _not_tensor(like, what)})
    _cold_and_warm(bad, good, _storages(c), TypeError, name)


def _vllm_bad(c):
    T = c.q.shape[1]
    return [("ssm_state", {"ssm_state": c.pool.half()}, TypeError),
            ("prefill_state_indices", {"prefill_state_indices": c.idx.float()}, TypeError),
            ("prefill_has_initial_state", {"prefill_has_initial_state": c.init.int()},
             TypeError),
            ("prefill_has_initial_state", {"prefill_has_initial_state": c.init[:-1]},
             ValueError),
            ("cu_seqlens", {"cu_seqlens": c.cu.float()}, TypeError),
            ("use_qk_l2norm_in_kernel", {"use_qk_l2norm_in_kernel": "yes"}, TypeError),
            ("scale", {"scale": "0.1"}, TypeError),
            ("core_attn_out", {"core_attn_out": torch.empty(T - 1, HV, V, dtype=c.q.dtype,
                                                            device=DEVICE)}, ValueError),
            ("core_attn_out", {"core_attn_out": torch.empty(T, HV, V, device=DEVICE)},
             TypeError),
            ("q", {"q": c.q[0]}, ValueError),
            ("g", {"g": c.g.double()}, TypeError),
            ("beta", {"beta": c.beta[:, :-1]}, ValueError)]


def _sglang_bad(c):
    return [("ssm_states", {"ssm_states": c.pool[:, :, :, :32]}, ValueError),
            ("cache_indices", {"cache_indices": c.idx.float()}, TypeError),
            ("cache_indices", {"cache_indices": c.idx[:-1]}, ValueError),
            ("query_start_loc", {"query_start_loc": c.cu.float()}, TypeError),
            ("has_initial_state", {"has_initial_state": c.init.int()}, TypeError),
            ("inplace_update", {"inplace_update": False}, ValueError),
            ("k", {"k": c.k[:, :-1]}, ValueError),
            ("v", {"v": c.v[0]}, ValueError)]


BAD = {"vllm": _vllm_bad, "sglang": _sglang_bad}


@pytest.mark.parametrize("engine,i", [(e, i) for e in BAD
                                      for i in range(len(BAD[e](make_case(e))))])
def test_prefill_adapter_names_arguments_as_the_engine(engine, i, memo):
    """gdnzoo's own checks (and the adapters'), reported under the engine's names (not
    state, state_indices, has_initial_state, cu_seqlens, out or use_qk_l2norm)."""
    c = make_case(engine, seed=7)
    name, change, exc = BAD[engine](c)[i]
    bad, good = CALLS[engine](c, **change)
    _cold_and_warm(bad, good, _storages(c), exc, name)


@pytest.mark.parametrize("engine", list(CALLS))
def test_value_errors_name_the_engines_argument(engine, monkeypatch):
    """The checks of cu_seqlens' values (pt-reference reads them on the host) and of the
    slots (GDNZOO_CHECK_INDICES=1) name the engine's argument, subscript kept."""
    c = make_case(engine, seed=8)
    cu_name, idx_name = (("cu_seqlens", "prefill_state_indices") if engine == "vllm"
                         else ("query_start_loc", "cache_indices"))
    bad_cu = c.cu.clone()
    bad_cu[-1] += 1
    bad, _ = CALLS[engine](c, **{cu_name: bad_cu})
    with pytest.raises(ValueError, match=rf"^{cu_name}\[{len(c.cu) - 1}\] = "):
        bad()
    monkeypatch.setenv("GDNZOO_CHECK_INDICES", "1")
    dup = c.idx.clone()
    dup[1] = dup[0]
    bad, _ = CALLS[engine](c, **{idx_name: dup})
    with pytest.raises(ValueError, match=rf"^{idx_name}\[\d\] = "):
        bad()


@pytest.mark.parametrize("engine", list(CALLS))
def test_error_messages_speak_only_the_engines_names(engine, memo):
    """Not only the leading name: where a message goes on to mention another argument of
    gdnzoo's (the entry before a decreasing cu_seqlens, the indices that make the state a
    pool), it mentions it under the engine's name too."""
    c = make_case(engine, seed=9)
    cu_name, idx_name, pool_name = (("cu_seqlens", "prefill_state_indices", "ssm_state")
                                    if engine == "vllm" else
                                    ("query_start_loc", "cache_indices", "ssm_states"))
    bad_cu = c.cu.clone()
    bad_cu[3] = bad_cu[2] - 1                     # decreasing at entry 3
    bad, _ = CALLS[engine](c, **{cu_name: bad_cu})
    with pytest.raises(ValueError) as ei:
        bad()
    assert str(ei.value).startswith(f"{cu_name}[3] = {int(bad_cu[3])}: expected >= "
                                    f"{cu_name}[2] = {int(bad_cu[2])}"), str(ei.value)
    bad, _ = CALLS[engine](c, **{pool_name: c.pool[:, :HV // 2]})
    with pytest.raises(ValueError) as ei:
        bad()
    msg = str(ei.value)
    assert msg.startswith(f"{pool_name}: ") and f"({idx_name} given)" in msg, msg


@pytest.mark.parametrize("engine", ("vllm", "sglang"))
def test_adapters_compile_as_they_are(engine):
    """torch.compile(fullgraph=True) takes the prefill adapters as they are and gives the eager
    call's output and pool bit for bit."""
    c = make_case(engine)
    pool0 = c.pool.clone()
    want = run_adapter(c, "pt-reference").clone()
    pool_want = c.pool.clone()
    c.pool.copy_(pool0)
    torch._dynamo.reset()
    got = torch.compile(lambda: run_adapter(c, "pt-reference"), fullgraph=True,
                        backend="aot_eager")()
    assert torch.equal(got, want) and torch.equal(c.pool, pool_want)

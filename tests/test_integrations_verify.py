"""The engines' speculative-verify entry points served by gdnzoo (gdnzoo.integrations.vllm /
.sglang ``fused_sigmoid_gating_delta_rule_update``, SGLang's commit), and fi-baseline's verify.

Inputs are laid out as the engines pass them: q, k, v [1, N*T, ...] views of one packed row per
token (row stride larger than q || k || v, nonzero storage offset), a and b strided views of one
[N*T, 2*HV] tensor, ``cu_seqlens`` [N+1], the state a page-strided pool with random values in
the page gaps.  Each call is checked against the float64 reference (out, every written slot or
intermediate state, zeros for padded sequences, everything else bit-identical) and against the
same call made directly through gdnzoo.decode (bit-identical).  vLLM pads with index <= 0,
SGLang with index < 0.  GPU tests compare the vLLM adapter with vLLM's own kernel; SGLang's
kernel is not installed on the GPU machine, so its adapter is checked against the reference
only.
"""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

import gdnzoo
from gdnzoo import gate, registry
from gdnzoo.inputs import Inputs, make_inputs, packed, paged_pool
from gdnzoo.integrations import sglang as sg, vllm as vl
from gdnzoo.pool import Pool
from gdnzoo.reference import reference_verify_outputs
from gdnzoo.verify import Verify
from conftest import DEVICE
from gdnzoo.inputs import make_verify_case
from verify_cases import check_verify_call

CPU_ALGOS = ["pt-reference", "fla-recurrent"]


@dataclasses.dataclass
class Call:
    """One engine verify call's tensors, and the same call as gdnzoo Inputs (q/k/v/a/b [N, T,
    ...] sliced by hand) for the reference."""
    q: torch.Tensor              # [1, N*T, H, K] views of rows
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor              # [N*T, HV] strided views of ab
    b: torch.Tensor
    cu: torch.Tensor             # cu_seqlens [N+1]
    pool: torch.Tensor           # [P, HV, V, K], page-strided view of buf
    buf: torch.Tensor
    rows: torch.Tensor           # the packed rows' storage
    ab: torch.Tensor
    x: Inputs
    N: int
    T: int


def make_call(N=3, T=3, H=2, HV=4, K=32, V=64, sd=torch.float32, seed=0, device=DEVICE):
    x0 = make_inputs(B=N, T=T, H=H, HV=HV, K=K, V=V, state_dtype=sd, seed=seed)
    gen = torch.Generator().manual_seed(seed + 500)
    HK, NT = H * K, N * T
    pk = packed(x0, lead=8, trail=16, gen=gen)          # token rows of 24 elements more
    pool = paged_pool(N * (T + 1) + 4, HV, V, K, dtype=sd, device=device, gen=gen)
    pk = pk.to(device)
    rows, s = pk.rows, pk.rows.stride(0)

    def varlen(off, heads, dim):                        # [1, N*T, heads, dim]: one "sequence"
        return rows.as_strided((1, NT, heads, dim), (NT * s, s, dim, 1), 8 + off)
    q, k, v = varlen(0, H, K), varlen(HK, H, K), varlen(2 * HK, HV, V)
    cu = torch.arange(N + 1, dtype=torch.int32, device=device) * T
    return Call(q, k, v, pk.a2, pk.b2, cu, pool.state, pool.buf, rows, pk.ab,
                Inputs(*pk.args(pool.state)), N, T)


def slots(c, seed, dim, low=1):
    """Distinct random pool slots >= ``low``: [N, T] (dim 2) or [N]."""
    gen = torch.Generator().manual_seed(seed)
    P = c.pool.shape[0]
    s = torch.randperm(P - low, generator=gen)[:c.N * c.T] + low
    return (s.view(c.N, c.T) if dim == 2 else s[:c.N]).to(torch.int32).to(c.q.device)


def untouched_outside(buf, before, view, blocks):
    """Whether ``buf`` equals ``before`` outside the [HV, V, K] blocks of ``view`` at
    ``blocks`` (index tuples of its leading dims)."""
    keep = torch.ones_like(buf, dtype=torch.bool)
    size = view.shape[-3] * view.shape[-2] * view.shape[-1]
    base = view.storage_offset() - buf.storage_offset()
    for blk in blocks:
        start = base + sum(i * st for i, st in zip(blk, view.stride()))
        keep[start:start + size] = False
    return torch.equal(buf[keep], before[keep])


def vllm_call(c, idx, acc, l2, algo, **kw):
    return vl.fused_sigmoid_gating_delta_rule_update(
        A_log=c.x.A_log, a=c.a, b=c.b, dt_bias=c.x.dt_bias, q=c.q, k=c.k, v=c.v,
        initial_state=c.pool, cu_seqlens=kw.pop("cu_seqlens", c.cu), ssm_state_indices=idx,
        num_accepted_tokens=acc, use_qk_l2norm_in_kernel=l2, algo=algo, **kw)


def sglang_call(c, idx, l2, algo, **kw):
    return sg.fused_sigmoid_gating_delta_rule_update(
        A_log=c.x.A_log, a=c.a, dt_bias=c.x.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=c.q, k=c.k, v=c.v, b=c.b, initial_state_source=c.pool, initial_state_indices=idx,
        use_qk_l2norm_in_kernel=l2, cu_seqlens=kw.pop("cu_seqlens", c.cu), algo=algo, **kw)


def _geometry(algo):
    """fla-recurrent takes K = V in (64, 128, 256); pt-reference also checks K != V."""
    return dict(K=64, V=64) if algo == "fla-recurrent" else dict(K=32, V=64)


def _usable(algo):
    ok, why = registry.availability(algo, DEVICE)
    if not ok:
        pytest.skip(f"{algo} unavailable here: {why}")


# ------------------------------------------------------------------ vLLM: per-token slots

@pytest.mark.parametrize("algo", CPU_ALGOS)
@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
def test_vllm_per_token_slots_match_reference(algo, sd):
    """[N, T] slots, random counts: out [1, N*T, HV, V] in q's dtype, token t's state in slot
    [n, t]; sequence 1 reads the null block (padding: zeros, nothing written); token 1 of
    sequence 0 has slot -1 (not stored, the others are)."""
    _usable(algo)
    if algo == "fla-recurrent" and sd == torch.bfloat16 and not torch.cuda.is_available():
        pytest.skip("fla-recurrent: fp32 only under the Triton interpreter (its time)")
    c = make_call(sd=sd, seed=3, **_geometry(algo))
    idx = slots(c, 1, 2)
    acc = torch.tensor([2, 3, 1], dtype=torch.int32, device=c.q.device)
    idx[1, acc[1] - 1] = 0
    idx[0, 1] = -1
    _check_vllm(c, idx, acc, True, algo)


@pytest.mark.parametrize("count", (1, 2, 3, 4))
def test_vllm_each_accepted_count(count):
    c = make_call(T=4, seed=10 + count)
    idx = slots(c, count, 2)
    acc = torch.full((c.N,), count, dtype=torch.int64, device=c.q.device)
    _check_vllm(c, idx, acc, False, "pt-reference")


@pytest.mark.parametrize("bad", (0, 5))
def test_vllm_count_outside_1_to_T_pads(bad):
    c = make_call(T=4, seed=7)
    idx = slots(c, 2, 2)
    acc = torch.tensor([1, bad, 4], dtype=torch.int32, device=c.q.device)
    _check_vllm(c, idx, acc, True, "pt-reference", padded={1})


def _check_vllm(c, idx, acc, l2, algo, padded=None):
    N, T = c.N, c.T
    pool_args = Pool(idx, idx, 0)
    ref_out, ref_pool, _ = reference_verify_outputs(c.x, Verify(None, None, True, True, acc), l2,
                                                    pool_args)
    buf0, rows0, ab0, idx0 = c.buf.clone(), c.rows.clone(), c.ab.clone(), idx.clone()
    o, final = vllm_call(c, idx, acc, l2, algo)
    assert final is c.pool
    assert o.shape == c.v.shape and o.dtype == c.q.dtype and o.device == c.q.device
    out = o[0].view(N, T, *o.shape[2:])
    cnt = acc.tolist()
    pad = set(padded or ()) | {n for n in range(N) if not 1 <= cnt[n] <= T
                               or int(idx[n, cnt[n] - 1]) <= 0}
    written = [int(idx[n, t]) for n in range(N) if n not in pad for t in range(T)
               if int(idx[n, t]) > 0]
    assert written, "the case writes no slot"
    j = gate.judge(out, c.pool[written], ref_out, ref_pool[written], state_dtype=c.pool.dtype)
    assert j.ok, j.reason
    for n in pad:
        assert torch.equal(out[n], torch.zeros_like(out[n])), f"padded sequence {n}"
    assert untouched_outside(c.buf, buf0, c.pool, [(s,) for s in written])
    assert torch.equal(c.rows, rows0) and torch.equal(c.ab, ab0) and torch.equal(idx, idx0)
    # the same call straight through gdnzoo.decode: bit-identical
    got_out, got_buf = out.clone(), c.buf.clone()
    c.buf.copy_(buf0)
    direct = torch.empty_like(c.x.v)
    gdnzoo.decode(c.x.q, c.x.k, c.x.v, c.pool, c.x.A_log, c.x.a, c.x.dt_bias, c.x.b, out=direct,
                  use_qk_l2norm=l2, algo=algo, state_indices=idx, null_slot=0,
                  num_accepted_tokens=acc)
    assert torch.equal(direct, got_out) and torch.equal(c.buf, got_buf)


# ------------------------------------------------------------------ vLLM: other forms

@pytest.mark.parametrize("dense_form", (False, True))
def test_vllm_decode_one_token_a_sequence(dense_form):
    """vLLM's non-spec decode: [N] indices, one token each (flattened with cu_seqlens, or
    [N, 1, ...] without); 0 and -1 pad."""
    c = make_call(N=4, T=1, seed=21)
    idx = slots(c, 3, 1)
    idx[1], idx[2] = 0, -1
    kw = {}
    if dense_form:
        kw = dict(cu_seqlens=None, q=c.x.q, k=c.x.k, v=c.x.v)
    ref_out, ref_pool, _ = reference_verify_outputs(c.x, Verify(None, None, True, False, None),
                                                    False, Pool(idx, idx, 0))
    buf0 = c.buf.clone()
    o, final = vl.fused_sigmoid_gating_delta_rule_update(
        c.x.A_log, c.a, c.b, c.x.dt_bias, kw.get("q", c.q), kw.get("k", c.k), kw.get("v", c.v),
        initial_state=c.pool, cu_seqlens=kw.get("cu_seqlens", c.cu), ssm_state_indices=idx,
        algo="pt-reference")
    assert final is c.pool and o.shape == kw.get("v", c.v).shape
    out = o.reshape(4, 1, *o.shape[2:])
    real = [0, 3]
    written = [int(idx[n]) for n in real]
    j = gate.judge(out[real], c.pool[written], ref_out[real], ref_pool[written],
                   state_dtype=c.pool.dtype)
    assert j.ok, j.reason
    assert torch.equal(out[1:3], torch.zeros_like(out[1:3]))
    assert untouched_outside(c.buf, buf0, c.pool, [(s,) for s in written])


@pytest.mark.parametrize("varlen", (False, True))
def test_vllm_not_in_place_writes_per_token_states_to_a_new_tensor(varlen):
    """inplace_final_state=False: final_state [k.shape[1], HV, V, K] gets the state after each
    token (row n*T + t); the pool stays bit-identical.  Flattened: one token a sequence ([N]
    index); [1, T, ...] without cu_seqlens: T tokens of one sequence."""
    N, T = (4, 1) if varlen else (1, 3)
    c = make_call(N=N, T=T, seed=30 + varlen)
    idx = slots(c, 5, 1)
    if varlen:
        idx[2] = 0
    verify = Verify(torch.zeros(N, T, *c.pool.shape[1:], dtype=c.pool.dtype, device=c.q.device),
                    None, False, False, None)
    ref_out, _, ref_inter = reference_verify_outputs(c.x, verify, True, Pool(idx, idx, 0))
    buf0 = c.buf.clone()
    q, k, v, cu = (c.q, c.k, c.v, c.cu) if varlen else (c.x.q, c.x.k, c.x.v, None)
    o, final = vl.fused_sigmoid_gating_delta_rule_update(
        c.x.A_log, c.a, c.b, c.x.dt_bias, q, k, v, initial_state=c.pool,
        inplace_final_state=False, cu_seqlens=cu, ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True, algo="pt-reference")
    assert torch.equal(c.buf, buf0), "the pool was written"
    assert final is not c.pool and final.shape == (k.shape[1], *c.pool.shape[1:])
    assert final.dtype == c.pool.dtype
    real = [n for n in range(N) if int(idx[n]) > 0]
    got = final.view(N, T, *final.shape[1:])
    out = o.reshape(N, T, *o.shape[-2:])
    j = gate.judge(out[real], got[real], ref_out[real], ref_inter[real],
                   state_dtype=c.pool.dtype)
    assert j.ok, j.reason
    if varlen:
        assert torch.equal(out[2], torch.zeros_like(out[2]))


# ------------------------------------------------------------------ vLLM: refusals

def _vllm_refusal(what):
    c = make_call(seed=40)
    idx = slots(c, 6, 2)
    acc = torch.ones(c.N, dtype=torch.int32, device=c.q.device)
    kw = dict(A_log=c.x.A_log, a=c.a, b=c.b, dt_bias=c.x.dt_bias, q=c.q, k=c.k, v=c.v,
              initial_state=c.pool, cu_seqlens=c.cu, ssm_state_indices=idx,
              num_accepted_tokens=acc, algo="pt-reference")
    if what == "cu_seqlens":
        kw["cu_seqlens"] = torch.tensor([0, 2, 6, 9], dtype=torch.int32, device=c.q.device)
    elif what == "beta":
        kw["beta"] = 2.0
    elif what == "threshold":
        kw["threshold"] = 10.0
    elif what == "is_kda":
        kw["is_kda"] = True
    elif what == "scale":
        kw["scale"] = -1.0
    elif what == "initial_state":
        kw["initial_state"] = None
    elif what == "ssm_state_indices":        # [N] with T > 1 tokens a sequence, in place
        kw.update(cu_seqlens=None, q=c.x.q, k=c.x.k, v=c.x.v, ssm_state_indices=idx[:, 0].clone(),
                  num_accepted_tokens=None)
    elif what == "contiguous":               # a column slice of a wider block table
        table = torch.zeros(c.N, c.T + 5, dtype=torch.int32, device=c.q.device)
        table[:, :c.T] = idx
        kw["ssm_state_indices"] = table[:, :c.T]
    elif what == "num_accepted_tokens":
        kw["inplace_final_state"] = False
    elif what == "read_column":
        kw.update(inplace_final_state=False, num_accepted_tokens=None)
    elif what == "inplace_final_state":
        kw.update(inplace_final_state=False, num_accepted_tokens=None, cu_seqlens=None,
                  q=c.x.q, k=c.x.k, v=c.x.v, ssm_state_indices=idx[:, 0].clone())
    elif what == "q":
        kw["q"] = c.x.q
    return c, kw


@pytest.mark.parametrize("what,name", [
    ("cu_seqlens", "cu_seqlens"), ("beta", "beta"), ("threshold", "threshold"),
    ("is_kda", "is_kda"), ("scale", "scale"), ("initial_state", "initial_state"),
    ("ssm_state_indices", "ssm_state_indices"), ("contiguous", "ssm_state_indices"),
    ("num_accepted_tokens", "num_accepted_tokens"), ("read_column", "ssm_state_indices"),
    ("inplace_final_state", "inplace_final_state"), ("q", "q")])
def test_vllm_unserved_inputs_raise_naming_the_argument(what, name, monkeypatch):
    if what == "cu_seqlens":        # ragged T is read on the host: a device tensor only when
        monkeypatch.setenv("GDNZOO_CHECK_INDICES", "1")   # checking (no sync by default)
    c, kw = _vllm_refusal(what)
    before = c.buf.clone()
    with pytest.raises(ValueError, match=f"^{name}: "):
        vl.fused_sigmoid_gating_delta_rule_update(**kw)
    assert torch.equal(c.buf, before)


def test_vllm_ssm_state_indices_required():
    c, kw = _vllm_refusal(None)
    kw["ssm_state_indices"] = None
    with pytest.raises(ValueError, match="^ssm_state_indices: required"):
        vl.fused_sigmoid_gating_delta_rule_update(**kw)


def test_graph_padded_index_and_count_buffers_are_cut_to_n_rows():
    """vLLM's CUDA-graph buffers hold more rows than sequences: only the first N are read."""
    c = make_call(seed=45)
    idx = slots(c, 8, 2)
    acc = torch.tensor([1, 2, 3], dtype=torch.int32, device=c.q.device)
    big_idx = torch.cat([idx, torch.full((2, c.T), 10**6, dtype=torch.int32,
                                         device=c.q.device)])
    big_acc = torch.cat([acc, torch.full((2,), 7, dtype=torch.int32, device=c.q.device)])
    buf0 = c.buf.clone()
    o1, _ = vllm_call(c, big_idx, big_acc, True, "pt-reference")
    b1 = c.buf.clone()
    c.buf.copy_(buf0)
    o2, _ = vllm_call(c, idx, acc, True, "pt-reference")
    assert torch.equal(o1, o2) and torch.equal(b1, c.buf)


# ------------------------------------------------------------------ SGLang: verify

def _sglang_buffer(c, S, pitch_extra=0):
    """intermediate_states_buffer [S, T, HV, V, K] (row pitch T + pitch_extra states) with
    random values everywhere."""
    HV, V, K = c.pool.shape[1:]
    slot = HV * V * K
    steps = c.T + pitch_extra
    gen = torch.Generator().manual_seed(99)
    ibuf = (torch.randn(S * steps * slot, generator=gen) * 0.05).to(c.pool.dtype)
    ibuf = ibuf.to(c.q.device)
    return ibuf, ibuf.as_strided((S, c.T, HV, V, K), (steps * slot, slot, V * K, K, 1))


@pytest.mark.parametrize("algo", CPU_ALGOS)
@pytest.mark.parametrize("update", (False, True))
def test_sglang_verify_matches_reference(algo, update):
    """disable_state_update (SGLang's verify) leaves the whole pool bit-identical; the states
    after each token land at [intermediate_state_indices[n], t]; slot 0 is a real slot; -1
    pads (zeros, no intermediate rows).  With update, the final state is written too."""
    _usable(algo)
    if algo == "fla-recurrent" and update and not torch.cuda.is_available():
        pytest.skip("fla-recurrent: one case under the Triton interpreter (its time)")
    c = make_call(N=4, seed=50 + update, **_geometry(algo))
    idx = slots(c, 9, 1)
    idx[1], idx[2] = -1, 0
    S = 6
    ibuf, inter = _sglang_buffer(c, S, pitch_extra=1)
    rows = torch.tensor([4, 0, 5, 2, 1, 3], dtype=torch.int64, device=c.q.device)   # [>= N]
    verify = Verify(inter, rows[:4], update, False, None)
    ref_out, ref_pool, ref_inter = reference_verify_outputs(c.x, verify, True,
                                                            Pool(idx, idx, -1))
    buf0, ibuf0 = c.buf.clone(), ibuf.clone()
    o = sglang_call(c, idx, True, algo, disable_state_update=not update,
                    intermediate_states_buffer=inter, intermediate_state_indices=rows,
                    cache_steps=c.T)
    assert o.shape == c.v.shape and o.dtype == c.q.dtype
    out = o[0].view(4, c.T, *o.shape[2:])
    real = [0, 2, 3]
    blocks = [(int(rows[n]), t) for n in real for t in range(c.T)]
    got = torch.stack([inter[blk] for blk in blocks])
    ref = torch.stack([ref_inter[blk] for blk in blocks])
    j = gate.judge(out[real], got, ref_out[real], ref, state_dtype=c.pool.dtype)
    assert j.ok, j.reason
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert untouched_outside(ibuf, ibuf0, inter, blocks)
    written = [int(idx[n]) for n in real] if update else []
    if update:
        j = gate.judge(out[real], c.pool[written], ref_out[real], ref_pool[written],
                       state_dtype=c.pool.dtype)
        assert j.ok, j.reason
    assert untouched_outside(c.buf, buf0, c.pool, [(s,) for s in written])
    # the same call straight through gdnzoo.decode: bit-identical
    got_out, got_buf, got_ibuf = out.clone(), c.buf.clone(), ibuf.clone()
    c.buf.copy_(buf0)
    ibuf.copy_(ibuf0)
    direct = torch.empty_like(c.x.v)
    gdnzoo.decode(c.x.q, c.x.k, c.x.v, c.pool, c.x.A_log, c.x.a, c.x.dt_bias, c.x.b, out=direct,
                  use_qk_l2norm=True, algo=algo, state_indices=idx, intermediate_states=inter,
                  intermediate_indices=rows[:4], update_state=update)
    assert torch.equal(direct, got_out) and torch.equal(c.buf, got_buf)
    assert torch.equal(ibuf, got_ibuf)


def test_sglang_disable_state_update_without_buffer_writes_nothing():
    c = make_call(seed=55)
    idx = slots(c, 11, 1)
    buf0 = c.buf.clone()
    o = sglang_call(c, idx, False, "pt-reference", disable_state_update=True,
                    intermediate_state_indices=idx)          # ignored without a buffer
    assert torch.equal(c.buf, buf0)
    ref_out, _, _ = reference_verify_outputs(c.x, Verify(None, None, False, False, None), False,
                                             Pool(idx, idx, -1))
    assert gate.compare(o[0].view(c.N, c.T, *o.shape[2:]), ref_out).ok


def test_sglang_decode_one_token_updates_the_slots():
    """SGLang's plain decode through the same function: T = 1, the pool updated in place."""
    c = make_call(N=4, T=1, seed=56)
    idx = slots(c, 12, 1)
    idx[3] = -1
    ref_out, ref_pool, _ = reference_verify_outputs(c.x, Verify(None, None, True, False, None),
                                                    True, Pool(idx, idx, -1))
    o = sglang_call(c, idx, True, "pt-reference")
    written = [int(s) for s in idx[:3]]
    out = o[0].view(4, 1, *o.shape[2:])
    j = gate.judge(out[:3], c.pool[written], ref_out[:3], ref_pool[written],
                   state_dtype=c.pool.dtype)
    assert j.ok, j.reason
    assert torch.equal(out[3], torch.zeros_like(out[3]))


@pytest.mark.parametrize("what,name", [
    ("retrieve_parent_token", "retrieve_parent_token"), ("softplus_beta", "softplus_beta"),
    ("softplus_threshold", "softplus_threshold"), ("is_kda", "is_kda"),
    ("lower_bound", "lower_bound"), ("match_cutedsl_decode", "match_cutedsl_decode"),
    ("cache_ring", "cache_ring"), ("replayssm_g", "replayssm_g"), ("scale", "scale"),
    ("initial_state_indices", "initial_state_indices"),
    ("gaps", "intermediate_states_buffer"), ("rank", "intermediate_states_buffer"),
    ("cu_seqlens", "cu_seqlens"), ("uneven", "cu_seqlens"), ("k", "k")])
def test_sglang_unserved_inputs_raise_naming_the_argument(what, name, monkeypatch):
    if what == "cu_seqlens":        # ragged T: read on the host when checking (see vLLM's)
        monkeypatch.setenv("GDNZOO_CHECK_INDICES", "1")
    c = make_call(seed=60)
    idx = slots(c, 13, 1)
    ibuf, inter = _sglang_buffer(c, c.N)
    kw = dict(disable_state_update=True, intermediate_states_buffer=inter)
    if what == "retrieve_parent_token":
        kw[what] = torch.zeros(c.N, c.T, dtype=torch.int64, device=c.q.device)
    elif what in ("softplus_beta", "softplus_threshold"):
        kw = dict(kw, **{what: 2.0})
    elif what in ("is_kda", "match_cutedsl_decode", "cache_ring"):
        kw[what] = True
    elif what == "lower_bound":
        kw[what] = -5.0
    elif what == "replayssm_g":
        kw[what] = torch.zeros(4, device=c.q.device)
    elif what == "scale":
        kw[what] = 0.0
    elif what == "initial_state_indices":
        idx = None
    elif what == "gaps":                         # step blocks apart: SGLang's kernel would not
        HV, V, K = c.pool.shape[1:]               # address them
        slot = HV * V * K
        wide = torch.zeros(c.N * c.T * (slot + 16), dtype=c.pool.dtype, device=c.q.device)
        kw["intermediate_states_buffer"] = wide.as_strided(
            (c.N, c.T, HV, V, K), (c.T * (slot + 16), slot + 16, V * K, K, 1))
    elif what == "rank":
        kw["intermediate_states_buffer"] = inter[0]
    elif what == "cu_seqlens":
        kw["cu_seqlens"] = torch.tensor([0, 4, 5, 9], dtype=torch.int32, device=c.q.device)
    elif what == "uneven":                       # 9 tokens into 2 sequences
        kw["cu_seqlens"] = torch.tensor([0, 4, 8], dtype=torch.int32, device=c.q.device)
    elif what == "k":
        kw["k"] = c.x.k
    call = dict(A_log=c.x.A_log, a=c.a, dt_bias=c.x.dt_bias, softplus_beta=1.0,
                softplus_threshold=20.0, q=c.q, k=c.k, v=c.v, b=c.b, initial_state_source=c.pool,
                initial_state_indices=idx, cu_seqlens=c.cu, algo="pt-reference")
    call.update(kw)
    before, ibefore = c.buf.clone(), ibuf.clone()
    with pytest.raises(ValueError, match=f"^{name}: "):
        sg.fused_sigmoid_gating_delta_rule_update(**call)
    assert torch.equal(c.buf, before) and torch.equal(ibuf, ibefore)


# ------------------------------------------------------------------ SGLang: commit

def test_sglang_commit_copies_the_accepted_step_of_every_layer():
    """dst[l, dst[i]] = src[l, row i, step i]; a negative step or one >= T_max, a destination
    outside [0, P) and a source row outside [0, S) copy nothing; slot 0 is a real slot."""
    L, S, T_max, HV, V, K, P = 2, 5, 3, 2, 8, 16, 9
    gen = torch.Generator().manual_seed(70)
    dst = torch.randn(L, P, HV, V, K, generator=gen).to(DEVICE)
    src = torch.randn(L, S, T_max, HV, V, K, generator=gen).to(DEVICE)
    i32 = dict(dtype=torch.int32, device=DEVICE)
    dst_idx = torch.tensor([3, 0, 5, 7, P + 1, 2], **i32)
    steps = torch.tensor([2, 0, -1, T_max, 1, 1], **i32)
    rows = torch.tensor([4, 1, 0, 2, 3, S], **i32)
    want = dst.clone()
    for i in range(6):
        st, d, r = int(steps[i]), int(dst_idx[i]), int(rows[i])
        if 0 <= st < T_max and 0 <= d < P and 0 <= r < S:
            want[:, d] = src[:, r, st]
    sg.fused_mamba_state_scatter_with_mask(dst, src, dst_idx, steps, rows)
    assert torch.equal(dst, want)
    want2 = dst.clone()
    want2[:, 3] = src[:, 0, 2]                     # src_indices_raw None: row i
    sg.fused_mamba_state_scatter_with_mask(dst, src, dst_idx[:1], steps[:1])
    assert torch.equal(dst, want2)


@pytest.mark.parametrize("bad", ("conv", "layers"))
def test_sglang_commit_refuses_other_states(bad):
    dst = torch.zeros(2, 4, 2, 8, 16)
    src = torch.zeros(2, 3, 2, 2, 8, 16)
    if bad == "conv":                              # a conv window [L, P, dim, width]
        dst, src, name = torch.zeros(2, 4, 8, 3), torch.zeros(2, 3, 2, 8, 3), "dst"
    else:
        src, name = torch.zeros(3, 3, 2, 2, 8, 16), "src"
    i = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"^{name}: "):
        sg.fused_mamba_state_scatter_with_mask(dst, src, i, i)


# ------------------------------------------------------------------ no copies

def _record(monkeypatch):
    """Replace gdnzoo.decode with a recorder of its arguments (the adapters look it up per
    call); returns the list of recorded calls."""
    calls = []

    def fake(*args, **kw):
        calls.append((args, kw))
    monkeypatch.setattr(gdnzoo, "decode", fake)
    return calls


def _same_memory(view, src):
    return view.data_ptr() == src.data_ptr() and \
        view.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()


def test_vllm_adapter_passes_views_only(monkeypatch):
    c = make_call(seed=80)
    idx = slots(c, 14, 2)
    acc = torch.ones(c.N, dtype=torch.int32, device=c.q.device)
    calls = _record(monkeypatch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o, _ = vllm_call(c, idx, acc, True, "pt-reference")
    (args, kw), = calls
    q, k, v, state, A_log, a, dt_bias, b, _ = args
    for got, src in ((q, c.q), (k, c.k), (v, c.v), (a, c.a), (b, c.b), (kw["out"], o)):
        assert _same_memory(got, src) and got.shape[:2] == (c.N, c.T)
    assert state is c.pool and A_log is c.x.A_log and dt_bias is c.x.dt_bias
    assert _same_memory(kw["state_indices"], idx) and _same_memory(kw["num_accepted_tokens"], acc)
    assert kw["null_slot"] == 0
    _no_copy_ops(prof)


def test_sglang_adapter_passes_views_only(monkeypatch):
    c = make_call(seed=81)
    idx = slots(c, 15, 1)
    ibuf, inter = _sglang_buffer(c, c.N + 2)
    rows = torch.arange(c.N + 2, dtype=torch.int32, device=c.q.device)
    calls = _record(monkeypatch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o = sglang_call(c, idx, True, "pt-reference", disable_state_update=True,
                        intermediate_states_buffer=inter, intermediate_state_indices=rows)
    (args, kw), = calls
    for got, src in zip(args[:3] + (args[5], args[7], kw["out"]),
                        (c.q, c.k, c.v, c.a, c.b, o)):
        assert _same_memory(got, src) and got.shape[:2] == (c.N, c.T)
    assert args[3] is c.pool and kw["intermediate_states"] is inter
    assert _same_memory(kw["state_indices"], idx) and kw["state_indices"].shape == (c.N,)
    assert _same_memory(kw["intermediate_indices"], rows)
    assert kw["update_state"] is False and "null_slot" not in kw
    _no_copy_ops(prof)


def _no_copy_ops(prof):
    """No op that copies data: views, the output's allocation and the host read of a CPU
    cu_seqlens only."""
    names = {e.name for e in prof.events()}
    copying = {n for n in names if any(w in n for w in ("copy", "clone", "contiguous", "_to",
                                                        "cat", "index", "fill", "zero"))}
    assert names and not copying, copying


# ------------------------------------------------------------------ fi-baseline verify (GPU)

def _fi_case(sd, T, update, states, B=5, seed=0, rows_extra=0):
    """A dense-state verify case in the only buffer layout FlashInfer's MTP kernels address:
    contiguous [B (+ rows_extra), T, HV, V, K], row n."""
    case = make_verify_case("states", B=B, T=T, H=4, HV=8, K=128, V=128, state_dtype=sd,
                            device=DEVICE, seed=seed, dense=True, update=update,
                            rows="default")
    inter = inter_buf = None
    if states:
        gen = torch.Generator().manual_seed(seed + 1)
        inter_buf = (torch.randn((B + rows_extra) * T * 8 * 128 * 128, generator=gen)
                     * 0.05).to(sd).to(DEVICE)
        inter = inter_buf.view(B + rows_extra, T, 8, 128, 128)
    return dataclasses.replace(case, inter=inter, inter_buf=inter_buf, inter_idx=None)


def _fi_usable():
    ok, why = registry.availability("fi-baseline", DEVICE)
    if not ok:
        pytest.skip(f"fi-baseline unavailable here: {why}")


@pytest.mark.parametrize("T", (2, 4, 8))
@pytest.mark.parametrize("sd,update", [(torch.float32, False), (torch.float32, True),
                                       (torch.bfloat16, False)])
def test_fi_baseline_verify_matches_reference(sd, update, T):
    _fi_usable()
    for B in (5, 33):
        case = _fi_case(sd, T, update, True, B=B, seed=T + B)
        check_verify_call("fi-baseline", case, bool(B % 2), f"fi-baseline B={B} T={T}")


@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
def test_fi_baseline_verify_without_states_writes_nothing(sd):
    """update_state=False alone (FlashInfer's disable_state_update): out only."""
    _fi_usable()
    case = _fi_case(sd, 4, False, False, B=9, seed=3)
    x = case.x
    ref_out, _, _ = reference_verify_outputs(x, case.verify(), True, None)
    before = case.buf.clone()
    out, _ = gdnzoo.decode(*x.args(), use_qk_l2norm=True, algo="fi-baseline", **case.kwargs())
    torch.cuda.synchronize()
    assert torch.equal(case.buf, before)
    assert gate.compare(out, ref_out).ok


@pytest.mark.parametrize("what,frag", [
    ("indices", "no intermediate_indices"), ("gaps", r"contiguous \[B, T"),
    ("bf16_update", "skip the final-state write"), ("fp32_rows", r"contiguous \[B, T")])
def test_fi_baseline_refuses_what_flashinfer_cannot_express(what, frag):
    _fi_usable()
    if what == "indices":
        case = _fi_case(torch.float32, 2, False, True)
        case = dataclasses.replace(case, inter_idx=torch.arange(5, device=DEVICE))
    elif what == "gaps":
        case = make_verify_case("states", B=3, T=2, H=4, HV=8, state_dtype=torch.float32,
                                device=DEVICE, dense=True, rows="default")
    elif what == "bf16_update":
        case = _fi_case(torch.bfloat16, 2, True, True)
    else:                       # FlashInfer's fp32 kernel takes more rows; gdnzoo passes B
        case = _fi_case(torch.float32, 2, False, True, rows_extra=1)
    before = case.buf.clone(), case.inter_buf.clone()
    with pytest.raises(ValueError, match=f"'fi-baseline' cannot serve.*{frag}"):
        gdnzoo.decode(*case.x.args(), algo="fi-baseline", **case.kwargs())
    assert torch.equal(case.buf, before[0]) and torch.equal(case.inter_buf, before[1])


def test_fi_baseline_refuses_one_token_verify():
    from gdnzoo.contract import Problem
    p = Problem(B=4, T=1, H=4, HV=8, K=128, V=128, state_dtype=torch.float32,
                io_dtype=torch.bfloat16, device="cuda", cc=(9, 0), verify="states")
    ok, why = registry.backend_module("fi-baseline").supports(p)
    assert not ok and "T >= 2" in why
    ok, _ = registry.backend_module("fi-baseline").supports(dataclasses.replace(p, T=2))
    assert ok
    for form, layout, sd, frag in (("states", "indexed", torch.float32, "addressed by row"),
                                   ("states+update", "rows", torch.bfloat16, "final-state"),
                                   ("states+update", "indexed", torch.bfloat16, "by row")):
        ok, why = registry.backend_module("fi-baseline").supports(dataclasses.replace(
            p, T=2, verify=form, intermediate=layout, state_dtype=sd))
        assert not ok and frag in why, why
    ok, _ = registry.backend_module("fi-baseline").supports(dataclasses.replace(
        p, T=2, verify="states+update", intermediate="rows"))
    assert ok


# ------------------------------------------------------------------ against vLLM's kernel (GPU)

VLLM_VERIFY = "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating"


def _vllm_kernel():
    if DEVICE != "cuda":
        pytest.skip("vLLM's fused_sigmoid_gating_delta_rule_update is a CUDA Triton kernel; "
                    "no CUDA device here (SGLang's is not installed on the GPU machine either: "
                    "its adapter is checked against the reference only)")
    try:
        return importlib.import_module(VLLM_VERIFY).fused_sigmoid_gating_delta_rule_update
    except ImportError as e:
        pytest.skip(f"{VLLM_VERIFY} cannot be imported: {e}")


@pytest.mark.parametrize("algo", (None, "fla-recurrent", "cuda-v4"))
@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("N,T", [(1, 2), (16, 4), (33, 8)])
def test_vllm_adapter_matches_vllm_kernel(N, T, sd, algo):
    """The same engine call through vLLM's kernel and through the adapter: out of every real
    sequence and the whole pool storage agree within the gate (padded rows: vLLM leaves them
    unwritten, the adapter writes zeros)."""
    fn = _vllm_kernel()
    if algo is not None:
        _usable(algo)
    c = make_call(N=N, T=T, H=4, HV=8, K=128, V=128, sd=sd, seed=N + T)
    idx = slots(c, N, 2)
    gen = torch.Generator().manual_seed(T)
    acc = torch.randint(1, T + 1, (N,), generator=gen).to(torch.int32).to(DEVICE)
    if N > 1:
        idx[1, int(acc[1]) - 1] = 0                       # reads the null block: padding
        idx[0, T - 1] = 0                                 # one token not stored
    buf0 = c.buf.clone()
    runs = []
    for call in (lambda: fn(c.x.A_log, c.a, c.b, c.x.dt_bias, c.q, c.k, c.v,
                            initial_state=c.pool, inplace_final_state=True, cu_seqlens=c.cu,
                            ssm_state_indices=idx, num_accepted_tokens=acc,
                            use_qk_l2norm_in_kernel=True),
                 lambda: vllm_call(c, idx, acc, True, algo)):
        c.buf.copy_(buf0)
        o, final = call()
        torch.cuda.synchronize()
        assert final is c.pool and o.shape == c.v.shape and o.dtype == c.q.dtype
        runs.append((o[0].view(N, T, 8, 128).clone(), c.buf.clone()))
    real = [n for n in range(N) if not (N > 1 and n == 1)]
    (o_v, b_v), (o_g, b_g) = runs
    assert gate.compare(o_g[real], o_v[real]).ok
    assert gate.compare(b_g, b_v).ok


@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
def test_vllm_adapter_not_in_place_matches_vllm_kernel(sd):
    fn = _vllm_kernel()
    c = make_call(N=8, T=1, H=4, HV=8, K=128, V=128, sd=sd, seed=90)
    idx = slots(c, 16, 1)
    buf0 = c.buf.clone()
    o_v, f_v = fn(c.x.A_log, c.a, c.b, c.x.dt_bias, c.q, c.k, c.v, initial_state=c.pool,
                  inplace_final_state=False, cu_seqlens=c.cu, ssm_state_indices=idx,
                  use_qk_l2norm_in_kernel=True)
    o_g, f_g = vllm_call(c, idx, None, True, None, inplace_final_state=False)
    torch.cuda.synchronize()
    assert torch.equal(c.buf, buf0)
    assert f_g.shape == f_v.shape and f_g.dtype == f_v.dtype
    assert gate.compare(o_g, o_v).ok and gate.compare(f_g, f_v).ok


def test_vllm_one_token_index_with_counts():
    """A [N] index with num_accepted_tokens and one token a sequence: a count other than 1
    pads the sequence (vLLM would read another sequence's entry)."""
    c = make_call(N=4, T=1, seed=95)
    idx = slots(c, 17, 1)
    acc = torch.tensor([1, 2, 1, 0], dtype=torch.int32, device=c.q.device)
    buf0 = c.buf.clone()
    o, _ = vllm_call(c, idx, acc, False, "pt-reference")
    out = o[0].view(4, 1, *o.shape[2:])
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    written = [int(idx[0]), int(idx[2])]
    assert not torch.equal(c.pool[written], buf0.as_strided(c.pool.shape, c.pool.stride())[written])
    assert untouched_outside(c.buf, buf0, c.pool, [(s,) for s in written])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("bad,exc,frag", [
    ("float", TypeError, "cu_seqlens: expected dtype int32 or int64"),
    ("meta", ValueError, "cu_seqlens: expected device")], ids=["dtype", "device"])
def test_verify_cu_seqlens_dtype_and_device_checked(engine, bad, exc, frag):
    """cu_seqlens is an index tensor like the others: int32/int64, on q's device or the CPU
    (the verify adapters read only its shape, and its values where that needs no sync)."""
    c = make_call(N=2, T=2, seed=57)
    cu = c.cu.float() if bad == "float" else c.cu.to("meta")
    before = c.pool.clone()
    with pytest.raises(exc, match=frag):
        if engine == "vllm":
            vllm_call(c, slots(c, 13, 2), None, True, "pt-reference", cu_seqlens=cu)
        else:
            sglang_call(c, slots(c, 13, 1), True, "pt-reference", cu_seqlens=cu)
    assert torch.equal(c.pool, before)


@pytest.mark.parametrize("engine", ("vllm", "sglang"))
def test_verify_adapters_compile_as_they_are(engine):
    """torch.compile(fullgraph=True) takes the verify adapters as they are (a CPU cu_seqlens's
    values, checked on the host eagerly, are not read while dynamo traces) and gives the eager
    call's out and pool bit for bit."""
    c = make_call(seed=3)
    idx = slots(c, 1, 2) if engine == "vllm" else slots(c, 9, 1)
    acc = torch.tensor([2, 3, 1], dtype=torch.int32, device=c.q.device)

    def call():
        r = (vllm_call(c, idx, acc, True, "pt-reference") if engine == "vllm"
             else sglang_call(c, idx, True, "pt-reference"))
        return r[0] if isinstance(r, tuple) else r
    buf0 = c.buf.clone()
    want = call().clone()
    pool_want = c.buf.clone()
    c.buf.copy_(buf0)
    torch._dynamo.reset()
    got = torch.compile(call, fullgraph=True, backend="aot_eager")()
    assert torch.equal(got, want) and torch.equal(c.buf, pool_want)

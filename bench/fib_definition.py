"""The contest's definitions of the GDN decode (``gdn_decode_qk4_v8_d128_k_last``) and prefill
(``gdn_prefill_qk4_v8_d128_k_last``): axes, inputs and outputs as flashinfer-bench's trace set
publishes them, with reference ``run`` functions written here from :mod:`gdnzoo.reference` and
:mod:`gdnzoo.prefill_reference`.  With the Solutions of ``gdnzoo pack`` they make a local trace
set for flashinfer-bench's own evaluator (``lab/fib_eval.py``); tests check that the references
compute what gdnzoo's do.

One rule of the published prefill reference differs from :func:`gdnzoo.prefill`: a zero-length
sequence's new state is left at zero (gdnzoo carries its initial state over); the reference
here keeps the contest's rule, which is gdnzoo's with ``has_initial_state = (length > 0)``."""
from __future__ import annotations

DEF_NAME = "gdn_decode_qk4_v8_d128_k_last"

REFERENCE = '''import math
import torch
import torch.nn.functional as F


def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    # One gated-delta-rule decode step, all arithmetic in fp32.  State is k-last [B, HV, V, K].
    B, T, H, K = q.shape
    HV = v.shape[2]
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(K)
    rep = HV // H                                     # value head h reads q/k head h // rep
    qf = q[:, 0].float().repeat_interleave(rep, dim=1)
    kf = k[:, 0].float().repeat_interleave(rep, dim=1)
    vf = v[:, 0].float()
    x = a[:, 0].float() + dt_bias.float()
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(x))          # decay in (0, 1)
    beta = torch.sigmoid(b[:, 0].float())
    S = state.float() * g[..., None, None]                            # decay first
    u = beta[..., None] * (vf - torch.einsum("bhvk,bhk->bhv", S, kf))  # read k from decayed S
    S = S + u[..., None] * kf[:, :, None, :]                          # rank-1 update
    o = scale * torch.einsum("bhvk,bhk->bhv", S, qf)                  # output from updated S
    return o.unsqueeze(1).to(torch.bfloat16), S.to(state.dtype)
'''


# the contest's heads and head size (both definitions)
HEADS = dict(num_q_heads=dict(type="const", value=4), num_k_heads=dict(type="const", value=4),
             num_v_heads=dict(type="const", value=8), head_size=dict(type="const", value=128))


def _tensor(shape, dtype, desc=None) -> dict:
    """A TensorSpec of the definition JSON (shape None: a scalar)."""
    return dict(shape=shape, dtype=dtype, **({"description": desc} if desc else {}))


def definition_dict() -> dict:
    """The contest definition (facts from the published JSON; reference in our own words)."""
    t = _tensor
    return dict(
        name=DEF_NAME, op_type="gdn",
        description="Gated delta rule decode, Qwen3-Next linear attention at TP=4, k-last state "
                    "(local copy written by gdnzoo for its own evaluation).",
        tags=["stage:decode", "model:qwen3-next", "layout:k-last", "tp:4"],
        axes=dict(batch_size=dict(type="var"), seq_len=dict(type="const", value=1), **HEADS),
        constraints=["num_v_heads >= num_q_heads", "num_v_heads % num_q_heads == 0",
                     "num_k_heads == num_q_heads"],
        inputs=dict(
            q=t(["batch_size", "seq_len", "num_q_heads", "head_size"], "bfloat16"),
            k=t(["batch_size", "seq_len", "num_k_heads", "head_size"], "bfloat16"),
            v=t(["batch_size", "seq_len", "num_v_heads", "head_size"], "bfloat16"),
            state=t(["batch_size", "num_v_heads", "head_size", "head_size"], "float32",
                    "k-last layout [B, HV, V, K]"),
            A_log=t(["num_v_heads"], "float32"),
            a=t(["batch_size", "seq_len", "num_v_heads"], "bfloat16"),
            dt_bias=t(["num_v_heads"], "float32"),
            b=t(["batch_size", "seq_len", "num_v_heads"], "bfloat16"),
            scale=t(None, "float32", "default 1/sqrt(head_size)")),
        outputs=dict(
            output=t(["batch_size", "seq_len", "num_v_heads", "head_size"], "bfloat16"),
            new_state=t(["batch_size", "num_v_heads", "head_size", "head_size"], "float32",
                        "k-last layout [B, HV, V, K]")),
        reference=REFERENCE)


PREFILL_DEF_NAME = "gdn_prefill_qk4_v8_d128_k_last"

PREFILL_REFERENCE = '''import math
import torch
import torch.nn.functional as F


def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    # N sequences packed on one token axis; sequence n is tokens cu_seqlens[n]:cu_seqlens[n+1].
    # Each runs the decode step token by token from its state (zeros when state is None), all
    # arithmetic in fp32.  States are k-last [N, HV, V, K].  A zero-length sequence's new state
    # stays zero.
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu_seqlens.shape[0] - 1
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(K)
    rep = HV // H                                     # value head h reads q/k head h // rep
    qf = q.float().repeat_interleave(rep, dim=1)      # [T, HV, K]
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float()                                    # [T, HV, V]
    g = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [T, HV]
    beta = torch.sigmoid(b.float())
    output = torch.zeros(T, HV, V, dtype=torch.bfloat16, device=q.device)
    new_state = torch.zeros(N, HV, V, K, dtype=torch.float32, device=q.device)
    bounds = cu_seqlens.tolist()
    for n in range(N):
        if bounds[n + 1] <= bounds[n]:
            continue
        if state is None:
            S = torch.zeros(HV, V, K, dtype=torch.float32, device=q.device)
        else:
            S = state[n].float().clone()
        for t in range(bounds[n], bounds[n + 1]):
            S = S * g[t][:, None, None]                                    # decay first
            u = beta[t][:, None] * (vf[t] - torch.einsum("hvk,hk->hv", S, kf[t]))
            S = S + u[:, :, None] * kf[t][:, None, :]                      # rank-1 update
            output[t] = (scale * torch.einsum("hvk,hk->hv", S, qf[t])).to(torch.bfloat16)
        new_state[n] = S
    return output, new_state
'''


def prefill_definition_dict() -> dict:
    """The contest's prefill definition (facts from the published JSON; reference in our own
    words).  Its ``state`` may be None (zeros); flashinfer-bench 0.1.2 has no field for that
    and always passes a tensor."""
    t = _tensor
    return dict(
        name=PREFILL_DEF_NAME, op_type="gdn",
        description="Gated delta rule prefill of variable-length sequences (cu_seqlens), Qwen3-Next "
                    "linear attention at TP=4, k-last state (local copy written by gdnzoo for its "
                    "own evaluation).",
        tags=["stage:prefill", "model:qwen3-next", "layout:k-last", "tp:4"],
        axes=dict(total_seq_len=dict(type="var"), num_seqs=dict(type="var"), **HEADS,
                  len_cu_seqlens=dict(type="var")),
        constraints=["len_cu_seqlens == num_seqs + 1"],
        inputs=dict(
            q=t(["total_seq_len", "num_q_heads", "head_size"], "bfloat16"),
            k=t(["total_seq_len", "num_k_heads", "head_size"], "bfloat16"),
            v=t(["total_seq_len", "num_v_heads", "head_size"], "bfloat16"),
            state=t(["num_seqs", "num_v_heads", "head_size", "head_size"], "float32",
                    "k-last layout [N, HV, V, K]; optional (None: zeros)"),
            A_log=t(["num_v_heads"], "float32"),
            a=t(["total_seq_len", "num_v_heads"], "bfloat16"),
            dt_bias=t(["num_v_heads"], "float32"),
            b=t(["total_seq_len", "num_v_heads"], "bfloat16"),
            cu_seqlens=t(["len_cu_seqlens"], "int64",
                         "sequence n is tokens cu_seqlens[n]:cu_seqlens[n+1]"),
            scale=t(None, "float32", "default 1/sqrt(head_size)")),
        outputs=dict(
            output=t(["total_seq_len", "num_v_heads", "head_size"], "bfloat16"),
            new_state=t(["num_seqs", "num_v_heads", "head_size", "head_size"], "float32",
                        "k-last layout [N, HV, V, K]")),
        reference=PREFILL_REFERENCE)


#: Each operation's definition: (name, the function returning its dict).
DEFINITIONS = {"decode": (DEF_NAME, definition_dict),
               "prefill": (PREFILL_DEF_NAME, prefill_definition_dict)}

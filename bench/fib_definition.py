"""The contest's definition of the GDN decode (``gdn_decode_qk4_v8_d128_k_last``: axes, inputs
and outputs as flashinfer-bench's trace set publishes them) with a reference ``run`` written
here from :mod:`gdnzoo.reference`.  With the Solutions of ``gdnzoo pack`` it makes a local
trace set for flashinfer-bench's own evaluator (``lab/fib_eval.py``); tests check that the
reference computes what ``gdnzoo.reference`` does."""
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


def definition_dict() -> dict:
    """The contest definition (facts from the published JSON; reference in our own words)."""
    t = lambda shape, dtype, desc=None: dict(shape=shape, dtype=dtype, **({"description": desc} if desc else {}))
    return dict(
        name=DEF_NAME, op_type="gdn",
        description="Gated delta rule decode, Qwen3-Next linear attention at TP=4, k-last state "
                    "(local copy written by gdnzoo for its own evaluation).",
        tags=["stage:decode", "model:qwen3-next", "layout:k-last", "tp:4"],
        axes=dict(batch_size=dict(type="var"), seq_len=dict(type="const", value=1),
                  num_q_heads=dict(type="const", value=4), num_k_heads=dict(type="const", value=4),
                  num_v_heads=dict(type="const", value=8), head_size=dict(type="const", value=128)),
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

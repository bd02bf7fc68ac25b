"""pt-reference's vectorized math against a deliberately naive, step-by-step float64 version."""
import math

import pytest
import torch

from gdnzoo.inputs import make_inputs
from gdnzoo.reference import reference_decode


def naive_decode(q, k, v, state, A_log, a, dt_bias, b, scale, use_qk_l2norm):
    """The decode step, one (sequence, head, token) at a time, one V-row at a time, float64."""
    f = lambda t: t.detach().to(torch.float64).cpu()
    q, k, v, S0, A_log, a, dt_bias, b = map(f, (q, k, v, state, A_log, a, dt_bias, b))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    out = torch.zeros(B, T, HV, V, dtype=torch.float64)
    new = S0.clone()
    for n in range(B):
        for h in range(HV):
            hq = h // (HV // H)
            S = new[n, h].clone()                       # [V, K]
            for t in range(T):
                x = float(a[n, t, h] + dt_bias[h])
                softplus = x if x > 20 else math.log1p(math.exp(x))
                g = math.exp(-math.exp(float(A_log[h])) * softplus)
                beta = 1.0 / (1.0 + math.exp(-float(b[n, t, h])))
                qv, kv = q[n, t, hq].clone(), k[n, t, hq].clone()
                if use_qk_l2norm:
                    qv = qv / math.sqrt(float((qv * qv).sum()) + 1e-6)
                    kv = kv / math.sqrt(float((kv * kv).sum()) + 1e-6)
                S = g * S
                for r in range(V):
                    sk = float((S[r] * kv).sum())
                    u = beta * (float(v[n, t, h, r]) - sk)
                    S[r] = S[r] + u * kv
                for r in range(V):
                    out[n, t, h, r] = scale * float((S[r] * qv).sum())
            new[n, h] = S
    return out, new


@pytest.mark.parametrize("H,HV,T,l2,sd,seed", [
    (4, 8, 1, False, torch.float32, 0),
    (2, 4, 2, True, torch.bfloat16, 1),
    (1, 3, 3, False, torch.float32, 2),
    (2, 2, 1, True, torch.float32, 3),
])
def test_reference_matches_naive_loops(H, HV, T, l2, sd, seed):
    x = make_inputs(B=2, T=T, H=H, HV=HV, K=16, V=8, state_dtype=sd, seed=seed)
    B, K, V = 2, 16, 8
    out = torch.empty(B, T, HV, V, dtype=torch.float64)
    st = torch.empty(B, HV, V, K, dtype=torch.float64)
    reference_decode(*x.args(), out, st, l2, compute_dtype=torch.float64)
    n_out, n_st = naive_decode(*x.args(), l2)
    torch.testing.assert_close(out, n_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(st, n_st, rtol=1e-12, atol=1e-12)


def test_gva_mapping_is_repeat_interleave_not_modulo():
    # v-heads 0,1 read q/k head 0; with h % H they would read heads 0,1.
    x = make_inputs(B=1, H=2, HV=4, K=8, V=4, seed=5)
    out = torch.empty(1, 1, 4, 4, dtype=torch.float64)
    st = torch.empty(1, 4, 4, 8, dtype=torch.float64)
    reference_decode(*x.args(), out, st, False, compute_dtype=torch.float64)
    x2 = x.clone()
    x2.q[:, :, 1] = 0           # head 1 feeds only v-heads 2 and 3
    out2 = torch.empty_like(out)
    reference_decode(*x2.args(), out2, torch.empty_like(st), False, compute_dtype=torch.float64)
    assert torch.equal(out[:, :, :2], out2[:, :, :2])
    assert (out2[:, :, 2:] == 0).all()


def test_softplus_threshold_and_decay_first():
    # a + dt_bias > 20: softplus is the identity there, so g = exp(-exp(A_log) * x).
    x = make_inputs(B=1, H=1, HV=1, K=4, V=2, seed=7)
    x.a.fill_(30.0)
    x.A_log.fill_(math.log(0.01))
    out = torch.empty(1, 1, 1, 2, dtype=torch.float64)
    st = torch.empty(1, 1, 2, 4, dtype=torch.float64)
    reference_decode(*x.args(), out, st, False, compute_dtype=torch.float64)
    n_out, n_st = naive_decode(*x.args(), False)
    torch.testing.assert_close(st, n_st, rtol=1e-12, atol=1e-12)

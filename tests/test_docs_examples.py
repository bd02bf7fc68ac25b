"""The python examples of docs/*.md run as written, on CPU.

Unlike the README's (tests/test_readme.py), the docs' examples are call sites: they use names an
engine or a model already has (q, k, v, the pool, the slots, ...).  Each block runs here after a
prelude that makes those names from gdnzoo.inputs, small, so that a changed signature, argument
name or return value in the docs fails a test.  The one block left out says why."""
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gdnzoo
from gdnzoo.inputs import accepted_counts, make_pool_case, make_verify_case

from test_integrations import make_packed, nan_out
from test_integrations_prefill import make_case

DOCS = Path(__file__).resolve().parent.parent / "docs"
SMALL = dict(B=3, H=2, HV=4, K=32, V=32)


def blocks(name):
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)


def decode_names(**kw):
    c = make_pool_case(T=1, pad="null", **SMALL, **kw)
    x = c.x
    return dict(torch=torch, gdnzoo=gdnzoo, q=x.q, k=x.k, v=x.v, pool=x.state, A_log=x.A_log,
                a=x.a, dt_bias=x.dt_bias, b=x.b, scale=x.scale, slots=c.idx,
                out=torch.empty_like(x.v))


def packed_names():
    c = make_packed("sglang", B=3, H=2, HV=4, K=32, V=32, device="cpu")
    return dict(mixed_qkv=c.mixed_qkv, a=c.a, b=c.b, A_log=c.A_log, dt_bias=c.dt_bias,
                scale=c.scale, initial_state=c.pool, out=nan_out(c), ssm_state_indices=c.idx)


def prefill_names():
    c = make_case("vllm")
    return dict(q=c.q, k=c.k, v=c.v, g=c.g, beta=c.beta, ssm_state=c.pool,
                prefill_state_indices=c.idx, prefill_has_initial_state=c.init,
                attn_metadata=SimpleNamespace(prefill_query_start_loc=c.cu),
                ssm_states=c.pool, cache_indices=c.idx, query_start_loc=c.cu)


def verify_names():
    c = make_verify_case("states", T=2, **SMALL)
    s = make_verify_case("slots", T=2, seed=1, **SMALL)      # same pool size: its slots fit
    x = c.x
    return dict(torch=torch, gdnzoo=gdnzoo, q=x.q, k=x.k, v=x.v, pool=x.state,
                A_log=x.A_log, a=x.a, dt_bias=x.dt_bias, b=x.b, scale=x.scale, slots=c.idx,
                inter=c.inter, rows=c.inter_idx,
                accepted_steps=accepted_counts(3, 2, torch.Generator().manual_seed(2)),
                slots_bt=s.idx, accepted=s.accepted)


# (doc, block index) -> the names it runs with
PRELUDES = {
    ("serving.md", 0): decode_names,
    ("serving.md", 1): packed_names,
    ("serving.md", 2): prefill_names,
    ("serving.md", 3): verify_names,
    ("model.md", 0): decode_names,
    ("models.md", 1): dict,
}
LEFT_OUT = {("models.md", 0): "downloads an 80B checkpoint; transformers' own layers on "
                              "gdnzoo are tests/test_integrations_transformers.py's"}


def test_every_block_is_run_or_says_why():
    found = {(f.name, i) for f in sorted(DOCS.glob("*.md")) for i in range(len(blocks(f.name)))}
    assert found == set(PRELUDES) | set(LEFT_OUT)


@pytest.mark.parametrize("doc, i", sorted(PRELUDES), ids=lambda x: str(x))
def test_docs_block_runs(doc, i):
    ns = PRELUDES[(doc, i)]()
    exec(compile(blocks(doc)[i], f"docs/{doc} python block {i}", "exec"), ns)

"""gdnzoo.integrations.transformers: transformers' Qwen3-Next, Qwen3.5 and Qwen3.5-MoE GDN layers
on gdnzoo.  Tiny random-init bf16 models of each family (GVA ratios 2 and 3; dense MLPs where
the family has them, four tiny experts in Qwen3.5-MoE): prefill and teacher-forced decode with
enable() match transformers' own path (logits and the cache's final states), never run
transformers' torch fallbacks, and leave each step's state at least as close to a float64
oracle of the step as transformers' own; generate() works with the cache and a left-padded
batch; disable() puts back the very same objects; unsupported versions and layouts are refused,
changing nothing."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from contextlib import contextmanager

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e "
                                           "'.[test]')")
import transformers                                                         # noqa: E402

from gdnzoo.checks import IO_DTYPES                                        # noqa: E402
from gdnzoo.integrations import fla                                         # noqa: E402
from gdnzoo.integrations import transformers as hook                       # noqa: E402
from fla_oracle import fla_oracle, state_error                             # noqa: E402

RECURRENT, CHUNK = hook.RECURRENT, hook.CHUNK
MODULES = {f.name: f for f in hook.FAMILIES}
BF16 = torch.bfloat16
LONG = fla.DECODE_MAX_T + 6          # a prompt past the decode/prefill split


def tiny(family, ratio, dtype=BF16, seed=0):
    """A random-init model of ``family``: hidden 64, GDN heads H=2 (HV = 2 * ratio), K=V=16,
    layers GDN, attention, GDN; vocab 128."""
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, intermediate_size=64,
                  linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                  linear_num_value_heads=2 * ratio,
                  layer_types=["linear_attention", "full_attention", "linear_attention"])
    if family == "qwen3_next":
        cfg = transformers.Qwen3NextConfig(**common, mlp_only_layers=[0, 1, 2], num_experts=0)
        cls = transformers.Qwen3NextForCausalLM
    elif family == "qwen3_5":
        cfg, cls = transformers.Qwen3_5TextConfig(**common), transformers.Qwen3_5ForCausalLM
    else:
        cfg = transformers.Qwen3_5MoeTextConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                moe_intermediate_size=32,
                                                shared_expert_intermediate_size=32)
        cls = transformers.Qwen3_5MoeForCausalLM
    torch.manual_seed(seed)
    return cls(cfg).to(dtype).eval()


def gdn_layers(model):
    return [layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn")]


def module_of(family):
    return importlib.import_module(MODULES[family].module)


# With FLA importable, transformers (5.17 on) routes the two names to FLA's Triton kernels,
# which take CUDA tensors only; these CPU models are compared with transformers' own torch
# loops, as on a machine without FLA (CI).  The comparison with FLA on a GPU: lab.models_gpu.
FLA_IMPORTABLE = importlib.util.find_spec("fla") is not None


@pytest.fixture(autouse=True)
def _disabled(monkeypatch):
    hook.disable()
    if FLA_IMPORTABLE:
        for fam in hook.FAMILIES:
            mod = module_of(fam.name)
            for name in (RECURRENT, CHUNK):
                monkeypatch.setattr(mod, name, inspect.unwrap(getattr(mod, name)))
    yield
    hook.disable()


# ------------------------------------------------------------------ recording the GDN calls

@contextmanager
def recording(family, calls):
    """Every GDN call of ``family`` (whatever its module-level functions are now) recorded with
    its inputs (the initial state copied before the call), the raw b of its forward, and the
    state it returned; the fallbacks' ``l2norm`` counted in ``calls['l2norm']``."""
    mod = module_of(family)
    fam = MODULES[family]
    raw_b = []
    saved = [(mod, n, getattr(mod, n)) for n in (RECURRENT, CHUNK, "l2norm")]
    cls = getattr(mod, fam.layer)

    def recorder(fn, kind):
        def call(query, key, value, g=None, beta=None, initial_state=None, **kw):
            h0 = None if initial_state is None else initial_state.clone()
            out, state = fn(query, key, value, g=g, beta=beta, initial_state=initial_state, **kw)
            calls["steps"].append(dict(kind=kind, q=query.clone(), k=key.clone(),
                                       v=value.clone(), g=g.clone(), b=raw_b[-1], h0=h0,
                                       state=state.clone(), in_place=state is initial_state))
            return out, state
        return call

    def l2norm(*args, **kw):
        calls["l2norm"] += 1
        return saved[2][2](*args, **kw)

    setattr(mod, RECURRENT, recorder(saved[0][2], "recurrent"))
    setattr(mod, CHUNK, recorder(saved[1][2], "chunk"))
    setattr(mod, "l2norm", l2norm)
    if fam.b_from == "in_proj_b":
        orig_forward = cls.forward

        def forward(self, *args, **kw):      # the test's own view of the raw b
            handle = self.in_proj_b.register_forward_hook(
                lambda m, a, out: raw_b.append(out.clone()))
            try:
                return orig_forward(self, *args, **kw)
            finally:
                handle.remove()
        cls.forward = forward
    else:
        orig_split = cls.fix_query_key_value_ordering

        def split(self, *args, **kw):
            parts = orig_split(self, *args, **kw)
            raw_b.append(parts[4].clone())
            return parts
        cls.fix_query_key_value_ordering = split
    try:
        yield
    finally:
        for m, n, fn in saved:
            setattr(m, n, fn)
        if fam.b_from == "in_proj_b":
            cls.forward = orig_forward
        else:
            cls.fix_query_key_value_ordering = orig_split


def teacher_forced(model, family, ids, prompt):
    """Prefill ``prompt`` tokens, then decode the rest of ``ids`` one token at a time with the
    cache: (per-step last logits, the cache's final GDN states, the recorded calls)."""
    calls = {"steps": [], "l2norm": 0}
    logits = []
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"                          # renamed in transformers 5.24
    with recording(family, calls), torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        cache = getattr(out, name)
        logits.append(out.logits[:, -1].float())
        for t in range(prompt, ids.shape[1]):
            out = model(ids[:, t:t + 1], use_cache=True, **{name: cache})
            logits.append(out.logits[:, -1].float())
    states = [cache.layers[i].recurrent_states[0].clone()
              for i, layer in enumerate(model.model.layers) if hasattr(layer, "linear_attn")]
    return logits, states, calls


def oracle_error(step):
    """The relative error of a recorded call's returned state against the float64 oracle of the
    same step: the call's q, k, v, g, initial state, and beta = sigmoid(raw b) in float64."""
    _, ref = fla_oracle(step["q"], step["k"], step["v"], g=step["g"], beta=step["b"],
                        initial_state=step["h0"], use_qk_l2norm_in_kernel=True,
                        use_beta_sigmoid_in_kernel=True)
    return state_error(step["state"], ref)


CASES = [(f, r) for f in MODULES for r in (2, 3)]


@pytest.mark.parametrize("family,ratio", CASES, ids=[f"{f}-gva{r}" for f, r in CASES])
def test_prefill_and_decode_match_transformers(family, ratio):
    """Prompt of 9 tokens (GVA 2: gdnzoo's decode step of 9 tokens) or LONG (GVA 3: its
    prefill), then 4 decode steps."""
    prompt = 9 if ratio == 2 else LONG
    model = tiny(family, ratio)
    ids = torch.randint(0, 128, (2, prompt + 4), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_states, ref_calls = teacher_forced(model, family, ids, prompt)
    hook.enable()
    logits, states, calls = teacher_forced(model, family, ids, prompt)
    hook.disable()

    assert ref_calls["l2norm"] > 0                 # transformers' own path: its torch loops
    assert calls["l2norm"] == 0                    # enabled: never its torch loops
    kinds = [s["kind"] for s in calls["steps"]]
    assert kinds == [s["kind"] for s in ref_calls["steps"]]
    assert kinds == ["chunk"] * 2 + ["recurrent"] * 8          # 2 GDN layers, 4 steps
    # decode steps update the cache's buffer in place (its copy onto itself is then a no-op)
    assert [s["in_place"] for s in calls["steps"]] == [False] * 2 + [True] * 8
    assert not any(s["in_place"] for s in ref_calls["steps"])
    for step, (ours, theirs) in enumerate(zip(logits, ref_logits)):
        torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2, msg=f"step {step}")
    for ours, theirs in zip(states, ref_states):
        assert ours.dtype == torch.float32 and ours.shape == theirs.shape
        assert state_error(ours, theirs) < 2e-2
    for i, (ours, theirs) in enumerate(zip(calls["steps"], ref_calls["steps"])):
        e_ours, e_theirs = oracle_error(ours), oracle_error(theirs)
        assert e_ours <= e_theirs and e_ours < 1e-5, (i, ours["kind"], e_ours, e_theirs)


@pytest.mark.parametrize("family", list(MODULES))
def test_generate_with_cache(family):
    """generate() on gdnzoo, a batch with a left-padded prompt and its attention mask: each new
    token is transformers' own greedy choice at that position (its full forward over the
    sequence with the mask, no cache), up to near-ties of bf16 logits."""
    model = tiny(family, 2)
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0                                # row 1: a 4-token prompt, padded left
    ids = ids * mask                               # pad token 0
    calls = {"steps": [], "l2norm": 0}
    hook.enable()
    with recording(family, calls), torch.no_grad():
        seq = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                             min_new_tokens=6, pad_token_id=0)
    hook.disable()
    assert seq.shape == (2, 13) and calls["l2norm"] == 0
    assert [s["kind"] for s in calls["steps"]].count("recurrent") == 2 * 5
    full = torch.cat([mask, torch.ones(2, 6, dtype=mask.dtype)], 1)
    with torch.no_grad():
        logits = model(seq, attention_mask=full).logits[:, 6:-1].float()
    picked = logits.gather(-1, seq[:, 7:, None])[..., 0]
    assert (logits.max(-1).values - picked).max() <= 2e-2


def test_enable_disable_restore_the_same_objects():
    before = {}
    for fam in hook.FAMILIES:
        mod = module_of(fam.name)
        cls = getattr(mod, fam.layer)
        before[fam.name] = (mod, cls, getattr(mod, RECURRENT), getattr(mod, CHUNK),
                            dict(vars(cls)))
    model = tiny("qwen3_5", 2)
    hook.enable()
    assert hook.is_enabled()
    replaced = {n: (getattr(m, RECURRENT), getattr(m, CHUNK), c.forward)
                for n, (m, c, *_) in before.items()}
    for name, (rec, chunk, fwd) in replaced.items():
        assert rec is hook._recurrent and chunk is hook._chunk
        assert fwd is not before[name][4]["forward"]
    hook.enable()                                   # idempotent: nothing wrapped twice
    assert replaced == {n: (getattr(m, RECURRENT), getattr(m, CHUNK), c.forward)
                        for n, (m, c, *_) in before.items()}
    with torch.no_grad():
        model(torch.zeros(1, 3, dtype=torch.long))
    projs = [layer.in_proj_b for layer in gdn_layers(model)]
    assert all(len(p._forward_hooks) == 1 for p in projs)
    hook.disable()
    hook.disable()
    assert not hook.is_enabled()
    for name, (mod, cls, rec, chunk, attrs) in before.items():
        assert getattr(mod, RECURRENT) is rec and getattr(mod, CHUNK) is chunk
        assert dict(vars(cls)) == attrs and all(vars(cls)[n] is attrs[n] for n in attrs)
    assert all(len(p._forward_hooks) == 0 for p in projs)


def test_models_made_before_and_after_enable():
    before = tiny("qwen3_5", 3, seed=3)
    hook.enable()
    after = tiny("qwen3_5", 3, seed=3)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(3))
    for model in (before, after):
        calls = {"steps": [], "l2norm": 0}
        with recording("qwen3_5", calls), torch.no_grad():
            model(ids)
        assert calls["l2norm"] == 0 and len(calls["steps"]) == 2
    hook.disable()
    for model in (before, after):
        calls = {"steps": [], "l2norm": 0}
        with recording("qwen3_5", calls), torch.no_grad():
            model(ids)
        assert calls["l2norm"] > 0


@pytest.mark.parametrize("version", ["5.16.1", "5.25.0", "4.57.1", "6.0.0.dev0"])
def test_unsupported_version_refused(monkeypatch, version):
    mod = module_of("qwen3_5")
    original = getattr(mod, CHUNK)
    # importing a modeling file may put a new module object under sys.modules["transformers"]
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    with pytest.raises(RuntimeError, match=rf"^transformers {version}: .* supports transformers "
                                           rf"5\.17 through 5\.24"):
        hook.enable()
    assert not hook.is_enabled() and getattr(mod, CHUNK) is original


def test_unexpected_layout_refused_changing_nothing(monkeypatch):
    moe = module_of("qwen3_5_moe")
    monkeypatch.delattr(moe, CHUNK)
    nxt = module_of("qwen3_next")
    original = getattr(nxt, RECURRENT)
    with pytest.raises(RuntimeError, match=r"Qwen3_5MoeGatedDeltaNet is missing"):
        hook.enable()
    assert not hook.is_enabled() and getattr(nxt, RECURRENT) is original


@pytest.mark.skipif(torch.float32 in IO_DTYPES, reason="gdnzoo serves fp32 q, k, v")
def test_fp32_model_refused_naming_q():
    model = tiny("qwen3_5", 2, dtype=torch.float32)
    hook.enable()
    with torch.no_grad(), pytest.raises(TypeError, match=r"^q: expected dtype .* fp32"):
        model(torch.zeros(1, 3, dtype=torch.long))

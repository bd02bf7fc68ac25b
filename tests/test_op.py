"""torch.ops.gdnzoo.decode_ (gdnzoo/op.py) and the decode layer built on it (gdnzoo/layer.py).

The operator: torch.library.opcheck on the dense, pool and verify forms; out, state, pool
(page gaps included) and intermediate states bit-identical to gdnzoo.decode's and within the
gate of the float64 reference, for pt-reference and fla-recurrent (the Triton interpreter
without a GPU); bad inputs raise gdnzoo.decode's error; registered once across reloads.  The
layer: torch.compile(fullgraph=True) with no graph break, aot_eager and inductor equal to eager.
CUDA only: the layer under mode="reduce-overhead" replayed on fresh data; a 4-layer decode
loop captured in one torch.cuda.CUDAGraph; pdl="wait"/"early" bit-identical to pdl off under
graph replay.
"""
import copy
import importlib
import inspect

import pytest
import torch

import gdnzoo
import gdnzoo.op as op
from conftest import DEVICE, HAS_CUDA
from gdnzoo import gate, registry
from gdnzoo.inputs import make_inputs, make_prefill_inputs
from gdnzoo.layer import GatedDeltaNetDecode
from gdnzoo.reference import reference_outputs, reference_verify_outputs
from gdnzoo.inputs import make_pool_case as make_case, paged_pool
from gdnzoo.inputs import make_verify_case

CUDA = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
FORMS = ("dense", "dense-dest", "pool", "pool-other", "verify-states", "verify-slots")


def _need(algo, device):
    ok, why = registry.availability(algo, device)
    if not ok:
        pytest.skip(f"{algo} unavailable on {device}: {why}")


class Case:
    """One call of a form: decode's keyword arguments, the storages it may write (out first),
    and the float64 reference of (out, written state or pool, intermediate states)."""

    def __init__(self, form, device, H=2, HV=4, K=16, B=3, seed=0):
        self.inter = self.inter_buf = None
        if form.startswith("dense"):
            self.x = x = make_inputs(B=B, H=H, HV=HV, K=K, V=K, device=device, seed=seed)
            dest = torch.empty_like(x.state) if form == "dense-dest" else None
            self.kw, self.storages = dict(new_state=dest), [x.state]
            self.written = x.state if dest is None else dest
            self.storages += [] if dest is None else [dest]
            self._ref = lambda: reference_outputs(x) + (None,)
        elif form.startswith("pool"):
            c = make_case(B=B, H=H, HV=HV, K=K, V=K, device=device, seed=seed,
                          pad="null" if form == "pool" else "neg",
                          separate_write=form == "pool", other_pool=form == "pool-other")
            self.x, self.kw = c.x, c.kwargs()
            self.storages = [c.buf] + ([] if c.dest_buf is None else [c.dest_buf])
            self.written = c.x.state if c.dest is None else c.dest
            self._ref = lambda: reference_outputs(c.x, pool=c.pool(), new_pool=c.dest) + (None,)
        else:
            c = make_verify_case(form[7:], B=B, T=2, H=H, HV=HV, K=K, V=K, device=device,
                                 seed=seed, pad="row" if form == "verify-states" else "neg",
                                 update=True)
            self.x, self.kw, self.written, self.inter = c.x, c.kwargs(), c.x.state, c.inter
            self.storages = [c.buf] + ([] if c.inter_buf is None else [c.inter_buf])
            self._ref = lambda: reference_verify_outputs(c.x, c.verify(), False, c.pool())
        self.out = torch.full(self.x.v.shape, float("nan"), dtype=self.x.v.dtype,
                              device=device)
        self.storages.insert(0, self.out)

    def reference(self):
        return self._ref()

    def op_args(self, algo="pt-reference", pdl=None):
        """The operator's positional arguments."""
        kw = dict(dict(new_state=None, state_indices=None, new_state_indices=None,
                       null_slot=None, intermediate_states=None, intermediate_indices=None,
                       update_state=True, num_accepted_tokens=None), **self.kw)
        return (*self.x.args(), self.out, kw["new_state"], False, algo, kw["state_indices"],
                kw["new_state_indices"], kw["null_slot"], kw["intermediate_states"],
                kw["intermediate_indices"], kw["update_state"], kw["num_accepted_tokens"], pdl)


# ------------------------------------------------------------------------- the operator

def test_schema_declares_every_written_argument():
    schema = torch.ops.gdnzoo.decode_.default._schema
    written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert written == {"state", "out", "new_state", "intermediate_states"}
    assert not schema.returns
    assert [a.name for a in schema.arguments] == list(inspect.signature(gdnzoo.decode).parameters)


def test_module_docstring_shows_the_live_schema():
    """gdnzoo.op's docstring prints decode's schema: it is the one registered."""
    import gdnzoo.op as op_module
    flat = " ".join(op_module.__doc__.split())
    assert "gdnzoo::" + str(torch.ops.gdnzoo.decode_.default._schema).split("::", 1)[1] in flat


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
def test_opcheck(form, device):
    torch.library.opcheck(op.OP, Case(form, device).op_args())


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("algo,geometry,seed", [
    ("pt-reference", dict(H=2, HV=4, K=16), 0), ("pt-reference", dict(H=1, HV=2, K=32), 1),
    ("fla-recurrent", dict(H=1, HV=2, K=64, B=2), 2), ("cuda-v4", dict(H=1, HV=2, K=128), 3)])
def test_matches_decode_and_reference(form, algo, geometry, seed):
    device = "cuda" if HAS_CUDA else "cpu"
    _need(algo, device)
    c = Case(form, device, seed=seed, **geometry)
    ref_out, ref_state, ref_inter = c.reference()
    before = [t.clone() for t in c.storages]
    got = op.decode_(*c.x.args(), out=c.out, algo=algo, **c.kw)
    assert got is c.out
    after_op = [t.clone() for t in c.storages]
    for t, b in zip(c.storages, before):
        t.copy_(b)
    gdnzoo.decode(*c.x.args(), out=c.out, algo=algo, **c.kw)
    for i, (a, b) in enumerate(zip(after_op, c.storages)):
        assert torch.equal(a, b), f"{algo} {form}: storage {i} differs from gdnzoo.decode's"
    j = gate.judge(c.out, c.written, ref_out, ref_state, state_dtype=c.written.dtype)
    assert j.ok, f"{algo} {form}: {j.reason}"
    if ref_inter is not None:
        v = gate.compare(c.inter, ref_inter)
        assert v.ok, f"{algo} {form}: intermediate states: {v.reason}"


def test_keywords_form_updates_in_place_and_allocates_out():
    x = make_inputs(B=2, H=2, HV=4, K=16, V=16, seed=3)
    ref_out, ref_state = reference_outputs(x)
    out = op.decode_(*x.args(), new_state=x.state, algo="pt-reference")
    j = gate.judge(out, x.state, ref_out, ref_state)
    assert j.ok, j.reason


def _bad_inputs():
    """(what, case form, change to decode's keyword arguments and positional inputs)."""
    x = make_inputs(B=3, H=2, HV=4, K=16, V=16)
    return [
        ("k shape", "dense", dict(k=x.k[:, :, :1])),
        ("A_log dtype", "dense", dict(A_log=x.A_log.double())),
        ("out dtype", "dense", dict(out=torch.empty(3, 1, 4, 16))),
        ("out aliases v", "dense", dict(out="v")),
        ("q requires grad", "dense", dict(q="grad")),
        ("negative scale", "dense", dict(scale=-1.0)),
        ("unknown algo", "dense", dict(algo="no-such-backend")),
        ("index dtype", "pool", dict(state_indices=torch.zeros(3))),
        ("new_state_indices without a pool", "dense",
         dict(new_state_indices=torch.zeros(3, dtype=torch.int32))),
        ("intermediate_indices alone", "pool",
         dict(intermediate_indices=torch.zeros(3, dtype=torch.int32))),
    ]


BAD = _bad_inputs()


@pytest.mark.parametrize("what,form,change", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_decodes_error(what, form, change):
    c = Case(form, "cpu")
    names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale")
    pos = dict(zip(names, c.x.args()))
    kw = dict(c.kw, out=c.out, algo="pt-reference")
    for name, value in change.items():
        value = c.x.v if value == "v" else value
        value = c.x.q.detach().clone().requires_grad_() if value == "grad" else value
        (pos if name in names else kw)[name] = value
    errors = []
    for call in (gdnzoo.decode, op.decode_):
        before = [t.clone() for t in c.storages]
        with pytest.raises((TypeError, ValueError)) as e:
            call(*pos.values(), **kw)
        errors.append((type(e.value), str(e.value)))
        for t, b in zip(c.storages, before):                     # nothing written
            torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)
    assert errors[0] == errors[1], what


def test_registered_once():
    lib, schema = op._LIB, str(torch.ops.gdnzoo.decode_.default._schema)
    importlib.reload(op)
    importlib.import_module("gdnzoo.op")
    assert op._LIB is lib and str(op.OP._schema) == schema
    c = Case("dense", "cpu")
    ref_out, ref_state, _ = c.reference()
    op.OP(*c.op_args())
    assert gate.judge(c.out, c.x.state, ref_out, ref_state).ok


# ---------------------------------------------------------------------------- the layer

HIDDEN = 32


def _layer(algo="pt-reference", pooled=True, device="cpu", H=2, HV=4, K=16, seed=0, **kw):
    m = GatedDeltaNetDecode(HIDDEN, H, HV, K, K, slots=8 if pooled else None,
                            batch=None if pooled else 3, algo=algo,
                            null_slot=0 if pooled else None,
                            device=device, seed=seed, **kw)
    m.state.copy_(torch.randn(m.state.shape, generator=torch.Generator().manual_seed(seed))
                  * 0.05)
    return m


def _step_inputs(step, B, slots, device, hidden=HIDDEN):
    """Fresh hidden states and slots (sequence 1 padded by null_slot 0 when B > 2)."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(B, hidden, generator=gen).to(torch.bfloat16).to(device)
    idx = torch.randperm(slots - 1, generator=gen)[:B] + 1
    if B > 2:
        idx[1] = 0
    return x, idx.to(torch.int32).to(device)


@pytest.mark.parametrize("pooled", (True, False), ids=("pool", "dense"))
def test_layer_has_no_graph_break(pooled):
    torch._dynamo.reset()
    m = _layer(pooled=pooled)
    x, idx = _step_inputs(0, 3, 8, "cpu")
    exp = torch._dynamo.explain(m)(x, idx if pooled else None)
    assert (exp.graph_count, exp.graph_break_count) == (1, 0), exp.break_reasons


def _inductor_cpu():
    """None when inductor compiles for the CPU here, else why not."""
    try:
        torch.compile(lambda t: t.sin() + 1, fullgraph=True)(torch.ones(4))
    except Exception as e:  # no working C++ compiler, most often
        return f"inductor cannot compile for the CPU here: {type(e).__name__}: {e}"[:300]
    return None


@pytest.mark.parametrize("backend,algo,pooled", [
    ("aot_eager", "pt-reference", True), ("aot_eager", "pt-reference", False),
    ("aot_eager", "fla-recurrent", True), ("inductor", "pt-reference", True),
    ("inductor", "pt-reference", False)])
def test_layer_compiled_matches_eager(backend, algo, pooled):
    _need(algo, DEVICE)
    if backend == "inductor" and DEVICE == "cpu" and (why := _inductor_cpu()):
        pytest.skip(why)
    torch._dynamo.reset()
    geom = dict(H=1, HV=2, K=64) if algo == "fla-recurrent" else {}
    eager = _layer(algo, pooled, DEVICE, **geom)
    compiled_layer = copy.deepcopy(eager)
    compiled = torch.compile(compiled_layer, fullgraph=True, backend=backend)
    B = 2 if algo == "fla-recurrent" and pooled else 3
    for step in range(3):
        x, idx = _step_inputs(step, B, 8, DEVICE)
        idx = idx if pooled else None
        y, y_ref = compiled(x, idx), eager(x, idx)
        if backend == "aot_eager":
            assert torch.equal(y, y_ref), f"step {step}: out"
            assert torch.equal(compiled_layer.state, eager.state), f"step {step}: state"
        else:
            j = gate.judge(y, compiled_layer.state, y_ref, eager.state)
            assert j.ok, f"step {step}: {j.reason}"


def test_layer_compiled_with_a_dynamic_batch():
    """The batch changes between calls: dynamo makes it symbolic (the fake takes any shape)."""
    torch._dynamo.reset()
    eager = _layer()
    compiled_layer = copy.deepcopy(eager)
    compiled = torch.compile(compiled_layer, fullgraph=True, backend="aot_eager")
    for step, B in enumerate((3, 2, 4, 3)):
        x, idx = _step_inputs(step, B, 8, "cpu")
        assert torch.equal(compiled(x, idx), eager(x, idx)), f"B={B}: out"
        assert torch.equal(compiled_layer.state, eager.state), f"B={B}: state"


# -------------------------------------------------------------------------- CUDA graphs

GPU_ALGOS = ("fla-recurrent", "cuda-v4")


def _gpu_layer(algo, seed=0):
    return _layer(algo, True, "cuda", H=2, HV=4, K=128, seed=seed)


@CUDA
@pytest.mark.parametrize("algo", GPU_ALGOS)
def test_layer_reduce_overhead_replays_fresh_inputs(algo):
    _need(algo, "cuda")
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    eager = _gpu_layer(algo)
    graphed = copy.deepcopy(eager)
    compiled = torch.compile(graphed, mode="reduce-overhead", fullgraph=True)
    for step in range(6):                     # warm-up, record, then 4 replays
        x, idx = _step_inputs(step, 4, 8, "cuda")
        y = compiled(x, idx).clone()
        y_ref = eager(x, idx)
        j = gate.judge(y, graphed.state, y_ref, eager.state)
        assert j.ok, f"{algo} step {step}: {j.reason}"
    assert counters["inductor"]["cudagraph_skips"] == 0, "cudagraphs were skipped"


def _decode_loop(layers, x, idx):
    for m in layers:
        x = x + m(x, idx)
    return x


@CUDA
@pytest.mark.parametrize("algo", GPU_ALGOS)
def test_four_layer_loop_in_one_cuda_graph(algo):
    _need(algo, "cuda")
    layers = [_gpu_layer(algo, seed=i) for i in range(4)]
    eager = copy.deepcopy(layers)
    x, idx = _step_inputs(0, 4, 8, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):             # binds every launcher outside the capture
        _decode_loop(layers, x, idx)
    torch.cuda.current_stream().wait_stream(side)
    for m, e in zip(layers, eager):
        m.state.copy_(e.state)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = _decode_loop(layers, x, idx)
    for step in range(1, 5):
        xs, ids = _step_inputs(step, 4, 8, "cuda")
        x.copy_(xs)
        idx.copy_(ids)
        g.replay()
        y_ref = _decode_loop(eager, xs, ids)
        for i, (m, e) in enumerate(zip(layers, eager)):
            j = gate.judge(y, m.state, y_ref, e.state)
            assert j.ok, f"{algo} replay {step}, layer {i}: {j.reason}"


@CUDA
@pytest.mark.parametrize("level", ("wait", "early"))
@pytest.mark.parametrize("algo", GPU_ALGOS)
def test_pdl_bit_identical_under_graph_replay(algo, level):
    """Two decode steps of one pool per graph, a producer kernel (no PDL) before each; every
    replay on fresh q/k/v, gates and slots; out and the whole pool storage compared bitwise."""
    _need(algo, "cuda")
    B, H, HV, K, P = 4, 2, 4, 128, 16
    W = 2 * H * K + HV * K
    gen = torch.Generator().manual_seed(7)
    buf0 = paged_pool(P, HV, K, K, device="cuda", gen=gen).buf
    A_log = make_inputs(H=H, HV=HV, K=K, V=K, device="cuda").A_log
    dt_bias = torch.zeros(HV, device="cuda")
    src = torch.empty(2, B, W, device="cuda")      # fp32: the producer below is a kernel
    gates = torch.empty(2, 2, B, 1, HV, dtype=torch.bfloat16, device="cuda")
    idx = torch.empty(B, dtype=torch.int32, device="cuda")

    def fresh(r):
        g = torch.Generator().manual_seed(100 + r)
        src.copy_(torch.randn(src.shape, generator=g) * 0.1)
        gates.copy_(torch.randn(gates.shape, generator=g))
        slots = torch.randperm(P - 1, generator=g)[:B] + 1
        slots[1] = 0
        idx.copy_(slots)

    def run(pdl):
        p = paged_pool(P, HV, K, K, device="cuda", gen=gen)
        buf, pool = p.buf, p.state
        buf.copy_(buf0)
        qkv = torch.empty(B, W, dtype=torch.bfloat16, device="cuda")
        q = qkv[:, :H * K].view(B, 1, H, K)
        k = qkv[:, H * K:2 * H * K].view(B, 1, H, K)
        v = qkv[:, 2 * H * K:].view(B, 1, HV, K)
        out = torch.empty(2, B, 1, HV, K, dtype=torch.bfloat16, device="cuda")

        def steps():
            for s in range(2):
                qkv.copy_(src[s])               # the producer: a conversion kernel, no PDL
                op.decode_(q, k, v, pool, A_log, gates[s, 0], dt_bias, gates[s, 1],
                           out=out[s], state_indices=idx, null_slot=0, use_qk_l2norm=True,
                           algo=algo, pdl=pdl)
        fresh(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            try:
                steps()
            except ValueError as e:
                if pdl == "off":
                    raise
                pytest.skip(f"{algo} refuses pdl={pdl!r}: {e}")
        torch.cuda.current_stream().wait_stream(side)
        buf.copy_(buf0)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            steps()
        results = []
        for r in range(1, 4):
            fresh(r)
            g.replay()
            results.append((out.clone(), buf.clone()))
        return results

    base = run("off")
    for r, ((o, s), (o0, s0)) in enumerate(zip(run(level), base)):
        assert torch.equal(o, o0) and torch.equal(s, s0), f"{algo} pdl={level} replay {r}"
    assert not torch.equal(base[0][1], buf0), "the replays wrote no state"


def test_public_functions_compile_as_they_are():
    """gdnzoo.decode, gdnzoo.prefill, gdnzoo.commit, a gdnzoo.get(...) callable and an engine
    adapter, made before torch._dynamo is imported, compile with fullgraph=True (traced as
    their operators) and give the eager results.  A fresh interpreter: dynamo not yet loaded."""
    import subprocess
    import sys
    code = r'''
import sys
import gdnzoo
from gdnzoo.integrations import vllm
dec, pre, com, ref = gdnzoo.decode, gdnzoo.prefill, gdnzoo.commit, gdnzoo.get("pt-reference")
assert "torch._dynamo" not in sys.modules
import torch
from gdnzoo.inputs import make_inputs, make_prefill_inputs
x = make_inputs(B=2, T=2, H=2, HV=4, K=32, V=32)
p = make_prefill_inputs([3, 0, 5], H=2, HV=4, K=32, V=32)
def step(x):
    o, s = dec(*x.args(), use_qk_l2norm=True)
    o2, s2 = ref(*x.args())
    return o * 2, o2
def fill(p):
    o, s = pre(*p.args())
    return o + 1, s
def keep(inter, steps, pool, idx):
    return com(inter, None, steps, pool, idx)
for fn, args in ((step, lambda: (x.clone(),)), (fill, lambda: (p.clone(),))):
    want, got = fn(*args()), torch.compile(fn, fullgraph=True)(*args())
    assert all(torch.equal(a, b) for a, b in zip(want, got)), fn.__name__
inter, steps = torch.randn(2, 2, 4, 32, 32), torch.tensor([1, -1])
pool, idx = torch.randn(5, 4, 32, 32), torch.tensor([3, 4])
a, b = pool.clone(), pool.clone()
keep(inter, steps, a, idx)
torch.compile(keep, fullgraph=True)(inter, steps, b, idx)
assert torch.equal(a, b)
mixed = torch.randn(2, 2 * 2 * 32 + 4 * 32).to(torch.bfloat16)
gates = torch.randn(2, 8).to(torch.bfloat16)
def packed(pool, out):
    vllm.packed_decode(mixed, gates[:, :4], gates[:, 4:], x.A_log, x.dt_bias, None, pool, out,
                       torch.tensor([1, 3]), use_qk_l2norm_in_kernel=True)
    return out
o1, o2 = torch.empty(2, 1, 4, 32, dtype=torch.bfloat16), torch.empty(2, 1, 4, 32,
                                                                     dtype=torch.bfloat16)
a, b = pool.clone(), pool.clone()
packed(a, o1)
torch.compile(packed, fullgraph=True)(b, o2)
assert torch.equal(o1, o2) and torch.equal(a, b)
print("ok")
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize("what", ["decode", "prefill"])
def test_compiled_call_refuses_a_tensor_that_requires_grad(what):
    """Under torch.compile the operator runs with grad mode off, so the eager refusal of a
    tensor that requires grad (a model's parameter outside torch.no_grad()) is checked while
    dynamo traces: the compiled call fails with the eager message instead of dropping the
    gradient silently; under no_grad it runs and equals the eager call."""
    if what == "decode":
        x = make_inputs(B=2, T=1, H=2, HV=4, K=32, V=32)
        fn = gdnzoo.decode
    else:
        x = make_prefill_inputs([3, 0, 5], H=2, HV=4, K=32, V=32)
        fn = gdnzoo.prefill
    A_log = torch.nn.Parameter(x.A_log.clone())

    def f(*args):
        return fn(*args, algo="pt-reference")[0]

    def args():
        a = list(x.clone().args())
        a[4] = A_log
        return a
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match="A_log: expected a tensor that does not require grad"):
        f(*args())
    with pytest.raises(Exception, match="A_log: expected a tensor that does not require grad"):
        compiled(*args())
    with torch.no_grad():
        assert torch.equal(compiled(*args()), f(*args()))


@pytest.mark.parametrize("what", ["decode", "prefill"])
def test_the_operator_itself_refuses_a_tensor_that_requires_grad_under_compile(what):
    """A graph that calls torch.ops.gdnzoo.*_ directly (not through the public functions):
    the operator's fake implementation refuses, as the eager operator does, a tensor that
    requires grad while grad mode is on (it ran with the gradient silently dropped); under
    no_grad the compiled call equals the eager one."""
    if what == "decode":
        x = make_inputs(B=2, T=1, H=2, HV=4, K=32, V=32)

        def f(q, k, v, state, A_log, a, dt_bias, b, scale):
            out = torch.empty_like(v)
            torch.ops.gdnzoo.decode_(q, k, v, state, A_log, a, dt_bias, b, scale, out)
            return out

        def args():
            return list(x.clone().args())
    else:
        x = make_prefill_inputs([3, 0, 5], H=2, HV=4, K=32, V=32)

        def f(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens):
            out = torch.empty_like(v)
            torch.ops.gdnzoo.prefill_(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, None,
                                      out)
            return out

        def args():
            y = x.clone()
            return [y.q, y.k, y.v, y.state, y.A_log, y.a, y.dt_bias, y.b, y.cu_seqlens]
    A_log = torch.nn.Parameter(x.A_log.clone())

    def with_param():
        a = args()
        a[4] = A_log
        return a
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="A_log: expected a tensor that does not require grad"):
        compiled(*with_param())
    with torch.no_grad():
        assert torch.equal(compiled(*with_param()), f(*with_param()))

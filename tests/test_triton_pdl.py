"""Programmatic dependent launch (PDL) in fla-recurrent's Triton kernel (the ``PDL`` constexpr).

No GPU needed: the kernel compiled for sm_90 (``triton.compile`` with ``GPUTarget("cuda", 90,
32)``, the arguments fla_recurrent.launch passes, specialized as Triton's JIT specializes them)
for dense, pool and verify calls.  PDL 0 gives the PTX of the kernel before PDL existed
(:data:`BEFORE_PDL`, debug line info aside); level 1 executes ``griddepcontrol.wait`` before
its first global load or store, level 2 loads the state, its indices, A_log and dt_bias before
the wait and q, k, v, a, b and every store after it (told apart by the PTX's source lines);
both trigger the next kernel (``griddepcontrol.launch_dependents``) right after the wait.  The
refusals (CPU and the interpreter, compute capability < 9.0, fla-tma) and the launch cache's
key.

CUDA only, through ``gdnzoo.decode(..., algo="fla-recurrent", pdl=...)``: results bit-identical
to ``pdl="off"`` (out, the whole state or pool storage, intermediate states) for dense, pool
and verify calls, fp32 and bf16 state, B in {1, 16, 256}, the first (Triton's launcher) and
the cached (raw) launch; CUDA-graph capture of [a producer writing q, k, v, a, b, the decode]
replayed with new data equal to the same steps eager without PDL; "early" with a kernel launched
without PDL between steps on one state equal to the float64 reference.
"""
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gdnzoo
from conftest import HAS_CUDA
from gdnzoo import contract
from gdnzoo.backends import _triton_launch as tlaunch
from gdnzoo.backends._triton_launch import compile_offline as compile_sm90
from gdnzoo.backends import fla_recurrent
from gdnzoo.inputs import make_inputs, make_pool_case as make_case, make_problem
from gdnzoo.reference import reference_outputs
from helpers import assert_matches, ptx_code, record, run
from gdnzoo.inputs import make_verify_case

NAME = "fla-recurrent"
ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "backends" / "_triton_decode_kernel.py"
# The last commit whose kernel had no PDL: PDL 0 must compile to its code.
BEFORE_PDL = "b39e856dd9855cfcb87660a225490775c8f46cd8"

# ------------------------------------------------------------------ compiled for sm_90, no GPU
# The compiles run in a subprocess in Triton's JIT mode: this session may run the interpreter
# (TRITON_INTERPRET=1, set by conftest before triton loaded), whose triton.language helpers
# cannot be compiled.


def _load_kernel(path, name):
    """gdn_decode_kernel of the source file ``path`` (a Triton JIT function in JIT mode)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.gdn_decode_kernel


class _Recorder:
    """Stands in for the kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return record


def launch_args(call, pdl, config):
    """(args, kwargs) that fla_recurrent.launch passes the kernel for ``call`` (launch's args
    and kwargs) at this PDL level and launch config (JIT mode: T is passed as an int)."""
    import gdnzoo.backends._triton_decode_kernel as tk
    rec, kernel = _Recorder(), tk.gdn_decode_kernel
    args, kw = call
    tk.gdn_decode_kernel = rec
    try:
        fla_recurrent.launch(*args, **kw, config=config, pdl=pdl)
    finally:
        tk.gdn_decode_kernel = kernel
    return rec.args, rec.kwargs


def ptx_memory_ops(ptx, path):
    """[(op, source line)] of the PTX's global loads/stores and grid dependency instructions,
    in order; source line: the line of ``path`` that the last ``.loc`` named (None elsewhere)."""
    files = dict(re.findall(r'\.file\s+(\d+)\s+"([^"]+)"', ptx))
    ours = {n for n, f in files.items() if Path(f).name == Path(path).name}
    line, out = None, []
    for s in ptx.splitlines():
        s = s.strip()
        m = re.match(r"\.loc\s+(\d+)\s+(\d+)", s)
        if m:
            line = int(m.group(2)) if m.group(1) in ours else None
            continue
        m = re.match(r"(?:@!?%p\d+\s+)?(ld\.global|st\.global|griddepcontrol\.\w+)", s)
        if m:
            out.append((m.group(1), line))
    return out


def source_lines(path, needles):
    """The 1-based numbers of the lines of ``path`` that contain any of ``needles``."""
    lines = Path(path).read_text().splitlines()
    return {i + 1 for i, s in enumerate(lines) if any(n in s for n in needles)}


# What the kernel before us does not write (read before the wait at level 2) and what it does.
STATE_LOADS = ("h = tl.load(src + rows4", "tl.load(A_log", "tl.load(dt_bias",
               "r = tl.load(slot_idx", "w = tl.load(new_slot_idx", "c = tl.load(accepted",
               "r = tl.load(row", "row = tl.load(inter_idx")
PRODUCER_LOADS = ("tl.load(p_q)", "tl.load(p_k)", "tl.load(p_v)", "tl.load(p_a)", "tl.load(p_b)")


def _dense(sd, T=1, l2=False, inplace=True, io=torch.bfloat16, B=2):
    x = make_inputs(B=B, T=T, H=2, HV=4, K=128, V=128, state_dtype=sd, io_dtype=io)
    new = x.state if inplace else torch.empty_like(x.state)
    return (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale,
            torch.empty_like(x.v), new, l2), {}


def _pool(sd, T=1, separate=False, idx=torch.int32):
    case = make_case(B=3, T=T, H=2, HV=4, state_dtype=sd, separate_write=separate,
                     index_dtype=idx, pad="neg")
    x = case.x
    return (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale,
            torch.empty_like(x.v), x.state, False), dict(pool=case.pool())


def _verify(sd, form="states", T=2, update=True, dense=False, rows="indexed"):
    case = make_verify_case(form, B=3, T=T, H=2, HV=4, state_dtype=sd, update=update,
                            dense=dense, rows=rows)
    x = case.x
    return (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale,
            torch.empty_like(x.v), x.state, False), dict(pool=case.pool(), verify=case.verify())


F32, BF16 = torch.float32, torch.bfloat16
# (name, call builder, launch config (BV, num_warps, num_stages, LPR, DENSE))
COMPILED = [
    ("dense-fp32-T1-inplace-const", lambda: _dense(F32), (4, 1, 1, 8, 1)),
    ("dense-bf16-T2-dest-l2", lambda: _dense(BF16, T=2, l2=True, inplace=False),
     (8, 2, 1, 16, 0)),
    ("pool-fp32-same-i32", lambda: _pool(F32), (16, 4, 1, 32, 1)),
    ("pool-bf16-separate-i64", lambda: _pool(BF16, separate=True, idx=torch.int64),
     (4, 1, 1, 8, 0)),
    ("verify-states-pool-fp32", lambda: _verify(F32), (8, 2, 1, 16, 1)),
    ("verify-slots-bf16", lambda: _verify(BF16, form="slots", T=3), (4, 1, 1, 8, 1)),
    ("verify-states-dense-rown", lambda: _verify(F32, update=False, dense=True, rows="default"),
     (8, 2, 1, 16, 1)),
]
COMPILED_IDS = [c[0] for c in COMPILED]


def compile_all(before_path, out_path):
    """The subprocess's work (JIT mode): every case of :data:`COMPILED` compiled with this
    tree's kernel at PDL 0, 1, 2 and with the kernel at ``before_path`` (as PDL 0 calls it);
    writes {name: {"before": ptx, "0"/"1"/"2": {"ptx", "launch_pdl", "level", "option"}}} as
    JSON to ``out_path``."""
    now, before = _load_kernel(KERNEL, "kernel_now"), _load_kernel(before_path, "kernel_before")
    at = now.arg_names.index("PDL")        # PDL, then the model forms (GATES, NEG, KFIRST)
    result = {}
    for name, make, config in COMPILED:
        entry = {}
        for level in (0, 1, 2):
            args, kw = launch_args(make(), level, config)
            assert not any(args[at + 1:]), f"{name}: a model form is on: {args[at + 1:]}"
            k = compile_sm90(now, args, kw)
            entry[str(level)] = dict(ptx=k.asm["ptx"], launch_pdl=bool(k.metadata.launch_pdl),
                                     level=args[at], option=kw.get("launch_pdl"))
            if level == 0:      # the arguments before PDL: all the kernel before PDL took
                entry["before"] = compile_sm90(before, args[:at], kw).asm["ptx"]
        result[name] = entry
    Path(out_path).write_text(json.dumps(result))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """:func:`compile_all`'s result, from a subprocess in Triton's JIT mode."""
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("Triton's NVIDIA backend (its sm_90 compiler) is not installed")
    try:
        src = subprocess.run(["git", "show", f"{BEFORE_PDL}:backends/_triton_kernel.py"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the kernel before PDL (commit {BEFORE_PDL[:7]}) is not in this checkout "
                    f"(git show: {e})")
    tmp = tmp_path_factory.mktemp("pdl_compile")
    (tmp / "_triton_decode_kernel.py").write_text(src)
    out = tmp / "ptx.json"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_triton_pdl as t; "
            "t.compile_all(sys.argv[2], sys.argv[3])")
    # A cache of its own: a cached PTX names the file it was first compiled from.
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp / "cache"))
    run = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent),
                          str(tmp / "_triton_decode_kernel.py"), str(out)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"the sm_90 compiles failed:\n{run.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", COMPILED_IDS)
def test_pdl_off_compiles_to_the_code_before_pdl(compiled, name):
    c = compiled[name]
    assert c["0"]["level"] == 0 and c["0"]["option"] is None and not c["0"]["launch_pdl"], \
        "PDL 0 must be a plain launch"
    now, before = ptx_code(c["0"]["ptx"]), ptx_code(c["before"])
    assert now == before, f"{name}: PDL 0 changed the PTX ({len(now)} vs {len(before)} lines)"
    assert "griddepcontrol" not in c["0"]["ptx"]


@pytest.mark.parametrize("name", COMPILED_IDS)
def test_pdl_wait_first(compiled, name):
    """Level 1: the wait before any global load or store, the trigger right after it."""
    c = compiled[name]["1"]
    assert c["level"] == 1 and c["option"] is True and c["launch_pdl"]
    ops = [op for op, _ in ptx_memory_ops(c["ptx"], KERNEL)]
    assert ops[:2] == ["griddepcontrol.wait", "griddepcontrol.launch_dependents"], \
        f"{name}: the first global accesses are {ops[:4]}"
    assert ops.count("griddepcontrol.wait") == 1 and "ld.global" in ops and "st.global" in ops


@pytest.mark.parametrize("name", COMPILED_IDS)
def test_pdl_state_early(compiled, name):
    """Level 2: the state's loads (its indices, A_log, dt_bias) before the wait; q, k, v, a, b
    and every store after it; the trigger right after the wait."""
    import triton
    if not triton.__version__.startswith("3.6."):
        pytest.skip(f"the PTX's source lines are read as Triton 3.6 (the GPU machines') writes "
                    f"them; Triton {triton.__version__} places them otherwise (one line lower, "
                    f"the state tile's load at a later statement)")
    c = compiled[name]["2"]
    assert c["level"] == 2 and c["option"] is True and c["launch_pdl"]
    ops = ptx_memory_ops(c["ptx"], KERNEL)
    names = [op for op, _ in ops]
    assert names.count("griddepcontrol.wait") == 1, f"{name}: {names}"
    w = names.index("griddepcontrol.wait")
    assert names[w + 1] == "griddepcontrol.launch_dependents"
    state = source_lines(KERNEL, STATE_LOADS)
    tile = source_lines(KERNEL, STATE_LOADS[:1])
    before, after = ops[:w], ops[w + 2:]
    assert before and all(op == "ld.global" and line in state for op, line in before), \
        f"{name}: before the wait: {before}"
    assert any(line in tile for _, line in before), \
        f"{name}: the state tile is not loaded before the wait"
    assert not any(op == "ld.global" and line in state for op, line in after), \
        f"{name}: a state load after the wait"
    loaded_after = {line for op, line in after if op == "ld.global"}
    for load in PRODUCER_LOADS:      # each at one of its lines (GATES picks the gates' lines)
        assert source_lines(KERNEL, (load,)) & loaded_after, \
            f"{name}: {load} is not loaded after the wait"
    assert any(op == "st.global" for op, _ in after)


# ------------------------------------------------------------------ refusals and the cache key


def _problem(**kw):
    return make_problem(**{"B": 2, "H": 2, "HV": 4, "pdl": "wait", **kw})


def test_supports_refuses_pdl_without_a_gpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")          # CPU tensors: the interpreter's case
    ok, why = fla_recurrent.supports(_problem(device="cpu", cc=None))
    assert not ok and why == ("programmatic dependent launch needs a CUDA GPU; the Triton "
                              "interpreter has none")
    ok, why = fla_recurrent.supports(_problem(device="cpu", cc=None, pdl=""))
    assert ok == (tlaunch.interpreter_on()), why


@pytest.mark.parametrize("level", ["wait", "early"])
def test_supports_pdl_by_compute_capability(monkeypatch, level):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = fla_recurrent.supports(_problem(cc=(8, 9), pdl=level))
    assert not ok and why == ("programmatic dependent launch needs compute capability >= 9.0, "
                              "this GPU has 8.9")
    assert fla_recurrent.supports(_problem(cc=(9, 0), pdl=level)) == (True, "")
    assert fla_recurrent.supports(_problem(cc=(10, 0), pdl=level)) == (True, "")
    ok, why = fla_recurrent.supports(_problem(K=96, pdl=level))
    assert not ok and "96" in why                       # the other refusals come first


def test_launch_refuses_pdl_in_the_interpreter_and_bad_levels():
    args, _ = _dense(F32)
    if tlaunch.interpreter_on():
        with pytest.raises(ValueError, match="interpreter has none"):
            fla_recurrent.launch(*args, pdl=1)
    with pytest.raises(ValueError, match=r"pdl must be one of \(0, 1, 2\), got 3"):
        fla_recurrent.launch(*args, pdl=3)


def test_fla_tma_refuses_a_pdl_level():
    """fla-tma shares the launch cache but has no PDL: a level is refused before any launch."""
    from gdnzoo.backends import fla_tma
    args, _ = _dense(F32)
    before = args[3].clone()
    with pytest.raises(ValueError, match="pdl: this backend has no programmatic dependent"):
        fla_tma.bind(record(*args, pdl=1))
    with pytest.raises(ValueError, match="pdl: this backend has no programmatic dependent"):
        run(fla_tma, *args, pdl=2)
    assert torch.equal(args[3], before)


def test_cache_key_holds_the_level():
    args, kw = _verify(F32)
    q, k, v, state, A_log, a, dt_bias, b, _, out, new, l2 = args
    keys = [tlaunch.Dispatcher.key(q, k, v, state, A_log, a, dt_bias, b, out, new, l2,
                                   kw["pool"], kw["verify"], pdl) for pdl in (0, 1, 2)]
    assert len(set(keys)) == 3
    assert keys[0] == tlaunch.Dispatcher.key(q, k, v, state, A_log, a, dt_bias, b, out, new, l2,
                                             kw["pool"], kw["verify"])


# ------------------------------------------------------------------ on a GPU

LEVELS = ("wait", "early")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="programmatic dependent launch needs a "
                                                     "CUDA GPU (compute capability >= 9.0)")


def _need_pdl():
    cc = torch.cuda.get_device_capability()
    if cc < (9, 0):
        pytest.skip(f"programmatic dependent launch needs compute capability >= 9.0, this GPU "
                    f"has {cc[0]}.{cc[1]}")


def _bits(t):
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _gpu_case(form, sd, B, seed):
    """(decode's positional args, its keyword args, the storage it writes: [out, the state's
    whole storage, the intermediate storage or None]) of a case on the GPU; the same seed
    gives the same case."""
    if form == "dense":
        x = make_inputs(B=B, T=1, H=4, HV=8, K=128, V=128, state_dtype=sd, device="cuda",
                        seed=seed)
        out = torch.empty_like(x.v)
        return x.args(), dict(out=out), [out, x.state, None]
    if form == "pool":
        case = make_case(B=B, T=1, H=4, HV=8, state_dtype=sd, device="cuda", seed=seed,
                         pad="null" if B > 2 else None, separate_write=B > 1)
        out = torch.empty_like(case.x.v)
        return case.x.args(), dict(case.kwargs(), out=out), [out, case.buf, None]
    case = make_verify_case(form, B=B, T=3, H=4, HV=8, state_dtype=sd, device="cuda",
                            seed=seed, pad="neg" if B > 2 else None, update=True)
    out = torch.empty_like(case.x.v)
    return case.x.args(), dict(case.kwargs(), out=out), [out, case.buf, case.inter_buf]


def _pdl_launchers(level):
    """fla-recurrent's cached launchers of this level (their key ends in ("pdl", level))."""
    return [f for (base, _), f in fla_recurrent._DISPATCH.fast.items()
            if isinstance(base, tuple) and base[-2:] == ("pdl", level)]


@needs_cuda
@pytest.mark.parametrize("form", ["dense", "pool", "states", "slots"])
@pytest.mark.parametrize("sd", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("B", [1, 16, 256])
@pytest.mark.parametrize("pdl", LEVELS)
def test_pdl_results_bit_identical_to_off(form, sd, B, pdl):
    """Three steps (the first through Triton's launcher, then the cached raw launch) with and
    without PDL on two copies of one case: every written byte the same after each step."""
    _need_pdl()
    runs = {}
    for mode in ("off", pdl):
        args, kw, written = _gpu_case(form, sd, B, seed=B)
        steps = []
        for _ in range(3):
            kw["out"].fill_(float("nan"))
            gdnzoo.decode(*args, algo=NAME, pdl=mode, **kw)
            torch.cuda.synchronize()
            steps.append([None if t is None else _bits(t).clone() for t in written])
        runs[mode] = steps
    for i, (off, on) in enumerate(zip(runs["off"], runs[pdl])):
        for what, x, y in zip(("out", "state storage", "intermediate storage"), off, on):
            assert x is None or torch.equal(x, y), f"step {i}: {what} differs with pdl={pdl!r}"
    made = _pdl_launchers(contract.PDL_LEVELS[pdl])
    assert made and all(getattr(f, "pdl", None) for f in made), \
        f"no cached PDL launcher for pdl={pdl!r}: {made}"


def _produce(src, dst):
    """A producer launched without PDL: each of dst (q, k, v, a, b) = its src * 1."""
    for s, d in zip(src, dst):
        torch.mul(s, 1, out=d)


def _sources(y):
    return (y.q, y.k, y.v, y.a, y.b)


@needs_cuda
@pytest.mark.parametrize("pdl", LEVELS)
@pytest.mark.parametrize("form", ["dense", "pool", "states"])
def test_cuda_graph_of_producer_and_pdl_decode(pdl, form):
    """Capture [producer writing q, k, v, a, b; decode with PDL] and replay it with new
    sources, step after step on one state: equal to the same steps run eagerly without PDL."""
    _need_pdl()
    B = 64
    args, kw, written = _gpu_case(form, torch.float32, B, seed=21)
    x = args
    inputs = (x[0], x[1], x[2], x[5], x[7])             # q, k, v, a, b: the producer's output
    src = [torch.empty_like(t) for t in inputs]
    start = [None if t is None else t.clone() for t in written]

    def step(mode):
        _produce(src, inputs)
        gdnzoo.decode(*args, algo=NAME, pdl=mode, **kw)

    def restart():
        for t, t0 in zip(written, start):
            if t is not None:
                t.copy_(t0)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(pdl)                                       # compiles and caches before capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(pdl)
    news = [make_inputs(B=B, T=x[0].shape[1], H=4, HV=8, K=128, V=128, device="cuda", seed=sd)
            for sd in (31, 32, 33)]
    expect = []
    restart()
    for y in news:
        for d, t in zip(src, _sources(y)):
            d.copy_(t)
        step("off")
        torch.cuda.synchronize()
        expect.append([None if t is None else _bits(t).clone() for t in written])
    restart()
    for i, y in enumerate(news):
        for d, t in zip(src, _sources(y)):
            d.copy_(t)
        written[0].fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for what, t, e in zip(("out", "state storage", "intermediate storage"), written,
                              expect[i]):
            assert t is None or torch.equal(_bits(t), e), f"replay {i}: {what} differs"


@needs_cuda
@pytest.mark.parametrize("sd", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_state_early_with_a_kernel_between_steps(sd):
    """"early", step after step, each step reading the state the step before wrote, with only
    the producer (launched without PDL) between them and no sync until the end: every step
    against the float64 reference (states kept by destination passing), and in place
    bit-identical to "off"."""
    _need_pdl()
    B, n = 256, 6
    xs = [make_inputs(B=B, T=1, H=4, HV=8, K=128, V=128, state_dtype=sd, device="cuda",
                      seed=40 + i) for i in range(n)]
    bufs = xs[0].clone()
    inputs = _sources(bufs)
    states = [xs[0].state.clone()] + [torch.empty_like(xs[0].state) for _ in range(n)]
    outs = [torch.empty_like(bufs.v) for _ in range(n)]
    for i, y in enumerate(xs):
        _produce(_sources(y), inputs)
        gdnzoo.decode(bufs.q, bufs.k, bufs.v, states[i], bufs.A_log, bufs.a, bufs.dt_bias,
                      bufs.b, bufs.scale, out=outs[i], new_state=states[i + 1], algo=NAME,
                      pdl="early")
    torch.cuda.synchronize()
    for i, y in enumerate(xs):
        # the step's inputs: y's q, k, v, a, b (copied into bufs); bufs' A_log and dt_bias
        ref_out, ref_state = reference_outputs(
            dataclasses.replace(y, state=states[i], A_log=bufs.A_log, dt_bias=bufs.dt_bias), False)
        assert_matches(outs[i], states[i + 1], ref_out, ref_state, sd, f"early step {i}")

    def in_place(mode):
        bufs = xs[0].clone()
        got = []
        for y in xs:
            _produce(_sources(y), _sources(bufs))
            out = torch.empty_like(bufs.v)
            gdnzoo.decode(*bufs.args(), out=out, algo=NAME, pdl=mode)
            got.append(out)
        torch.cuda.synchronize()
        return got, bufs.state

    (off, s_off), (early, s_early) = in_place("off"), in_place("early")
    for i, (a, b) in enumerate(zip(off, early)):
        assert torch.equal(_bits(a), _bits(b)), f"in place, step {i}: out differs from off"
    assert torch.equal(_bits(s_off), _bits(s_early)), "in place: the state differs from off"


@needs_cuda
@pytest.mark.parametrize("which", ["wait", "early", "fla-tma"])
def test_triton_c_launcher(which):
    """The cached launcher without CuPy (FastLaunch: Triton's C launcher) of fla-recurrent's PDL
    kernels (launched with PDL, as their metadata says) and of fla-tma's kernel (its arguments
    stop before PDL: the launcher fills in the default), against the float64 reference."""
    _need_pdl()
    x = make_inputs(B=4, T=1, H=4, HV=8, K=128, V=128, device="cuda", seed=50)
    out, new = torch.empty_like(x.v), torch.empty_like(x.state)
    args = (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, new, False)
    if which == "fla-tma":
        from gdnzoo.backends import fla_tma
        compiled, grid0, tail, alloc = fla_tma.launch(*args)
        scratch, level = alloc.buffer, 0
    else:
        level = contract.PDL_LEVELS[which]
        compiled, grid0, tail = fla_recurrent.launch(*args, pdl=level)
        scratch = None
    fast = tlaunch.FastLaunch(compiled, grid0, tail, x.q.get_device(), scratch,
                              absent=tlaunch.NO_VERIFY)
    assert bool(fast.pdl) == bool(level)
    out.fill_(float("nan"))
    new.fill_(float("nan"))
    ptrs, _ = tlaunch.Dispatcher.pointers(x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b,
                                          out, new)
    fast(ptrs, x.scale)
    torch.cuda.synchronize()
    ref_out, ref_state = reference_outputs(x, False)
    assert_matches(out, new, ref_out, ref_state, torch.float32, f"FastLaunch {which}")


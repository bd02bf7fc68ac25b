"""The CUDA backends (cuda-v1, cuda-v4) without a GPU: their .cu sources compile with nvcc for
sm_90a and sm_100a under the same -D/-std options the runtime passes to NVRTC, and the Python
launchers marshal arguments, key their caches and pick launch shapes correctly.  In place vs
destination-passing is a runtime property (new_state == state), not a compile variant.
GPU tests at the end: CUDA-graph capture and replay with new data, strided views."""
from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from gdnzoo import cuda_build
from gdnzoo.backends import cuda_v1, cuda_v4
from gdnzoo.contract import Problem, validate
from gdnzoo.inputs import make_inputs

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
NVCC = shutil.which("nvcc")

# (source, state, io, a, b, dt_bias, K, l2norm, extra -D)
VARIANTS = [
    (cuda_v1.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, {}),
    (cuda_v1.SOURCE, BF16, F16, F16, BF16, BF16, 128, True, {}),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, False, dict(rw=2, vec16=1)),
    (cuda_v4.SOURCE, BF16, F16, F16, F16, BF16, 128, True, dict(rw=8, vec16=1)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 128, True, dict(rw=1, vec16=0)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 128, False, dict(rw=4, vec16=0)),
    (cuda_v4.SOURCE, F32, BF16, BF16, BF16, F32, 32, False, dict(rw=8, vec16=1)),
    (cuda_v4.SOURCE, BF16, BF16, BF16, BF16, F32, 256, True, dict(rw=4, vec16=1)),
]
ARCHS = [(9, 0), (10, 0)]


def _nvcc(src, defs, cc):
    cmd = [NVCC, *cuda_build.nvcc_args(defs, cc), "--cubin", "-o", "/dev/null", str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return cmd, r


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
def test_sources_compile_with_nvcc():
    jobs = []
    for src, sd, io, ad, bd, dd, K, l2, extra in VARIANTS:
        defs = cuda_build.defines(sd, io, ad, bd, dd, K, l2, **extra)
        jobs += [(src, defs, cc) for cc in ARCHS]
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda j: _nvcc(*j), jobs))
    failed = [f"{' '.join(cmd)}\n{r.stderr[-2000:]}" for cmd, r in results if r.returncode != 0]
    assert not failed, "nvcc failed:\n" + "\n\n".join(failed)


def test_nvcc_flags_match_nvrtc_options():
    defs = cuda_build.defines(F32, BF16, BF16, F16, F32, 128, True, rw=2, vec16=1)
    nvrtc = cuda_build.nvrtc_options(defs, "--gpu-architecture=sm_90a")
    nvcc = cuda_build.nvcc_args(defs, (9, 0))
    same = [o for o in nvrtc if o.startswith(("-D", "-std"))]
    assert same == [o for o in nvcc if o.startswith(("-D", "-std"))]
    assert "-DGDN_RW=2" in same and "-DGDN_L2NORM=1" in same and "-DGDN_B_DT=2" in same
    assert "-gencode=arch=compute_90a,code=sm_90a" in nvcc


def test_param_fields_mirror_the_c_struct():
    text = cuda_build.HEADER.read_text()
    body = re.search(r"struct GdnParams \{(.*?)\};", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            names += [n.strip().lstrip("*") for n in decl.split(None, 2)[-1].split(",")] \
                if decl.startswith("long long") else [decl.split()[-1].lstrip("*")]
    assert tuple(names) == cuda_build.PARAM_FIELDS
    assert cuda_build.PARAMS.size == 8 * len(names)


def _unpack(values):
    buf = bytearray(cuda_build.PARAMS.size)
    cuda_build.PARAMS.pack_into(buf, 0, *values)
    return dict(zip(cuda_build.PARAM_FIELDS, cuda_build.PARAMS.unpack(bytes(buf))))


def test_param_values_of_strided_views():
    x = make_inputs(B=3, T=2, H=2, HV=4, K=16, V=8)
    q = torch.zeros(3, 2, 5, 16)[:, :, 1:3]                 # a view: head stride 16, t stride 80
    out = torch.empty(3, 2, 4, 8)
    new_state = torch.empty(3, 4, 8, 16)
    vals = cuda_build.param_values(q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, 0.25,
                                   out, new_state, aux0=7)
    f = _unpack(vals)
    assert f["q"] == q.data_ptr() and f["new_state"] == new_state.data_ptr()
    assert (f["q_n"], f["q_t"], f["q_h"]) == q.stride()[:3] == (160, 80, 16)
    assert (f["s_n"], f["s_h"], f["s_v"]) == x.state.stride()[:3]
    assert (f["B"], f["T"], f["H"], f["HV"], f["V"], f["aux0"]) == (3, 2, 2, 4, 8, 7)
    assert f["scale"] == 0.25 and f["A_log_h"] == 1


def test_defines_and_arch_options():
    d = dict(cuda_build.defines(BF16, F16, F16, BF16, BF16, 64, True, rw=4))
    assert d == dict(GDN_K=64, GDN_STATE_DT=1, GDN_IO_DT=2, GDN_A_DT=2, GDN_B_DT=1, GDN_DTB_DT=1,
                     GDN_L2NORM=1, GDN_RW=4)
    assert cuda_build.arch_option((9, 0)) == ("--gpu-architecture=sm_90a", "cubin")
    assert cuda_build.arch_option((10, 0), {90, 100}) == ("--gpu-architecture=sm_100a", "cubin")
    assert cuda_build.arch_option((8, 9), {80, 89, 90}) == ("--gpu-architecture=sm_89", "cubin")
    assert cuda_build.arch_option((12, 5), {90, 100, 120}) == ("--gpu-architecture=compute_120", "ptx")


def test_cache_key_tracks_source_options_and_compiler():
    base = cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 0), "cubin")
    assert base == cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 0), "cubin")
    assert base != cuda_build.cache_key("src2", ["-DGDN_K=128"], (13, 0), "cubin")
    assert base != cuda_build.cache_key("src", ["-DGDN_K=64"], (13, 0), "cubin")
    assert base != cuda_build.cache_key("src", ["-DGDN_K=128"], (13, 1), "cubin")


def _problem(**kw):
    p = dict(B=1, T=1, H=4, HV=8, K=128, V=128, state_dtype=F32, io_dtype=BF16, device="cuda",
             cc=(9, 0))
    p.update(kw)
    return Problem(**p)


def test_supports_reasons():
    assert cuda_v1.supports(_problem()) == (True, "")
    assert cuda_v4.supports(_problem(state_dtype=BF16, B=512)) == (True, "")
    for mod, p, word in ((cuda_v1, _problem(device="cpu"), "CUDA"),
                         (cuda_v1, _problem(K=256, V=256), "K <= 128"),
                         (cuda_v1, _problem(V=512), "V <= 256"),
                         (cuda_v4, _problem(K=96, V=96), "K in"),
                         (cuda_v4, _problem(cc=(7, 5)), "8.0"),
                         (cuda_v4, _problem(B=2**28), "grid")):
        ok, why = mod.supports(p)
        assert not ok and word in why, (p.describe(), why)


def test_v4_config_table():
    for sd in (F32, BF16):
        rows = cuda_v4.CONFIG_TABLE[sd]
        his = [r[0] for r in rows]
        assert his[-1] is None and his[:-1] == sorted(his[:-1])
        for _, w, rw in rows:
            assert (w, rw) in cuda_v4.CANDIDATES
            assert rw * cuda_v4.rows_per_group(128, sd) <= 32
    assert cuda_v4.rows_per_group(128, F32) == 1 and cuda_v4.rows_per_group(128, BF16) == 2
    assert cuda_v4.rows_per_group(64, F32) == 2 and cuda_v4.rows_per_group(128, F32, False) == 1
    assert cuda_v4.blocks_per_head(128, 4, 2, 1) == 16 and cuda_v4.blocks_per_head(100, 4, 2, 2) == 7


@pytest.fixture
def fake_gpu(monkeypatch):
    """Replace compiling and launching by recorders; everything else runs as on a GPU."""
    compiled, launches = [], []

    def get_kernel(src, name, defs, dev):
        compiled.append((Path(src).name, name, dict(defs), dev))
        return ("kernel", len(compiled))

    monkeypatch.setattr(cuda_build, "get_kernel", get_kernel)
    monkeypatch.setattr(cuda_build, "launch",
                        lambda kern, grid, block, dev, values: launches.append(
                            (kern, grid, block, dev, _unpack(values))))
    monkeypatch.setattr(cuda_v1, "_plans", {})
    monkeypatch.setattr(cuda_v4, "_plans", {})
    return compiled, launches


def _call(mod, x, l2=False, inplace=True, **kw):
    B, T, H, K = x.q.shape
    HV, V = x.v.shape[2:]
    out = torch.empty(B, T, HV, V, dtype=x.v.dtype)
    ns = x.state if inplace else torch.empty_like(x.state)
    validate(*x.args(), out=out, new_state=ns, use_qk_l2norm=l2)
    mod.run(*x.args()[:-1], x.scale, out, ns, l2, **kw)
    return out, ns


def test_v4_launch_marshalling(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=1, H=4, HV=8)
    _call(cuda_v4, x)
    _call(cuda_v4, make_inputs(B=1, H=4, HV=8, seed=1))       # same shape: cached plan
    assert len(compiled) == 1 and len(launches) == 2
    src, name, defs, _ = compiled[0]
    assert (src, name) == ("cuda_v4.cu", "gdn_decode_v4")
    assert defs["GDN_VEC16"] == 1 and defs["GDN_STATE_DT"] == 0 and defs["GDN_L2NORM"] == 0
    w, rw = cuda_v4.pick_config(8, F32)
    kern, grid, block, _, f = launches[0]
    assert block == 32 * w and f["aux0"] == -(-128 // (w * rw)) and grid == 8 * f["aux0"]
    assert f["state"] == f["new_state"] == x.state.data_ptr()
    _, ns = _call(cuda_v4, x, inplace=False)                   # destination passing: same plan
    assert len(compiled) == 1 and launches[-1][4]["new_state"] == ns.data_ptr()
    _call(cuda_v4, x, l2=True)                                 # new variant
    assert len(compiled) == 2 and compiled[1][2]["GDN_L2NORM"] == 1
    _call(cuda_v4, x, config=(2, 8))
    assert launches[-1][2] == 64 and launches[-1][4]["aux0"] == 8


def test_v4_falls_back_to_element_loads_when_misaligned(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=2, H=2, HV=4, K=128, V=32, state_dtype=BF16)
    big = torch.zeros(2 * 4 * 32 * 128 + 1, dtype=BF16)
    x.state = big[1:].view(2, 4, 32, 128)                    # 2-byte offset: not 16-byte aligned
    _call(cuda_v4, x)
    assert compiled[-1][2]["GDN_VEC16"] == 0
    w, rw = cuda_v4.pick_config(8, BF16)
    assert launches[-1][4]["aux0"] == -(-32 // (w * rw))       # one row per group without vectors


def test_v1_launch_marshalling(fake_gpu):
    compiled, launches = fake_gpu
    x = make_inputs(B=3, T=2, H=2, HV=6, K=64, V=40, state_dtype=BF16)
    _call(cuda_v1, x, l2=True)
    assert compiled[0][2]["GDN_K"] == 64 and compiled[0][2]["GDN_L2NORM"] == 1
    kern, grid, block, _, f = launches[0]
    assert grid == 3 * 6 and block == 64 and (f["T"], f["H"], f["HV"]) == (2, 2, 6)


# ------------------------------------------------------------------------------------- GPU

def _gpu_ready():
    import importlib.util
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("cupy") is None:
        return "cupy not installed"
    return None


gpu = pytest.mark.skipif(_gpu_ready() is not None, reason=f"needs a GPU and CuPy: {_gpu_ready()}")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mod", [cuda_v1, cuda_v4], ids=["cuda-v1", "cuda-v4"])
@pytest.mark.parametrize("state_dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_graph_capture_and_replay_with_new_data(mod, state_dtype):
    from tests.helpers import assert_matches, reference64
    x = make_inputs(B=4, T=2, state_dtype=state_dtype, device="cuda", seed=1)
    out = torch.empty(4, 2, 8, 128, dtype=BF16, device="cuda")
    ns = torch.empty_like(x.state)
    args = lambda: (x.q, x.k, x.v, x.state, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, ns, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mod.run(*args())                                   # compile and load before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mod.run(*args())
    for seed in (2, 3):
        y = make_inputs(B=4, T=2, state_dtype=state_dtype, device="cuda", seed=seed)
        for name in ("q", "k", "v", "state", "a", "b"):
            getattr(x, name).copy_(getattr(y, name))
        out.fill_(float("nan"))
        ns.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ro, rs = reference64(y, True)
        assert_matches(out, ns, ro, rs, state_dtype, f"{mod.__name__} graph replay seed {seed}")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mod", [cuda_v1, cuda_v4], ids=["cuda-v1", "cuda-v4"])
def test_strided_views(mod):
    from tests.helpers import assert_matches, reference64
    x = make_inputs(B=3, T=2, state_dtype=F32, device="cuda", seed=4)
    ref_o, ref_s = reference64(x, False)
    qkv = torch.zeros(3, 2, 4 + 4 + 8 + 1, 128, dtype=BF16, device="cuda")   # fused qkv buffer
    q, k, v = qkv[:, :, 0:4], qkv[:, :, 4:8], qkv[:, :, 8:16]
    q.copy_(x.q), k.copy_(x.k), v.copy_(x.v)
    pool = torch.zeros(5, 8, 128, 128, device="cuda")[1:4]                    # offset slab
    pool.copy_(x.state)
    ab = torch.zeros(3, 2, 2, 8, dtype=BF16, device="cuda")
    a, b = ab[:, :, 0], ab[:, :, 1]
    a.copy_(x.a), b.copy_(x.b)
    out = torch.full((3, 2, 8, 2, 128), float("nan"), dtype=BF16, device="cuda")[:, :, :, 1]
    validate(q, k, v, pool, x.A_log, a, x.dt_bias, b, x.scale, out=out, new_state=pool)
    mod.run(q, k, v, pool, x.A_log, a, x.dt_bias, b, x.scale, out, pool, False)
    torch.cuda.synchronize()
    assert_matches(out, pool, ref_o, ref_s, F32, f"{mod.__name__} strided views")

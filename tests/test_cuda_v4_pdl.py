"""cuda-v4 with programmatic dependent launch (``pdl=``): GDN_PDL 1 (wait-first) and 2
(state-early) in the kernel, cuLaunchKernelEx in the launcher.

Without a GPU, from nvcc's PTX (sm_90a) of dense, pool and verify variants: every level
compiles (ptxas included); PDL off has no grid dependency instruction; wait-first issues ``griddepcontrol.wait`` before every global access; state-early
issues the state's loads (its slot indices, A_log, dt_bias) before the wait and q, k, v, a, b
and every store after it (a taint analysis of each access's address over the PTX registers);
the parameter block is the same at every level; sm_80 refuses PDL.  The launcher compiles and
keys one variant per level, launches PDL variants through cuLaunchKernelEx (warm dense path
included) and supports() refuses PDL below compute capability 9.0.

On a GPU, through ``gdnzoo.decode(algo="cuda-v4", pdl=...)``: "wait" and "early" write what
"off" writes, bit for bit (out, state, pool, intermediate states), dense, pool and verify, fp32
and bf16, B in {1, 16, 256}; a CUDA graph of [a producer kernel writing q, k, v, decode with
PDL] replayed with new data equals eager calls; state-early steps on one state with a kernel
launched without PDL between them equal the same steps without PDL and the reference.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import gdnzoo
from gdnzoo import gate
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import cuda_v4
from gdnzoo.contract import PDL_LEVELS
from gdnzoo.inputs import make_inputs, make_pool_case as make_case, make_problem
from gdnzoo.reference import reference_outputs
from gdnzoo.inputs import make_verify_case
from helpers import cuda_missing, record, run
from v4_defines import v4_defines

F32, BF16 = torch.float32, torch.bfloat16
NVCC = shutil.which("nvcc")
H100 = "NVIDIA H100 80GB HBM3"
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the "
                                                     "CUDA sources")


_defs = functools.partial(v4_defines, l2=True, HINT=3)   # PDL=level adds GDN_PDL


# Dense (registers with .nc state loads; runtime strides with the q/k lane-pair split; shared
# q/k; staged through shared memory with shared q/k; element loads with a tail of rows), pools
# (read = write slots; separate int64 write slots, T = 3) and verify (intermediate rows n with
# the final store; indexed rows, deferred; indexed rows with shared q/k, an H100 row where
# NVVM moved non-volatile state loads past the wait, and ptxas .nc ones; per-token slots with
# accepted counts; per-token slots staged at T = 1; every token at once (the chunk), and the
# token loop a token ahead, unrolled, rolled and with every token's q and k first).
VARIANTS = {
    "dense": dict(),
    "dense-strided-qks2": dict(sd=BF16, T=2, DENSE=0, QKS=2, LPR=8, W=4, HINT=2),
    "dense-qks1": dict(QKS=1, W=4, RW=1, LPR=4),
    "dense-smem-qks1": dict(SMEM=1, QKS=1, W=8, RW=8, LPR=16, HINT=2),
    "dense-elements-tail": dict(V=96, HV=64, GVA=4, W=4, RW=1, LPR=32, VEC16=0, HINT=0,
                                DENSE=0),
    "pool": dict(POOL=1, IDX64=0),
    "pool-separate": dict(sd=BF16, T=3, POOL=2, IDX64=3, W=1, RW=8),
    "verify-rows": dict(T=3, INTER=1, UPDATE=1),
    "verify-indexed-deferred": dict(T=2, sd=BF16, POOL=1, IDX64=4, INTER=2, UPDATE=0),
    "verify-indexed-qks1": dict(T=2, sd=BF16, W=1, RW=4, LPR=8, FAST=0, QKS=1, POOL=1, IDX64=4,
                                INTER=2, UPDATE=1),
    "verify-slots": dict(T=4, POOL=4, IDX64=9, INTER=0, UPDATE=1, QKS=1, W=4, LPR=8),
    "verify-slots-smem": dict(T=1, POOL=3, IDX64=0, INTER=0, UPDATE=1, SMEM=1, W=8, RW=8),
    "verify-chunk": dict(T=4, POOL=1, IDX64=4, INTER=2, UPDATE=0, W=4, RW=1, CHUNK=1),
    "verify-slots-chunk-regs": dict(T=2, POOL=4, IDX64=9, INTER=0, UPDATE=1, W=2, CHUNK=2),
    "verify-ahead": dict(T=4, INTER=1, UPDATE=1, W=1, RW=1, QKS=2, AHEAD=1),
    "verify-slots-ahead-rolled": dict(T=3, POOL=4, IDX64=9, INTER=0, UPDATE=1, QKS=2, AHEAD=2),
    "verify-pool-ahead-qk": dict(T=4, POOL=1, IDX64=4, INTER=2, UPDATE=0, QKS=2, AHEAD=3),
}
LEVELS = (0, 1, 2)
POINTERS = {"q", "k", "v", "a", "b", "A_log", "dt_bias", "state", "new_state", "out", "idx",
            "new_idx", "inter", "inter_idx", "accepted"}
EARLY = {"state", "idx", "new_idx", "accepted", "A_log", "dt_bias"}   # may precede the wait
PARAM = "gdn_decode_v4_param_0"


def _compile(src, defs, ptx, cc=(9, 0)):
    """nvcc's PTX of ``src`` at ``ptx``, then ptxas of it into the .cubin beside it; the
    returncode and stderr."""
    args = cuda_build.nvcc_args(defs, cc)
    r = subprocess.run([NVCC, *args, "--ptx", "-o", str(ptx), str(src)], capture_output=True,
                       text=True, timeout=300)
    if r.returncode == 0:
        gencode = [a for a in args if a.startswith("-gencode")]
        r = subprocess.run([NVCC, *gencode, "--cubin", "-o", str(Path(ptx).with_suffix(".cubin")),
                            str(ptx)], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stderr


def _nvdisasm():
    """nvdisasm: on PATH, or the copy Triton ships; None without either."""
    found = shutil.which("nvdisasm")
    spec = importlib.util.find_spec("triton")
    if found is None and spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
        found = str(bundled) if bundled.exists() else None
    return found


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """{(variant, level): PTX text} of the source and "dir": the folder that holds them and
    their cubins; compiled once for the module."""
    if NVCC is None:
        pytest.skip("nvcc not on PATH: cannot compile the CUDA sources")
    d = tmp_path_factory.mktemp("pdl_ptx")
    jobs = [(name, lvl) for name in VARIANTS for lvl in LEVELS]

    def job(j):
        name, lvl = j
        out = d / f"{name}-{lvl}.ptx"
        rc, err = _compile(cuda_v4.SOURCE, _defs(**VARIANTS[name], PDL=lvl), out)
        return (name, lvl), (out.read_text() if rc == 0 else None), err

    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(job, jobs))
    failed = [f"{k}: {err[-1500:]}" for k, text, err in results if text is None]
    assert not failed, "nvcc/ptxas failed:\n" + "\n\n".join(failed)
    texts = {k: text for k, text, _ in results}
    texts["dir"] = d
    return texts


def accesses(ptx_text):
    """The kernel's global loads and stores and its griddepcontrol instructions, in text
    order: (kind, pointers), kind "wait", "trigger", "ld" or "st", pointers the parameter
    block's pointer fields the address is computed from (followed through every register
    that a parameter load, or an instruction reading such a register, writes)."""
    fields = cuda_build.PARAM_FIELDS
    reg = re.compile(r"%[a-z]+\d+")
    insts = []
    for line in ptx_text.split(f"{cuda_v4.KERNEL}(")[1].splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if line.startswith("@"):                               # a predicate guard
            line = line.split(None, 1)[1]
        if line and not line.endswith(":") and not line.startswith((".", "{", "}", ")")):
            op, _, rest = line.partition(" ")
            insts.append((op, rest.strip()))
    # Registers holding the parameter block's address plus offsets: one pass in text order,
    # each register keeping every offset it is given (a merge after a branch sees them all).
    at = {}
    for op, rest in insts:
        m = re.fullmatch(r"(%rd\d+),\s*" + PARAM + r"(?:\+(\d+))?", rest)
        if op.startswith("mov") and m:
            at.setdefault(m.group(1), set()).add(int(m.group(2) or 0))
        m = re.fullmatch(r"(%rd\d+),\s*(%rd\d+)", rest)
        if op.startswith("mov") and m and m.group(2) in at:
            at.setdefault(m.group(1), set()).update(at[m.group(2)])
        m = re.fullmatch(r"(%rd\d+),\s*(%rd\d+),\s*(-?\d+)", rest)
        if op == "add.s64" and m and m.group(2) in at:
            at.setdefault(m.group(1), set()).update({o + int(m.group(3)) for o in at[m.group(2)]})

    def field(offset):
        return fields[offset // 8] if 0 <= offset < 8 * len(fields) else None

    taint = {}                  # register -> the pointer fields it derives from
    changed = True
    while changed:              # to a fixed point: loops carry registers backwards
        changed = False
        for op, rest in insts:
            if op.startswith(("st.", "bra", "setp", "griddepcontrol", "cp.async")):
                continue
            m = re.fullmatch(r"(%rd\d+),\s*\[(" + PARAM + r"|%rd\d+)(?:\+(-?\d+))?\]", rest)
            if op.startswith("ld.param") and m:
                bases = {0} if m.group(2) == PARAM else at.get(m.group(2), set())
                dsts = [m.group(1)]
                t = {field(b + int(m.group(3) or 0)) for b in bases} & POINTERS
            else:
                if rest.startswith("{"):                       # a vector destination
                    vec, _, srcs = rest[1:].partition("}")
                    dsts, srcs = reg.findall(vec), reg.findall(srcs)
                else:
                    regs = reg.findall(rest)
                    dsts, srcs = regs[:1], regs[1:]
                t = set().union(*(taint.get(r, set()) for r in srcs))
            for r in dsts:
                if not taint.get(r, set()) >= t:
                    taint[r] = taint.get(r, set()) | t
                    changed = True
    out = []
    for op, rest in insts:
        if op == "griddepcontrol.wait":
            out.append(("wait", set()))
        elif op == "griddepcontrol.launch_dependents":
            out.append(("trigger", set()))
        elif ".global" in op and op.startswith(("ld.", "st.", "cp.async")):
            addr = re.search(r"\[(%rd\d+)", rest).group(1)
            out.append(("st" if op.startswith("st.") else "ld", taint.get(addr, set())))
    return out


def _param_bytes(ptx_text):
    return int(ptx_text.split(f"{PARAM}[")[1].split("]")[0])


@needs_nvcc
def test_pdl_off_has_no_grid_dependency(ptx):
    for name in VARIANTS:
        assert "griddepcontrol" not in ptx[name, 0], name


@needs_nvcc
def test_parameter_block_is_the_same_at_every_level(ptx):
    for name in VARIANTS:
        sizes = {_param_bytes(ptx[name, lvl]) for lvl in LEVELS}
        assert sizes == {cuda_build.PARAMS.size}, (name, sizes)


@needs_nvcc
def test_wait_first_waits_before_any_global_access(ptx):
    for name in VARIANTS:
        acc = accesses(ptx[name, 1])
        kinds = [k for k, _ in acc]
        assert kinds[:2] == ["wait", "trigger"] and kinds.count("wait") == 1, (name, kinds[:4])
        assert "ld" in kinds and "st" in kinds, name


@needs_nvcc
def test_state_early_loads_the_state_before_the_wait(ptx):
    for name, cfg in VARIANTS.items():
        acc = accesses(ptx[name, 2])
        waits = [i for i, (k, _) in enumerate(acc) if k == "wait"]
        # one wait, and one more in front of a pool's padded sequences' zero out rows
        assert len(waits) == 1 + bool(cfg.get("POOL")), (name, len(waits))
        first, last = waits[0], waits[-1]
        assert acc[first + 1][0] == "trigger" and acc[last + 1][0] == "trigger", name
        before = acc[:last]
        for i, (kind, ptrs) in enumerate(before):
            if kind == "ld":
                assert ptrs <= EARLY, f"{name}: a load of {sorted(ptrs)} before the wait"
            elif kind == "st":     # only the padded branch's out rows, behind its own wait
                assert i > first and ptrs == {"out"}, f"{name}: store of {sorted(ptrs)} at {i}"
        loads_before = set().union(*(p for k, p in before if k == "ld"))
        assert {"state", "A_log", "dt_bias"} <= loads_before, (name, loads_before)
        if cfg.get("POOL"):
            assert loads_before & {"idx", "accepted"}, name
        after = acc[last:]
        assert not any("state" in p for k, p in after if k == "ld"), name   # all issued early
        loads_after = set().union(*(p for k, p in after if k == "ld"))
        assert {"q", "k", "v", "a", "b"} <= loads_after, (name, loads_after)
        if cfg.get("INTER") == 2:
            assert "inter_idx" in loads_after, name
        assert any(k == "st" for k, _ in after), name


@needs_nvcc
@pytest.mark.skipif(_nvdisasm() is None, reason="no nvdisasm (CUDA toolkit or Triton's copy)")
def test_the_machine_code_keeps_the_order(ptx):
    """ptxas keeps the wait (ACQBULK) where the PTX has it: wait-first accesses nothing
    before it; state-early issues exactly the PTX's early loads before it and stores nothing."""
    access = re.compile(r"\b(LDG|LDGSTS|STG|ACQBULK)\b")
    for name in VARIANTS:
        for lvl in (1, 2):
            cubin = ptx["dir"] / f"{name}-{lvl}.cubin"
            r = subprocess.run([_nvdisasm(), "-c", str(cubin)], capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 0, r.stderr[-1000:]
            ops = [m.group(1) for m in map(access.search, r.stdout.splitlines()) if m]
            head = ops[:ops.index("ACQBULK")]
            assert "STG" not in head, (name, lvl, head)
            if lvl == 1:
                assert head == [], (name, head)
            else:
                acc = accesses(ptx[name, 2])
                last = max(i for i, (k, _) in enumerate(acc) if k == "wait")
                early = sum(k == "ld" and p <= EARLY for k, p in acc[:last])
                assert len(head) == early, (name, head, early)


@needs_nvcc
@pytest.mark.parametrize("level", (1, 2))
@pytest.mark.parametrize("name", ("dense", "pool-separate", "verify-slots"))
def test_pdl_compiles_for_sm100a(tmp_path, name, level):
    rc, err = _compile(cuda_v4.SOURCE, _defs(**VARIANTS[name], PDL=level), tmp_path / "x.ptx",
                       cc=(10, 0))
    assert rc == 0, err[-1500:]


@needs_nvcc
@pytest.mark.parametrize("level", (1, 2))
def test_pdl_needs_sm90(tmp_path, level):
    rc, err = _compile(cuda_v4.SOURCE, _defs(PDL=level), tmp_path / "x.ptx", cc=(8, 0))
    assert rc != 0 and "needs sm_90" in err, err[-1000:]


@needs_nvcc
def test_pdl_levels_outside_0_to_2_fail(tmp_path):
    rc, err = _compile(cuda_v4.SOURCE, _defs(PDL=3), tmp_path / "x.ptx")
    assert rc != 0 and "GDN_PDL: 0 off" in err, err[-1000:]


# --------------------------------------------------------------- launcher (no GPU needed)

@pytest.fixture
def fake_gpu(monkeypatch):
    """Compiling and both driver launches replaced by recorders."""
    compiled, plain, pdl = [], [], []

    def get_kernel(src, name, defs, dev):
        compiled.append(dict(defs))
        return ("kernel", len(compiled))

    monkeypatch.setattr(cuda_build, "get_kernel", get_kernel)
    monkeypatch.setattr(cuda_build, "launch_raw",
                        lambda func, grid, block, dev, argv, shared=0: plain.append(func))
    monkeypatch.setattr(cuda_build, "launch_raw_pdl",
                        lambda config, func, dev, argv: pdl.append((config, func)))
    monkeypatch.setattr(cuda_v4, "_binds", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: H100)
    return compiled, plain, pdl


def _dense_args(B=2, T=1, state=None):
    x = make_inputs(B=B, T=T, seed=1)
    out = torch.empty(B, T, *x.v.shape[2:], dtype=x.v.dtype)
    st = x.state if state is None else state
    return (x.q, x.k, x.v, st, x.A_log, x.a, x.dt_bias, x.b, x.scale, out, st, False)


def test_each_level_its_own_variant_and_launch(fake_gpu):
    compiled, plain, pdl = fake_gpu
    args = _dense_args()
    recs = [record(*args, pdl=lvl) for lvl in LEVELS]
    bounds = [cuda_v4.bind(r) for r in recs]
    assert len({id(b) for b in bounds}) == 3 and cuda_v4.bind(record(*args, pdl=2)) is bounds[2]
    assert "GDN_PDL" not in compiled[0]          # off: the options (and cache files) of before
    assert [c.get("GDN_PDL") for c in compiled] == [None, 1, 2]
    assert {k: v for k, v in compiled[2].items() if k != "GDN_PDL"} == compiled[0]
    assert bounds[0].vec16.pdl is None
    for b in bounds[1:]:
        cfg = b.vec16.pdl
        assert (cfg.grid, cfg.block, cfg.shared) == (b.vec16.grid, b.vec16.block, 0)
    bounds[0](recs[0])
    assert (len(plain), len(pdl)) == (1, 0)
    bounds[1](recs[1])
    bounds[2](recs[2])
    assert (len(plain), len(pdl)) == (1, 2) and pdl[0][1] == ("kernel", 2)
    # The warm dense path (gdnzoo.decode's pointers) launches through cuLaunchKernelEx too.
    ptrs = [t.data_ptr() for t in args[:8]] + [args[9].data_ptr(), 0]
    assert bounds[2].with_pointers(ptrs, args[8]) is True
    assert (len(plain), len(pdl)) == (1, 3) and pdl[-1][1] == ("kernel", 3)
    assert bounds[0].with_pointers(ptrs, args[8]) is True and len(plain) == 2


def test_pool_verify_and_element_loads_with_pdl(fake_gpu):
    compiled, plain, pdl = fake_gpu
    case = make_case(B=3, T=2, seed=2, separate_write=True)
    x = case.x
    out = torch.empty(3, 2, *x.v.shape[2:], dtype=x.v.dtype)
    run(cuda_v4, *x.args(), out, x.state, False, case.pool(), pdl=2)
    assert (compiled[-1]["GDN_POOL"], compiled[-1]["GDN_PDL"]) == (2, 2) and len(pdl) == 1
    vcase = make_verify_case("slots", B=3, T=3, seed=3)
    vx = vcase.x
    vout = torch.empty(3, 3, *vx.v.shape[2:], dtype=vx.v.dtype)
    run(cuda_v4, *vx.args(), vout, vx.state, False, vcase.pool(), vcase.verify(), pdl=1)
    assert (compiled[-1]["GDN_POOL"], compiled[-1]["GDN_PDL"]) == (4, 1) and len(pdl) == 2
    # A state one element off 16-byte alignment: the element-load variant, PDL as well.
    dense = make_inputs(B=2, seed=4).state
    shifted = torch.zeros(dense.numel() + 1)[1:].view(dense.shape)
    run(cuda_v4, *_dense_args(state=shifted), pdl=2)
    assert (compiled[-1]["GDN_VEC16"], compiled[-1]["GDN_PDL"]) == (0, 2) and len(pdl) == 3
    assert not plain


def test_bad_level_raises(fake_gpu):
    with pytest.raises(ValueError, match="pdl"):
        cuda_v4.bind(record(*_dense_args())._replace(pdl=3))


def _problem(**kw):
    return make_problem(**{"B": 4, **kw})


def test_supports_refuses_pdl_below_sm90():
    for level in ("wait", "early"):
        assert cuda_v4.supports(_problem(pdl=level)) == (True, "")
        assert cuda_v4.supports(_problem(pdl=level, cc=(10, 0))) == (True, "")
        ok, why = cuda_v4.supports(_problem(pdl=level, cc=(8, 9)))
        assert not ok and "programmatic dependent launch needs compute capability >= 9.0" in why
        ok, why = cuda_v4.supports(_problem(pdl=level, device="cpu", cc=None))
        assert not ok and "CUDA" in why
    assert cuda_v4.supports(_problem(cc=(8, 9))) == (True, "")        # PDL off: as before


# ------------------------------------------------------------------------------------- GPU

needs_gpu = pytest.mark.skipif(cuda_missing((9, 0)) is not None,
                               reason=f"cuda-v4 PDL runs need a GPU of compute capability >= "
                                      f"9.0 and CuPy: {cuda_missing((9, 0))}")
PDL_ON = ("wait", "early")


def _case(form, B, sd, seed):
    """(call(pdl), buffers it writes): one decode of a fresh, seeded case on a dense state, a
    pool (separate write slots, padding) or a verify call (intermediate states with the final
    store, or per-token slots; padding)."""
    kw = {}
    if form == "dense":
        x = make_inputs(B=B, T=1, state_dtype=sd, device="cuda", seed=seed)
        T, written = 1, [x.state]
    elif form == "pool":
        c = make_case(B=B, T=2, state_dtype=sd, device="cuda", seed=seed, pad="null",
                      separate_write=True)
        x, T, kw, written = c.x, 2, c.kwargs(), [c.buf]
    else:
        c = make_verify_case(form, B=B, T=3, H=4, HV=8, state_dtype=sd, device="cuda",
                             seed=seed, pad="neg", update=True)
        x, T, kw = c.x, 3, c.kwargs()
        written = [c.buf] + ([c.inter_buf] if c.inter_buf is not None else [])
    out = torch.full((B, T, *x.v.shape[2:]), float("nan"), dtype=x.v.dtype, device="cuda")

    def call(pdl):
        gdnzoo.decode(*x.args(), out=out, use_qk_l2norm=True, algo="cuda-v4", pdl=pdl, **kw)
    return call, [out, *written]


def _bound_levels():
    return {b.pdl for b in cuda_v4._binds.values()}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("B", (1, 16, 256))
@pytest.mark.parametrize("sd", (F32, BF16), ids=("fp32", "bf16"))
@pytest.mark.parametrize("form", ("dense", "pool", "states", "slots"))
def test_pdl_writes_what_pdl_off_writes(form, sd, B):
    call, ref = _case(form, B, sd, seed=B)
    call("off")
    for pdl in PDL_ON:
        call_pdl, got = _case(form, B, sd, seed=B)
        call_pdl(pdl)
        torch.cuda.synchronize()
        assert PDL_LEVELS[pdl] in _bound_levels(), f"no cuda-v4 launcher with pdl={pdl}"
        for name, r, g in zip(("out", "state", "intermediate"), ref, got):
            assert torch.equal(r, g), f"{form} {sd} B={B} pdl={pdl}: {name} differs from off"


def _producer(src, dst):
    """A kernel launched without PDL that writes dst: 2 * src, exact in every dtype."""
    torch.mul(src, 2, out=dst)


class Steps:
    """Decode steps on one state (dense, or a pool with padding), each behind a producer
    kernel that writes q, k, v, a, b from this step's sources."""

    def __init__(self, form, B, sd, seed, steps):
        self.form = form
        c = make_case(B=B, T=1, state_dtype=sd, device="cuda", seed=seed, pad="neg")
        self.case, self.x = c, c.x
        if form == "dense":
            self.x.state = make_inputs(B=B, state_dtype=sd, device="cuda", seed=seed).state
        self.kw = c.kwargs() if form == "pool" else {}
        self.srcs = [make_inputs(B=B, device="cuda", seed=seed + 1 + i) for i in range(steps)]
        self.out = torch.empty(B, 1, *self.x.v.shape[2:], dtype=self.x.v.dtype, device="cuda")

    def state_storage(self):
        return self.case.buf if self.form == "pool" else self.x.state

    def run(self, pdl, last=None):
        """Every step; ``last``: called before the last step's decode."""
        x = self.x
        for i, s in enumerate(self.srcs):
            for name in ("q", "k", "v", "a", "b"):
                _producer(getattr(s, name), getattr(x, name))
            if last is not None and i == len(self.srcs) - 1:
                last()
            gdnzoo.decode(*x.args(), out=self.out, algo="cuda-v4", pdl=pdl, **self.kw)

    def load(self, other):
        """This case's sources, A_log, dt_bias, state and indices from ``other`` (same
        shapes)."""
        for mine, theirs in zip(self.srcs, other.srcs):
            for name in ("q", "k", "v", "a", "b"):
                getattr(mine, name).copy_(getattr(theirs, name))
        self.x.A_log.copy_(other.x.A_log)
        self.x.dt_bias.copy_(other.x.dt_bias)
        self.state_storage().copy_(other.state_storage())
        self.case.idx.copy_(other.case.idx)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("pdl", PDL_ON)
@pytest.mark.parametrize("form", ("dense", "pool"))
def test_graph_of_producer_and_decode(form, pdl):
    """[producer, decode with PDL] twice on one state, captured and replayed with new sources,
    state and slots, writes what the same steps made eagerly without PDL write."""
    graphed = Steps(form, 16, F32, 200, steps=2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graphed.run(pdl)                               # compile and bind before the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed.run(pdl)
    for seed in (210, 220):
        eager = Steps(form, 16, F32, seed, steps=2)
        graphed.load(eager)
        graphed.out.fill_(float("nan"))
        eager.run("off")
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(graphed.out, eager.out), f"{form} pdl={pdl} replay {seed}: out"
        assert torch.equal(graphed.state_storage(), eager.state_storage()), \
            f"{form} pdl={pdl} replay {seed}: state"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("form", ("dense", "pool"))
def test_state_early_with_a_plain_kernel_between_steps(form):
    """The condition of state-early: a kernel launched without PDL (the producer) between two
    decodes of one state.  Twelve such steps at B=256 (long decodes, short producers) write
    what the same steps without PDL write, bit for bit, and the last step matches the float64
    reference from the state before it."""
    early, off = Steps(form, 256, F32, 300, steps=12), Steps(form, 256, F32, 300, steps=12)
    early.run("early")
    before = []
    off.run("off", last=lambda: before.append(off.x.state.clone()))
    torch.cuda.synchronize()
    assert torch.equal(early.out, off.out), f"{form}: state-early out differs from PDL off"
    assert torch.equal(early.state_storage(), off.state_storage()), \
        f"{form}: state-early state differs from PDL off"
    x = dataclasses.replace(off.x, state=before[0])
    pool = off.case.pool() if form == "pool" else None
    ref_out, ref_state = reference_outputs(x, False, pool=pool)
    j = gate.judge(off.out, off.x.state, ref_out, ref_state, state_dtype=F32)
    assert j.ok, f"{form}: the last step against the reference: {j.reason}"

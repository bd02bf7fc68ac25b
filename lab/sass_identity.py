"""Whether two source trees compile cuda-v4 to the same machine code, launch row by launch row.

    python3 -m lab.sass_identity [--before REF] [--after DIR] [--arch sm_90a] [--jobs N]
                                 [--every N] [--log FILE]

The calls: for every cuda-v4 row of the launch tables (``backends/tables/*.yaml`` of the after
tree), the calls that row serves, at the file's measured geometry, B the row's least batch and
T the row's ``tokens`` (and the largest T its row set serves, 16 for the open last set):

* a decode row (``inplace``, ``dest``, ``any``: each of its modes): a dense state with 16-byte
  aligned tensors and again with q misaligned (the element-load variant), with programmatic
  dependent launch 1 and 2, in a state pool (read and write slots alike with int32 indices, or
  separate int64 write slots, by turns), and the engines' packed q/k/v and a/b views (their
  strides compiled in) or no L2 norm, by turns;
* a verify row: intermediate states on a dense state (rows n, deferred commit; with the final
  store and PDL 1; with the final store and no L2 norm), on a pool (indexed int64 rows with the
  final store and separate write slots; int32 rows, packed views), per-token slots with int64
  accepted counts, without counts, and with int32 counts and PDL 2, each also misaligned where
  marked (the first), so a tensor-core row (cuda_v4_tc.cu) is checked in every form it serves
  and in its token-loop fallback;
* cuda-v1 (no launch rows; it shares gdn_common.cuh): fp32 and bf16 states, bf16 and fp16
  q/k/v, K 64 and 128, with and without the L2 norm.

Each tree's own host code names the variants (source, kernel, -D constants): ``cuda_v4.run``
with compiling and launching replaced by a recorder, in a subprocess that imports that tree's
gdnzoo.  Every distinct variant is compiled with nvcc (``-cubin -arch``, the include path and
-D constants of the backend) and disassembled with ``cuobjdump -sass`` (Triton's wheel), and
each call's variants are compared between the trees: the -D constants and the SASS text,
byte for byte, after dropping only lines that name a file.  ``--every N`` keeps every N-th
call (a quick look while editing).  SASS hashes are cached under ``$GDNZOO_CACHE_DIR`` (else
~/.cache/gdnzoo)/sass_identity, keyed by the tree's CUDA sources, the variant and nvcc.

Prints a table (per source: variants compared, identical, different) and every difference;
exit status 1 on any difference.  Needs nvcc; no GPU.  It drives ``run`` of either backend
protocol (the decode call record, or the positional form before it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKEND = "cuda-v4"


# ------------------------------------------------------------------------------------ calls

def _set_bounds(rows):
    """{(state, mode, tokens): the largest T the row set serves (None: no limit)}."""
    tokens = {}
    for r in rows:
        tokens.setdefault(r["state"], set()).add(r["tokens"])
    out = {}
    for r in rows:
        above = [t for t in tokens[r["state"]] if t > r["tokens"]]
        out[r["state"], r["mode"], r["tokens"]] = min(above) - 1 if above else None
    return out


def calls(tables_dir: Path) -> list[dict]:
    """The calls of every cuda-v4 row (the module docstring), each a dict of plain values."""
    import yaml
    out = []
    for path in sorted(tables_dir.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        rows = [r for r in data["rows"] if r["backend"] == BACKEND]
        bounds = _set_bounds(rows)
        for i, r in enumerate(rows):
            geo = {**data["measured_at"], **(r.get("geometry") or {})}
            last = bounds[r["state"], r["mode"], r["tokens"]]
            last = 16 if last is None and r["tokens"] > 1 else last
            Ts = [r["tokens"]] + ([last] if last and last > r["tokens"] else [])
            base = dict(gpu=data["gpu"], sd=r["state"], B=r["batch"][0], **geo, pdl=0,
                        aligned=True, packed=False, l2=True, pool=None, verify=None,
                        row=f"{path.stem}:{i} {r['state']} {r['mode']} tokens {r['tokens']} "
                            f"batch {r['batch'][0]}..{r['batch'][1] or ''}")
            for T in Ts:
                extra = T != r["tokens"]           # the largest T: the first form only
                if r["mode"] == "verify":
                    out += [dict(base, T=T, **f) for f in _verify_forms(i)[:1 if extra else None]]
                    continue
                for mode in (("inplace", "dest") if r["mode"] == "any" else (r["mode"],)):
                    out += [dict(base, T=T, inplace=mode == "inplace", **f)
                            for f in _decode_forms(i)[:1 if extra else None]]
    for i, (sd, io, K, l2) in enumerate([("fp32", "bf16", 128, False), ("bf16", "fp16", 128, True),
                                         ("fp32", "bf16", 64, True), ("bf16", "bf16", 64, False)]):
        out.append(dict(backend="cuda-v1", gpu="", sd=sd, io=io, B=2, T=1 + i % 3, H=4, HV=8,
                        K=K, V=K, pdl=0, aligned=True, packed=False, l2=l2, pool=None,
                        verify=None, inplace=i % 2 == 0, form="dense", row="cuda-v1"))
    for c in out:
        c["label"] = f"{c['row']} | {_form_name(c)}"
    return out


def _decode_forms(i):
    pool = dict(same=True, idx64=False) if i % 2 == 0 else dict(same=False, idx64=True)
    return [dict(form="dense", aligned=False), dict(form="pdl1", pdl=1),
            dict(form="pdl2", pdl=2), dict(form="pool", pool=pool),
            dict(form="packed", packed=True) if i % 2 == 0 else dict(form="no-l2", l2=False)]


def _verify_forms(i):
    pool32 = dict(same=True, idx64=False)
    states = dict(per_token=False, indexed=False, update=False, idx64=False)
    slots = dict(per_token=True, accepted=True, idx64=True)
    return [
        dict(form="states-dense", aligned=False, inplace=True, verify=states),
        dict(form="states-pool-update", inplace=True, pool=dict(same=False, idx64=True),
             verify=dict(states, indexed=True, update=True, idx64=True)),
        dict(form="states-pool-packed", inplace=True, pool=pool32, packed=True,
             verify=dict(states, indexed=True)),
        dict(form="states-dense-update-pdl1", inplace=False, pdl=1,
             verify=dict(states, update=True)),
        dict(form="states-dense-update-no-l2", inplace=True, l2=False,
             verify=dict(states, update=True)),
        dict(form="slots-acc64", inplace=True, pool=pool32, verify=slots),
        dict(form="slots-no-acc", inplace=True, pool=dict(same=True, idx64=True),
             verify=dict(slots, accepted=False)),
        dict(form="slots-acc32-pdl2", inplace=True, pool=pool32, pdl=2,
             verify=dict(slots, idx64=False)),
    ]


def _form_name(c):
    return (f"{'in place' if c['inplace'] else 'dest'} T={c['T']} B={c['B']} {c['form']}"
            f"{'' if c['aligned'] else ' (+ element loads)'}")


# ----------------------------------------------------------------- a tree's host code (worker)

def _import_tree(tree: Path):
    """Make ``import gdnzoo`` import ``tree``'s package (gdnzoo/ with backends/ and bench/ as
    its subpackages, as pyproject maps them)."""
    root = Path(tempfile.mkdtemp(prefix="sass_identity_pkg"))
    pkg = root / "gdnzoo"
    pkg.mkdir()
    for p in (tree / "gdnzoo").iterdir():
        (pkg / p.name).symlink_to(p)
    for sub in ("backends", "bench"):
        (pkg / sub).symlink_to(tree / sub)
    sys.path.insert(0, str(root))
    return root


def _tensors(c):
    import torch
    from gdnzoo.pool import Pool
    from gdnzoo.verify import Verify
    B, T, H, HV, K, V = c["B"], c["T"], c["H"], c["HV"], c["K"], c["V"]
    io, f32 = {"bf16": torch.bfloat16, "fp16": torch.float16}[c.get("io", "bf16")], torch.float32
    sd = f32 if c["sd"] == "fp32" else torch.bfloat16
    if c["packed"]:                       # the engines' views of one projection
        m = torch.empty(B, T, 2 * H * K + HV * V, dtype=io)
        q, k = m[..., :H * K].unflatten(2, (H, K)), m[..., H * K:2 * H * K].unflatten(2, (H, K))
        v = m[..., 2 * H * K:].unflatten(2, (HV, V))
        g = torch.empty(B, T, 2 * HV, dtype=io)
        a, b = g[..., :HV], g[..., HV:]
    else:
        q, k = torch.empty(B, T, H, K, dtype=io), torch.empty(B, T, H, K, dtype=io)
        v = torch.empty(B, T, HV, V, dtype=io)
        a, b = torch.empty(B, T, HV, dtype=io), torch.empty(B, T, HV, dtype=io)
    A_log, dt_bias = torch.empty(HV, dtype=f32), torch.empty(HV, dtype=f32)
    out = torch.empty(B, T, HV, V, dtype=io)
    ver, pool, vf = None, None, c["verify"]
    slots = B + 3 if c["pool"] else B
    state = torch.empty(slots, HV, V, K, dtype=sd)
    new_state = state if c["inplace"] else torch.empty_like(state)
    if c["pool"]:
        idt = torch.int64 if c["pool"]["idx64"] else torch.int32
        read = torch.arange(B * T if vf and vf["per_token"] else B, dtype=idt)
        read = read.view(B, T) if vf and vf["per_token"] else read
        write = read if c["pool"]["same"] else torch.arange(1, B + 1, dtype=idt)
        pool = Pool(read, write, -1)
    if vf is not None:
        idt = torch.int64 if vf["idx64"] else torch.int32
        if vf["per_token"]:
            acc = torch.ones(B, dtype=idt) if vf["accepted"] else None
            ver = Verify(None, None, True, True, acc)
        else:
            states = torch.empty(B, T, HV, V, K, dtype=sd)
            ver = Verify(states, torch.arange(B, dtype=idt) if vf["indexed"] else None,
                         vf["update"], False, None)
    args = [q, k, v, state, A_log, a, dt_bias, b, K ** -0.5, out, new_state, c["l2"]]
    misaligned = None
    if not c["aligned"]:                  # the same signature, q 2 bytes off 16
        buf = torch.empty(q.numel() + 8, dtype=io)
        misaligned = list(args)
        misaligned[0] = buf[1:1 + q.numel()].view(q.shape)
    return args, misaligned, pool, ver


def call_record(name, args, pool=None, verify=None, pdl=0):
    """The decode call record (gdnzoo.contract.Call) of backend ``name`` for the positional
    form ``args`` (q .. use_qk_l2norm), ``pool``, ``verify`` and ``pdl``: the other fields at the
    operation's defaults, no Problem (a backend's bind and launch do not read it)."""
    from gdnzoo.contract import Call
    from gdnzoo.operation import DECODE
    named = dict({a.name: a.default for a in DECODE.args}, **dict(zip(DECODE.names, args)),
                 algo=name, state_indices=None if pool is None else pool.read,
                 new_state_indices=None if pool is None else pool.write,
                 null_slot=-1 if pool is None else pool.null_slot,
                 intermediate_states=None if verify is None else verify.states,
                 intermediate_indices=None if verify is None else verify.indices,
                 update_state=True if verify is None else verify.update,
                 num_accepted_tokens=None if verify is None else verify.accepted, pdl=pdl)
    return Call(**named, problem=None, pool=pool, verify=verify)


def takes_record(mod) -> bool:
    """Whether backend module ``mod``'s run takes the call record (else the positional form
    of the trees before it)."""
    import inspect
    return next(iter(inspect.signature(mod.run).parameters)) == "call"


def backend_run(mod):
    """``mod.run`` as ``run(*positional, pool=, verify=, pdl=)`` on either protocol."""
    name = mod.__name__.rsplit(".", 1)[1].replace("_", "-")
    if not takes_record(mod):
        return lambda *args, pool=None, verify=None, pdl=0: (
            mod.run(*args) if name == "cuda-v1" else
            mod.run(*args, pool=pool, verify=verify, pdl=pdl))
    return lambda *args, pool=None, verify=None, pdl=0: mod.run(
        call_record(name, args, pool, verify, pdl))


def worker(tree: Path):
    """Read calls (JSON) on stdin; write, per call, the variants ``tree``'s cuda_v4 builds."""
    _import_tree(tree)
    import types

    import torch
    from gdnzoo.backends import cuda_v1, cuda_v4
    # The plumbing module cuda_v4 compiles and launches through, whatever its name.
    build = next(m for m in vars(cuda_v4).values() if isinstance(m, types.ModuleType)
                 and hasattr(m, "get_kernel") and hasattr(m, "Launch"))
    assert Path(cuda_v4.__file__).resolve().is_relative_to(tree.resolve()), cuda_v4.__file__
    made, gpu = [], [""]

    def get_kernel(src, name, defs, dev):
        made.append([Path(src).name, name, [list(d) for d in defs]])
        return types.SimpleNamespace(func=0)

    build.get_kernel = get_kernel
    build.launch_raw = lambda *a, **kw: None
    build.launch_raw_pdl = lambda *a, **kw: None
    torch.cuda.get_device_name = lambda *a, **kw: gpu[0]
    run_v1, run_v4 = backend_run(cuda_v1), backend_run(cuda_v4)
    result = []
    for c in json.load(sys.stdin):
        gpu[0] = c["gpu"]
        del made[:]
        for mod in (cuda_v1, cuda_v4):            # a bound launcher's key has no GPU name
            mod._binds.clear()
        args, misaligned, pool, ver = _tensors(c)
        if c.get("backend") == "cuda-v1":
            run_v1(*args)
            calls_v4 = ()
        else:
            calls_v4 = [x for x in (args, misaligned) if x is not None]
        for call in calls_v4:
            run_v4(*call, pool=pool, verify=ver, pdl=c["pdl"])
        result.append(list(made))
    json.dump(result, sys.stdout)


def variants_of(tree: Path, cs) -> list:
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(tree)],
                       input=json.dumps(cs), capture_output=True, text=True, cwd=tree)
    if r.returncode:
        raise RuntimeError(f"the host code of {tree} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout)


# --------------------------------------------------------------------------------- compiling

def _tools():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda-13.0/bin/nvcc"
    import triton
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return nvcc, str(cuobjdump), version


def sources_hash(tree: Path, src: str) -> str:
    """A hash of ``src`` and every header beside it (what its variants are compiled from)."""
    h = hashlib.sha256()
    for p in [tree / "backends" / src, *sorted((tree / "backends").glob("*.cuh"))]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\1")
    return h.hexdigest()


def cache_dir() -> Path:
    base = os.environ.get("GDNZOO_CACHE_DIR") or Path.home() / ".cache" / "gdnzoo"
    return Path(base) / "sass_identity"


def build_key(tree, src, defs, arch, version) -> str:
    """The cache key of one variant: its source and the headers beside it, its -D constants,
    the architecture and nvcc (not the tree's path: equal sources compile alike)."""
    return hashlib.sha256(json.dumps([sources_hash(tree, src), src, arch, list(map(list, defs)),
                                      version]).encode()).hexdigest()[:40]


def sass(tree, src, defs, arch, tools, key):
    """(sha256 of the SASS text, instruction count) of one variant, cached under ``key``;
    (None, error) where nvcc fails."""
    nvcc, cuobjdump, _ = tools
    path = cache_dir() / f"{key}.json"
    if path.exists():
        return tuple(json.loads(path.read_text()))
    opts = ["-std=c++17", f"-arch={arch}", "-cubin", f"-I{tree / 'backends'}",
            *(f"-D{n}={v}" for n, v in defs)]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "v.cubin"
        r = subprocess.run([nvcc, *opts, "-o", str(cubin), str(tree / "backends" / src)],
                           capture_output=True, text=True)
        if r.returncode:
            return None, r.stderr[-2000:]
        text = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    lines = [ln for ln in text.splitlines() if tmp not in ln and src not in ln]
    result = (hashlib.sha256("\n".join(lines).encode()).hexdigest(),
              sum(1 for ln in lines if ln.lstrip().startswith("/*") and "*/ " in ln))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def snapshot(tree: Path) -> Path:
    """A copy of ``tree``'s CUDA sources, compiled in place of the tree's own files, so that an
    edit during a run neither reaches a build nor a cache entry keyed by the sources before."""
    dest = Path(tempfile.mkdtemp(prefix="sass_identity_src")) / "backends"
    dest.mkdir()
    for pat in ("*.cu", "*.cuh"):
        for p in (tree / "backends").glob(pat):
            shutil.copy2(p, dest / p.name)
    return dest.parent


def tree_of(ref: str) -> Path:
    """``ref``'s backends/, gdnzoo/, bench/ extracted (git archive), cached by commit."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], capture_output=True,
                         text=True, check=True).stdout.strip()
    dest = cache_dir() / "trees" / sha
    if not (dest / "backends").exists():
        dest.mkdir(parents=True, exist_ok=True)
        arch = subprocess.run(["git", "-C", str(REPO), "archive", sha, "backends", "gdnzoo",
                               "bench"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest


# ------------------------------------------------------------------------------------ report

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="git ref (default: merge-base of HEAD and main)")
    ap.add_argument("--after", default=str(REPO), help="a source tree (default: this checkout)")
    ap.add_argument("--arch", default="sm_90a", help="nvcc -arch (default sm_90a: what NVRTC "
                                                     "builds on the H100 and H200)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--every", type=int, default=1, help="keep every N-th call")
    ap.add_argument("--log", default=None, help="also write the report to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(Path(a.worker))
    ref = a.before or subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
                                     capture_output=True, text=True, check=True).stdout.strip()
    before, after = tree_of(ref), Path(a.after).resolve()
    lines = []

    def log(*parts):
        lines.append(" ".join(map(str, parts)))
        print(lines[-1], flush=True)

    sources = {"before": snapshot(before), "after": snapshot(after)}
    cs = calls(after / "backends" / "tables")[::a.every]
    tools = _tools()
    log(f"before: {ref} = {before.name[:12]}; after: {after} at {_head(after)}"
        f"{' with uncommitted changes to backends/' if _dirty(after) else ''}")
    log(f"nvcc: {tools[2].strip().splitlines()[-1]}; -arch={a.arch}; {len(cs)} calls")
    vb, va = variants_of(before, cs), variants_of(after, cs)
    trees = sources                                   # compiled from the snapshots
    keys = {(side, v[0], tuple(map(tuple, v[2]))): None for side, vs in (("before", vb),
            ("after", va)) for made in vs for v in made}
    for side, src, defs in keys:
        keys[side, src, defs] = build_key(trees[side], src, defs, a.arch, tools[2])
    todo = {k: t for t, k in keys.items()}          # one build per key
    log(f"{len(keys)} (tree, variant) pairs, {len(todo)} distinct builds, {a.jobs} at a time")
    with ThreadPoolExecutor(a.jobs) as ex:
        built = dict(zip(todo, ex.map(lambda k: sass(trees[todo[k][0]], todo[k][1],
                                                     todo[k][2], a.arch, tools, k), todo)))
    done = {t: built[k] for t, k in keys.items()}
    compared, same, diffs, seen = Counter(), Counter(), [], set()
    for c, mb, ma in zip(cs, vb, va):
        if len(mb) != len(ma):
            diffs.append(f"{c['label']}: {len(mb)} variants before, {len(ma)} after")
            continue
        for b, x in zip(mb, ma):
            kb, ka = ("before", b[0], tuple(map(tuple, b[2]))), ("after", x[0],
                                                                  tuple(map(tuple, x[2])))
            if (kb, ka) in seen:
                continue
            seen.add((kb, ka))
            src = x[0]
            compared[src] += 1
            sb, sa = done[kb], done[ka]
            why = []
            if b[:2] != x[:2]:
                why.append(f"kernel {b[:2]} -> {x[:2]}")
            if kb[2] != ka[2]:
                db, da = dict(kb[2]), dict(ka[2])
                why.append("-D " + ", ".join(f"{n}: {db.get(n)} -> {da.get(n)}"
                                             for n in sorted(set(db) | set(da))
                                             if db.get(n) != da.get(n)))
            if sb[0] is None or sa[0] is None:
                why.append(f"nvcc failed: {(sb if sb[0] is None else sa)[1]}")
            elif sb[0] != sa[0]:
                why.append(f"SASS differs ({sb[1]} -> {sa[1]} instructions)")
            if why:
                diffs.append(f"{c['label']}: {src}: {'; '.join(why)}")
            else:
                same[src] += 1
    log("")
    log(f"{'source':<16} {'variants':>9} {'identical':>10} {'different':>10}")
    for src in sorted(compared):
        log(f"{src:<16} {compared[src]:>9} {same[src]:>10} {compared[src] - same[src]:>10}")
    log(f"{'all':<16} {sum(compared.values()):>9} {sum(same.values()):>10} "
        f"{sum(compared.values()) - sum(same.values()):>10}")
    sizes = sorted(s[1] for s in done.values() if s[0] is not None)
    if sizes:
        log(f"instructions a variant: {sizes[0]} .. {sizes[-1]}")
    for d in diffs:
        log("DIFFERENT", d)
    if a.log:
        Path(a.log).write_text("\n".join(lines) + "\n")
    return 1 if diffs else 0


def _head(tree: Path) -> str:
    r = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "(not a git checkout)"


def _dirty(tree: Path) -> bool:
    r = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "backends"],
                       capture_output=True, text=True)
    return bool(r.stdout.strip())


if __name__ == "__main__":
    sys.exit(main())

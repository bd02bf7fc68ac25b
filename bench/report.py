"""Benchmark results: one schema of long-format rows for every mode, the table built from the
measured rows (derived columns), the environment, and the one writer and reader of
``results.csv`` / ``results.json``.

A row is keyed by ``bench`` (the ``gdnzoo bench --mode`` that measured it), ``backend`` (the
entry), the shape (B, T, H, HV, K, V), ``state_dtype``, ``mode`` (the call's form: inplace,
dest, pool, a verify form, a PDL level), ``l2norm``, a mode's own key columns, and ``clock``.
Files written before ``bench`` and the automatic-choice columns existed load as they are: the
reader infers ``bench`` from ``mode`` (:data:`LEGACY_BENCH`)."""
from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import json
import os
import math
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from gdnzoo import gate
from gdnzoo.bench import clocks
from gdnzoo.bench.clocks import summarize

COLUMNS = ["backend", "B", "T", "H", "HV", "K", "V", "state_dtype", "mode", "l2norm", "clock",
           "status", "note", "median_us", "p20_us", "p80_us", "n", "max_abs_err_out",
           "max_abs_err_state", "rel_err_out", "rel_err_state", "n_bad", "bytes_moved",
           "achieved_gbps", "pct_copy_bw", "x_floor", "speedup_vs_ref",
           "speedup_vs_fi", "n_sets", "working_set_mib", "flags", "method", "bench", "auto",
           "auto_vs_best"]
KEYS = ("bench", "backend", "B", "T", "H", "HV", "K", "V", "state_dtype", "mode", "l2norm", "clock")
LEGACY_BENCH = {"inplace": "dense", "dest": "dest", "pool": "pool", "states": "verify",
                "states+update": "verify", "slots": "verify", "commit": "verify",
                "off": "chained", "wait": "chained", "early": "chained"}
REF, FI, FLOOR = "pt-reference", "fi-baseline", "floor"
NAN = float("nan")


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def columns(mode) -> list:
    """The columns of a mode's results: :data:`COLUMNS`, its cell keys, its own columns."""
    return COLUMNS + [c for c in (*mode.keys, *mode.columns) if c not in COLUMNS]


def build_table(raw, ref, plan) -> list:
    """The measured rows (a cell, a clock, samples) as result rows with the derived columns."""
    mode = plan.mode
    copy_gbps = ((ref or {}).get("copy") or {}).get("gbps", NAN)
    out = []
    for r in raw:
        c = r["cell"]
        s = summarize(r.get("samples") or [])
        row = dict(bench=c.bench, backend=c.backend, B=c.B, T=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V,
                   state_dtype=c.state_dtype, mode=c.mode, l2norm=c.l2norm, **dict(c.keys),
                   clock=r["clock"], status=r["status"], note=r.get("note", ""),
                   median_us=s["median"], p20_us=s["p20"], p80_us=s["p80"], n=s["n"],
                   **{k: r.get(k, NAN) for k in ("max_abs_err_out", "max_abs_err_state",
                                                 "rel_err_out", "rel_err_state")},
                   n_bad=r.get("n_bad", ""), bytes_moved=mode.bytes_moved(c),
                   n_sets=r.get("n_sets", ""), working_set_mib=r.get("working_set_mib", ""),
                   flags=r.get("flags", ""), method=r.get("method", ""), auto=r.get("auto", ""))
        row.update({k: r.get(k, v) for k, v in mode.columns.items()})
        if "median_us" in r:                       # rows that arrive summarized (NVBench)
            row.update({k: r[k] for k in ("median_us", "p20_us", "p80_us", "n") if k in r})
        m = row["median_us"]
        row["achieved_gbps"] = row["bytes_moved"] / m / 1e3 if finite(m) and m > 0 else NAN
        row["pct_copy_bw"] = (100 * row["achieved_gbps"] / copy_gbps
                              if finite(copy_gbps) and finite(row["achieved_gbps"]) else NAN)
        out.append(row)
    derive(out, mode)
    mode.derive(out, plan)
    return out


def derive(rows, mode):
    """x_floor (``mode.floor_of``: which floor divides a row), the speedups over pt-reference
    and fi-baseline, and per cell the automatic choice's time over the best entry's
    (``auto_vs_best``: the ``auto`` entry, else the backend the choice names).  The best is
    taken over the entries held to the automatic choice's own state bound: not the mode's
    ``not_rivals``, nor a backend judged with the peers' bound because it rounds the state
    (``rounds_state``), which the automatic choice never picks."""
    keys = KEYS + tuple(mode.keys)
    rival = functools.lru_cache(maxsize=None)(lambda name: not_a_rival(name, mode) is None)

    def key(r, **over):
        return tuple({**r, **over}.get(k) for k in keys)
    timed = [r for r in rows if r["status"] == "PASS" and finite(r["median_us"])]
    by = {key(r): r["median_us"] for r in timed}
    ok = {id(r) for r in timed}
    cells = {}
    for r in rows:
        r["x_floor"] = r["speedup_vs_ref"] = r["speedup_vs_fi"] = r["auto_vs_best"] = NAN
        if r["backend"] != FLOOR:
            cells.setdefault(key(r, backend=""), []).append(r)
    for r in timed:
        m, over = r["median_us"], mode.floor_of(r)
        if r["backend"] == FLOOR or m <= 0:
            continue
        if over is not None and by.get(key(r, backend=FLOOR, **over)):
            r["x_floor"] = m / by[key(r, backend=FLOOR, **over)]
        for name, col in ((REF, "speedup_vs_ref"), (FI, "speedup_vs_fi")):
            if by.get(key(r, backend=name)):
                r[col] = by[key(r, backend=name)] / m
    for rs in cells.values():
        ms = {r["backend"]: r["median_us"] for r in rs if id(r) in ok and rival(r["backend"])}
        pick = "auto" if "auto" in ms else rs[0].get("auto")
        if ms and pick in ms:
            for r in rs:
                r["auto_vs_best"] = ms[pick] / min(ms.values())


def not_a_rival(name, mode):
    """Why ``auto/best`` leaves the entry ``name`` out of its best (None: it counts)."""
    if name in mode.not_rivals:
        return "the engine's own call, what the adapters replace"
    if gate.state_tol_of(name, mode.op) is not None:
        return ("rounds its state's operands or states to bf16 (judged with the peers' bound), "
                "which the automatic choice never picks")
    return None


# ------------------------------------------------------------------------------ environment

def gpu_name():
    with contextlib.suppress(Exception):
        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    return "cpu"


def gpu_slug(name=None):
    """This GPU's name as a folder name (gdnzoo.tables.gpu_slug)."""
    from gdnzoo.tables import gpu_slug as slug
    return slug(name or gpu_name())


def default_out_dir():
    """``gdnzoo-results/<gpu-slug>`` in the working directory (never inside the installed
    package or the checkout's committed results)."""
    return str(Path("gdnzoo-results") / gpu_slug())


def _version(dist):
    try:
        return metadata.version(dist)
    except Exception:
        return None


def _run(*cmd, cwd=None, timeout=5):
    """A command's stripped output, or None when it fails."""
    try:
        c = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except Exception:
        return None
    return c.stdout.strip() if c.returncode == 0 else None


def _git_commit():
    """``$GDNZOO_COMMIT`` when set (a copy of the tree on a lent GPU machine may carry a stale
    .git), else HEAD of the checkout (``-dirty`` if modified), else None."""
    if os.environ.get("GDNZOO_COMMIT"):
        return os.environ["GDNZOO_COMMIT"]
    here = Path(__file__).resolve().parent.parent
    head = _run("git", "rev-parse", "HEAD", cwd=here)
    dirty = head and _run("git", "status", "--porcelain", "--untracked-files=no", cwd=here)
    return head and head + ("-dirty" if dirty else "")


def environment(method, ref=None, notes=()):
    driver = _run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", timeout=10)
    env = dict(gpu=gpu_name(), driver=driver.splitlines()[0] if driver else None,
               cuda=torch.version.cuda,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               commit=_git_commit(), method=method, notes=list(notes),
               versions={d: _version(d) for d in (
                   "torch", "triton", "cupy-cuda13x", "cupy-cuda12x", "flashinfer-python",
                   "nvidia-cutlass-dsl", "fla-core", "flash-linear-attention", "cupti-python",
                   "cuda-bench", "gdnzoo")},
               device_reference=ref or {})
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(l2_bytes=int(p.L2_cache_size), sms=p.multi_processor_count,
                   kernel_clock=("cupti-python" if clocks.cupti_python_available()[0]
                                 else "torch.profiler (CUPTI)") + " activity records")
    return env


# ------------------------------------------------------------------------------------ files

def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def read_results(path):
    """(rows as dicts, environment) from a results.json of any mode, this schema's or an earlier
    one's (``bench`` inferred from ``mode``; columns it lacks read as empty)."""
    doc = json.loads(Path(path).read_text())
    cols = doc["columns"]
    rows = []
    for r in doc["rows"]:
        d = dict(zip(cols, r)) if isinstance(r, list) else dict(r)
        d.update({k: NAN for k in ("median_us", "p20_us", "p80_us") if d.get(k) is None})
        d["bench"] = d.get("bench") or LEGACY_BENCH.get(d.get("mode"), "")
        for k in COLUMNS:
            d.setdefault(k, None)
        rows.append(d)
    return rows, doc.get("environment") or {}


def write_results(rows, env, out_dir, cols=COLUMNS) -> list:
    """results.csv and results.json under ``out_dir`` (:func:`read_results` reads it back).
    The json: environment, columns, then one row per line as a list in column order, compact
    on purpose (a full H100 run stays a few hundred kB, small enough to commit)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows({k: (f"{v:.6g}" if math.isfinite(v) else "") if isinstance(
            v := r.get(k, ""), float) else v for k in cols} for r in rows)
    head = json.dumps(_jsonable(dict(environment=env, columns=cols)), indent=1)
    body = ",\n".join(json.dumps(_jsonable([r.get(k, "") for k in cols]), separators=(",", ":"))
                      for r in rows)
    (out / "results.json").write_text(head[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n")
    return [str(out / "results.csv"), str(out / "results.json")]

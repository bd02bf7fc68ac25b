"""Benchmark results as long-format rows, the console tables, and the files written to --out."""
from __future__ import annotations

import csv
import datetime
import json
import os
import math
import subprocess
from pathlib import Path

from gdnzoo.bench.clocks import summarize

COLUMNS = ["backend", "B", "T", "H", "HV", "K", "V", "state_dtype", "mode", "l2norm", "clock",
           "status", "note", "median_us", "p20_us", "p80_us", "n", "max_abs_err_out",
           "max_abs_err_state", "rel_err_out", "rel_err_state", "n_bad", "bytes_moved",
           "achieved_gbps", "pct_copy_bw", "x_floor", "speedup_vs_ref",
           "speedup_vs_fi", "n_sets", "working_set_mib", "flags", "method"]
REF, FI, FLOOR = "pt-reference", "fi-baseline", "floor"
NAN = float("nan")


def _finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def build_rows(raw, ref=None):
    """Flatten measured rows (cell + samples) into COLUMNS and fill the derived columns."""
    from gdnzoo.bench.sweep import bytes_moved, state_set_bytes
    ref = ref or {}
    copy_gbps = (ref.get("copy") or {}).get("gbps", NAN)
    out = []
    for r in raw:
        c = r["cell"]
        s = summarize(r.get("samples") or [])
        row = dict(backend=c.backend, B=c.B, T=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V,
                   state_dtype=c.state_dtype, mode=c.mode, l2norm=c.l2norm, clock=r["clock"],
                   status=r["status"], note=r.get("note", ""), median_us=s["median"],
                   p20_us=s["p20"], p80_us=s["p80"], n=s["n"],
                   max_abs_err_out=r.get("max_abs_err_out", NAN),
                   max_abs_err_state=r.get("max_abs_err_state", NAN),
                   rel_err_out=r.get("rel_err_out", NAN), rel_err_state=r.get("rel_err_state", NAN),
                   n_bad=r.get("n_bad", ""),
                   bytes_moved=bytes_moved(c) if c.backend != FLOOR else 2 * state_set_bytes(c), n_sets=r.get("n_sets", ""),
                   working_set_mib=r.get("working_set_mib", ""), flags=r.get("flags", ""),
                   method=r.get("method", ""))
        if "median_us" in r:                       # rows that arrive summarized (NVBench)
            row.update({k: r[k] for k in ("median_us", "p20_us", "p80_us", "n") if k in r})
        m = row["median_us"]
        row["achieved_gbps"] = row["bytes_moved"] / m / 1e3 if _finite(m) and m > 0 else NAN
        row["pct_copy_bw"] = (100 * row["achieved_gbps"] / copy_gbps
                              if _finite(copy_gbps) and _finite(row["achieved_gbps"]) else NAN)
        out.append(row)
    _derive(out)
    return out


def _key(r, *drop):
    keys = ("backend", "B", "T", "H", "HV", "K", "V", "state_dtype", "mode", "l2norm", "clock")
    return tuple(r[k] for k in keys if k not in drop)


def _derive(rows):
    by = {_key(r): r for r in rows if r["status"] == "PASS" and _finite(r["median_us"])}
    floors = {_key(r, "backend", "mode"): r["median_us"] for r in rows
              if r["backend"] == FLOOR and r["status"] == "PASS" and _finite(r["median_us"])}
    for r in rows:
        m = r["median_us"]
        r["x_floor"] = r["speedup_vs_ref"] = r["speedup_vs_fi"] = NAN
        if not (_finite(m) and m > 0):
            continue
        f = floors.get(_key(dict(r, clock="kernel"), "backend", "mode"))
        if r["clock"] in ("kernel", "nvbench") and f:
            r["x_floor"] = m / f
        for name, col in ((REF, "speedup_vs_ref"), (FI, "speedup_vs_fi")):
            other = by.get((name,) + _key(r)[1:])
            if other:
                r[col] = other["median_us"] / m


# ------------------------------------------------------------------------------ environment

def gpu_name():
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:
        pass
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
    from importlib import metadata
    try:
        return metadata.version(dist)
    except Exception:
        return None


def _git_commit():
    """``$GDNZOO_COMMIT`` when set (a copy of the tree on a lent GPU machine may carry a stale
    .git), else HEAD of the checkout (``-dirty`` if modified), else None."""
    here = Path(__file__).resolve().parent.parent
    env = os.environ.get("GDNZOO_COMMIT")
    if env:
        return env
    try:
        c = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                           timeout=5)
        if c.returncode != 0:
            return None
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5)
        return c.stdout.strip() + ("-dirty" if d.stdout.strip() else "")
    except Exception:
        return None


def _driver():
    try:
        c = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        return c.stdout.strip().splitlines()[0] if c.returncode == 0 and c.stdout.strip() else None
    except Exception:
        return None


def environment(method, ref=None, notes=()):
    import torch
    from gdnzoo.bench import clocks
    env = dict(gpu=gpu_name(), driver=_driver(), cuda=torch.version.cuda,
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
                   kernel_clock=clocks.kernel_clock_method())
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


def json_text(rows, env):
    """results.json: environment, columns, then one row per line as a list in column order.

    Compact on purpose: a full H100 sweep stays a few hundred kB, small enough to commit.
    """
    head = json.dumps(_jsonable(dict(environment=env, columns=COLUMNS)), indent=1)
    body = ",\n".join(json.dumps(_jsonable([r.get(k, "") for k in COLUMNS]), separators=(",", ":"))
                      for r in rows)
    return head[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"


def read_results(path):
    """(rows as dicts, environment) from a results.json written by :func:`write_all`."""
    doc = json.loads(Path(path).read_text())
    cols = doc["columns"]
    rows = []
    for r in doc["rows"]:
        d = dict(zip(cols, r)) if isinstance(r, list) else dict(r)
        for k in ("median_us", "p20_us", "p80_us"):
            if d.get(k) is None:
                d[k] = NAN
        rows.append(d)
    return rows, doc.get("environment") or {}


def _fmt_csv(x):
    if isinstance(x, float):
        return "" if not math.isfinite(x) else f"{x:.6g}"
    return x


def write_all(rows, env, out_dir, plots=True):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt_csv(r.get(k, "")) for k in COLUMNS})
    files.append(str(out / "results.csv"))
    with open(out / "results.json", "w") as f:
        f.write(json_text(rows, env))
    files.append(str(out / "results.json"))
    if plots:
        from gdnzoo.bench import plots as plots_mod
        files += plots_mod.plot_all(rows, env, out)
    return files


# ---------------------------------------------------------------------------------- console

def _us(x):
    return "-" if not _finite(x) else (f"{x:.2f}" if x < 100 else f"{x:.0f}" if x < 1e5 else f"{x:.3g}")


def _x(x):
    return "-" if not _finite(x) else f"{x:.2f}x"


def published_table(rows, B, state_dtype, mode, clock="kernel"):
    """Algorithm | Median (us) | Speedup | vs FlashInfer, at one batch size (the published shape)."""
    sel = [r for r in rows if r["B"] == B and r["state_dtype"] == state_dtype and r["mode"] == mode
           and r["clock"] == clock and r["backend"] != FLOOR]
    sel.sort(key=lambda r: (r["status"] != "PASS", not _finite(r["median_us"]),
                            r["median_us"] if _finite(r["median_us"]) else 0, r["backend"]))
    w = max([len(r["backend"]) + (1 if r["flags"] else 0) for r in sel] + [9])
    lines = [f"| {'Algorithm':<{w}} | Median (us) | Speedup | vs FlashInfer |",
             f"|{'-' * (w + 2)}|-------------|---------|---------------|"]
    for r in sel:
        name = r["backend"] + ("*" if r["flags"] else "")
        if r["status"] == "PASS" and _finite(r["median_us"]):
            med = _us(r["median_us"])
        else:
            med = r["status"] if r["status"] != "PASS" else "n/a"
        lines.append(f"| {name:<{w}} | {med:>11} | {_x(r['speedup_vs_ref']):>7} | "
                     f"{_x(r['speedup_vs_fi']):>13} |")
    return lines


def pivot(rows, state_dtype, mode, clock="kernel", with_floor=True):
    """Backends x batch sizes: median us, and the multiple of the floor when measured."""
    sel = [r for r in rows if r["state_dtype"] == state_dtype and r["clock"] == clock
           and (r["mode"] == mode or r["backend"] == FLOOR)]
    Bs = sorted({r["B"] for r in sel})
    names = []
    for r in sel:
        if r["backend"] not in names:
            names.append(r["backend"])
    if FLOOR in names:
        names = [FLOOR] + [n for n in names if n != FLOOR]
    cell = {(r["backend"], r["B"]): r for r in sel}
    cw = 12 if with_floor else 8
    w = max([len(n) for n in names] + [7])
    lines = [f"{'backend':<{w}} " + "".join(f"{'B=' + str(B):>{cw}}" for B in Bs)]
    for n in names:
        parts = []
        for B in Bs:
            r = cell.get((n, B))
            if r is None:
                s = ""
            elif r["status"] != "PASS":
                s = r["status"]
            elif not _finite(r["median_us"]):
                s = "n/a"
            elif with_floor and n != FLOOR and _finite(r["x_floor"]):
                s = f"{_us(r['median_us'])}/{r['x_floor']:.1f}x"
            else:
                s = _us(r["median_us"])
            parts.append(" " + f"{s:>{cw - 1}}")     # a separating blank even when s fills it
        lines.append(f"{n:<{w}} " + "".join(parts))
    return lines


def run_line(env, command="gdnzoo bench") -> str:
    """A console's first line: the command, GPU, driver, CUDA, torch and commit of the run."""
    return (f"{command} on {env.get('gpu')} (driver {env.get('driver')}, CUDA {env.get('cuda')}, "
            f"torch {env['versions'].get('torch')}), commit {env.get('commit')}")


def console(rows, env, notes=(), files=()):
    ref = env.get("device_reference") or {}
    copy = ref.get("copy") or {}
    empty = ref.get("empty_kernel") or {}
    lines = [run_line(env)]
    if _finite(copy.get("gbps", NAN)):
        lines.append(f"D2D copy {copy['gbps'] / 1e3:.2f} TB/s (read+write); empty kernel "
                     f"{_us(empty.get('us', NAN))} us; kernel clock: {env.get('kernel_clock')}; "
                     f"cold L2: rotated state sets >= 4x L2")
    combos = []
    for r in rows:
        k = (r["state_dtype"], r["mode"])
        if r["backend"] != FLOOR and k not in combos:
            combos.append(k)
    clocks_present = {r["clock"] for r in rows if _finite(r["median_us"]) and r["backend"] != FLOOR}
    clock = "kernel" if "kernel" in clocks_present else ("host" if "host" in clocks_present else "kernel")
    for sd, mode in combos:
        Bs = sorted({r["B"] for r in rows if r["state_dtype"] == sd})
        B0 = 1 if 1 in Bs else Bs[0]
        lines.append(f"\n{sd} state, {mode}, B={B0}, {clock} clock "
                     f"(Speedup vs pt-reference; * = warm write target):")
        lines += published_table(rows, B0, sd, mode, clock)
        if len(Bs) > 1:
            lines.append(f"{clock} clock, us" + ("/x floor" if clock == "kernel" else "") + ":")
            lines += pivot(rows, sd, mode, clock, with_floor=(clock == "kernel"))
    fails = [r for r in rows if r["status"] in ("FAIL", "ERROR") and r["clock"] == clock]
    for r in fails[:6]:
        lines.append(f"{r['status']} {r['backend']} B={r['B']} {r['state_dtype']}: {r['note'][:150]}")
    if len(fails) > 6:
        lines.append(f"... {len(fails) - 6} more FAIL/ERROR cells in results.csv")
    for n in notes:
        lines.append(f"note: {n}")
    if files:
        lines.append("wrote: " + ", ".join(files))
    return "\n".join(lines)

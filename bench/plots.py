"""latency.png and bandwidth.png from the result rows (matplotlib, imported only here)."""
from __future__ import annotations

import math
from pathlib import Path

FLOOR = "floor"


def _series(rows, sd, clock="kernel"):
    """{backend: [(B, median_us, pct_copy_bw)]} for PASS rows of one state dtype: the backends'
    rows of one mode (in place first) and the floor, which is always in place."""
    modes = [m for m in ("inplace", "dest") if any(r["mode"] == m and r["backend"] != FLOOR
                                                   for r in rows)]
    mode = modes[0] if modes else "inplace"
    out = {}
    for r in rows:
        if (r["state_dtype"] != sd or r["clock"] != clock or r["status"] != "PASS"
                or not isinstance(r["median_us"], float) or not math.isfinite(r["median_us"])):
            continue
        if r["backend"] != FLOOR and r["mode"] != mode:
            continue
        out.setdefault(r["backend"], []).append((r["B"], r["median_us"], r["pct_copy_bw"],
                                                 r["bytes_moved"]))
    for v in out.values():
        v.sort()
    return out


def _finish_axes(ax, ylabel, title):
    """What every panel shares: log2 batch axis, labels, grid, legend."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _save(plt, fig, path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_all(rows, env, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["(plots skipped: matplotlib not installed)"]
    out_dir = Path(out_dir)
    dtypes = [d for d in ("fp32", "bf16") if any(r["state_dtype"] == d for r in rows)]
    if not dtypes or not any(r["clock"] == "kernel" and r["status"] == "PASS"
                             and isinstance(r["median_us"], float) and math.isfinite(r["median_us"])
                             for r in rows):
        return ["(plots skipped: no kernel-clock results)"]
    copy_gbps = ((env.get("device_reference") or {}).get("copy") or {}).get("gbps")
    files = []
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.8), squeeze=False)
    for ax, sd in zip(axes[0], dtypes):
        ser = _series(rows, sd)
        for name, pts in ser.items():
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            style = dict(color="black", ls="--", lw=2, marker="s", ms=3) if name == FLOOR else dict(marker="o", ms=3)
            ax.plot(xs, ys, label=name, **style)
        if copy_gbps and ser:
            pts = sorted({(p[0], p[3]) for v in ser.values() for p in v})
            ax.plot([p[0] for p in pts], [p[1] / copy_gbps / 1e3 for p in pts], color="gray",
                    ls=":", label="bytes / copy bandwidth")
        ax.set_yscale("log")
        _finish_axes(ax, "kernel time per call (us), CUPTI, cold L2", f"{env.get('gpu')}, {sd} state")
    files.append(_save(plt, fig, out_dir / "latency.png"))

    if copy_gbps:
        fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.8), squeeze=False)
        for ax, sd in zip(axes[0], dtypes):
            for name, pts in _series(rows, sd).items():
                style = dict(color="black", ls="--", lw=2, marker="s", ms=3) if name == FLOOR else dict(marker="o", ms=3)
                ax.plot([p[0] for p in pts], [p[2] for p in pts], label=name, **style)
            _finish_axes(ax, f"% of measured D2D copy bandwidth ({copy_gbps / 1e3:.2f} TB/s)",
                         f"{env.get('gpu')}, {sd} state")
        files.append(_save(plt, fig, out_dir / "bandwidth.png"))
    return files

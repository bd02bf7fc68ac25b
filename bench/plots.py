"""latency.png and bandwidth.png from a run's rows (matplotlib, imported only here: the bench
extra, ``pip install 'gdnzoo[bench]'``; without it the run says the plots were skipped)."""
from __future__ import annotations

from pathlib import Path

from gdnzoo.bench.report import FLOOR, finite

NEEDS = "skipped: they need matplotlib (pip install 'gdnzoo[bench]')"


def _series(rows, sd, clock="kernel"):
    """{label: [(B, median_us, pct_copy_bw, bytes_moved)]} of the PASS rows of one state dtype
    and clock: an entry per line, named with its form and T where the rows have several."""
    sel = [r for r in rows if r["state_dtype"] == sd and r["clock"] == clock
           and r["status"] == "PASS" and finite(r["median_us"])]
    forms = {r["mode"] for r in sel if r["backend"] != FLOOR}
    floors = {r["mode"] for r in sel if r["backend"] == FLOOR}
    Ts = {r["T"] for r in sel}
    out = {}
    for r in sel:
        several = len(floors if r["backend"] == FLOOR else forms) > 1
        label = (r["backend"] + (f" [{r['mode']}]" if several else "")
                 + (f" T={r['T']}" if len(Ts) > 1 else ""))
        out.setdefault(label, []).append((r["B"], r["median_us"], r["pct_copy_bw"],
                                          r["bytes_moved"]))
    return {label: sorted(pts) for label, pts in out.items()}


def _panels(plt, dtypes, env, ylabel, draw, path) -> str:
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.8), squeeze=False)
    for ax, sd in zip(axes[0], dtypes):
        draw(ax, sd)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{env.get('gpu')}, {sd} state")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def _style(name):
    return (dict(color="black", ls="--", lw=2, marker="s", ms=3) if name.startswith(FLOOR)
            else dict(marker="o", ms=3))


def plot_all(rows, env, out_dir, plan=None) -> str:
    """Draw the plots into ``out_dir``; returns what the console says: the files written, or
    why none were."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NEEDS
    clock = next((k for k in ("kernel", "host") if any(     # kernel, else host (no GPU)
        r["clock"] == k and r["status"] == "PASS" and finite(r["median_us"]) for r in rows)), None)
    dtypes = [d for d in ("fp32", "bf16") if any(r["state_dtype"] == d for r in rows)]
    if clock is None or not dtypes:
        return "none: nothing was timed"
    out = Path(out_dir)
    copy_gbps = ((env.get("device_reference") or {}).get("copy") or {}).get("gbps")

    def latency(ax, sd):
        ser = _series(rows, sd, clock)
        for name, pts in ser.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **_style(name))
        if finite(copy_gbps) and ser:
            pts = sorted({(p[0], p[3]) for v in ser.values() for p in v})
            ax.plot([p[0] for p in pts], [p[1] / copy_gbps / 1e3 for p in pts], color="gray",
                    ls=":", label="bytes / copy bandwidth")
        ax.set_yscale("log")
    files = [_panels(plt, dtypes, env, f"time per call (us), {clock} clock, cold", latency,
                     out / "latency.png")]
    if finite(copy_gbps) and clock == "kernel":
        def bandwidth(ax, sd):
            for name, pts in _series(rows, sd, clock).items():
                ax.plot([p[0] for p in pts], [p[2] for p in pts], label=name, **_style(name))
        files.append(_panels(plt, dtypes, env, f"% of measured D2D copy bandwidth "
                             f"({copy_gbps / 1e3:.2f} TB/s)", bandwidth, out / "bandwidth.png"))
    return ", ".join(files)

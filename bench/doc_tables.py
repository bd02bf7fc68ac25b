"""The results tables of docs/serving.md, rendered from committed results files (the
``results.json`` that ``gdnzoo bench`` writes), so that the published numbers are the files':

    python3 -m gdnzoo.bench.doc_tables pool    bench/results/h100-80gb-hbm3/pool_fineclock/run4_results.json
    python3 -m gdnzoo.bench.doc_tables verify  bench/results/h100-80gb-hbm3/verify/{fp32,bf16}_results.json
    python3 -m gdnzoo.bench.doc_tables chained bench/results/h100-80gb-hbm3/chained/results_{fp32,bf16}.json

Each prints its table's lines, a blank line, then what the text around the table states: the
cells against their bar and the peers that are as fast or faster.  Kernel µs are the CUPTI
medians; ``(x)`` is the multiple of the same run's floor.
"""
from __future__ import annotations

import sys

TICK = 0.032                                     # one step of the kernel clock, µs
STATES = ("fp32", "bf16")


def load_rows(paths):
    """Every row of the results files (report.read_results)."""
    from gdnzoo.bench.report import read_results
    return [r for p in paths for r in read_results(p)[0]]


def fmt_us(x):
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def cell(r):
    """A timed row as ``µs (x floor)``; the floor as ``µs``; nothing for a missing row; a row
    that was not timed by its status (``fail``, ``error``, ``skip``)."""
    if r is None:
        return ""
    if r["status"] != "PASS":
        return r["status"].lower()
    if r["backend"] == "floor" or r["x_floor"] is None:
        return fmt_us(r["median_us"])
    return f"{fmt_us(r['median_us'])} ({r['x_floor']:.2f})"


class Bar:
    """Cells of one entry against a bar of ``margin`` x the same-run floor plus one tick, and
    the peers as fast as or faster than it in each cell."""

    def __init__(self, margin):
        self.margin, self.within, self.total = margin, 0, 0
        self.misses, self.peer_faster = [], []

    def judge(self, name, ours, floor, peers):
        """One cell (``name``): ``ours`` and ``floor`` rows, ``peers`` {peer: row or None}."""
        if ours is None or floor is None or ours["status"] != "PASS":
            return
        self.total += 1
        bar = self.margin * floor["median_us"] + TICK
        if ours["median_us"] <= bar:
            self.within += 1
        else:
            self.misses.append(f"{name}: {ours['median_us']:.3f} against a bar of {bar:.3f} "
                               f"(floor {floor['median_us']:.3f})")
        self.peer_faster += [f"{p} {name}" for p, r in peers.items()
                             if r and r["status"] == "PASS" and r["median_us"] <= ours["median_us"]]

    def summary(self, within, faster):
        return ([f"{within}: {self.within} of {self.total}"] + [f"  miss: {m}" for m in self.misses]
                + [f"{faster}: {len(self.peer_faster)}"] + [f"  {p}" for p in self.peer_faster])


# ------------------------------------------------------------------------------------ pool

POOL_ENTRIES = [("floor", "pool floor"), ("auto", "auto"), ("fla-recurrent", "fla-recurrent"),
                ("fla-tma", "fla-tma"), ("cuda-v4", "cuda-v4"), ("vllm-packed", "vllm-packed"),
                ("flashinfer-pool", "FlashInfer pool API")]
POOL_PEERS = ("vllm-packed", "flashinfer-pool")


def pool_table(paths):
    """``gdnzoo bench --mode pool``: one row per state dtype and entry, one column per B; then
    auto against the bar (10% plus one tick over the pool floor) and the peers against auto."""
    rows = [r for r in load_rows(paths) if r["clock"] == "kernel" and r["mode"] == "pool"]
    at = {(r["state_dtype"], r["backend"], r["B"]): r for r in rows}
    Bs = sorted({r["B"] for r in rows})
    out = ["| state | entry | " + " | ".join(f"B={B}" for B in Bs) + " |",
           "|---|---|" + "---|" * len(Bs)]
    bar = Bar(1.10)
    for sd in STATES:
        for e, name in POOL_ENTRIES:
            got = [at.get((sd, e, B)) for B in Bs]
            if not all(g is None or g["status"] == "SKIP" for g in got):   # timed somewhere
                out.append(f"| {sd} | {name} | " + " | ".join(cell(g) for g in got) + " |")
        for B in Bs:
            bar.judge(f"{sd} B={B}", at.get((sd, "auto", B)), at.get((sd, "floor", B)),
                      {p: at.get((sd, p, B)) for p in POOL_PEERS})
    return out + [""] + bar.summary("auto within the pool floor bar",
                                    "peers as fast as or faster than auto")


# ---------------------------------------------------------------------------------- verify

VERIFY_ENTRIES = ["floor", "cuda-v4", "fla-recurrent", "flashinfer-mtp", "flashinfer-pretranspose",
                  "vllm-spec"]
VERIFY_PEERS = ["flashinfer-mtp", "flashinfer-pretranspose", "vllm-spec"]   # the engines' kernels
FORMS = ["states", "states+update", "slots"]


def verify_tables(paths):
    """``gdnzoo bench --mode verify`` (one file per state dtype): the verify table (state, T,
    form, entry; one column per B) and the commit table; then cuda-v4 against the floor bar
    (15% plus one tick over the same-run verify floor of the form) and the engines' kernels."""
    rows = [r for r in load_rows(paths) if r["clock"] == "kernel"]
    at = {(r["state_dtype"], r["T"], r["mode"], r["backend"], r["B"]): r for r in rows}
    Bs = sorted({r["B"] for r in rows})
    out = ["| state | T | form | entry | " + " | ".join(f"B={B}" for B in Bs) + " |",
           "|---|---|---|---|" + "---|" * len(Bs)]
    bar = Bar(1.15)
    for sd in STATES:
        for T in sorted({r["T"] for r in rows if r["state_dtype"] == sd}):
            for form in FORMS:
                head = f"| {sd} | {T} | {form} |"      # on the form's first row only
                for e in VERIFY_ENTRIES:
                    got = [at.get((sd, T, form, e, B)) for B in Bs]
                    if all(g is None or g["status"] == "SKIP" for g in got):
                        continue
                    out.append(f"{head} {e} | " + " | ".join(cell(g) for g in got) + " |")
                    head = "| | | |"
                for B in Bs:
                    bar.judge(f"{sd} T={T} {form} B={B}", at.get((sd, T, form, "cuda-v4", B)),
                              at.get((sd, T, form, "floor", B)),
                              {p: at.get((sd, T, form, p, B)) for p in VERIFY_PEERS})
    out += ["", "| state | commit | " + " | ".join(f"B={B}" for B in Bs) + " |",
            "|---|---|" + "---|" * len(Bs)]
    for sd in STATES:
        for e, name in (("floor", "copy floor"), ("commit", "gdnzoo.commit")):
            got = [at.get((sd, 8, "commit", e, B)) for B in Bs]
            out.append(f"| {sd} | {name} | " + " | ".join(cell(g) for g in got) + " |")
    return out + [""] + bar.summary("cuda-v4 within the floor bar",
                                    "engine kernels as fast as or faster than cuda-v4")


# --------------------------------------------------------------------------------- chained

LEVELS = ("off", "wait", "early")
CHAINED_PEERS = [("vllm-packed", "vLLM"), ("flashinfer-pool", "FlashInfer")]


def chained_table(paths, ours=("fla-recurrent",)):
    """``gdnzoo bench --timing chained`` (one file per state dtype): µs per layer at each PDL
    level (off / wait / early) for the chained floor and ``ours``, the peers without PDL; then
    the bars the bench printed for ``ours`` (its ``bar_*`` columns), how many passed, and the
    peers as fast as or faster than ``ours`` at their quickest level."""
    rows = [r for r in load_rows(paths) if r["clock"] == "chained"]
    at = {(r["state_dtype"], r["B"], r["backend"], r["mode"]): r for r in rows}
    Bs = sorted({r["B"] for r in rows})

    def us(r):
        return fmt_us(r["median_us"]) if r and r["status"] == "PASS" else "–"

    out = ["| state | B | floor off / wait / early | "
           + " | ".join(f"{o} off / wait / early" for o in ours) + " | "
           + " | ".join(n for _, n in CHAINED_PEERS) + " |",
           "|---|---|---|" + "---|" * (len(ours) + len(CHAINED_PEERS))]
    bars = {"bar_floor": [0, 0], "bar_off": [0, 0], "bar_standalone": [0, 0]}
    misses, peer_faster = [], []
    for sd in STATES:
        for B in Bs:
            levels = [" / ".join(us(at.get((sd, B, e, lv))) for lv in LEVELS)
                      for e in ("floor",) + tuple(ours)]
            peers = [us(at.get((sd, B, p, "off"))) for p, _ in CHAINED_PEERS]
            out.append(f"| {sd} | {B} | " + " | ".join(levels + peers) + " |")
            for e in ours:
                for lv in LEVELS:
                    r = at.get((sd, B, e, lv))
                    for bar, count in bars.items():
                        if r and r.get(bar) in ("PASS", "MISS"):
                            count[1] += 1
                            count[0] += r[bar] == "PASS"
                            if r[bar] == "MISS":
                                misses.append(f"{e} {sd} B={B} {lv}: {bar}")
                best = min((r["median_us"] for lv in LEVELS if (r := at.get((sd, B, e, lv)))
                            and r["status"] == "PASS"), default=None)
                for p, _ in CHAINED_PEERS:
                    pr = at.get((sd, B, p, "off"))
                    if best and pr and pr["status"] == "PASS" and pr["median_us"] <= best:
                        peer_faster.append(f"{p} {sd} B={B}: {pr['median_us']:.2f} against "
                                           f"{e} {best:.2f}")
    out += [""] + [f"{bar}: {n} of {of} pass" for bar, (n, of) in bars.items()]
    out += [f"  miss: {m}" for m in misses]
    out += [f"peers as fast as or faster than ours at its quickest level: {len(peer_faster)}"]
    out += [f"  {p}" for p in peer_faster]
    return out


RENDER = {"pool": pool_table, "verify": verify_tables, "chained": chained_table}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in RENDER:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("\n".join(RENDER[argv[0]](argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The verify tables of docs/serving.md from one run's two results files (`gdnzoo bench --mode
verify`, fp32 and bf16 state), and the cells of cuda-v4 against the floor bar (within 15% plus
one 32 ns tick of the same-run floor of the form) and against the engines' kernels:

    python3 lab/verify_table.py bench/results/h100-80gb-hbm3/verify/{fp32,bf16}_results.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import read_results  # noqa: E402

ENTRIES = ["floor", "cuda-v4", "fla-recurrent", "flashinfer-mtp", "flashinfer-pretranspose",
           "vllm-spec"]
PEERS = ["flashinfer-mtp", "flashinfer-pretranspose", "vllm-spec"]   # the engines' kernels
FORMS = ["states", "states+update", "slots"]
TICK = 0.032


def _us(x):
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _cell(r):
    if r is None:
        return ""
    if r["status"] != "PASS":
        return r["status"].lower()
    if r["backend"] == "floor" or r["x_floor"] is None:
        return _us(r["median_us"])
    return f"{_us(r['median_us'])} ({r['x_floor']:.2f})"


def render(paths):
    """The two tables' lines, a blank line, then the cells against the bar and the peers."""
    rows = [r for p in paths for r in read_results(p)[0] if r["clock"] == "kernel"]
    cell = {(r["state_dtype"], r["T"], r["mode"], r["backend"], r["B"]): r for r in rows}
    Bs = sorted({r["B"] for r in rows})
    out = ["| state | T | form | entry | " + " | ".join(f"B={B}" for B in Bs) + " |",
           "|---|---|---|---|" + "---|" * len(Bs)]
    within = total = 0
    misses, peer_faster = [], []
    for sd in ("fp32", "bf16"):
        for T in sorted({r["T"] for r in rows if r["state_dtype"] == sd}):
            for form in FORMS:
                first = True
                for e in ENTRIES:
                    got = [cell.get((sd, T, form, e, B)) for B in Bs]
                    if all(g is None or g["status"] == "SKIP" for g in got):
                        continue
                    head = f"| {sd} | {T} | {form} |" if first else "| | | |"
                    first = False
                    out.append(f"{head} {e} | " + " | ".join(_cell(g) for g in got) + " |")
                for B in Bs:
                    v4, fl = cell.get((sd, T, form, "cuda-v4", B)), cell.get((sd, T, form, "floor", B))
                    if v4 is None or fl is None or v4["status"] != "PASS":
                        continue
                    total += 1
                    bar = 1.15 * fl["median_us"] + TICK
                    if v4["median_us"] <= bar:
                        within += 1
                    else:
                        misses.append(f"{sd} T={T} {form} B={B}: {v4['median_us']:.3f} against a "
                                      f"bar of {bar:.3f} (floor {fl['median_us']:.3f})")
                    for p in PEERS:
                        pr = cell.get((sd, T, form, p, B))
                        if pr and pr["status"] == "PASS" and pr["median_us"] <= v4["median_us"]:
                            peer_faster.append(f"{p} {sd} T={T} {form} B={B}")
    out += ["", "| state | commit | " + " | ".join(f"B={B}" for B in Bs) + " |",
            "|---|---|" + "---|" * len(Bs)]
    for sd in ("fp32", "bf16"):
        for e, name in (("floor", "copy floor"), ("commit", "gdnzoo.commit")):
            got = [cell.get((sd, 8, "commit", e, B)) for B in Bs]
            out.append(f"| {sd} | {name} | " + " | ".join(_cell(g) for g in got) + " |")
    out += ["", f"cuda-v4 within the floor bar: {within} of {total}"]
    out += [f"  miss: {m}" for m in misses]
    out += [f"engine kernels as fast as or faster than cuda-v4: {len(peer_faster)}"]
    out += [f"  {p}" for p in peer_faster]
    return out


if __name__ == "__main__":
    print("\n".join(render(sys.argv[1:])))

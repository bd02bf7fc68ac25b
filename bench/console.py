"""The one console renderer of ``gdnzoo bench``: the run's line, then per section of the mode
(``Mode.sections``) a grid of B rows x entries with the automatic choice and its time over the
best entry of each cell, the mode's own lines (its bars), the entries that best leaves out
and why, what was not timed and why, the notes, the plots and the files."""
from __future__ import annotations

from gdnzoo.bench.report import FLOOR, finite, not_a_rival


def us(x) -> str:
    return "-" if not finite(x) else (f"{x:.2f}" if x < 100 else f"{x:.0f}" if x < 1e5
                                      else f"{x:.3g}")


def ratio(x) -> str:
    return "-" if not finite(x) else f"{x:.2f}x"


def text(r, with_floor=True) -> str:
    """One cell of a grid: the status, or the median (and / x the floor)."""
    if r is None:
        return ""
    if r["status"] != "PASS":
        return r["status"]
    if not finite(r["median_us"]):
        return "n/a"
    x = r.get("x_floor")
    return us(r["median_us"]) + (f"/{x:.2f}x" if with_floor and finite(x) else "")


def grid(rows, with_floor=True, by="B") -> list:
    """Rows by the cell key ``by`` (B; a mode may key its cells otherwise) x entries (the floor
    first): us (and / x the floor); then ``auto``, the backend the automatic choice picks in
    that cell, and ``auto/best``, its time over the fastest entry's in the same cell."""
    keys = list(dict.fromkeys(r[by] for r in rows))
    if all(isinstance(k, int) for k in keys):
        keys.sort()
    names = sorted(dict.fromkeys(r["backend"] for r in rows), key=lambda n: n != FLOOR)
    cell = {(r["backend"], r[by]): r for r in rows}
    pick = {}
    for r in rows:
        if r["backend"] != FLOOR and (r[by] not in pick or finite(r.get("auto_vs_best"))):
            pick[r[by]] = (r.get("auto") or "-", r.get("auto_vs_best"))
    w = [max(len(n), 11) for n in names]
    kw = max([len(str(k)) for k in keys] + [5])
    aw = max([len(a) for a, _ in pick.values()] + [4])
    lines = [f"{by:>{kw}}" + "".join(f"  {n:>{x}}" for n, x in zip(names, w))
             + f"  {'auto':>{aw}}  {'auto/best':>9}"]
    for k in keys:
        a, x = pick.get(k, ("-", None))
        lines.append(f"{str(k):>{kw}}" + "".join(f"  {text(cell.get((n, k)), with_floor):>{x}}"
                                                 for n, x in zip(names, w))
                     + f"  {a:>{aw}}  {ratio(x):>9}")
    return lines


def left_out(table, mode) -> list:
    """A line per reason an entry the grids show is not counted in ``auto/best``'s best."""
    why = {}
    for name in dict.fromkeys(r["backend"] for r in table
                              if r["status"] == "PASS" and finite(r["median_us"])):
        if name != FLOOR and (reason := not_a_rival(name, mode)):
            why.setdefault(reason, []).append(name)
    return [f"auto/best leaves out {', '.join(names)}: {reason}" for reason, names in why.items()]


def render(table, env, plan, files=(), drawn="") -> str:
    mode = plan.mode
    lines = [f"gdnzoo bench --mode {','.join(plan.words)} on {env.get('gpu')} (driver "
             f"{env.get('driver')}, CUDA {env.get('cuda')}, torch "
             f"{(env.get('versions') or {}).get('torch')}), commit {env.get('commit')}"]
    calls = mode.headline.format(tokens=",".join(map(str, plan.tokens)), l2norm=plan.l2norm,
                                 layers=plan.layers, kernel_clock=env.get("kernel_clock", "n/a"))
    # the geometries the table holds (a prefill run without --heads times five)
    geoms = list(dict.fromkeys((r["H"], r["HV"]) for r in table if "HV" in r))
    heads = (f"H={plan.H} HV={plan.HV}" if geoms in ([], [(plan.H, plan.HV)]) else
             "H/HV " + ", ".join(f"{h}/{hv}" for h, hv in geoms))
    lines.append(f"{heads} K={plan.K} V={plan.V}, {calls}"
                 + (mode.k_first if plan.layout == "k-first" else ""))
    ref = env.get("device_reference") or {}
    copy, empty = ref.get("copy") or {}, ref.get("empty_kernel") or {}
    if finite(copy.get("gbps")):
        lines.append(f"D2D copy {copy['gbps'] / 1e3:.2f} TB/s (read+write); empty kernel "
                     f"{us(empty.get('us'))} us; kernel clock: {env.get('kernel_clock')}")
    for title, keep, with_floor, *by in mode.sections(plan, table):
        rows = [r for r in table if keep(r)]
        if any(r["status"] == "PASS" and finite(r["median_us"]) for r in rows):
            lines += [title] if isinstance(title, str) else title
            lines += grid(rows, with_floor, *by)
    lines += mode.extra_lines(table, plan)
    lines += left_out(table, mode)
    # the entries checked but not timed (no CUDA device) with their cells, a line per FAIL or
    # ERROR (entry, reason), one per SKIP reason naming its entries
    seen, skips, checked = set(), {}, {}
    for r in table:
        if r["status"] == "PASS" and "checked, not timed" in r["note"]:
            rows, clocks = checked.setdefault(r["backend"], [0, set()])
            checked[r["backend"]] = [rows + 1, clocks | {r["clock"]}]
    if checked:
        lines.append("CHECKED, not timed (no CUDA device), against the reference: " + ", ".join(
            f"{n} ({rows // len(clocks)} cell{'s' * (rows != len(clocks))})"
            for n, (rows, clocks) in checked.items()))
    for r in table:
        if r["status"] in ("FAIL", "ERROR") and (r["backend"], r["note"]) not in seen:
            seen.add((r["backend"], r["note"]))
            lines.append(f"{r['status']} {r['backend']} ({r['state_dtype']} B={r['B']}): "
                         f"{r['note'][:200]}")
        elif r["status"] == "SKIP":
            skips.setdefault(r["note"], {})[r["backend"]] = None       # ordered, once each
    lines += [f"SKIP {', '.join(names)}: {note[:200]}" for note, names in skips.items()]
    lines += [f"note: {n}" for n in plan.notes   # not what a SKIP line already said
              if n not in skips and not any(n.endswith(f"({w})") and len(w) <= 200 for w in skips)]
    if drawn:
        lines.append(f"plots: {drawn}")
    if files:
        lines.append("wrote: " + ", ".join(files))
    return "\n".join(lines)

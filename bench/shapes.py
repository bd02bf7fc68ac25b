"""``gdnzoo tune --shapes``: the launch-shape search of the tunable backends, on the kernel clock
of ``gdnzoo bench``, and the launch rows it writes (``backends/tables/<gpu>.yaml``).

Per (state dtype, B) at the launch tables' geometry (H=4, HV=8, K=V=128):

1. the floor, with its own shape search (:mod:`gdnzoo.bench.floor`);
2. every first-stage candidate of each tunable backend (its ``candidates``), each checked by
   the gate (gdnzoo.gate) against the float64 reference and timed on the CUPTI kernel clock
   in a session of its own over a cold rotation (clocks.Rotation: candidates that store with
   different L2 eviction priorities must not share a session's lines);
3. each backend's second stage (its ``refine`` of the first stage's ranking), two rounds;
4. confirm: each backend's winner and the row this GPU runs now (its committed row, through
   the tables' fallbacks for a GPU without a file) re-timed beside the floor in bench-length
   sessions, alternated: the minimum of many noisy medians reads low (about 5% at B=1).  A row
   changes only where the winner reads at least ``--margin`` (1%) faster there.

A candidate that fails the gate, or fails to compile or launch, is reported and never timed.
``--mode pool`` and ``--mode verify`` (``--tokens`` T >= 2) measure the cells of ``gdnzoo bench
--mode pool`` (T=1) and of ``--mode verify``'s ``states`` form (``update_state=False``) in their
serving convention (page-strided pool, fresh random distinct slots and intermediate rows every
call), each candidate checked by that bench's check beside that bench's floor, and write rows
with ``mode: pool`` or ``mode: verify, tokens: T`` (what such a call prefers).  A verify row
serves all three forms, so its confirm runs in each (``states+update`` and ``slots`` too, each
beside its own floor) and a row changes only where the winner's worst multiple of a form's floor
is the margin below the committed row's: a shape faster with ``update_state=False`` can be
slower when it writes the final state.

Writes ``gpu_tune.{csv,json,log}`` under ``--out`` after every cell (a time-out keeps what was
measured) and prints the rows; ``--write`` puts them into this GPU's table file (a new file for
a GPU that has none).  Measured at T tokens (``--tokens``), the rows serve T and up
(``--rows-from-tokens`` lowers that, e.g. rows tuned at T=4 serving T >= 3); rows of several
tokens measured in place serve either mode.
"""
from __future__ import annotations

import csv
import datetime
import json
import math
import statistics
import time
from pathlib import Path

import torch
import yaml

from gdnzoo import registry, tables
from gdnzoo.bench import clocks, entries, floor
from gdnzoo.bench.args import usage_error
from gdnzoo.inputs import DTYPES

GEOMETRY = dict(H=4, HV=8, K=128, V=128)
BATCHES = (1, 4, 8, 16, 32, 48, 64, 128, 256, 512)
COMMAND = "gdnzoo tune --shapes"


def add_shapes_args(p):
    g = p.add_argument_group("--shapes (the launch-shape search; a CUDA device)")
    g.add_argument("--state-dtype", default="fp32,bf16", help="comma list (default fp32,bf16)")
    g.add_argument("--mode", default="inplace", type=lambda s: {"dense": "inplace"}.get(s, s),
                   choices=("inplace", "dest", "pool", "verify"),
                   help="the bench mode whose cells are searched: inplace (dense), dest "
                        "(destination passing, a distinct new_state rotated cold), pool (the "
                        "serving convention of gdnzoo bench --mode pool; T=1) or verify (the "
                        "serving convention of gdnzoo bench --mode verify, states form, confirmed "
                        "in all three forms; --tokens T >= 2)")
    g.add_argument("--tokens", type=int, default=1, help="T tokens per call (default 1)")
    g.add_argument("--rows-from-tokens", type=int, default=None,
                   help="the least T the written rows serve (default: --tokens)")
    g.add_argument("--reps", type=int, default=12, help="calls per first/second-stage session")
    g.add_argument("--confirm-iters", type=int, default=100,
                   help="calls per confirm session (gdnzoo bench's floor uses 100)")
    g.add_argument("--confirm-rounds", type=int, default=3)
    g.add_argument("--margin", type=float, default=0.01,
                   help="change a row only where the winner reads this fraction faster than the "
                        "committed row in the confirm sessions (default 0.01)")
    return p


def check_args(args):
    """The mode and token arguments of a shape search (before any device is looked at): a bad
    one is a usage error (exit status 2)."""
    if args.mode == "pool" and args.tokens != 1:
        usage_error(f"--tokens: a pool search measures the decode step, T=1; got {args.tokens}",
                    COMMAND)
    if args.mode == "verify" and not 2 <= args.tokens <= floor.MAX_TOKENS:
        usage_error(f"--tokens: a verify search (--mode verify) needs T draft tokens in "
                    f"2..{floor.MAX_TOKENS}; got {args.tokens}", COMMAND)


def make_cells(args, sd, pools):
    """The cells of one state dtype, one per ``--batch``: the TuneCell of the bench mode
    searched (bench/mode_dense.py, mode_pool.py, mode_verify.py); a pool or verify search
    shares one pool."""
    from gdnzoo.bench import mode_dense, mode_pool, mode_verify
    if args.mode not in ("pool", "verify"):
        return (mode_dense.DenseCell(sd, B, args.mode == "dest", args.tokens, GEOMETRY)
                for B in args.batch)
    if sd not in pools:
        elem, HV, V, K = DTYPES[sd].itemsize, GEOMETRY["HV"], GEOMETRY["V"], GEOMETRY["K"]
        T = args.tokens if args.mode == "verify" else 1
        P = mode_pool.pool_slots([(B, T) for B in args.batch], HV, V, K, elem, clocks.l2_bytes(),
                                 width=mode_verify.Verify.width if args.mode == "verify"
                                 else mode_pool.Serving.width)
        pools.clear()                                 # one pool at a time
        pools[sd] = mode_pool.state_pool(P, HV, V, K, sd, "cuda")
    if args.mode == "pool":
        return (mode_pool.PoolCell(sd, pools[sd], B, GEOMETRY) for B in args.batch)
    return (mode_verify.VerifyCell(sd, pools[sd], B, args.tokens, GEOMETRY) for B in args.batch)


def time_candidates(cands, reps, rounds=1, prepare=None):
    """({(backend, config): median us}, method): ``cands`` are (backend, config, launch); each
    candidate in its own kernel-clock session, all of them once per round (slow drift spreads
    over all).  ``prepare``: the cell's untimed step before each call (clocks.kernel_times)."""
    per = {(b, c): [] for b, c, _ in cands}
    method = ""
    for _ in range(rounds):
        for b, c, launch in cands:
            samples, method = clocks.kernel_times(launch, reps, prepare=prepare)
            per[(b, c)] += samples
    return {k: statistics.median(v) for k, v in per.items()}, method


def stage(cell, todo, reps, log, rounds=1, head=(), what="skip"):
    """Check and time (backend, config) candidates, beside ``head`` (launches already made, e.g.
    the floor's): ({key: median}, [(b, c, launch)], method); a failed check is logged after
    ``what``."""
    cands = list(head)
    for b, c in todo:
        try:
            cands.append((b, c, cell.checked(entries.raw(b), c)))
        except Exception as e:
            log(f"  {what} {b} {c}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            torch.cuda.synchronize()
    med, method = time_candidates(cands, reps, rounds, cell.prepare)
    return med, cands, method


def search_cell(cell, names, args, log, rows):
    """Stages 1-3 and the confirm for one cell; {backend: (config, us, floor_us, changed)}."""
    mods = {b: registry.backend_module(b) for b in names}
    fl = cell.floor_launcher()
    if fl["launch"] is None:
        raise SystemExit(f"the shape search needs the floor's CuPy kernel: {fl['config']}")
    todo = [(b, mods[b].CONFIG.normalize(c)) for b in names
            for c in mods[b].candidates(cell.problem)]
    med, _, method = stage(cell, todo, args.reps, log)
    todo = []
    for b in names:
        ranked = [c for _, c in sorted((us, c) for (bb, c), us in med.items() if bb == b)]
        todo += [(b, mods[b].CONFIG.normalize(c)) for c in mods[b].refine(ranked)]
    med2, cands2, _ = stage(cell, todo, args.reps, log, rounds=2)
    for stg, m in ((1, med), (2, med2)):
        rows += [dict(sd=cell.sd, B=cell.B, backend=b, config=c, us=us, stage=stg)
                 for (b, c), us in m.items()]
    picks, wins, committed = [("floor", "floor", fl["launch"])], {}, {}
    gpu = torch.cuda.get_device_name()
    for b in names:
        mine = [(us, c) for (bb, c), us in med2.items() if bb == b]
        if not mine:
            log(f"  {b}: no candidate passed the gate")
            continue
        wins[b] = min(mine)[1]
        picks += [t for t in cands2 if t[:2] == (b, wins[b])]
        committed[b] = mods[b].CONFIG.normalize(mods[b].launch_config(cell.problem, gpu))
        if committed[b] != wins[b]:
            try:
                picks.append((b, committed[b], cell.checked(entries.raw(b), committed[b])))
            except Exception as e:
                log(f"  committed row {b} {committed[b]}: {type(e).__name__}: {str(e)[:120]}")
                del committed[b]
    by_form = confirm(cell, picks, args, log)
    conf = by_form[cell.FORM]
    fmed = conf[("floor", "floor")]
    worst = worst_multiples(by_form)
    forms = len(by_form) > 1
    out, summary = {}, [f"{cell.sd} B={cell.B:<4d} floor {fmed:7.2f}"]
    for form, m in by_form.items():
        for (b, c), us in m.items():
            if b != "floor":
                kind = ("committed" if c == committed.get(b) and c != wins[b] else "confirm")
                rows.append(dict(sd=cell.sd, B=cell.B, backend=b, config=c, us=us,
                                 stage=kind if form == cell.FORM else f"{kind} {form}"))
    for b, c in wins.items():
        us = conf[(b, c)]
        text = f"{b} {us:7.2f} ({us / fmed:.3f}{_worst(worst, b, c) if forms else ''}) {c}"
        pick = (c, us, fmed, True)
        if b in committed:
            t_us = conf[(b, committed[b])] if committed[b] != c else us
            verdict = confirm_verdict(us, t_us, worst.get((b, c)), worst.get((b, committed[b])),
                                      committed[b] == c, args.margin, forms)
            text += (f" vs committed {t_us:7.2f} ({t_us / fmed:.3f}"
                     f"{_worst(worst, b, committed[b]) if forms else ''}) {committed[b]}: "
                     f"{verdict}")
            if verdict != "change":
                pick = (committed[b], t_us, fmed, False)
        elif worst[(b, c)][0] == math.inf:
            summary.append(f"{b}: the winner fails a form and no row serves here: none written")
            continue
        out[b] = pick
        summary.append(text)
    log("  ".join(summary) + f"   [{method}]")
    return out


def confirm(cell, picks, args, log) -> dict:
    """{form: {(backend, config): median us}} of the confirm sessions: ``picks`` (the floor
    first, then each backend's winner and committed row) in the cell's form; for a cell whose
    rows serve other forms too (``CONFIRM_FORMS``: a verify row serves all three), the same
    shapes checked and timed in each other form beside that form's floor (a shape that fails
    there is left out of it)."""
    by_form = {cell.FORM: time_candidates(picks, args.confirm_iters, args.confirm_rounds,
                                          cell.prepare)[0]}
    for form in getattr(cell, "CONFIRM_FORMS", ()):
        if form == cell.FORM:
            continue
        other = cell.in_form(form)
        fl = other.floor_launcher()
        if fl["launch"] is None:
            raise SystemExit(f"the shape search needs the floor's CuPy kernel: {fl['config']}")
        by_form[form] = stage(other, [p[:2] for p in picks[1:]], args.confirm_iters, log,
                              args.confirm_rounds, [("floor", "floor", fl["launch"])],
                              f"{form}:")[0]
    return by_form


def worst_multiples(by_form) -> dict:
    """(backend, config) -> (the largest multiple of its form's floor over the forms, that
    form): infinite where a shape was not timed in a form (it failed there)."""
    keys = {k for m in by_form.values() for k in m if k[0] != "floor"}
    worst = {}
    for k in keys:
        worst[k] = max(((m[k] / m[("floor", "floor")], f) if k in m else (math.inf, f)
                        for f, m in by_form.items()), key=lambda t: t[0])
    return worst


def _worst(worst, b, c) -> str:
    x, form = worst[(b, c)]
    return f"; worst {x:.3f} {form}"


def confirm_verdict(us, t_us, win_worst, row_worst, same, margin, forms) -> str:
    """"same", "change" or "keep" for a winner (``us``) beside the committed row (``t_us``) in
    the confirm sessions: "change" only where the winner reads at least ``margin`` faster (their
    spread is about 1%, and a table should not churn on noise); with ``forms`` (the row serves
    several forms), by the worst multiple of each form's floor (``*_worst``: (multiple, form)),
    so that a row faster in the searched form but slower in another is kept."""
    if same:
        return "same"
    if forms and win_worst[0] == math.inf:       # it failed a form's check: never written
        return "keep"
    if forms:
        return "change" if win_worst[0] <= row_worst[0] * (1 - margin) else "keep"
    return "change" if us <= t_us * (1 - margin) else "keep"


def write_files(out, rows, lines, env):
    with open(out / "gpu_tune.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["sd", "B", "backend", "config", "us", "stage"])
        w.writeheader()
        w.writerows(dict(r, config=str(r["config"])) for r in rows)
    (out / "gpu_tune.json").write_text(json.dumps(dict(env=env, rows=rows), default=str, indent=1))
    (out / "gpu_tune.log").write_text("\n".join(lines) + "\n")


def new_rows(lt, gpu, results, args, source_id):
    """The row sets of this tune and the sources they cite besides the tune's own.  Per
    (backend, state dtype): the chosen config per measured B, merged (tables.merge_measured)
    into the row set that served these calls on this GPU before, so that what was not measured
    keeps serving what it served; a changed row cites the tune, a kept one its old source (a row
    inherited from another file, e.g. a fallback's, cites ``<file>:<id>``).  Rows measured at
    T=1 are of their mode, rows of several tokens in place serve either mode, rows of a verify
    search serve verify calls."""
    mode = args.mode if args.tokens == 1 or args.mode in ("dest", "verify") else "any"
    tokens = args.rows_from_tokens or args.tokens
    own = lt.file_for(gpu)
    made, cited = [], {}
    for (b, sd), per_b in results.items():
        fields = registry.backend_module(b).CONFIG
        f, rows = lt.serving(b, gpu, sd, mode != "dest", tokens, GEOMETRY,
                             pool=mode in ("pool", "verify"), verify=mode == "verify")
        existing = []
        for r in rows:
            sid = r.source if f is own else f"{f.slug}:{r.source}"
            cited.setdefault(sid, f.sources[r.source])
            existing.append((r.lo, r.hi, (fields.normalize(r.config), sid)))
        chosen = {B: (cfg, source_id if changed else next(     # a kept row keeps its source
                      (v[1] for lo, hi, v in existing if lo <= B and (hi is None or B <= hi)),
                      source_id)) for B, (cfg, _, _, changed) in per_b.items()}
        merged = tables.merge_measured(existing, chosen)
        if merged == existing:               # every measured row kept: nothing to write
            continue
        made += [tables.LaunchRow(b, sd, mode, tokens, lo, hi, fields.as_dict(cfg), src,
                                  hv=GEOMETRY["HV"]) for lo, hi, (cfg, src) in merged]
    return made, cited


def write_table(gpu, made, source):
    """Put ``made`` into this GPU's table file (a new one when no file matches it)."""
    f = tables.launch_tables().file_for(gpu)
    if f.match is None:                     # no file of its own: start one
        f = tables.LaunchFile(tables.gpu_slug(gpu), tables.tables_dir() /
                              f"{tables.gpu_slug(gpu)}.yaml", gpu, gpu, tables.DEFAULT_FILE,
                              GEOMETRY, {}, [])
    f = tables.replace_rows(f, made, source)
    order = {b: registry.backend_module(b).CONFIG.names for b in {r.backend for r in f.rows}}
    text = tables.render_launch_file(f, order)
    tables.parse_launch_file(yaml.safe_load(text), f.path)                  # it must load
    f.path.write_text(text)
    tables.reset()
    return f.path


def fresh_source_id(base: str, taken) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first that no source of ``taken`` (a
    table file's sources) already names, so a second tune of a day never files its rows under
    the first one's description."""
    sid, i = base, 1
    while sid in taken:
        i += 1
        sid = f"{base}-{i}"
    return sid


def cmd_shapes(args) -> int:
    from gdnzoo.bench import report
    check_args(args)
    if not torch.cuda.is_available():
        raise SystemExit("gdnzoo tune --shapes: needs a CUDA device (the rows are per GPU)")
    # verify rows only for the backends serving verify
    tunable = entries.backends(tunable=True, verify=True if args.mode == "verify" else None)
    names = [n.strip() for n in (args.algo or ",".join(tunable)).split(",") if n.strip()]
    bad = [n for n in names if n not in tunable]
    if bad:
        raise SystemExit(f"--algo: not tunable{' in verify mode' * (args.mode == 'verify')}: "
                         f"{', '.join(bad)}; tunable: {', '.join(tunable)}")
    names = [n for n in names if registry.availability(n, "cuda")[0]]
    gpu = torch.cuda.get_device_name()
    out = Path(args.out or Path(report.default_out_dir()) / "shapes")
    out.mkdir(parents=True, exist_ok=True)
    env = report.environment("gdnzoo tune --shapes", {}, [])
    lines, rows, results = [], [], {}

    def log(s):
        lines.append(s)
        if not args.quiet or not s.startswith("  skip"):
            print(s, flush=True)

    t0 = time.time()
    log(f"# gdnzoo tune --shapes --algo {','.join(names)} --mode {args.mode} --tokens "
        f"{args.tokens} on {gpu}, commit {env.get('commit')}")
    pools = {}
    for sd in [s.strip() for s in args.state_dtype.split(",") if s.strip()]:
        for cell in make_cells(args, sd, pools):
            for b, pick in search_cell(cell, names, args, log, rows).items():
                results.setdefault((b, sd), {})[cell.B] = pick
            lines[-1] += f" [{time.time() - t0:.0f} s]"
            write_files(out, rows, lines, env)
            del cell
            torch.cuda.empty_cache()
    sid = fresh_source_id(f"tune-{datetime.date.today().isoformat()}-{args.mode}-t{args.tokens}",
                          tables.launch_tables().file_for(gpu).sources)
    try:                                      # the csv relative to the working directory
        shown = str((out / "gpu_tune.csv").resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(out / "gpu_tune.csv")
    conv = {"pool": " in the serving convention of gdnzoo bench --mode pool (page-strided pool, "
                    "fresh random slots every call, packed mixed_qkv, use_qk_l2norm=True)",
            "verify": " in the verify serving convention of gdnzoo bench --mode verify, "
                      "states form (intermediate_states by intermediate_indices, "
                      "update_state=False, page-strided pool, fresh random slots and "
                      "intermediate rows every call, packed mixed_qkv, use_qk_l2norm=True), "
                      "the winner confirmed beside the committed row in the states, "
                      "states+update and slots forms, each beside its own floor"
            }.get(args.mode, "")
    by = " by the worst multiple of a form's floor" if args.mode == "verify" else ""
    src = {sid: dict(how=f"gdnzoo tune --shapes --algo {','.join(names)} --mode {args.mode} "
                         f"--tokens {args.tokens} on {gpu}{conv}: winners beside the committed "
                         f"rows, changed where >= {args.margin:.0%} faster{by}",
                     date=datetime.date.today().isoformat(), commit=env.get("commit"),
                     results=[shown])}
    made, cited = new_rows(tables.launch_tables(), gpu, results, args, sid)
    src.update(cited)
    log("\nrow sets with a change (the winner beat the committed row by the margin; the other "
        "rows kept):" if made else "\nno row changed: every committed row held within the margin")
    for r in made:
        log(f"  {r.backend} {r.state} {r.mode} tokens>={r.tokens} batch [{r.lo}, {r.hi}]: "
            f"{r.config} ({r.source})")
    write_files(out, rows, lines, env)
    if args.write and made:
        log(f"wrote {write_table(gpu, made, src)}")
    elif made:
        log("(--write puts them into this GPU's file under backends/tables/)")
    return 0

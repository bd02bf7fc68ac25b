"""``gdnzoo bench``'s options: their types, the modes, the model presets, the results folder.

A bad value is a usage error (exit status 2, naming the option) before anything is measured.
Importing this module imports no torch (``gdnzoo bench --help`` answers at once).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from pathlib import Path

# --mode NAME -> the module under gdnzoo.bench that defines it (its MODES dict)
MODES = {"dense": "mode_dense", "dest": "mode_dense", "pool": "mode_pool",
         "verify": "mode_verify", "chained": "mode_chained", "prefill": "mode_prefill",
         "engine-prefill": "mode_engine_prefill"}
ALIASES = {"inplace": "dense"}
TOGETHER = ("dense", "dest")             # modes that share one run; the others run alone
CLOCKS = ("kernel", "graph", "host")
STATE_DTYPES = ("fp32", "bf16")
PREFILL_FORMS = ("dense", "pool")          # --mode prefill's cell forms
DEFAULT_BATCHES = (1, 4, 8, 16, 32, 48, 64, 128, 256, 512)
DEFAULT_BUDGET_S = 240.0
TP = (1, 2, 4, 8)
# GDN geometries of released models: (H, HV), K = V = 128; heads per GPU are H/TP, HV/TP
MODELS = {"qwen3-next": (16, 32), "qwen3.5-397b": (16, 64), "qwen3.5-27b": (16, 48),
          "qwen3.5-2b": (16, 16)}
MODEL_ALIASES = {"qwen3-next-80b-a3b": "qwen3-next", "qwen3.5-35b-a3b": "qwen3-next",
                 "qwen3.5-9b": "qwen3-next", "qwen3.5-4b": "qwen3-next",
                 "qwen3.5-397b-a17b": "qwen3.5-397b", "qwen3.5-122b-a10b": "qwen3.5-397b",
                 "qwen3.6-27b": "qwen3.5-27b", "qwen3.5-0.8b": "qwen3.5-2b"}
MODEL_DIM = 128


def usage_error(msg, command="gdnzoo bench"):
    """An argument error: exit status 2, as argparse's own."""
    print(f"{command}: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def words(s) -> list:
    """A comma list's words, duplicates dropped (first kept)."""
    return list(dict.fromkeys(x.strip() for x in str(s).split(",") if x.strip()))


def positive_int(s):
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _ints(s, what) -> list:
    ws = [x.strip() for x in str(s).split(",") if x.strip()]
    if not ws:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return [positive_int(w) for w in ws]


def positive_ints(s):
    """A comma list of positive integers, e.g. 1,4,16; a value given twice counts once."""
    return list(dict.fromkeys(_ints(s, "a comma list of positive integers")))


def non_negative_float(s):
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {s!r}")
    return x


def heads(s):
    """H,HV with HV a multiple of H, as (H, HV)."""
    try:
        H, HV = (int(w) for w in str(s).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,HV like 4,8; got {s!r}") from None
    if H < 1 or HV < 1 or HV % H:
        raise argparse.ArgumentTypeError(f"expected H,HV >= 1 with HV a multiple of H, got {s!r}")
    return H, HV


def one_of(valid, what):
    """A comma list of words, each one of ``valid``."""
    def parse(s):
        ws = words(s)
        if not ws or any(w not in valid for w in ws):
            raise argparse.ArgumentTypeError(f"expected a comma list of {what} from "
                                             f"{', '.join(valid)}; got {s!r}")
        return ws
    return parse


def modes(s):
    """--mode: one mode, or dense and dest together (``inplace`` is dense)."""
    ws = list(dict.fromkeys(ALIASES.get(w, w) for w in one_of((*MODES, *ALIASES), "modes")(s)))
    if len(ws) > 1 and any(w not in TOGETHER for w in ws):
        alone = next(w for w in ws if w not in TOGETHER)
        raise argparse.ArgumentTypeError(f"{alone} runs alone; got {s!r}")
    return ws


def timings(s):
    """--timing: a comma list of kernel, graph, host; ``chained`` (alone) is --mode chained."""
    ws = one_of(CLOCKS + ("chained",), "clocks")(s)
    if "chained" in ws and len(ws) > 1:
        raise argparse.ArgumentTypeError(f"chained (--mode chained) runs alone; got {s!r}")
    return ws


def token_counts(s):
    """T: one positive integer, or (for --mode verify) a comma list of distinct ones, returned
    as a tuple."""
    ts = _ints(s, "a positive integer or a comma list of them")
    if len(set(ts)) != len(ts):
        raise argparse.ArgumentTypeError(f"expected distinct token counts, got {s!r}")
    return ts[0] if len(ts) == 1 else tuple(ts)


def names(s):
    if not words(s):
        raise argparse.ArgumentTypeError(f"expected a comma list of backend names or 'all', "
                                         f"got {s!r}")
    return ",".join(words(s))


def model(s):
    key = MODEL_ALIASES.get(str(s).lower(), str(s).lower())
    if key not in MODELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(MODELS)} (or "
                                         f"{', '.join(MODEL_ALIASES)}); got {s!r}")
    return key


class _Unset:
    """Marks a default value, so that a mode with defaults of its own tells it from the same
    value given on the command line."""


def _unset(value):
    """``value`` marked as a default: an instance of its type's subclass of :class:`_Unset`."""
    return type(f"_Unset{type(value).__name__}", (_Unset, type(value)), {})(value)


def given(value) -> bool:
    """Whether an option's value came from the command line (not :func:`add_bench_args`'s
    default)."""
    return not isinstance(value, _Unset)


def add_bench_args(p):
    p.add_argument("--mode", type=modes, default=_unset(["dense"]),
                   help="dense (in place; 'inplace' too), dest (destination passing; dense,dest "
                        "in one run), pool (the serving convention), verify (speculative verify), "
                        "chained (the decode in a graph of layers), prefill (the chunked "
                        "prefill of sequence mixes) or engine-prefill (the engines' prefill "
                        "call around FlashInfer beside gdnzoo's adapters); default dense")
    p.add_argument("--algo", type=names, default=None,
                   help="comma list of backends or 'all' (default: ALGO env, else the mode's)")
    p.add_argument("--batch", type=positive_ints, default=_unset(list(DEFAULT_BATCHES)),
                   help="comma list of batch sizes (default: the mode's; dense "
                        "1,4,8,16,32,48,64,128,256,512; --mode prefill and engine-prefill: "
                        "--mix)")
    p.add_argument("--heads", type=heads, default=_unset((4, 8)),
                   help="H,HV (default 4,8: the contest geometry; --mode prefill: 4,8 16,32 "
                        "16,48 16,64 2,8)")
    p.add_argument("--model", type=model, default=None,
                   help=f"the GDN geometry of a released model ({', '.join(MODELS)}): heads "
                        f"H/TP, HV/TP, K = V = {MODEL_DIM}; not with --heads")
    p.add_argument("--tp", type=positive_int, default=None,
                   help="--model: tensor-parallel ways, one of 1, 2, 4, 8 (default 1)")
    p.add_argument("--dim", type=positive_int, default=_unset(128), help="K = V (default 128)")
    p.add_argument("--tokens", type=token_counts, default=_unset(1),
                   help="T tokens per call (default 1); --mode verify: a comma list of T in "
                        "2..16 (default 2,4,8); --mode prefill and engine-prefill: --mix")
    p.add_argument("--state-dtype", type=one_of(STATE_DTYPES, "state dtypes"),
                   default=_unset(["fp32"]), help="fp32, bf16 or fp32,bf16")
    p.add_argument("--timing", type=timings, default=_unset(list(CLOCKS)),
                   help="comma list of kernel,graph,host (default: every clock the mode has); "
                        "'chained' is --mode chained")
    p.add_argument("--mix", type=mixes, default=None,
                   help="--mode prefill or engine-prefill: comma list of sequence mixes, NxL "
                        "(N sequences of L tokens) or ragged (default: the mode's mixes)")
    p.add_argument("--form", type=one_of(PREFILL_FORMS, "forms"), default=None,
                   help="--mode prefill: dense (one state per sequence), pool (the states in a "
                        "pool of slots) or dense,pool (default)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="--mode chained: layers in the graph (default 64)")
    p.add_argument("--state-layout", choices=("k-last", "k-first"), default="k-last",
                   help="--mode dense/dest/prefill: the state's layout, k-last [.., HV, V, K] "
                        "(default) or k-first [.., HV, K, V] (FLA's and transformers')")
    p.add_argument("--l2norm", action="store_true", help="use_qk_l2norm=True")
    p.add_argument("--iters", type=positive_int, default=200,
                   help="most timed calls per clock per cell")
    p.add_argument("--nvbench", action="store_true",
                   help="cross-check kernel time with NVBench (cuda-bench), in a subprocess")
    p.add_argument("--out", default=None,
                   help="results directory (default gdnzoo-results/<gpu-slug>/ in the working "
                        "directory, a subfolder per serving mode; split runs need one each)")
    p.add_argument("--time-budget", type=non_negative_float,
                   default=_unset(DEFAULT_BUDGET_S),
                   help=f"seconds; cells not started by then are SKIPped (slow backends run "
                        f"last); 0 = none (default: the mode's; dense {DEFAULT_BUDGET_S:g})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--no-plots", action="store_true",
                   help="no latency.png / bandwidth.png (they need matplotlib: the bench extra)")
    p.add_argument("--quiet", action="store_true", help="no progress")
    return p


MIX = re.compile(r"(\d+)x(\d+)(?:\+(\d+)pad)?")       # NxL, NxL+Kpad (a sequence mix)


def mixes(s) -> list:
    """``--mix``: a comma list of NxL, NxL+Kpad and ragged."""
    out = words(s)
    for w in out:
        m = MIX.fullmatch(w)
        if w != "ragged" and not (m and int(m[1]) >= 1 and int(m[2]) >= 1):
            raise argparse.ArgumentTypeError(f"expected NxL (N sequences of L tokens), NxL+Kpad "
                                             f"(and K padded entries) or ragged, got {w!r}")
    return out


def resolve(args) -> list:
    """Cross-option checks (usage errors) and the presets, in place on ``args``; returns notes
    to show.  ``--timing chained`` becomes ``--mode chained``; ``--model`` sets the heads and
    K = V."""
    notes = []
    if list(args.timing) == ["chained"]:
        if given(args.mode) and args.mode != ["chained"]:
            usage_error(f"--timing chained is --mode chained; got --mode {','.join(args.mode)}")
        args.mode, args.timing = ["chained"], _unset(list(CLOCKS))
        notes.append("--timing chained: read as --mode chained")
    if args.layers is not None and args.mode != ["chained"]:
        usage_error("--layers: only with --mode chained")
    if args.form is not None and args.mode != ["prefill"]:
        usage_error("--form: only with --mode prefill")
    from gdnzoo.bench.pipeline import get_mode
    if all("mix" in get_mode(m).keys for m in args.mode):
        # cells are sequence mixes: their sequences and tokens come from --mix, not B and T
        for option, value in (("--batch", args.batch), ("--tokens", args.tokens)):
            if given(value):
                usage_error(f"{option}: --mode {','.join(args.mode)} times sequence mixes; "
                            f"give them with --mix NxL (N sequences of L tokens)")
    elif args.mix is not None:
        usage_error("--mix: only with a mode whose cells are sequence mixes (--mode "
                    + " or ".join(m for m in MODES if "mix" in get_mode(m).keys) + ")")
    if args.model is None:
        if args.tp is not None:
            usage_error("--tp: only with --model")
        return notes
    if given(args.heads):
        usage_error("--model and --heads: give one of them (--model sets the heads)")
    if given(args.dim) and args.dim != MODEL_DIM:
        usage_error(f"--dim: --model {args.model} has K = V = {MODEL_DIM}, got {args.dim}")
    tp = args.tp or 1
    H, HV = MODELS[args.model]
    if tp not in TP or H % tp or HV % tp:
        usage_error(f"--tp: {args.model} (H={H}, HV={HV}) splits over TP in "
                    f"{', '.join(str(t) for t in TP if H % t == 0 and HV % t == 0)}; got {tp}")
    args.heads, args.dim = (H // tp, HV // tp), MODEL_DIM
    notes.append(f"--model {args.model} --tp {tp}: H={H // tp}, HV={HV // tp}, K=V={MODEL_DIM}")
    return notes


def drop_env_pdl(command: str) -> str | None:
    """Unset GDNZOO_PDL for the rest of this process: ``command`` (bench, check, tune --shapes)
    names every backend itself, and gdnzoo refuses a named backend that cannot launch with the
    PDL asked for; each of its calls runs without PDL (``gdnzoo bench --mode chained`` measures
    PDL levels of its own).  The note saying so, or None when the variable was unset."""
    value = os.environ.pop("GDNZOO_PDL", None)
    if not value:
        return None
    return (f"GDNZOO_PDL={value} is not applied by {command}: it names each backend, and calls "
            f"them without PDL (`gdnzoo bench --mode chained` measures PDL)")


def check_out(path, command="gdnzoo bench") -> Path:
    """The results folder, created and probed before anything is measured: an existing file, a
    folder that cannot be made or one not writable is a usage error."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        usage_error(f"--out: {out} exists and is not a directory", command)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".gdnzoo-probe-"):
            pass
    except OSError as e:
        usage_error(f"--out: cannot write results into {out} ({e.strerror or e})", command)
    if not os.access(out, os.W_OK):
        usage_error(f"--out: {out} is not writable", command)
    return out

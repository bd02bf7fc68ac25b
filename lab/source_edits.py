"""A kernel source with named text edits, for the A/B scripts (``lab/chain_ab.py``,
``lab/prep_ab.py``): each variant a list of (old, new) pairs, each ``old`` met exactly once."""
from __future__ import annotations

import runpy
import tempfile
from pathlib import Path


def edited(source: Path, edits: dict, name: str) -> Path:
    """``source`` with the edits of variant ``name`` ("a+b": both, in turn), written to a
    temporary file of the source's name (its includes still resolve through the build's
    include path)."""
    text = Path(source).read_text()
    for part in name.split("+"):
        for old, new in edits[part]:
            if text.count(old) != 1:
                raise SystemExit(f"variant {part}: an anchor is not in {Path(source).name} once "
                                 "(the kernel changed)")
            text = text.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"{Path(source).stem}_{name.replace('+', '_')}.cu"
    path.write_text(text)
    return path


def load(path: str) -> dict:
    """The ``EDITS`` dict of a Python file."""
    return runpy.run_path(path)["EDITS"]

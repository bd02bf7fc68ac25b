"""Ours and FLA itself against the float64 oracle where tests/test_integrations_fla.py's
test_matches_fla_itself compared the two directly until 1749cef: the allow_neg_eigval forms on
its "long" shape (chunk entry point).  Prints each side's relative RMS error of output and final
state against float64, and the largest elementwise state difference.  Kept as the record of what
ran (call5_fla_neg_oracle.log); ``python -m lab.models_gpu --parts correctness`` measures both
sides against float64 over every form and shape.  GPU with FLA importable, from the repository
root:

    python lab/notebook/h200/gpu_checks_bundle_2026-11-30/fla_neg_oracle.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
import test_integrations_fla as t                          # noqa: E402
from fla_oracle import fla_oracle, state_error             # noqa: E402


def main():
    from fla.ops import gated_delta_rule as upstream
    B, T, H, HV, lens = t.SHAPES["long"]
    for form in ("raw-neg", "beta-in-neg", "raw"):
        for v_first in (False, True):
            kw, oracle = t.make(13, B, T, H, HV, lens, K=128, V=128, form=form, v_first=v_first)
            ref_o, ref_s = fla_oracle(**oracle)
            mine = t.fla.chunk_gated_delta_rule(**kw)
            theirs = upstream.chunk_gated_delta_rule(**kw)
            row = []
            for who, (o, s) in (("gdnzoo", mine), ("FLA", theirs)):
                o, s = o.cpu(), s.cpu()
                row.append(f"{who}: out {state_error(o, ref_o):.3e} state "
                           f"{state_error(s, ref_s):.3e} max|ds| "
                           f"{(s.double() - ref_s.double()).abs().max().item():.3e}")
            print(f"{form:12s} v_first={v_first!s:5s} " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()

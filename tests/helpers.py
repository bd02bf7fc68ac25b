"""Test helpers: the correctness gate (gdnzoo.gate) as an assertion."""
from __future__ import annotations

from gdnzoo import gate


def assert_matches(out, new_state, ref_out, ref_state, state_dtype, what=""):
    """Both rules of the gate (the contest's elementwise rule and the relative-error bound) on
    output and new state, each in its expected dtype."""
    j = gate.judge(out, new_state, ref_out, ref_state, state_dtype=state_dtype)
    assert j.ok, f"{what}: {j.reason}"


def assert_gated(call, x, what="", **kw):
    """Run ``call`` through gate.gated_call (NaN-prefilled outputs, inputs and, with
    destination passing, state untouched) and assert the gate passed; returns (out, new_state)."""
    j, out, new_state = gate.gated_call(call, x, **kw)
    assert j.ok, f"{what}: {j.reason}"
    return out, new_state


def run_cli(argv, capsys):
    """(exit status, stdout, stderr) of ``gdnzoo ARGV`` in this process."""
    from gdnzoo import cli
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err

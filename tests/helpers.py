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


def record(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           pool=None, verify=None, pdl=0, algo="test"):
    """The decode call record a backend receives (``gdnzoo.dispatch.record``: validated) for
    arguments in the positional launch form (``pool``: a :class:`gdnzoo.pool.Pool`, ``verify``:
    a :class:`gdnzoo.verify.Verify`, ``pdl``: 0, 1 or 2), for tests that launch a backend
    directly."""
    from gdnzoo import dispatch
    from gdnzoo.operation import DECODE
    kw = dict(state_indices=None, new_state_indices=None, null_slot=None,
              intermediate_states=None, intermediate_indices=None, update_state=True,
              num_accepted_tokens=None)
    if pool is not None:
        kw.update(state_indices=pool.read,
                  new_state_indices=None if pool.write is pool.read else pool.write,
                  null_slot=None if pool.null_slot < 0 else pool.null_slot)
    if verify is not None:
        kw.update(intermediate_states=verify.states, intermediate_indices=verify.indices,
                  update_state=verify.update or verify.per_token,
                  num_accepted_tokens=verify.accepted)
    level = {0: None, 1: "wait", 2: "early"}.get(pdl, pdl)
    args = (q, k, v, state, A_log, a, dt_bias, b, scale, out,
            None if new_state is state else new_state, use_qk_l2norm, None, *kw.values(),
            level, None, None, False, "k-last")
    return dispatch.record(DECODE, args, algo)


def run(mod, *args, config=None, **kw):
    """``mod.run`` (a backend module) on the record of the positional launch form ``args``
    (:func:`record`'s, with its ``pool``, ``verify``, ``pdl`` keywords)."""
    mod.run(record(*args, **kw), config=config)

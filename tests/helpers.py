"""Test helpers: the correctness gate (gdnzoo.gate) as an assertion."""
from __future__ import annotations

from gdnzoo import gate


def cuda_missing(min_cc=None):
    """Why the CUDA backends' kernels cannot run here (no CUDA device, no CuPy, or a compute
    capability below ``min_cc``), or None when they can."""
    import importlib.util

    import torch
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("cupy") is None:
        return "cupy not installed"
    if min_cc is not None and torch.cuda.get_device_capability() < min_cc:
        return f"compute capability {torch.cuda.get_device_capability()} < {min_cc[0]}.{min_cc[1]}"
    return None


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


def bench_args(*argv):
    """``gdnzoo bench``'s options from ``argv`` (nothing run)."""
    import argparse
    from gdnzoo.bench import args
    return args.add_bench_args(argparse.ArgumentParser()).parse_args([str(a) for a in argv])


def bench_plan(*argv):
    """The plan of ``gdnzoo bench ARGV`` (defaults: --device cpu)."""
    from gdnzoo.bench import pipeline
    return pipeline.make_plan(bench_args(*(() if "--device" in argv else ("--device", "cpu")),
                                         *argv))


def bench_run(args):
    """(plan, measured rows, device reference) of a ``gdnzoo bench`` run; nothing written."""
    from gdnzoo.bench import pipeline
    plan = pipeline.make_plan(args)
    rows, ref = pipeline.measure(plan, args)
    return plan, rows, ref


def bench_files(raw, plan, out, ref=None):
    """The table of measured rows ``raw`` written under ``out`` with a made-up H100 environment
    and read back: (table, environment, files, rows read, columns)."""
    from gdnzoo.bench import report
    table = report.build_table(raw, ref, plan)
    env = dict(gpu="NVIDIA H100 80GB HBM3", driver="d", cuda="13.0", commit="c",
               method=plan.mode.method, versions={"torch": "2.11"},
               kernel_clock="cupti-python activity records")
    cols = report.columns(plan.mode)
    files = report.write_results(table, env, out, cols)
    back, _ = report.read_results(files[1])
    return table, env, files, back, cols
def record(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm,
           pool=None, verify=None, pdl=0, algo="test"):
    """The decode call record a backend receives (``gdnzoo.dispatch.record``: validated) for
    arguments in the positional launch form (``pool``: a :class:`gdnzoo.pool.Pool`, ``verify``:
    a :class:`gdnzoo.verify.Verify`, ``pdl``: 0, 1 or 2), for tests that launch a backend
    directly: the bench's own record (gdnzoo.bench.entries.record)."""
    from gdnzoo.bench import entries
    return entries.record(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
                          use_qk_l2norm, pool, verify, pdl, algo)


def run(mod, *args, config=None, **kw):
    """``mod.run`` (a backend module) on the record of the positional launch form ``args``
    (:func:`record`'s, with its ``pool``, ``verify``, ``pdl`` keywords)."""
    mod.run(record(*args, **kw), config=config)


def ptx_code(ptx):
    """The PTX's instructions and declarations, without debug info (line directives, labels
    that only mark lines, the debug sections, comments)."""
    out = []
    for line in ptx.split("\t.section\t.debug")[0].splitlines():
        s = line.split("//")[0].strip()
        if s and not s.startswith((".loc", ".file", "$L__tmp", "$L__func")):
            out.append(s)
    return out


def served_twice(call):
    """``call()``, a valid call, made twice: its signature memoized and, where dynamo's guards
    work in this process, guarded (a signature is guarded once seen again), so a refusal right
    after it meets both memo layers."""
    from gdnzoo import dispatch, guards
    call()
    call()
    assert dispatch._MEMO, "the valid call was not memoized"
    if guards._state.get("ok"):
        assert any(isinstance(k[0], str) for k in dispatch._MEMO), "the valid call was not guarded"

"""GPU lab: one-off experiments on a lent GPU (sanitizers, host-time breakdowns, gate accuracy,
flashinfer-bench's own evaluator), run from the repository root as ``python3 -m lab.<name>``.
Not part of the installed package; every script shares :mod:`lab.harness`."""

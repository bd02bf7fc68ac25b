"""GPU lab: one-off experiments on a lent GPU (sanitizers, host-time breakdowns and A/Bs, the
CUDA build report, flashinfer-bench's own evaluator, verify A/Bs of launch shapes), run from the
repository root as ``python3 -m lab.<name>``.  Not part of the installed package; every script
shares :mod:`lab.harness`.  What the sessions found, and each experiment's material: the
notebook, ``lab/notebook/`` (its README.md is the index)."""

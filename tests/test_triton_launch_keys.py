"""The raw launches of the chunked prefill's Triton kernels (``_triton_launch.LaunchCache``)
against Triton's own specialization.

After a signature's first call through Triton's ``kernel[grid](...)``, the launch cache sends
every call with the same key straight to that call's compiled kernel.  That is right only if
calls with one key are calls Triton would run on one compiled kernel.  Checked without a GPU:
in a subprocess in Triton's JIT mode, every launch triton_chunk.launch makes for a set of
prefill calls (token counts of every class Triton tells apart, zero-length sequences, pools,
no state, the "bf16" precision, the segmented form) is recorded instead of run, and for each
kernel, calls of equal keys must have equal Triton specializations (Triton's binder for an
sm_90 GPU: every parameter's type, alignment and int class, constexpr values, options).  And a
prompt of another length of the same class is no new key.  CI runs it under the pinned and the
newest Triton.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# (case, lengths, form): token counts 201 and 193 (odd), 192 (a multiple of 16), 1, 32
CASES = [("odd", [130, 64, 7], "dense"), ("odd2", [150, 40, 3], "dense"),
         ("x16", [64, 64, 64], "dense"), ("one", [1], "dense"), ("x16b", [16, 16], "dense"),
         ("zero", [130, 0, 71], "dense"), ("n4", [130, 64, 7, 9], "dense"),
         ("pool", [130, 64, 7], "pool"), ("pool2", [150, 40, 3], "pool"),
         ("nostate", [130, 64, 7], "none"), ("bf16", [130, 64, 7], "bf16"),
         ("bf16b", [150, 40, 3], "bf16"), ("seg", [130, 64, 7], "segments"),
         ("seg2", [150, 40, 3], "segments")]


def _record(lengths, form):
    """[(kernel name, LaunchCache key, Triton's specialization)] of every Triton launch
    triton_chunk.launch makes for one call (nothing run)."""
    from gdnzoo.backends import _triton_launch as tlaunch
    from gdnzoo.backends import triton_chunk
    from gdnzoo.inputs import make_prefill_inputs
    x = make_prefill_inputs(lengths, H=2, HV=4, K=128, V=128, seed=0)
    kw = dict(config=dict(block_v=32))
    state = x.state
    if form == "pool":
        state = torch.cat([x.state, x.state])            # a pool of 2N slots
        kw["state_indices"] = torch.arange(len(lengths), dtype=torch.int32) * 2
    elif form == "none":
        state = None
    elif form == "bf16":
        kw["config"] = dict(block_v=32, precision="bf16")
    elif form == "segments":
        kw["config"] = dict(block_v=32, segments=2)
    new_state = state if state is not None else torch.empty_like(x.state)
    seen, cache = [], tlaunch.LaunchCache()

    def launch(kernel, grid0, args, **kwargs):
        key = cache.key(kernel, args, kwargs)
        seen.append((kernel.fn.__name__, repr((key[0][0][1:], key[0][1:])),
                     repr(tlaunch.triton_specialization(kernel, args, kwargs))))
    saved = triton_chunk._LAUNCH
    triton_chunk._LAUNCH = launch
    try:
        triton_chunk.launch(x.q, x.k, x.v, state, x.A_log, x.a, x.dt_bias, x.b, x.cu_seqlens,
                            x.scale, torch.empty_like(x.v), new_state, True, **kw)
    finally:
        triton_chunk._LAUNCH = saved
    return seen


def record_all(out_path):
    """The subprocess's work (JIT mode): every case's launches, JSON to ``out_path``."""
    Path(out_path).write_text(json.dumps({c: _record(L, f) for c, L, f in CASES}))


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("launch_keys") / "keys.json"
    env = dict(os.environ, TRITON_INTERPRET="0")      # JIT mode (conftest keeps a set value)
    r = subprocess.run([sys.executable, __file__, str(out)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def test_equal_keys_are_one_compiled_kernel(launches):
    kernels, by_key = set(), {}
    for case, seen in launches.items():
        for name, key, spec in seen:
            kernels.add(name)
            by_key.setdefault((name, key), {}).setdefault(spec, []).append(case)
    # every kernel of the chunked prefill was launched, the segmented form's three included
    assert {"chunk_prep_kernel", "chunk_state_kernel", "cp_chain_kernel", "cp_combine_kernel",
            "cp_out_kernel"} <= kernels, kernels
    split = {k: v for k, v in by_key.items() if len(v) > 1}
    assert not split, f"one launch-cache key, several Triton specializations: {split}"


def test_another_prompt_length_is_no_new_key(launches):
    """Token counts 201 and 193 (and their sequences) are one class for Triton: the same keys,
    kernel by kernel, in every form."""
    for a, b in (("odd", "odd2"), ("pool", "pool2"), ("bf16", "bf16b"), ("seg", "seg2")):
        ka = [(n, k) for n, k, _ in launches[a]]
        kb = [(n, k) for n, k, _ in launches[b]]
        assert ka == kb, (a, b)


def test_triton_tells_the_classes_apart(launches):
    """The check has teeth: Triton itself specializes the state kernel differently for a
    token count of 1 or a multiple of 16 than for 201 (else the cases above prove little), and
    the launch cache's keys differ there too."""
    def state(case):
        return next((k, s) for n, k, s in launches[case] if n == "chunk_state_kernel")
    odd = state("odd")
    for case in ("one", "x16"):
        assert state(case)[1] != odd[1] and state(case)[0] != odd[0], case


if __name__ == "__main__":
    record_all(sys.argv[1])

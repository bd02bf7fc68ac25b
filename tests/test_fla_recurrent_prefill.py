"""fla-recurrent's prefill kernel (``gdn_varlen_kernel``) beyond the shared prefill matrix: it
compiles for sm_90 without a GPU in every form it declares (the arguments its launcher passes,
Triton's JIT mode in a subprocess), and its launch shape follows the decode rows."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from gdnzoo import dispatch, operation
from gdnzoo.inputs import make_prefill_inputs

ROOT = Path(__file__).resolve().parents[1]

# (name, keywords of gdnzoo.prefill beyond the inputs, state dtype, K-first)
FORMS = [
    ("dense-fp32", dict(use_qk_l2norm=True), torch.float32, False),
    ("pool-k-first-bf16-init", dict(state_indices=[2, -1, 0], null_slot=1,
                                    has_initial_state=[True, True, False]), torch.bfloat16, True),
    ("checkpoints-g-beta", dict(checkpoints=True, checkpoint_every=64, g=True),
     torch.float32, False),
    ("neg-eigval-dest-k-first", dict(allow_neg_eigval=True, new_state=True), torch.float32,
     True),
    ("zeros-dest", dict(state=None), torch.float32, False),
]


def _record(kw, sd, k_first):
    """The call record ``gdnzoo.prefill`` would hand the backend for this form (CPU tensors)."""
    x = make_prefill_inputs([130, 64, 7], H=2, HV=4, K=128, V=128, state_dtype=sd)
    kw = dict(kw)
    state = x.state.transpose(-1, -2).contiguous() if k_first else x.state
    if "state" in kw:
        state = kw.pop("state")
    A_log, a, dt_bias, b = x.A_log, x.a, x.dt_bias, x.b
    if kw.pop("g", False):
        g = -torch.rand(a.shape)
        kw.update(g=g, beta=torch.rand(a.shape).to(torch.bfloat16))
        A_log = a = dt_bias = b = None
    for name in ("state_indices", "has_initial_state"):
        if name in kw:
            kw[name] = torch.tensor(kw[name], dtype=torch.int32 if name == "state_indices"
                                    else torch.bool)
    if kw.get("new_state") is True:
        kw["new_state"] = torch.empty_like(state)
    if kw.get("checkpoints") is True:
        kw["checkpoints"] = torch.empty(3, 4, 128, 128)
    if k_first:
        kw["state_layout"] = "k-first"
    op = operation.get("prefill")
    args = operation.binder(op)(x.q, x.k, x.v, state, A_log, a, dt_bias, b, x.cu_seqlens, **kw)
    return dispatch.record(op, args, "fla-recurrent")


def compile_all(out_path):
    """The subprocess's work (JIT mode): each form's kernel compiled for sm_90."""
    import gdnzoo.backends._triton_decode_kernel as kern
    from gdnzoo.backends import _fla_recurrent_prefill as frp
    from gdnzoo.backends._triton_launch import compile_offline
    res = {}
    for name, kw, sd, k_first in FORMS:
        seen = {}

        class Rec:
            def __getitem__(self, grid):
                def record(*args, **kwargs):
                    seen.update(args=args, kwargs=kwargs)
                return record
        saved, kern.gdn_varlen_kernel = kern.gdn_varlen_kernel, Rec()
        try:
            frp.run(_record(kw, sd, k_first), config=(16, 4, 8))
        finally:
            kern.gdn_varlen_kernel = saved
        ck = compile_offline(kern.gdn_varlen_kernel, seen["args"], seen["kwargs"])
        ptx = ck.asm["ptx"]
        res[name] = dict(loads=ptx.count("ld.global"), stores=ptx.count("st.global"),
                         local=ptx.count(".local"))
    Path(out_path).write_text(json.dumps(res))


def test_compiles_for_sm90_in_every_form(tmp_path):
    out = tmp_path / "res.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys; sys.path[:0] = [%r, %r]; import test_fla_recurrent_prefill as t; "
            "t.compile_all(%r)" % (str(ROOT / "tests"), str(ROOT), str(out)))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) == {f[0] for f in FORMS}
    for name, r in res.items():
        assert r["loads"] > 0 and r["stores"] > 0, (name, r)
        assert r["local"] == 0, f"{name}: local memory in the PTX (a spill or a stack array)"


def test_launch_shape_follows_the_decode_rows(monkeypatch):
    """On a GPU the tile comes from fla-recurrent's decode rows at N sequences (K-first: at
    least one 32-byte sector a K row); on CPU one program a head."""
    from gdnzoo.backends import fla_recurrent as fr
    from gdnzoo.backends import _fla_recurrent_prefill as frp
    from gdnzoo.backends import _triton_launch as tlaunch
    rec = _record(dict(use_qk_l2norm=True), torch.float32, False)
    assert frp.config_for(rec) == (128, 1, fr.default_lpr("fp32", 128))
    cuda = rec._replace(problem=rec.problem.__class__(**{**rec.problem.__dict__,
                                                        "device": "cuda"}))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(tlaunch, "gpu_name", lambda dev: "NVIDIA H200")
    BV, nw, lpr = frp.config_for(cuda)
    want = fr.table_config("NVIDIA H200", "fp32", 3, 2, 4, 128, 128)
    assert (BV, nw) == want[:2]
    kf = cuda._replace(problem=cuda.problem.__class__(**{**cuda.problem.__dict__,
                                                        "k_first": True}))
    assert frp.config_for(kf)[0] >= 8

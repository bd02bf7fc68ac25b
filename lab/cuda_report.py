"""cuda-v4 on a GPU, beyond the tests (from the repository root): ``python3 -m lab.cuda_report``

1. accuracy of the precise and fast gates: with k = 0 the update is new_state = g * state
   exactly, so g is read back per (sequence, head) over a in [-30, 30] and compared with the
   float64 value (the ``fast_gates`` launch field);
2. registers, local memory (spills or stack) and static shared memory of the kernel variant of
   every launch row this GPU runs at the contest geometry (T = 1, 2, 4, 8; both modes).
"""
from __future__ import annotations

import torch

from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import cuda_v4
from gdnzoo.inputs import make_inputs
from lab import harness

F32, BF16 = torch.float32, torch.bfloat16


def gate_accuracy(lab):
    B, HV = 64, 8
    x = make_inputs(B=B, T=1, H=4, HV=HV, state_dtype=F32, device="cuda", seed=5)
    x.k.zero_()
    x.a.copy_(torch.linspace(-30, 30, B * HV, device="cuda").view(B, 1, HV))
    A = x.A_log.double().exp()
    xa = x.a.double()[:, 0] + x.dt_bias.double()
    g_ref = torch.exp(-A * torch.nn.functional.softplus(xa, beta=1.0, threshold=20.0))
    w, rw, lpr, hint = cuda_v4.table_config(torch.cuda.get_device_name(), F32, B, 4, HV, 128,
                                            128)[:4]
    res = {}
    for fast in (0, 1):
        out = torch.empty(B, 1, HV, 128, dtype=BF16, device="cuda")
        ns = torch.empty_like(x.state)
        cuda_v4.run(*x.args(), out, ns, False, config=(w, rw, lpr, hint, fast))
        torch.cuda.synchronize()
        s64 = x.state.double()
        g = (ns.double() * s64).sum((2, 3)) / (s64 * s64).sum((2, 3))
        res[f"fast_gates={fast}"] = float(((g - g_ref).abs() / g_ref.clamp_min(1e-30)).max())
    lab.results["gate_accuracy"] = res
    lab.log("max relative error of g over a in [-30, 30]:", res)


def resources(lab):
    gpu = torch.cuda.get_device_name()
    for sd in (F32, BF16):
        for T in (1, 2, 4, 8):
            for inplace in (True, False):
                for B in (1, 4, 8, 16, 32, 48, 64, 128, 256, 512):
                    x = make_inputs(B=B, T=T, state_dtype=sd, device="cuda", seed=0)
                    out = torch.empty(B, T, 8, 128, dtype=BF16, device="cuda")
                    ns = x.state if inplace else torch.empty_like(x.state)
                    cuda_v4.bind(*x.args(), out, ns, False)(*x.args(), out, ns, False)
    torch.cuda.synchronize()
    rows = [dict(defs=dict(defs), regs=k.num_regs, local_bytes=k.local_bytes, smem=k.static_smem)
            for (dev, src, name, defs), k in cuda_build._kernels.items() if name == cuda_v4.KERNEL]
    lab.results["resources"] = rows
    spills = [r for r in rows if r["local_bytes"]]
    lab.log(f"cuda-v4 on {gpu}: {len(rows)} variants, registers "
            f"{min(r['regs'] for r in rows)}..{max(r['regs'] for r in rows)}, "
            f"{len(spills)} with local memory")
    for r in spills:
        lab.log(f"  local memory {r['local_bytes']} B: {r['defs']}")


def main(lab):
    lab.part("gate accuracy", gate_accuracy, lab)
    lab.part("resources", resources, lab)


if __name__ == "__main__":
    harness.run("cuda_report", main)

"""fla-recurrent with PDL ("wait", "early"), for compute-sanitizer (memcheck, racecheck): dense
B in {1, 64} and a pool with padding and separate write slots at B=16, fp32 and bf16, each right
behind torch kernels (launched without PDL) rewriting q, k, v; judged by the gate against the
float64 reference:

    compute-sanitizer --tool racecheck python3 -m lab.sanitize_triton_pdl
"""
import torch, gdnzoo
from gdnzoo import gate
from gdnzoo.inputs import make_inputs
from gdnzoo.reference import reference_outputs
from gdnzoo.pool import Pool
ok = 0; n = 0
for pdl in ("wait", "early"):
    for sd in (torch.float32, torch.bfloat16):
        for B in (1, 64):
            x = make_inputs(B=B, T=1, H=4, HV=8, K=128, V=128, state_dtype=sd, device="cuda", seed=B)
            ref_out, ref_state = reference_outputs(x, True)
            for t in (x.q, x.k, x.v): torch.mul(t.clone(), 1, out=t)
            out, st = gdnzoo.decode(*x.args(), use_qk_l2norm=True, algo="fla-recurrent", pdl=pdl)
            torch.cuda.synchronize()
            j = gate.judge(out, st, ref_out, ref_state, state_dtype=sd); n += 1; ok += j.ok
            print(("PASS" if j.ok else "FAIL"), "fla-recurrent dense", pdl, sd, B, j.reason, flush=True)
        B = 16
        x = make_inputs(B=B, T=1, H=4, HV=8, K=128, V=128, state_dtype=sd, device="cuda", seed=3)
        P = 3 * B + 1
        pool = (torch.randn(P, 8, 128, 128, device="cuda") * 0.05).to(sd)
        read = torch.arange(B, 2 * B, dtype=torch.int32, device="cuda"); read[1] = -1
        write = torch.arange(2 * B, 3 * B, dtype=torch.int32, device="cuda")
        x.state = pool
        ref_out, ref_pool = reference_outputs(x, True, pool=Pool(read, write, -1))
        for t in (x.q, x.k, x.v): torch.mul(t.clone(), 1, out=t)
        out, _ = gdnzoo.decode(*x.args(), use_qk_l2norm=True, algo="fla-recurrent", state_indices=read, new_state_indices=write, pdl=pdl)
        torch.cuda.synchronize()
        j = gate.judge(out, pool, ref_out, ref_pool, state_dtype=sd); n += 1; ok += j.ok
        print(("PASS" if j.ok else "FAIL"), "fla-recurrent pool", pdl, sd, B, j.reason, flush=True)
print(f"{ok}/{n} cases passed the gate")

"""gdnzoo.integrations.fla and gdnzoo.integrations.transformers on a GPU, beside FLA 0.6 itself.
From the repository root (FLA importable, e.g. the GPU bundle on PYTHONPATH):

    python -m lab.models_gpu                           # everything (over 10 min on an H200:
                                                       # the correctness part compiles ~240 cases)
    python -m lab.models_gpu --parts decode --batches 1,32,256
    python -m lab.models_gpu --smoke                   # the logic on CPU (tiny shapes)

(a) correctness: the CPU tests' matrix (tests/test_integrations_fla.py: every gate form, both
state layouts, a decode step at GVA 2, 4 tokens at GVA 3, q/k already at HV heads, a dense call
past DECODE_MAX_T, packed sequences with a zero-length one) at K = V = 128, bf16 and fp16 io,
both entry points: gdnzoo's and FLA's results each judged by the project gate
(gdnzoo.gate.judge) against the float64 oracle (tests/fla_oracle.py), gdnzoo's state never
farther from it than FLA's; which gdnzoo backend served each call.
(b) decode: the same call through gdnzoo.integrations.fla and through FLA's own
fused_recurrent_gated_delta_rule: q, k [B, 1, H, K], v [B, 1, HV, V] bf16, K-first fp32 initial
state, precomputed gates (fp32 log decay, bf16 beta), qk l2 norm, the final state returned (a
fresh fp32 tensor on both sides), B = 1 ... 256 at H/HV = 16/32 (--geoms), K = V = 128.  Input
sets rotated so that the states read are cold (>= 4x L2).  Clocks: kernel (CUPTI: first start
to last end of one call's GPU work, both sides timed side by side in one session) and host
(wall per eager call, back to back, no sync: max(dispatch, GPU)).
(b') crossover: a dense fused_recurrent call of T = 2 ... 512 tokens per sequence through
both of gdnzoo's routes (a decode step of T tokens, the chunked prefill), whichever
DECODE_MAX_T and DECODE_MAX_WORK would pick: which is faster, to place the constants.
(c) generate: a random-init Qwen3.5-shaped model (bf16; 3 GDN layers with 16/32 heads,
K = V = 128, and one attention layer; hidden 2048), greedy generate() of --new tokens after a
--prompt token prompt at batch 1 and 32: transformers as imported (FLA's kernels when FLA is
importable, else its torch loops: said) against gdnzoo.integrations.transformers.enable().
Prefill: generate() of one token; decode tokens/s from the difference to --new tokens.

Everything goes to $OUT/models_gpu.json and .log (default /tmp/out); a short table comes last.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import gdnzoo                                                  # noqa: E402
from gdnzoo import gate                                        # noqa: E402
from gdnzoo.bench import clocks                                # noqa: E402
from gdnzoo.integrations import fla as ours                    # noqa: E402
from lab import harness                                        # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def upstream():
    """FLA's module of the two functions, or (None, why not)."""
    try:
        return importlib.import_module("fla.ops.gated_delta_rule"), ""
    except Exception as e:
        return None, f"FLA not importable: {type(e).__name__}: {e}"


def served_by(fn, kw):
    """The gdnzoo backend that serves ``fn(**kw)`` (gdnzoo.select on the call it makes)."""
    seen = []
    real = {op: getattr(gdnzoo, op) for op in ("decode", "prefill")}

    def spy(op):
        def call(*args, **k):
            seen.append((op, args, k))
            return real[op](*args, **k)
        return call
    for op in real:
        setattr(gdnzoo, op, spy(op))
    try:
        fn(**kw)
    finally:
        for op, f in real.items():
            setattr(gdnzoo, op, f)
    op, args, k = seen[0]
    return f"{op}:{gdnzoo.select(*args, op=op, **k).name}"


# ------------------------------------------------------------------ (a) correctness

def correctness(lab, args):
    import test_integrations_fla as cases
    from fla_oracle import fla_oracle
    mod, why = upstream()
    if mod is None:
        lab.log(f"  FLA itself: {why}; gdnzoo against the oracle only")
    K = args.head_dim
    rows = []
    t0 = time.time()
    for io in [getattr(torch, n) for n in args.io.split(",")]:
        for form in cases.FORMS:
            lab.log(f"  {io} {form}: {len(rows)} cases done, {time.time() - t0:.0f} s")
            for shape, (B, T, H, HV, lens) in cases.SHAPES.items():
                for name, fn in cases.FNS.items():
                    for v_first in (False, True):
                        kw, oracle = cases.make(21, B, T, H, HV, lens, K=K, V=K, io=io,
                                                form=form, v_first=v_first)
                        ref = [x.to(DEV) for x in fla_oracle(**oracle)]
                        row = dict(io=str(io).replace("torch.", ""), form=form, shape=shape,
                                   fn=name, v_first=v_first, backend=served_by(fn, kw))
                        mine = fn(**kw)
                        j = gate.judge(*mine, *ref, state_dtype=torch.float32)
                        row.update(ok=j.ok, rel_out=j.rel_err_out, rel_state=j.rel_err_state,
                                   why=j.reason)
                        if mod is not None:
                            # FLA's chunk rounds its states to bf16: the peers' state bound
                            tol = gate.PEER_STATE_TOL if name == "chunk" else None
                            theirs = getattr(mod, fn.__name__)(**kw)
                            jf = gate.judge(*theirs, *ref, state_dtype=torch.float32,
                                            state_tol=tol)
                            # beside FLA: never farther from float64 than FLA's state (as
                            # test_matches_fla_itself; FLA's bf16 chunk states with negative
                            # eigenvalues are up to 1.1e-2 off float64 elementwise)
                            near = j.rel_err_state <= max(jf.rel_err_state, 1e-5)
                            row.update(fla_ok=jf.ok, fla_rel_out=jf.rel_err_out,
                                       fla_rel_state=jf.rel_err_state, vs_fla_ok=near,
                                       vs_fla_why="" if near else "farther from float64 "
                                                                 "than FLA's state")
                        rows.append(row)
                        if not row["ok"] or not row.get("vs_fla_ok", True):
                            lab.log(f"  FAIL {row}")
    bad = [r for r in rows if not r["ok"] or not r.get("vs_fla_ok", True)]
    lab.log(f"  {len(rows) - len(bad)}/{len(rows)} cases pass the gate"
            + (" (gdnzoo vs oracle and vs FLA)" if mod is not None else " (vs oracle)")
            + f"; worst state error gdnzoo {max(r['rel_state'] for r in rows):.2e}"
            + (f", FLA {max(r['fla_rel_state'] for r in rows):.2e}" if mod is not None else ""))
    backends = sorted({r["backend"] for r in rows})
    lab.log(f"  gdnzoo backends that served: {', '.join(backends)}")
    lab.results["correctness"] = rows
    if bad:
        lab.failed.append(f"correctness: {len(bad)} cases")


# ------------------------------------------------------------------ (b) decode timing

def decode_sets(B, H, HV, K, n, seed):
    """``n`` input sets of the decode call (keyword arguments), on DEV."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def randn(*shape, dtype=BF16):
        return torch.randn(*shape, generator=gen, device=DEV).to(dtype)
    out = []
    for _ in range(n):
        g = -torch.rand(B, 1, HV, generator=gen, device=DEV)
        out.append(dict(q=randn(B, 1, H, K), k=randn(B, 1, H, K), v=randn(B, 1, HV, K),
                        g=g, beta=torch.rand(B, 1, HV, generator=gen, device=DEV).to(BF16),
                        initial_state=0.1 * randn(B, HV, K, K, dtype=torch.float32),
                        output_final_state=True, use_qk_l2norm_in_kernel=True))
    return out


def decode_timing(lab, args):
    mod, why = upstream()
    K = args.head_dim
    rows = []
    for geom in args.geoms.split(","):
        H, HV = map(int, geom.split("/"))
        for B in map(int, args.batches.split(",")):
            state_bytes = B * HV * K * K * 4
            n = clocks.rotation_count(state_bytes, clocks.l2_bytes()) if DEV == "cuda" else 2
            sets = decode_sets(B, H, HV, K, n, seed=B)
            fns = {"gdnzoo": ours.fused_recurrent_gated_delta_rule}
            if mod is not None:
                fns["FLA"] = mod.fused_recurrent_gated_delta_rule
            row = dict(geom=geom, B=B, sets=n, backend=served_by(fns["gdnzoo"], sets[0]))
            res = {name: fn(**sets[0]) for name, fn in fns.items()}
            if "FLA" in res:
                j = gate.judge(*res["gdnzoo"], *res["FLA"], state_dtype=torch.float32)
                row["vs_fla"] = "ok" if j.ok else j.reason
            launches = [lambda i, f=fn, s=sets, m=n: f(**s[i % m]) for fn in fns.values()]
            if DEV == "cuda":
                per, method = clocks.interleaved_kernel_times(launches, args.reps)
                row["kernel_method"] = method
                for name, s in zip(fns, per):
                    row[f"{name}_kernel_us"] = statistics.median(s)
            for name, launch in zip(fns, launches):
                row[f"{name}_host_us"] = statistics.median(
                    clocks.host_times(launch, 5, args.per_batch, warmup=5, warm_s=0.2))
            rows.append(row)
            lab.log(f"  {geom} B={B}: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                if k not in ("geom", "B")))
            if "FLA" in fns:
                if row["vs_fla"] != "ok":
                    lab.failed.append(f"decode {geom} B={B}: differs from FLA: {row['vs_fla']}")
            del sets
    lab.results["decode"] = rows
    if mod is None:
        lab.results["decode_note"] = why
    return rows


def crossover(lab, args):
    """A dense fused_recurrent call of T tokens per sequence through each of gdnzoo's two
    routes (decode step, chunked prefill), whichever the routing constants would pick: per-call ms
    (CUDA events, input sets rotated), to place the constant."""
    K = args.head_dim
    H, HV = map(int, args.geoms.split(",")[0].split("/"))
    limit, work = ours.DECODE_MAX_T, ours.DECODE_MAX_WORK
    rows = []
    try:
        for B in map(int, args.cross_batches.split(",")):
            for T in map(int, args.cross_tokens.split(",")):
                sets = [dict(kw, q=kw["q"].expand(B, T, H, K).contiguous(),
                             k=kw["k"].expand(B, T, H, K).contiguous(),
                             v=kw["v"].expand(B, T, HV, K).contiguous(),
                             g=kw["g"].expand(B, T, HV).contiguous(),
                             beta=kw["beta"].expand(B, T, HV).contiguous())
                        for kw in decode_sets(B, H, HV, K, 3, seed=T)]
                row = dict(B=B, T=T)
                for route, cap in (("decode", T), ("prefill", 0)):
                    ours.DECODE_MAX_T, ours.DECODE_MAX_WORK = cap, B * T * HV if cap else 0
                    ours._PLANS.clear()
                    row[route] = served_by(ours.fused_recurrent_gated_delta_rule, sets[0])
                    row[f"{route}_ms"] = clocks.event_time_us(
                        lambda i: ours.fused_recurrent_gated_delta_rule(**sets[i % 3]),
                        args.reps) / 1e3
                row["faster"] = min(("decode", "prefill"), key=lambda r: row[f"{r}_ms"])
                rows.append(row)
                lab.log(f"  B={B} T={T}: decode {row['decode_ms']:.3f} ms ({row['decode']}), "
                        f"prefill {row['prefill_ms']:.3f} ms ({row['prefill']}): "
                        f"{row['faster']} faster")
    finally:
        ours.DECODE_MAX_T, ours.DECODE_MAX_WORK = limit, work
        ours._PLANS.clear()
    lab.results["crossover"] = rows


# ------------------------------------------------------------------ (c) generate()

def qwen35_shaped(args):
    import transformers
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=16,
        num_key_value_heads=2, head_dim=128, intermediate_size=3 * args.hidden,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=args.head_dim,
        linear_value_head_dim=args.head_dim, max_position_embeddings=args.prompt + args.new + 8)
    torch.manual_seed(0)
    with torch.device(DEV):
        model = transformers.Qwen3_5ForCausalLM(cfg)
    return model.to(BF16).eval()


def generate_speed(lab, args):
    from gdnzoo.integrations import transformers as hook
    model = qwen35_shaped(args)
    modeling = importlib.import_module(hook.FAMILIES[1].module)
    rows = []
    for B in map(int, args.gen_batches.split(",")):
        ids = torch.randint(0, args.vocab, (B, args.prompt), device=DEV,
                            generator=torch.Generator(device=DEV).manual_seed(B))
        for mode in ("transformers", "gdnzoo"):
            if mode == "gdnzoo":
                hook.enable()
            fallbacks = [0]
            l2norm = modeling.l2norm

            def counting(*a, **k):
                fallbacks[0] += 1
                return l2norm(*a, **k)
            modeling.l2norm = counting

            def run(new):
                sync()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    seq = model.generate(ids, max_new_tokens=new, min_new_tokens=new,
                                         do_sample=False)
                sync()
                return time.perf_counter() - t0, seq
            try:
                run(2)                                         # compiles, allocates
                t1 = min(run(1)[0] for _ in range(args.gen_reps))
                tn, seq = min((run(args.new) for _ in range(args.gen_reps)),
                              key=lambda r: r[0])
            finally:
                modeling.l2norm = l2norm
                hook.disable()
            path = ("gdnzoo" if mode == "gdnzoo" else
                    "transformers' torch loops" if fallbacks[0] else "FLA")
            row = dict(B=B, mode=mode, gdn_path=path, prefill_s=t1,
                       prefill_tok_s=B * args.prompt / t1, total_s=tn,
                       decode_tok_s=B * (args.new - 1) / (tn - t1))
            row["tokens"] = seq[:, args.prompt:].tolist()
            rows.append(row)
            lab.log(f"  B={B} {mode} ({path}): prefill {t1 * 1e3:.1f} ms "
                    f"({row['prefill_tok_s']:.0f} tok/s), decode {row['decode_tok_s']:.1f} tok/s")
        same = rows[-1]["tokens"] == rows[-2]["tokens"]
        lab.log(f"  B={B}: greedy tokens {'identical' if same else 'differ (bf16 near-ties?)'}")
        for r in rows[-2:]:
            r["tokens_identical"] = same
            del r["tokens"]
    lab.results["generate"] = rows
    return rows


# ------------------------------------------------------------------ table and main

def table(lab):
    dec = lab.results.get("decode") or []
    if dec:
        lab.log("\ndecode (us)   B   gdnzoo kernel  FLA kernel  x     gdnzoo host  FLA host  x"
                "     served by")
        for r in dec:
            def ratio(a, b):
                return f"{r[a] / r[b]:.2f}" if a in r and b in r else "-"

            def us(k):
                return f"{r[k]:10.2f}" if k in r else "         -"
            lab.log(f"{r['geom']:>10} {r['B']:4d} {us('gdnzoo_kernel_us')}  "
                    f"{us('FLA_kernel_us')}  {ratio('gdnzoo_kernel_us', 'FLA_kernel_us'):>5} "
                    f"{us('gdnzoo_host_us')} {us('FLA_host_us')}  "
                    f"{ratio('gdnzoo_host_us', 'FLA_host_us'):>5}  {r['backend']}")
    gen = lab.results.get("generate") or []
    if gen:
        lab.log("\ngenerate   B  mode           GDN path                    prefill tok/s  "
                "decode tok/s")
        for r in gen:
            lab.log(f"{'':8} {r['B']:3d}  {r['mode']:<13}  {r['gdn_path']:<26}  "
                    f"{r['prefill_tok_s']:13.0f}  {r['decode_tok_s']:12.1f}")


def main(lab, args):
    t0 = time.time()
    where = torch.cuda.get_device_name() if DEV == "cuda" else "CPU"
    import transformers
    lab.log(f"models on {where}: torch {torch.__version__}, transformers "
            f"{transformers.__version__}, FLA: {upstream()[1] or 'importable'}")
    parts = args.parts.split(",")
    for name, fn in (("correctness", correctness), ("decode", decode_timing),
                     ("crossover", crossover), ("generate", generate_speed)):
        if name in parts:
            lab.part(name, fn, lab, args)
    table(lab)
    lab.log(f"total {time.time() - t0:.0f} s")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="correctness,decode,crossover,generate")
    p.add_argument("--io", default="bfloat16,float16", help="correctness: io dtypes")
    p.add_argument("--geoms", default="16/32", help="H/HV list of the decode timing")
    p.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--reps", type=int, default=50, help="kernel-clock samples per side")
    p.add_argument("--per-batch", type=int, default=100, help="calls per host-clock sample")
    p.add_argument("--cross-batches", default="1,32", help="crossover: batch sizes")
    p.add_argument("--cross-tokens", default="2,8,32,64,128,512", help="crossover: T list")
    p.add_argument("--gen-batches", default="1,32")
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--gen-reps", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--head-dim", type=int, default=128, help="K = V")
    p.add_argument("--smoke", action="store_true", help="tiny shapes: the logic on CPU")
    args = p.parse_args(argv)
    if args.smoke:
        args.head_dim, args.batches, args.reps, args.per_batch = 16, "1,4", 3, 3
        args.cross_batches, args.cross_tokens = "2", "2,70"
        args.gen_batches, args.prompt, args.new, args.gen_reps = "1,2", 70, 3, 1
        args.hidden, args.vocab = 64, 128
    return args


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _args = parse()
    harness.run("models_gpu", lambda lab: main(lab, _args))

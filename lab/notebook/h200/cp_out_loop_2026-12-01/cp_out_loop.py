"""The segmented form's output pass (``cp_out_kernel``) as programs that each take G chunks of a
value head in turn and BV of its V columns, keeping a segment's start tile (split once into
bf16 hi and lo parts for "bf16x3") across the chunks, against the product's pass (one program a
(chunk, value head), all V columns, the start tile read and split in every program).  Whole
calls side by side; on a GPU, from the repository root, with this file copied to
``lab/cp_out_loop.py`` (where it ran):

    python3 -m lab.cp_out_loop --algo cuda-chunk --cells "4,8:1x8192;4,8:1x32768" \\
        --halves 64k64,64k32,64k64w8

``--shapes``: GxBV variants (chunks a program x V columns a program; GxBVwW: W warps);
``--halves``: KHkBV variants (one chunk a program, BV columns, the product over K in pieces of
KH: fewer registers live; KHkBVwW: W warps).  Per cell and round, each
variant in turn: a call's GPU span (CUDA events behind a sleep kernel, median of --reps),
outputs and states compared bit for bit with the product's.  ``check()`` runs the variants
against the product's pass under the Triton interpreter (triton-chunk's Triton chains, CPU).
"""
from __future__ import annotations

import triton
import triton.language as tl

from gdnzoo.backends import triton_chunk as tc
from gdnzoo.backends._triton_chunk_cp import cp_out_kernel, segment_chunks
from gdnzoo.backends._triton_chunk_kernel import chunk_of_slot, mm_split, split_bf16
from gdnzoo.backends._triton_decode_kernel import INTERPRETED, bind_interpreted

LAUNCH = tc._LAUNCH


@triton.jit
def cp_out_loop_kernel(
        cu_seqlens, obuf, wbuf, starts, out, N, T_all, so_t, so_h,
        HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
        PREC: tl.constexpr, S: tl.constexpr, IN_PLACE: tl.constexpr, G: tl.constexpr,
        BV: tl.constexpr):
    NV: tl.constexpr = V // BV
    pid = tl.program_id(0)
    i_v = pid % NV
    rest = pid // NV
    i_hv = rest % HV
    grp = rest // HV
    cols = i_v * BV + tl.arange(0, BV)
    kk = tl.arange(0, K)
    rows = tl.arange(0, C)
    key = -1                                   # the (sequence, segment) whose start is held
    s_hi = tl.zeros([K, BV], tl.bfloat16)      # start^T [K, BV], hi and lo parts
    s_lo = tl.zeros([K, BV], tl.bfloat16)
    for j in range(G):
        slot = grp * G + j
        eos, t0, i_n, bos = chunk_of_slot(cu_seqlens, slot, N, T_all, C)
        if t0 < eos:
            t = t0 + rows
            m = t < eos
            dst = out + t[:, None] * so_t + i_hv * so_h + cols[None, :]
            _, per = segment_chunks(bos, eos, C, S)
            seg = ((t0 - bos) // C) // per
            if (seg > 0) | (IN_PLACE == 0):
                row = t[:, None] * (HV * V) + i_hv * V
                if IN_PLACE:
                    o = tl.load(dst, mask=m[:, None], other=0.0).to(tl.float32)
                else:
                    o = tl.load(obuf + row + cols[None, :], mask=m[:, None],
                                other=0.0).to(tl.float32)
                if seg > 0:
                    here = (i_n * S + seg).to(tl.int32)
                    if here != key:
                        at = (here * HV + i_hv).to(tl.int64) * (V * K)
                        st = tl.load(starts + at + cols[None, :] * K + kk[:, None])   # [K, BV]
                        if PREC == "bf16x3":
                            s_hi, s_lo = split_bf16(st.to(tl.float32))
                        else:
                            s_hi = st.to(tl.bfloat16)
                        key = here
                    w = tl.load(wbuf + row + kk[None, :], mask=m[:, None], other=0.0)
                    o = o + mm_split(w.to(tl.float32), s_hi, s_lo, PREC)
                tl.store(dst, o.to(out.dtype.element_ty), mask=m[:, None])


@triton.jit
def cp_out_halves_kernel(
        cu_seqlens, obuf, wbuf, starts, out, N, T_all, so_t, so_h,
        HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
        PREC: tl.constexpr, S: tl.constexpr, IN_PLACE: tl.constexpr, KH: tl.constexpr,
        BV: tl.constexpr):
    """The product's pass (one chunk a program) on BV of the V columns, the product w S^T
    taken over K in pieces of KH (each piece of w and of the start loaded, split and
    multiplied in turn: fewer registers live)."""
    NV: tl.constexpr = V // BV
    pid = tl.program_id(0)
    i_v = pid % NV
    rest = pid // NV
    i_hv = rest % HV
    slot = rest // HV
    eos, t0, i_n, bos = chunk_of_slot(cu_seqlens, slot, N, T_all, C)
    if t0 >= eos:
        return
    t = t0 + tl.arange(0, C)
    m = t < eos
    cols = i_v * BV + tl.arange(0, BV)
    row = t[:, None] * (HV * V) + i_hv * V
    dst = out + t[:, None] * so_t + i_hv * so_h + cols[None, :]
    _, per = segment_chunks(bos, eos, C, S)
    seg = ((t0 - bos) // C) // per
    if IN_PLACE:
        if seg == 0:
            return
        o = tl.load(dst, mask=m[:, None], other=0.0).to(tl.float32)
    else:
        o = tl.load(obuf + row + cols[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    if seg > 0:
        at = ((i_n * S + seg) * HV + i_hv).to(tl.int64) * (V * K)
        for k0 in tl.static_range(0, K, KH):
            kk = k0 + tl.arange(0, KH)
            w = tl.load(wbuf + row + kk[None, :], mask=m[:, None], other=0.0).to(tl.float32)
            st = tl.load(starts + at + cols[None, :] * K + kk[:, None]).to(tl.float32)  # [KH, BV]
            if PREC == "bf16x3":
                s_hi, s_lo = split_bf16(st)
            else:
                s_hi = st.to(tl.bfloat16)
                s_lo = s_hi
            o = o + mm_split(w, s_hi, s_lo, PREC)
    tl.store(dst, o.to(out.dtype.element_ty), mask=m[:, None])


def halves(kh: int, bv: int, warps: int = 4):
    """tc._LAUNCH with the output pass replaced by :func:`cp_out_halves_kernel` (K in pieces
    of ``kh``, ``bv`` columns a program, ``warps`` warps)."""
    def launch(kernel, grid0, args, **kw):
        if kernel is not cp_out_kernel:
            return LAUNCH(kernel, grid0, args, **kw)
        V = args[11]
        return LAUNCH(cp_out_halves_kernel, grid0 * (V // bv), (*args, kh, min(bv, V)),
                      **{**kw, "num_warps": warps})
    return launch


def looped(g: int, bv: int, warps: int = 4):
    """tc._LAUNCH with the output pass replaced by :func:`cp_out_loop_kernel` at G = ``g``
    chunks and BV = ``bv`` columns a program, ``warps`` warps."""
    def launch(kernel, grid0, args, **kw):
        if kernel is not cp_out_kernel:
            return LAUNCH(kernel, grid0, args, **kw)
        HV, V = args[9], args[11]
        if args[13] not in ("bf16x3", "bf16"):
            raise ValueError(f"the variant keeps bf16 parts of the start: not {args[13]!r}")
        groups = -(-(grid0 // HV) // g)
        return LAUNCH(cp_out_loop_kernel, groups * HV * (V // bv), (*args, g, min(bv, V)),
                      **{**kw, "num_warps": warps})
    return launch


def shapes_of(text: str):
    """"GxBV" or "GxBVwW" variants, comma-separated: {name: (G, BV, warps)}."""
    out = {}
    for v in filter(None, text.split(",")):
        g, rest = v.split("x")
        bv, _, w = rest.partition("w")
        out[v] = (int(g), int(bv), int(w or 4))
    return out


def check(seed: int = 0):
    """Looped and K-piece variants against the product's pass under the interpreter (K = V =
    32): triton-chunk in 3 segments, "bf16x3" and "bf16"; max abs difference of out and of the
    state (the same products, ~0; the K pieces add in another order)."""
    import torch

    from lab.harness import patch
    torch.manual_seed(seed)
    lens, H, HV, K = [70, 300, 0, 200], 2, 4, 32
    T, N = sum(lens), len(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    q, k = (torch.randn(T, H, K).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(T, HV, K).to(torch.bfloat16)
    a, b = torch.randn(T, HV), torch.randn(T, HV)
    A_log, dtb = torch.randn(HV) * 0.5, torch.randn(HV) * 0.5
    state = torch.randn(N, HV, K, K) * 0.1
    worst = 0.0
    for prec in ("bf16x3", "bf16"):
        cfg = dict(segments=3, block_v=16, precision=prec)
        runs = {}
        for name, launch in [("product", None), ("2x32", looped(2, 32)),
                             ("4x16", looped(4, 16)), ("3x8", looped(3, 8)),
                             ("h16k16", halves(16, 16)), ("h8k32", halves(8, 32))]:
            undo = (patch(tc, _LAUNCH=launch) if launch else patch(tc))()
            try:
                out, s = torch.empty(T, HV, K, dtype=torch.bfloat16), state.clone()
                tc.launch(q, k, v, s, A_log, a, dtb, b, cu, None, out, s, True, config=cfg)
            finally:
                undo()
            runs[name] = (out.float(), s)
        o0, s0 = runs.pop("product")
        for name, (o, s) in runs.items():
            d = max(float((o - o0).abs().max()), float((s - s0).abs().max()))
            worst = max(worst, d)
            print(f"{prec} {name}: max |diff| {d:.3e}")
    return worst


def halves_of(text: str):
    """"KHkBV" or "KHkBVwW" variants, comma-separated: {name: (KH, BV, warps)}."""
    out = {}
    for v in filter(None, text.split(",")):
        kh, rest = v.split("k")
        bv, _, w = rest.partition("w")
        out["h" + v] = (int(kh), int(bv), int(w or 4))
    return out


def main():
    from lab.harness import patch
    from lab.prefill_gpu import ab_cells

    def variants(a):
        v = {"product": patch(tc)}
        v.update({n: patch(tc, _LAUNCH=looped(*s)) for n, s in shapes_of(a.shapes).items()})
        v.update({n: patch(tc, _LAUNCH=halves(*s)) for n, s in halves_of(a.halves).items()})
        return v

    def more(ap):
        ap.add_argument("--shapes", default="", help="GxBV[wW]: chunks looped a program")
        ap.add_argument("--halves", default="64k64", help="KHkBV[wW]: one chunk a program, "
                        "K in pieces of KH")
    ab_cells(__doc__, variants, more_args=more)


if INTERPRETED:
    bind_interpreted(globals())

if __name__ == "__main__":
    main()

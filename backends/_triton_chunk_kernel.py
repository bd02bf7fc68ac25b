"""The Triton kernels of triton-chunk: the Gated Delta Net prefill in the chunked (WY) form.

The math.  Cut a sequence into chunks of C tokens.  Inside a chunk with start state S0 [V, K],
log-decays gamma_t, G_t = sum_{s<=t} gamma_s (from the chunk start), row norms rq, rk (1 without
the l2 norm: the normalized q, k are diag(rq) q, diag(rk) k of the raw 16-bit rows), the C
rank-1 delta updates fold into one low-rank update.  With the strictly lower triangular

    A[i, j] = beta_i rk_i rk_j (k_i . k_j) exp(G_i - G_j)      (i > j)
    T       = (I + A)^-1
    P[i, j] = scale rq_i rk_j (q_i . k_j) exp(G_i - G_j)        (i >= j, else 0)
    M       = P T

the chunk's "new values" (the u_t of the per-token form), outputs and end state are

    R    = v^T diag(beta) - (S0 k^T) diag(beta rk e^G)                        [V, C]
    V'^T = R T^T
    O^T  = (S0 q^T) diag(scale rq e^G) + V'^T P^T
         = (S0 q^T) diag(scale rq e^G) + R M^T
    S    = e^{G_last} S0 + V'^T diag(rk e^{G_last - G}) k                      [V, K]

(q, k the raw rows).  Only exp(G_i - G_j) with i >= j, e^G and e^{G_last - G} are formed: all
<= 1 for decays <= 1, so nothing overflows however strong the decay; each log decay is taken
as at least ``LOG_DECAY_MIN`` (-128, whose exp is 0 in fp32 already), so a hard reset (g =
-inf) or a huge negative g leaves the sums G finite and their differences exact.

Two launches:

* :func:`chunk_prep_kernel`, parallel over (chunk, value head): everything that does not
  depend on the state.  The gates, k k^T and q k^T (exact: 16-bit products, fp32 sums), T by
  blocked forward substitution (:func:`unit_lower_inverse`) and M = P T.  Stores T^T and M^T
  at the chunk's token rows and five factors per token (beta, beta rk e^G, scale rq e^G,
  rk e^{G_last - G}, e^{G_last}).
* :func:`chunk_state_kernel`, one program per (sequence, value head, V-tile of BV rows),
  sequential over the sequence's chunks with the [BV, K] state tile in registers: per chunk
  S0 k^T, R T^T and the update on the state's chain, S0 q^T and R M^T beside it, the chunk's
  outputs stored, so no per-chunk state is ever written.  A chunk's operands do not depend on
  the state, so Triton's pipeliner (``num_stages``) loads chunk j+1's (q, k, v, T^T, M^T,
  factors) into shared memory while chunk j computes.  With ``CKPT`` (off by default: the
  default kernel compiles without it) the tile is also stored as a state checkpoint after
  every E tokens (E a multiple of C): one masked store at the bottom of the chunk loop.
  The v rows are not a product's operand, so the pipeliner loads them into registers late in
  the chunk's own iteration; with ``V_AHEAD`` (off by default) chunk j+1's are loaded by hand
  at the top of chunk j's iteration instead.

Where the chunks are.  No host sync: sequence n's chunks get the slots
``cu[n] // C + n + j`` (j < ceil(len_n / C)); these ranges never overlap and all lie below
``T // C + N``, so the prep grid is that many slots (times HV), each program finds its sequence
by counting over cu_seqlens (:func:`chunk_of_slot`), and a slot past its sequence's
chunks exits.  The sequential kernel reads its sequence's bounds and loops over ceil(len / C)
chunks.  The workspace rows of a chunk are its own token rows, so rows past a partial chunk's
end (the next sequence's) are neither stored nor loaded.

Precision (``PREC``).  The 16-bit input rows are exact in bf16 (fp16: exact in two bf16 pieces),
so q k^T and k k^T are exact on tensor cores with fp32 accumulation.  Every product with an
fp32 operand (the state, T, R, P, M, V') is "bf16x3" by default: each fp32 operand split into
bf16 hi + lo (16 significant bits), hi*hi + hi*lo + lo*hi, a raw bf16 operand not split (two
products instead of three).  Emulated in float64 over 700 tokens at K = V = 128 this is ~4e-6
relative error on the state, against ~3e-4 for plain tf32 products (over the 1e-4 bound of an
fp32 state) and ~2.5e-3 with intermediates rounded to bf16.  ``PREC`` may instead name one of
Triton's ``input_precision`` values ("tf32x3", "ieee", "tf32"), applied to every fp32 product,
or "bf16": every product of the sequential kernel takes its fp32 operands rounded to bf16 (one
product each; T and M still formed as with "bf16x3" by the prep kernel, ``STORE`` "bf16": stored
rounded), ~2.5e-3 relative error on the state at 8k tokens on an H200, as the peers' kernels
round.  With "bf16x3" T^T and M^T are stored as bf16 hi and lo parts, so the pipelined loads
feed the products without a conversion; with "bf16" as bf16; otherwise as fp32.

The state tile's addressing takes strides for its V rows and K columns, so a k-last
``[.., V, K]`` and a K-first ``[.., K, V]`` state are read and written where they lie.
``PDL`` (off by default: the kernels compile as without it) is for a launch with programmatic
dependent launch: each kernel waits (``gdc_wait``) before any global load or store for the
kernel before it, then lets the next one launch (``gdc_launch_dependents``).

``POOL`` (0 dense, 1 the read slots written, 2 separate write slots) serves state pools with
the decode kernel's slot rules (:func:`pool_slots`).  ``GATES`` 0: raw gates (a, b with A_log,
dt_bias); 1: FLA's precomputed gates in the a, b slots: g log-space fp32, beta post-sigmoid.
``NEG`` (the prep kernel's; off by default, the kernel then compiles as without it): with raw
gates beta = 2 sigmoid(b), in [0, 2) (allow_neg_eigval).

Imported only when the backend runs (it imports triton at module level).
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from gdnzoo import prefill_reference
from gdnzoo.backends._triton_decode_kernel import (INTERPRETED, SEQ_BLOCK, bind_interpreted,
                                                    checkpoint_due, checkpoint_row0,
                                                    head_gate_constants,
                                                    sequence_bounds, sequence_program)

LOG_DECAY_MIN = tl.constexpr(prefill_reference.LOG_DECAY_MIN)
MAX_MERGE_LEVELS = tl.constexpr(4)       # base blocks of 8 merged up to C = 128


@triton.jit
def dot(a, b, acc=None):
    """tl.dot; under the interpreter, whose dot multiplies a bf16 operand's raw bits (Triton
    3.6), the operands are widened to fp32 first, which is exact."""
    if INTERPRETED:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        c = tl.dot(a, b, acc)
    return c


@triton.jit
def split_bf16(x):
    """fp32 ``x`` as bf16 hi + lo: 16 significant bits, relative error <= 2^-17 (the GPU rounds
    to nearest; Triton 3.6's interpreter truncates: 2^-15 there)."""
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def mm(a, b, PREC: tl.constexpr):
    """a @ b with fp32 accumulation, each operand fp32 or a raw 16-bit input.  "bf16x3": the
    small products first, so the large one is added last (one accumulator: two accumulators,
    so that the products' MMA chains overlap, measured 8% slower on an H200 at block_v 64,
    where the extra registers spill, and 2% faster at 16).  "bf16": each fp32 operand
    rounded to bf16, one product."""
    if PREC == "bf16x3":
        if a.dtype == tl.bfloat16:
            if b.dtype == tl.bfloat16:
                c = dot(a, b)
            else:
                b_hi, b_lo = split_bf16(b.to(tl.float32))
                c = dot(a, b_hi, dot(a, b_lo))
        else:
            a_hi, a_lo = split_bf16(a.to(tl.float32))
            if b.dtype == tl.bfloat16:
                c = dot(a_hi, b, dot(a_lo, b))
            else:
                b_hi, b_lo = split_bf16(b.to(tl.float32))
                c = dot(a_hi, b_hi, dot(a_hi, b_lo, dot(a_lo, b_hi)))
    elif PREC == "bf16":
        c = dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    return c


@triton.jit
def mm_split(a, b_hi, b_lo, PREC: tl.constexpr):
    """a @ b for a b stored as bf16 hi and lo parts ("bf16x3"), as bf16 ("bf16"), else as
    fp32 ``b_hi``."""
    if PREC == "bf16x3":
        a_hi, a_lo = split_bf16(a)
        c = dot(a_hi, b_hi, dot(a_hi, b_lo, dot(a_lo, b_hi)))
    elif PREC == "bf16":
        c = dot(a.to(tl.bfloat16), b_hi)
    else:
        c = tl.dot(a, b_hi, input_precision=PREC)
    return c


@triton.jit
def chunk_gates(a, b, t, m, i_hv, sa_t, sa_h, sb_t, sb_h, A_neg, dtb, GATES: tl.constexpr,
                NEG: tl.constexpr = 0):
    """Log-decays gamma and betas of the tokens ``t`` (0 both where not ``m``: a token past the
    sequence then neither decays nor writes).  GATES 0: gamma = -exp(A_log) softplus(a +
    dt_bias) (beta 1, threshold 20), beta = sigmoid(b), with ``NEG`` 2 sigmoid(b)
    (allow_neg_eigval); 1: a, b hold gamma and beta."""
    xa = tl.load(a + t * sa_t + i_hv * sa_h, mask=m, other=0.0).to(tl.float32)
    xb = tl.load(b + t * sb_t + i_hv * sb_h, mask=m, other=0.0).to(tl.float32)
    if GATES == 0:
        x = xa + dtb
        # Clamped so the branch where() drops never makes inf; below -15 log(1 + e^x) rounds
        # to 0 in fp32 while e^x is right to an ulp.
        e = tl.exp(tl.minimum(x, 20.0))
        soft = tl.where(x > 20.0, x, tl.where(x < -15.0, e, tl.log(1.0 + e)))
        gam = tl.where(m, A_neg * soft, 0.0)
        beta = tl.where(m, tl.sigmoid(xb), 0.0)
        if NEG:
            beta = 2.0 * beta
    else:
        gam = xa
        beta = xb
    # At least LOG_DECAY_MIN (exp of it is 0 in fp32 already): G stays finite (a NaN stays NaN)
    return tl.where(gam < LOG_DECAY_MIN, LOG_DECAY_MIN, gam), beta


@triton.jit
def inv_rows(x, C: tl.constexpr, L2NORM: tl.constexpr):
    """1 / ||row|| (with the 1e-6 of the l2 norm) of a [C, K] tile, or ones."""
    if L2NORM:
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, 1) + 1e-6)
    else:
        r = tl.full([C], 1.0, tl.float32)
    return r


@triton.jit
def unit_lower_inverse(A, C: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 of a strictly lower triangular [C, C] A.

    The C/BS diagonal blocks of BS x BS are inverted together by forward substitution (BS
    steps on a [C/BS, BS, BS] tensor), then merged pairwise, block size doubling: for D the
    inverse of the block diagonal at block size bs, the inverse at 2 bs is D - D A' D with A'
    the blocks of A just below D's blocks inside each 2bs block ([[X, 0], [Y, Z]]^-1 has
    -Z^-1 Y X^-1 there): log2(C/BS) levels of two C x C products, the substitution's serial
    chain only BS long."""
    NB: tl.constexpr = C // BS
    bi = tl.arange(0, NB)
    same = bi[:, None, None, None] == bi[None, None, :, None]
    Ad = tl.sum(tl.where(same, tl.reshape(A, (NB, BS, NB, BS)), 0.0), 2)
    r = tl.arange(0, BS)
    row = r[None, :, None]
    eye = (r[:, None] == r[None, :]).to(tl.float32)[None, :, :]
    Tb = eye + tl.zeros((NB, BS, BS), tl.float32)
    for s in tl.static_range(1, BS):
        a_s = tl.sum(tl.where(row == s, Ad, 0.0), 1)           # row s of each block
        Tb = tl.where(row == s, eye - tl.sum(a_s[:, :, None] * Tb, 1)[:, None, :], Tb)
    D = tl.reshape(tl.where(same, Tb[:, :, None, :], 0.0), (C, C))
    i = tl.arange(0, C)
    for lvl in tl.static_range(MAX_MERGE_LEVELS):
        if (BS << lvl) < C:
            bi_r = i[:, None] // (BS << lvl)
            bi_c = i[None, :] // (BS << lvl)
            below = (bi_r != bi_c) & (bi_r // 2 == bi_c // 2)
            D = D - mm(mm(D, tl.where(below, A, 0.0), PREC), D, PREC)
    return D


@triton.jit
def chunk_of_slot(cu_seqlens, slot, N, T, C: tl.constexpr):
    """(eos, t0, n, bos) of the chunk at ``slot``: its sequence's end, its first token (t0 >=
    eos when the slot is past that sequence's chunks), the sequence and its first token.
    Sequence n's chunks are the slots cu[n] // C + n + j, strictly increasing in n, so the
    slot's sequence is the count of sequences whose first slot is <= ``slot``, less one:
    counted SEQ_BLOCK sequences a load (one load below that many sequences; no constexpr
    depends on N)."""
    idx = tl.arange(0, SEQ_BLOCK)
    count = slot * 0
    n0 = slot * 0
    while n0 < N:
        i = n0 + idx
        first = tl.load(cu_seqlens + i, mask=i < N, other=0) // C + i
        count += tl.sum(((first <= slot) & (i < N)).to(tl.int32), 0)
        n0 += SEQ_BLOCK
    n = tl.maximum(count - 1, 0)
    bos, eos = sequence_bounds(cu_seqlens, n, T)
    j = slot - (bos // C + n)
    t0 = tl.where(count > 0, bos + j * C, eos)         # count 0: a cu_seqlens not from 0
    return eos, t0, n, bos


@triton.jit
def chunk_qk(q, k, t0, eos, i_h, sq_t, sq_h, sk_t, sk_h, C: tl.constexpr, K: tl.constexpr):
    """The chunk's row indices, tokens, token mask (t < eos) and raw [C, K] q and k rows (zeros
    past the sequence)."""
    rows = tl.arange(0, C)
    t = t0 + rows
    m = t < eos
    cols = tl.arange(0, K)
    qr = tl.load(q + t[:, None] * sq_t + i_h * sq_h + cols[None, :], mask=m[:, None], other=0.0)
    kr = tl.load(k + t[:, None] * sk_t + i_h * sk_h + cols[None, :], mask=m[:, None], other=0.0)
    return rows, t, m, qr, kr


@triton.jit
def store_cc(p, x, m, C: tl.constexpr, PREC: tl.constexpr):
    """A [C, C] fp32 tile at ``p`` (rows ``m``): its bf16 hi part, and its lo part C further
    ("bf16x3"), else fp32."""
    if PREC == "bf16x3":
        hi, lo = split_bf16(x)
        tl.store(p, hi, mask=m)
        tl.store(p + C, lo, mask=m)
    else:
        tl.store(p, x.to(p.dtype.element_ty), mask=m)


@triton.jit
def load_cc(p, m, C: tl.constexpr, PREC: tl.constexpr):
    """The (hi, lo) parts :func:`store_cc` stored (fp32: the tile twice)."""
    x0 = tl.load(p, mask=m, other=0.0)
    if PREC == "bf16x3":
        x1 = tl.load(p + C, mask=m, other=0.0)
    else:
        x1 = x0
    return x0, x1


@triton.jit
def chunk_prep_kernel(
        q, k, a, b, A_log, dt_bias, cu_seqlens, mats, vecs, scale,
        N, T_all, sq_t, sq_h, sk_t, sk_h, sa_t, sa_h, sb_t, sb_h, s_alog, s_dtb,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
        BS: tl.constexpr, L2NORM: tl.constexpr, GATES: tl.constexpr,
        PREC: tl.constexpr, STORE: tl.constexpr, PDL: tl.constexpr = 0,
        NEG: tl.constexpr = 0):
    if PDL:
        gdc_wait()                  # before any load: every input may be the producer's output
        gdc_launch_dependents()     # the sequential kernel waits for this whole grid
    # Neighbouring programs take the value heads of one chunk: they share its q, k rows in L2.
    pid = tl.program_id(0)
    i_hv = pid % HV
    slot = pid // HV
    i_h = i_hv // (HV // H)                        # GVA: repeat_interleave mapping
    eos, t0, _, _ = chunk_of_slot(cu_seqlens, slot, N, T_all, C)
    if t0 >= eos:
        return
    rows, t, m, qr, kr = chunk_qk(q, k, t0, eos, i_h, sq_t, sq_h, sk_t, sk_h, C, K)
    A_neg, dtb = head_gate_constants(A_log, dt_bias, i_hv, s_alog, s_dtb, GATES)
    gam, beta = chunk_gates(a, b, t, m, i_hv, sa_t, sa_h, sb_t, sb_h, A_neg, dtb, GATES, NEG)
    G = tl.cumsum(gam, 0)
    G_last = tl.sum(tl.where(rows == C - 1, G, 0.0), 0)    # gamma is 0 past the end
    rq = inv_rows(qr, C, L2NORM)
    rk = inv_rows(kr, C, L2NORM)
    incl = rows[:, None] >= rows[None, :]
    # exp only where i >= j (G_i - G_j <= 0 for decays <= 1): the dropped half could overflow.
    dec = tl.exp(tl.where(incl, G[:, None] - G[None, :], 0.0)) * rk[None, :]
    # q k^T and k k^T are exact: 16-bit products, fp32 sums.
    A = tl.where(rows[:, None] > rows[None, :],
                 dot(kr, tl.trans(kr)) * dec * (beta * rk)[:, None], 0.0)
    # P before the inverse: q, k and the decays are then dead during it (fewer registers).
    P = tl.where(incl, dot(qr, tl.trans(kr)) * dec * (scale * rq)[:, None], 0.0)
    Tm = unit_lower_inverse(A, C, BS, PREC)
    # Row j of a token's matrix rows holds column j of T (and of M = P T): the sequential
    # kernel's right operands are then row-major.  Rows past the sequence belong to the next
    # sequence's chunk: not stored.
    NP: tl.constexpr = 2 if STORE == "bf16x3" else 1
    pm = mats + t[:, None] * (HV * 2 * NP * C) + i_hv * (2 * NP * C) + rows[None, :]
    store_cc(pm, tl.trans(Tm), m[:, None], C, STORE)
    store_cc(pm + NP * C, tl.trans(mm(P, Tm, PREC)), m[:, None], C, STORE)
    eG = tl.exp(G)
    pv = vecs + i_hv * (5 * T_all) + t
    tl.store(pv, beta, mask=m)
    tl.store(pv + T_all, beta * rk * eG, mask=m)
    tl.store(pv + 2 * T_all, scale * rq * eG, mask=m)
    tl.store(pv + 3 * T_all, rk * tl.exp(G_last - G), mask=m)
    tl.store(pv + 4 * T_all, tl.zeros([C], tl.float32) + tl.exp(G_last), mask=m)


@triton.jit
def load_v(v, t0, eos, i_hv, rows_v, sv_t, sv_h, C: tl.constexpr):
    """The chunk's [BV, C] v rows as stored (zeros past the sequence; nothing read when the
    chunk starts at or past its end)."""
    t = t0 + tl.arange(0, C)
    return tl.load(v + t[None, :] * sv_t + i_hv * sv_h + rows_v[:, None], mask=(t < eos)[None, :],
                   other=0.0)


@triton.jit
def chunk_step(h, vt, t0, eos, q, k, v, mats, vecs, out, T_all, i_h, i_hv, rows_v, rd,
               sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
               HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr):
    """One chunk on the [BV, K] state tile ``h``: stores the chunk's [BV] output rows and
    returns the tile after the chunk.  ``vt``: the chunk's [BV, C] v rows as
    :func:`load_v` loads them, or None: loaded here."""
    rows, t, m, qr, kr = chunk_qk(q, k, t0, eos, i_h, sq_t, sq_h, sk_t, sk_h, C, K)
    if vt is None:
        vt = load_v(v, t0, eos, i_hv, rows_v, sv_t, sv_h, C)
    vt = vt.to(tl.float32)
    NP: tl.constexpr = 2 if PREC == "bf16x3" else 1
    pm = mats + t[:, None] * (HV * 2 * NP * C) + i_hv * (2 * NP * C) + rows[None, :]
    t_hi, t_lo = load_cc(pm, m[:, None], C, PREC)
    m_hi, m_lo = load_cc(pm + NP * C, m[:, None], C, PREC)
    pv = vecs + i_hv * (5 * T_all) + t
    beta = tl.load(pv, mask=m, other=0.0)
    bk = tl.load(pv + T_all, mask=m, other=0.0)
    fq = tl.load(pv + 2 * T_all, mask=m, other=0.0)
    fk = tl.load(pv + 3 * T_all, mask=m, other=0.0)
    g_last = tl.load(vecs + i_hv * (5 * T_all) + 4 * T_all + t0)

    X = mm(h, tl.trans(kr), PREC)                  # S0 k_j                        [BV, C]
    R = vt * beta[None, :] - X * bk[None, :]
    Vn = mm_split(R, t_hi, t_lo, PREC)             # V'^T = R T^T
    # O^T = (S0 q^T) diag(fq) + V'^T P^T, and V'^T P^T = R (P T)^T: off the state's chain.
    o = mm(h, tl.trans(qr), PREC) * fq[None, :] + mm_split(R, m_hi, m_lo, PREC)
    o = tl.where(rd, o, 0.0)
    tl.store(out + t[None, :] * so_t + i_hv * so_h + rows_v[:, None], o.to(out.dtype.element_ty),
             mask=m[None, :])
    return g_last * h + mm(Vn * fk[None, :], kr, PREC)


@triton.jit
def store_checkpoint(ckpt, h, j, row0, n_tok, every, ok, T_all, i_hv, rows_v, cols,
                     sc_n, sc_h, sc_v, sc_k, C: tl.constexpr):
    """The tile ``h`` (the state after chunk j) as a checkpoint when chunk j ends on a
    multiple of ``every`` inside the sequence (``n_tok`` tokens) and ``ok``; never past row
    T_all // every - 1 (:func:`checkpoint_due`)."""
    end = (j + 1) * C
    due = checkpoint_due(row0, end, every, T_all)
    row = row0 + end // every - 1
    tl.store(ckpt + row * sc_n + i_hv * sc_h + rows_v[:, None] * sc_v + cols[None, :] * sc_k,
             h.to(ckpt.dtype.element_ty), mask=ok & due & (end <= n_tok))


@triton.jit
def advance(h, vt, j, bos, eos, row0, every, q, k, v, mats, vecs, out, ckpt, T_all, i_h,
            i_hv, rows_v, cols, rd, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, sc_n, sc_h,
            sc_v, sc_k, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
            PREC: tl.constexpr, CKPT: tl.constexpr):
    """Chunk j of the sequence [bos, eos) (its v rows ``vt``, or None) applied to the tile
    ``h`` (its outputs written), and with ``CKPT`` the state after it stored as a checkpoint
    where one falls."""
    h = chunk_step(h, vt, bos + j * C, eos, q, k, v, mats, vecs, out, T_all, i_h, i_hv, rows_v,
                   rd, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, HV, K, C, PREC)
    if CKPT:
        store_checkpoint(ckpt, h, j, row0, eos - bos, every, rd, T_all, i_hv, rows_v, cols,
                         sc_n, sc_h, sc_v, sc_k, C)
    return h


@triton.jit
def chain_step(h, v_next, j, bos, eos, row0, every, q, k, v, mats, vecs, out, ckpt, T_all, i_h,
               i_hv, rows_v, cols, rd, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, sc_n,
               sc_h, sc_v, sc_k, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
               PREC: tl.constexpr, CKPT: tl.constexpr, V_AHEAD: tl.constexpr):
    """One iteration of :func:`chain`: (the tile after chunk j, chunk j + 1's v rows with
    ``V_AHEAD``, else ``v_next`` as given)."""
    vt = None
    if V_AHEAD:
        vt = v_next
        v_next = load_v(v, bos + (j + 1) * C, eos, i_hv, rows_v, sv_t, sv_h, C)
    h = advance(h, vt, j, bos, eos, row0, every, q, k, v, mats, vecs, out, ckpt, T_all, i_h,
                i_hv, rows_v, cols, rd, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, sc_n,
                sc_h, sc_v, sc_k, HV, K, C, PREC, CKPT)
    return h, v_next


@triton.jit
def chain(h, j0, j1, bos, eos, row0, every, q, k, v, mats, vecs, out, ckpt, T_all, i_h, i_hv,
          rows_v, cols, rd, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, sc_n, sc_h, sc_v, sc_k,
          HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr,
          CKPT: tl.constexpr, STAGES: tl.constexpr, V_AHEAD: tl.constexpr):
    """Chunks j0 <= j < j1 of the sequence [bos, eos) applied in order to the tile ``h``
    (:func:`advance`), the loop pipelined ``STAGES`` deep; returns the tile.  With ``V_AHEAD``
    chunk j + 1's v rows are loaded (into registers) while chunk j computes."""
    v_next = 0.0                                   # without V_AHEAD: carried, never read
    if V_AHEAD:
        v_next = load_v(v, bos + j0 * C, eos, i_hv, rows_v, sv_t, sv_h, C)
    if INTERPRETED:
        # The interpreter's scalars are 1-element arrays, which range() refuses.
        j = j0
        while j < j1:
            h, v_next = chain_step(h, v_next, j, bos, eos, row0, every, q, k, v, mats, vecs, out,
                                   ckpt, T_all, i_h, i_hv, rows_v, cols, rd, sq_t, sq_h, sk_t,
                                   sk_h, sv_t, sv_h, so_t, so_h, sc_n, sc_h, sc_v, sc_k, HV, K, C,
                                   PREC, CKPT, V_AHEAD)
            j += 1
    else:
        for j in tl.range(j0, j1, num_stages=STAGES):
            h, v_next = chain_step(h, v_next, j, bos, eos, row0, every, q, k, v, mats, vecs, out,
                                   ckpt, T_all, i_h, i_hv, rows_v, cols, rd, sq_t, sq_h, sk_t,
                                   sk_h, sv_t, sv_h, so_t, so_h, sc_n, sc_h, sc_v, sc_k, HV, K, C,
                                   PREC, CKPT, V_AHEAD)
    return h


@triton.jit
def chunk_state_kernel(
        q, k, v, cu_seqlens, mats, vecs, out, state, new_state, slot_idx, new_slot_idx,
        has_init, T_all, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
        ss_n, ss_h, ss_v, ss_k, sn_n, sn_h, sn_v, sn_k, P, PN, null_slot,
        ckpt, sc_n, sc_h, sc_v, sc_k, every,
        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
        BV: tl.constexpr, PREC: tl.constexpr, POOL: tl.constexpr, STATE0: tl.constexpr,
        HAS_INIT: tl.constexpr, STAGES: tl.constexpr, CKPT: tl.constexpr = 0,
        PDL: tl.constexpr = 0, V_AHEAD: tl.constexpr = 0):
    if PDL:
        gdc_wait()                  # before any load: the prep kernel's workspace (or, with
        gdc_launch_dependents()     # no tokens, the producer's state) must be complete
    # Neighbouring programs take the V-tiles of one head: they read the same q, k, T^T rows.
    i_v, i_n, i_hv, i_h, bos, eos, slot_r, slot_w, rd, wr = sequence_program(
        cu_seqlens, T_all, slot_idx, new_slot_idx, P, PN, null_slot, H, HV, V, BV, POOL)
    init = rd
    if HAS_INIT:
        init = init & (tl.load(has_init + i_n) != 0)
    rows_v = i_v * BV + tl.arange(0, BV)
    cols = tl.arange(0, K)
    if STATE0:
        h = tl.load(state + slot_r * ss_n + i_hv * ss_h + rows_v[:, None] * ss_v
                    + cols[None, :] * ss_k, mask=init, other=0.0).to(tl.float32)
    else:
        h = tl.zeros([BV, K], tl.float32)
    n_chunks = tl.cdiv(eos - bos, C)
    row0 = 0
    if CKPT:
        row0 = checkpoint_row0(cu_seqlens, i_n, every, T_all)
    # A padded sequence (rd False) writes no checkpoint.
    h = chain(h, 0, n_chunks, bos, eos, row0, every, q, k, v, mats, vecs, out, ckpt, T_all, i_h,
              i_hv, rows_v, cols, rd, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, sc_n, sc_h,
              sc_v, sc_k, HV, K, C, PREC, CKPT, STAGES, V_AHEAD)
    tl.store(new_state + slot_w * sn_n + i_hv * sn_h + rows_v[:, None] * sn_v
             + cols[None, :] * sn_k, h.to(new_state.dtype.element_ty), mask=wr)


if INTERPRETED:
    bind_interpreted(globals())

"""cuda-v4: the latency-optimized CUDA C++ decode kernel (``cuda_v4.cu``), launched through CuPy.

Each head's V rows are split over several blocks of several warps.  The launch shape and the
kernel's options come from this GPU's launch rows (``backends/tables/<gpu>.yaml``: by state
dtype, in place or destination passing, tokens per call and batch size; measured by ``gdnzoo
tune --shapes``), whose fields :data:`CONFIG` explains.  Shapes, GVA ratio and launch shape are
compile-time constants of the kernel (one NVRTC variant per signature, cached on disk), and so
are the strides: those of the dense layout when every tensor is contiguous, else the call's own
(the engines' q, k, v, a, b views of one fused projection, a pool or intermediate buffer with
its own slot stride), so a strided call gets the same constant index math as a dense one, at
one more variant per distinct layout.

State pools (:mod:`gdnzoo.pool`) are served natively: the kernel loads each sequence's slot
indices itself (its first load) and addresses the pool's slots with 64-bit offsets; padded
sequences get zero outputs and touch no state.  Their launch rows are the ``pool`` rows where a
table has them, else its in-place or destination-passing rows.

Speculative verify (:mod:`gdnzoo.verify`) is served natively too, on a dense state or a pool, in
the table's ``verify`` rows where it has them (``gdnzoo tune --shapes --mode verify``), else the
row the call would get anyway: one pass over the tokens with the state in registers, the state
after each token stored from them to its intermediate row and step, or to its per-token slot;
``update_state=False`` compiles the final store out.  Every thread stores the rows it holds, so
every launch shape serves every form.  A row may name a second kernel for the verify calls it
can serve, the tensor-core verify (``kernel: tc-verify``, :mod:`gdnzoo.backends._cuda_v4_tc`).

Programmatic dependent launch (``pdl=``, compute capability >= 9.0): the kernel is launched with
``cuLaunchKernelEx`` so that it may start while the kernel before it is still running, and
waits for that kernel (``griddepcontrol.wait``) before reading what it writes; right after the
wait it lets the kernel after it launch.  Level 1 (``"wait"``) waits before any global load or
store.  Level 2 (``"early"``) first issues the loads that do not depend on the kernel before it:
the slot indices (``state_indices``, ``num_accepted_tokens``), the state, ``A_log`` and
``dt_bias``; q, k, v, a, b, ``intermediate_indices`` and every store come after the wait.  It
is correct only when the state's last writer, and the writer of those indices, completed
before the kernel right before this one started: true when a kernel launched without PDL lies
between the previous decode of this state and this one (an engine's producer of q, k, v, or any
other kernel of the layer).  Level 0 compiles to the code of a plain launch.
"""
from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import torch

from gdnzoo import tables
from gdnzoo.backends import _cuda_build as cuda_build
from gdnzoo.backends import _cuda_v4_kfirst as kfirst
from gdnzoo.backends import _cuda_v4_tc as tc_verify

available = cuda_build.available

NAME = "cuda-v4"                 # its public name: the key of its rows in backends/tables/
SOURCE = Path(__file__).with_name("cuda_v4.cu")
KERNEL = "gdn_decode_v4"
HEAD_DIMS = (32, 64, 128, 256)   # K: whole 16-byte vectors per lane, lane groups dividing 32
MAX_GRID_X = 2**31 - 1
MAX_WARPS = 8
STATE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
SMEM_STATIC_MAX = 48 * 1024      # bytes of static shared memory a kernel may declare

# The launch fields, the one place their meanings are written: a row of
# backends/tables/<gpu>.yaml names them; an explicit ``config=`` gives them by name or in this
# order (a tuple of the first 4 to 12, the others defaulted).  cuda_v4.cu's switch of each is
# named in brackets.  A field that cannot serve a call (the conditions below) is left out of
# its variant, which is then the one built without it.
#   warps (W)          [GDN_W] warps per block
#   row_groups (RW)    [GDN_RW] row groups per warp; a row group is 32/LPR rows, one 16-byte load
#                      per lane per LPR*16 bytes of row; rows per block = W*RW*32/LPR, blocks per
#                      head = ceil(V / rows per block)
#   lanes_per_row (LPR) [GDN_LPR] the lanes that share a row, each reading 16-byte vectors of it
#   hint               [GDN_HINT] bit 0: state loads ld.global.nc.L1::no_allocate (safe in place
#                      too: each state element is read once, by the thread that later writes
#                      it; with pdl "early" ld.global.L1::no_allocate, which ptxas keeps before
#                      the wait); bit 1: state stores st.global.cs
#   fast_gates         [GDN_FASTGATE] 1: gates with fast intrinsics (relative error of g ~1e-5,
#                      lab/cuda_report.py measures it), 0: precise
#   chain              [GDN_CHAIN] c > 0: dot-product slices as chains of c fused multiply-adds
#                      (about half the instructions of a tree: it wins where one warp per
#                      scheduler issues everything itself); 0: balanced trees, the shortest path
#   smem               [GDN_SMEM] 1 (T = 1, 16-byte vectors, within static shared memory): the
#                      state staged through shared memory (cp.async) and updated one row group
#                      at a time, so a warp holds one group in registers and more blocks fit on
#                      an SM (what pays where one wave of register-bound blocks cannot hold the
#                      state: B*HV 257-384 on the H100)
#   qk_mode            [GDN_QKS] 1 (16-byte vectors): q and k read once per block into shared
#                      memory behind one barrier (one 16-byte load per thread instead of
#                      K/(LPR*VEC) small loads per lane: what makes 4 lanes per row pay); 2
#                      (16-byte vectors, LPR <= 16): the two rows of a lane pair split the q and
#                      k loads (one reads q, the other k) and swap them with one shuffle a word:
#                      half the load instructions and no barrier; 0: every lane its own slices
#   chunk              [GDN_CHUNK] every token at once instead of the token loop (T > 1, 16-byte
#                      vectors; its own q/k staging, so the q/k modes, staging, ahead and
#                      head_scalars do not apply): one butterfly for the 2T dot products with
#                      the initial state, the per-token corrections from the tokens' Gram
#                      entries (a scalar recurrence, no shuffle between tokens), then T plain
#                      updates.  1 (T <= CHUNK_MAX_T): q and k of every token staged in shared
#                      memory, the Gram entries from the block; 2 (T <= CHUNK_REG_MAX_T, above
#                      it 1 serves): each lane's own q/k slices of every token in registers, the
#                      Gram entries summed in the butterfly of the state's dot products: no
#                      shared memory, no barrier
#   ahead              [GDN_AHEAD] the token loop with the state in registers (T > 1, q/k mode
#                      not 1): the loads that do not depend on the state leave a token's own
#                      step, so it waits on its arithmetic, not on a load.  1: every token's v,
#                      gates and slots before the loop, q and k one token ahead, the loop
#                      unrolled; 2: all of them one token ahead, the loop rolled (T times less
#                      code: unrolled, a warp alone on its scheduler stalls on instruction-cache
#                      misses); 3: as 1, with every token's q and k before the loop too (T times
#                      their registers, so T <= QK_AHEAD_MAX_T; above it 1 serves)
#   head_scalars       [GDN_HSC] 1 (T > 1, the token loop, any ahead): the per-token scalars that
#                      every row of a head shares (decay and beta gates, q's and k's inverse
#                      norms, k.q) computed once per block, each warp its share of the tokens,
#                      and read from shared memory behind one barrier; 0: every warp computes
#                      all of them (T times per row: a quarter of a B = 1 warp's instructions at
#                      T = 8)
#   kernel             which kernel the row runs: "decode", cuda_v4.cu for every call; "tc-verify",
#                      the tensor-core verify (cuda_v4_tc.cu, :mod:`_cuda_v4_tc`: its own fixed
#                      launch shape) for the verify calls it serves, cuda_v4.cu with the row's
#                      other fields for every other call (so such a row keeps a shape of its own)
CONFIG = tables.ConfigFields(warps=tables.REQUIRED, row_groups=tables.REQUIRED,
                             lanes_per_row=tables.REQUIRED, hint=tables.REQUIRED, fast_gates=1,
                             chain=0, smem=0, qk_mode=0, chunk=0, ahead=0, head_scalars=0,
                             kernel="decode")
# The values of the fields that take a few, and the largest T each serves (see above).
KERNELS = ("decode", "tc-verify")
CHUNK = (0, 1, 2)
CHUNK_MAX_T = 16                 # chunk 1
CHUNK_REG_MAX_T = 4              # chunk 2
AHEAD = (0, 1, 2, 3)
QK_AHEAD_MAX_T = 8               # ahead 3
HEAD_SCALARS = (0, 1)

_binds: dict = {}                # signature -> Bound




def vec_elems(state_dtype, vec16=True):
    return 16 // cuda_build.ELEM_SIZE[state_dtype] if vec16 else 1


def valid_config(K, V, state_dtype, w, rw, lpr, vec16=True):
    """Why launch shape (W, RW, LPR) cannot serve K, V, or '' when it can."""
    vec = vec_elems(state_dtype, vec16)
    if lpr not in (1, 2, 4, 8, 16, 32) or K % (lpr * vec):
        return f"LPR={lpr} lanes x {vec} elements must divide K={K}"
    if rw < 1 or rw * (32 // lpr) > 32:
        return f"RW={rw} row groups of {32 // lpr} rows exceed a warp's 32 rows"
    if not 1 <= w <= MAX_WARPS:
        return f"W={w} warps per block not in 1..{MAX_WARPS}"
    return ""


def full_config(cfg):
    """(W, RW, LPR, HINT, FAST, CHAIN, SMEM, QKS, CHUNK, AHEAD, HSC, KERNEL) from a table row or
    an explicit config (:data:`CONFIG`)."""
    return CONFIG.normalize(cfg)


def smem_bytes(K, state_dtype, w, rw, lpr):
    """Shared memory of GDN_SMEM=1: each warp's row groups, one 16-byte vector per lane."""
    return w * rw * (K // (lpr * vec_elems(state_dtype))) * 32 * 16


def effective_qks(qks, vec16, lpr):
    """The q/k mode a variant is built with: both sharing modes need 16-byte vectors, and the
    lane-pair split (2) a second row in the pair (LPR <= 16); otherwise 0, every lane reads its
    own slices."""
    if not vec16 or qks not in (1, 2) or (qks == 2 and lpr > 16):
        return 0
    return int(qks)


def qks_bytes(K, io_dtype, T):
    """Shared memory of GDN_QKS=1: q and k rows of one token (two tokens' when T > 1)."""
    return (2 if T > 1 else 1) * 2 * K * cuda_build.ELEM_SIZE[io_dtype]


def table_config(gpu, state_dtype, B, H, HV, K, V, inplace=True, T=1, pool=False, verify=False):
    """The launch row of this GPU for the call (backends/tables/), fitted to K: the rows are
    measured at K=128, and narrower rows take fewer lanes per row."""
    w, rw, lpr, *rest = tables.launch_config(NAME, CONFIG, gpu, STATE_NAMES[state_dtype], inplace,
                                             T, B, H, HV, K, V, pool, verify)
    while lpr > 1 and K % (lpr * vec_elems(state_dtype)):
        lpr //= 2
    while rw > 1 and rw * (32 // lpr) > 32:       # a warp owns at most 32 rows
        rw //= 2
    return (w, rw, lpr, *rest)


def launch_config(problem, gpu):
    """The tunable protocol's table lookup: :func:`table_config` for a Problem."""
    p = problem
    return table_config(gpu, p.state_dtype, p.B, p.H, p.HV, p.K, p.V, p.inplace, p.T, p.pool,
                        bool(p.verify))


def candidates(problem):
    """The shape search's first stage (tunable protocol): every register shape (W, RW, LPR) with
    at most 64 state elements a lane, with each cache hint 0, 2, 3 and each distinct q/k mode,
    and at T > 1 also as one chunk (:data:`CONFIG` ``chunk`` 1, and 2 where T allows); at T = 1
    every shape staged through shared memory (hints 0, 2: .nc loads are unused when staging);
    fast gates, tree sums."""
    K, V, sd, T = problem.K, problem.V, problem.state_dtype, problem.T
    vec = vec_elems(sd)
    chunks = chunk_values(T)
    if getattr(problem, "verify", ""):
        return verify_candidates(K, V, vec, chunks, T)
    out = []
    for w, rw, lpr in register_shapes(K, V, vec, 64):
        out += [(w, rw, lpr, h, 1, 0, 0, q) for h in (0, 2, 3) for q in _qk_modes(lpr)]
        out += [(w, rw, lpr, h, 1, 0, 0, 0, c) for h in (0, 2, 3) for c in chunks]
    for lpr in (8, 16, 32) if T == 1 else ():
        for w in (2, 4, 8):
            for rw in (2, 4, 8, 16):
                if K % (lpr * vec) == 0 and rw * (32 // lpr) <= 32 and w * rw * (32 // lpr) <= V \
                        and smem_bytes(K, sd, w, rw, lpr) <= SMEM_STATIC_MAX:
                    out += [(w, rw, lpr, h, 1, 0, 1, q) for h in (0, 2) for q in _qk_modes(lpr)]
    return out


def chunk_values(T):
    """The chunk values of cuda_v4.cu (:data:`CONFIG` ``chunk`` 1, 2) that serve T tokens."""
    return [c for c in (1, 2) if 1 < T <= (CHUNK_MAX_T if c == 1 else CHUNK_REG_MAX_T)]


def verify_candidates(K, V, vec, chunks, T):
    """The first stage for a verify call, whose registers also hold per-token values: every
    register shape with at most 32 state elements a lane, as one chunk where T allows (each of
    ``chunks``, see :func:`chunk_values`), as the token loop with its q/k split (shared q/k
    where the split cannot serve), and as the token loop a token ahead (:data:`CONFIG`
    ``ahead`` 1, 2 and, T <= 8, 3; split q/k, or each lane's own where the split cannot
    serve); every token-loop candidate also with the head's scalars from the block
    (``head_scalars`` 1); hint 3, fast gates (the second stage varies both); at K = V = 128
    and T <= 8 also the tensor-core verify (``kernel`` tc-verify; its fields for the calls it
    does not serve: the token loop of 8 warps, q/k a token ahead, the head's scalars from the
    block)."""
    out, ahead = [], [a for a in AHEAD[1:] if a != 3 or T <= QK_AHEAD_MAX_T]
    if (K, V) == (128, 128) and T <= tc_verify.MAX_T:
        lpr = 32 if vec == 4 else 16
        out.append((8, 1, lpr, 3, 1, 0, 0, 2 if lpr <= 16 else 0, 0, 3, 1, "tc-verify"))
    for w, rw, lpr in register_shapes(K, V, vec, 32):
        for hs in HEAD_SCALARS:
            out.append((w, rw, lpr, 3, 1, 0, 0, 2 if lpr <= 16 else 1, 0, 0, hs))
            out += [(w, rw, lpr, 3, 1, 0, 0, 2 if lpr <= 16 else 0, 0, a, hs) for a in ahead]
        out += [(w, rw, lpr, 3, 1, 0, 0, 0, c) for c in chunks]
    return out


def register_shapes(K, V, vec, max_elems):
    """Every (W, RW, LPR) with the state in registers: whole vectors of ``vec`` elements a lane,
    at most 32 rows a warp and V rows a block, at most ``max_elems`` state elements a lane."""
    for lpr in (4, 8, 16, 32):
        for w in (1, 2, 4, 8):
            for rw in (1, 2, 4, 8):
                rows = rw * (32 // lpr)
                if (K % (lpr * vec) == 0 and rows <= 32 and w * rows <= V
                        and rw * K // lpr <= max_elems):
                    yield w, rw, lpr


def _qk_modes(lpr):
    """The distinct q/k modes of a shape with 16-byte vectors (the launcher's own rule)."""
    return tuple(sorted({effective_qks(q, True, lpr) for q in (0, 1, 2)}))


def refine(ranked):
    """The shape search's second stage (tunable protocol): the four best shapes (W, RW, LPR,
    SMEM, QKS, CHUNK, AHEAD, HSC, KERNEL) of the first, each with every cache hint and both gate
    precisions."""
    shapes = list(dict.fromkeys(c[:3] + c[6:] for c in map(full_config, ranked)))[:4]
    return [(w, rw, lpr, h, f, 0, smem, qks, chunk, ahead, hsc, kernel)
            for w, rw, lpr, smem, qks, chunk, ahead, hsc, kernel in shapes
            for h in ((0, 2) if smem else (0, 2, 3)) for f in (0, 1)]


def blocks_per_head(V, w, rw, lpr):
    return -(-V // (w * rw * (32 // lpr)))


def pdl_warps(state_dtype, BHV, K, V, w, rw, lpr):
    """Warps per block of a PDL launch of table shape (w, rw, lpr): doubled (the same work a
    thread) while the grid's blocks are too small for PDL
    (:func:`gdnzoo.backends._pdl_launch.too_small`)."""
    from gdnzoo.backends._pdl_launch import too_small
    size = cuda_build.ELEM_SIZE[state_dtype]
    rows = lambda w: w * rw * (32 // lpr)                  # noqa: E731  rows a block
    while (w < MAX_WARPS and rows(2 * w) <= V
           and too_small(BHV * blocks_per_head(V, w, rw, lpr), 2 * rows(w) * K * size)):
        w *= 2
    return w


def supports(problem):
    if problem.device != "cuda":
        return False, f"runs on CUDA GPUs only, got device {problem.device}"
    if problem.cc is not None and tuple(problem.cc) < (8, 0):
        return False, f"needs compute capability >= 8.0 (bf16 conversions), got {problem.cc}"
    if getattr(problem, "pdl", "") and (problem.cc is None or tuple(problem.cc) < (9, 0)):
        return False, (f"programmatic dependent launch needs compute capability >= 9.0, got "
                       f"{problem.cc}")
    if problem.K not in HEAD_DIMS:
        return False, (f"K in {HEAD_DIMS} (each row is split into 16-byte vectors over a "
                       f"power-of-two lane group), got K={problem.K}")
    grid = max(problem.B * problem.HV * blocks_per_head(problem.V, w, rw, 32)  # the largest grid
               for gpu in tables.launch_tables().every_gpu() for inplace in (True, False)
               for w, rw, *_ in [launch_config(dataclasses.replace(problem, inplace=inplace), gpu)])
    if grid > MAX_GRID_X:
        return False, f"grid of {grid} blocks exceeds {MAX_GRID_X} (B*HV={problem.B * problem.HV})"
    why = kfirst.serves(problem.K, problem.V, cuda_build.ELEM_SIZE[problem.state_dtype]) \
        if problem.k_first else ""
    return (False, why) if why else (True, "")


def pool_mode(pool):
    """The kernel's GDN_POOL and GDN_IDX64 for a :class:`gdnzoo.pool.Pool` (None: dense)."""
    if pool is None:
        return dict(pool=0)
    i64 = int(pool.read.dtype == torch.int64) + 2 * int(pool.write.dtype == torch.int64)
    return dict(pool=1 if pool.same_indices else 2, idx64=i64)


def verify_mode(pool, verify):
    """The kernel's GDN_POOL, GDN_IDX64, GDN_INTER and GDN_UPDATE for a verify call (a
    :class:`gdnzoo.verify.Verify`; ``pool`` None: a dense state)."""
    i64 = lambda x: int(x is not None and x.dtype == torch.int64)      # noqa: E731
    if verify.per_token:
        return dict(pool=3 if verify.accepted is None else 4,
                    idx64=i64(pool.read) + 8 * i64(verify.accepted), inter=0, update=1)
    mode = pool_mode(pool)
    inter = 0 if verify.states is None else 1 if verify.indices is None else 2
    if inter == 2:
        mode["idx64"] = mode.get("idx64", 0) + 4 * i64(verify.indices)
    return dict(mode, inter=inter, update=int(verify.update))


def stride_defines(values, verify=False) -> tuple:
    """GDN_DENSE=2's -D constants: the call's own strides (``values``: GdnParams' field values;
    GdnParams' q_n .. dtb_h, and a verify call's i_n and i_t), compiled into the variant, so a
    strided layout (the engines' views of one fused activation tensor, a page-strided pool) gets
    the constant index math of a dense call; one variant per layout."""
    named = dict(zip(cuda_build.PARAM_FIELDS, values))
    fields = cuda_build.STRIDE_FIELDS + (("i_n", "i_t") if verify else ())
    return tuple((f"GDN_SC_{n}", int(named[n])) for n in fields)


def verify_key(verify):
    """What a verify launcher depends on beyond the dense signature and the pool (None: no
    verify)."""
    if verify is None:
        return None
    x = verify.states
    dtype = lambda t: None if t is None else t.dtype                  # noqa: E731
    return (verify.per_token, verify.update, None if x is None else (x.shape, x.stride()),
            dtype(verify.indices), dtype(verify.accepted))


class Bound:
    """cuda-v4 for one signature: a Launch for 16-byte-aligned pointers and one (built on first
    need) for the element-load variant; per call only the pointers are looked at.  Each call
    path launches with cuLaunchKernel, or cuLaunchKernelEx where the Launch has PDL (the branch
    is written out in each: no extra call on the host path).  Where the row's tensor-core
    verify serves the signature, its own call (:func:`gdnzoo.backends._cuda_v4_tc.bind`) takes
    the place of :meth:`launch` on the instance."""

    def __init__(self, q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, l2, config,
                 pool=None, verify=None, pdl=0, form=None):
        # Only plain values are kept: a bound launcher must not keep the first call's tensors alive.
        self.values = cuda_build.param_values(q, k, v, state, A_log, a, dt_bias, b, scale, out,
                                              new_state, pool, verify)
        self.dtypes = (state.dtype, q.dtype, a.dtype, b.dtype, dt_bias.dtype)
        self.shape = (*q.shape, v.shape[2], v.shape[3])         # B, T, H, K, HV, V
        self.l2, self.config, self.dev = bool(l2), config, q.get_device()
        self.pdl = int(pdl)                       # the kernel's GDN_PDL, 0: a plain launch
        self.form = dict(form or {})              # GDN_GATES, GDN_NEG where on (gate_form)
        self.kfirst = bool(self.form.pop("kfirst", 0))    # cuda_v4_kfirst.cu
        self.dest = new_state is not state        # which table: bind() keys on it
        self.verify = verify is not None
        f = dict(zip(cuda_build.PARAM_FIELDS, self.values))
        # 16-byte loads: the state, new_state (and intermediate) strides and q's and k's are
        # multiples of 16 bytes
        st = io = 0
        for n in ("s_n", "s_h", "s_v", "ns_n", "ns_h", "ns_v") + ("i_n", "i_t") * self.verify:
            st |= f[n]
        for n in ("q_n", "q_t", "q_h", "k_n", "k_t", "k_h"):
            io |= f[n]
        self.strides_aligned = (st * state.element_size() | io * q.element_size()) & 15 == 0
        # The kernel's pool and verify switches (GDN_POOL, GDN_IDX64, GDN_INTER, GDN_UPDATE).
        self.switches = pool_mode(pool) if verify is None else verify_mode(pool, verify)
        # A pool: every other tensor dense and each slot a dense [HV, V, K] block (the slot
        # strides stay runtime values).
        self.dense = cuda_build.dense(q, k, v, state, A_log, a, dt_bias, b, out, new_state) \
            if pool is None else cuda_build.dense(q, k, v, state[0], A_log, a, dt_bias, b, out,
                                                  new_state[0])
        # Not dense: the call's strides compiled in (GDN_DENSE=2).
        self.stride_defs = () if self.dense else stride_defines(self.values, self.verify)
        if pool is not None or verify is not None or self.form:
            self.with_pointers = None             # dense raw-gate calls only
        self.launches = {}
        if self.strides_aligned:
            self.vec16 = self.make(True)

    def make(self, vec16):
        """The Launch for 16-byte vectors (``vec16``) or element loads: the row's (or the
        explicit config's) fields, each fitted to what this signature can serve."""
        B, T, H, K, HV, V = self.shape
        sd, io, ad, bd, dd = self.dtypes
        config = self.config
        if config is None:
            w, rw, lpr, hint, fast, chain, smem, qks, chunk, ahead, hsc, kernel = table_config(
                torch.cuda.get_device_name(self.dev), sd, B, H, HV, K, V, not self.dest, T,
                self.switches["pool"] > 0, "inter" in self.switches)
            if self.pdl:
                w = pdl_warps(sd, B * HV, K, V, w, rw, lpr)
        else:
            w, rw, lpr, hint, fast, chain, smem, qks, chunk, ahead, hsc, kernel = \
                full_config(config)
        if self.kfirst:                  # its own kernel and shape; the row's gates
            staged = False
            if config is None:
                size = cuda_build.ELEM_SIZE[sd]
                w, lpr, hint = kfirst.shape(size, B * HV, K, V, not self.dest, vec16)
                staged = vec16 and kfirst.pick_staged(
                    size, B * HV, K, V, T, not self.dest,
                    self.values[cuda_build.PARAM_FIELDS.index("s_v")], self.verify)
            launch = self.launches[vec16] = kfirst.launch(self, vec16, w, lpr, hint, fast,
                                                          staged)
            return launch
        if not vec16:
            lpr, hint = min(32, K), 0                  # element loads: one element per lane
        why = valid_config(K, V, sd, w, rw, lpr, vec16) or (
            f"ahead={ahead!r} is not 0, 1, 2 or 3" if ahead not in AHEAD else
            f"chunk={chunk!r} is not 0, 1 or 2" if chunk not in CHUNK else
            f"head_scalars={hsc!r} is not 0 or 1" if hsc not in HEAD_SCALARS else
            f"kernel={kernel!r} is not one of {', '.join(KERNELS)}" if kernel not in KERNELS
            else "")
        if why:
            raise ValueError(f"cuda-v4: launch config invalid: {why}")
        if kernel == "tc-verify":        # where it serves; else cuda_v4.cu with the other fields
            tc = tc_verify.bind(self, vec16, fast, types.MethodType(Bound.launch, self))
            if tc is not None:
                launch, self.launch = tc          # its own call in place of Bound.launch
                self.launches[vec16] = launch
                return launch
        # every token at once: 16-byte vectors, the values that serve T (2 above its limit: 1)
        serve = chunk_values(T) if vec16 else []
        chunk = chunk if chunk in serve else 1 if chunk and 1 in serve else 0
        qks = 0 if chunk else effective_qks(qks, vec16, lpr)
        # staging: 16-byte vectors, T = 1, within static shared memory
        smem = int(bool(smem) and vec16 and T == 1 and smem_bytes(K, sd, w, rw, lpr)
                   + (qks == 1) * qks_bytes(K, io, T) <= SMEM_STATIC_MAX)
        # the head's scalars from the block: the token loop with the state in registers
        hsc = hsc if not chunk and not smem and T > 1 else 0
        # the token loop a token ahead: T > 1, the state in registers, q/k not staged per block
        ahead = ahead if not chunk and not smem and T > 1 and qks != 1 else 0
        ahead = 1 if ahead == 3 and T > QK_AHEAD_MAX_T else ahead
        # GDN_PDL, GDN_CHUNK, GDN_AHEAD and GDN_HSC only when on: the variants without them keep
        # their options and cache entries.
        opt = {n: v for n, v in (("pdl", self.pdl), ("chunk", chunk), ("ahead", ahead),
                                 ("hsc", hsc)) if v}
        opt.update(self.form)
        defs = cuda_build.defines(sd, io, ad, bd, dd, K, self.l2, v=V, t=T, hv=HV, gva=HV // H,
                                  w=w, rw=rw, lpr=lpr, vec16=int(vec16), hint=hint,
                                  fastgate=fast, dense=1 if self.dense else 2, chain=chain,
                                  smem=smem, qks=qks, **self.switches, **opt)
        defs = tuple(sorted(defs + self.stride_defs))
        kern = cuda_build.get_kernel(SOURCE, KERNEL, defs, self.dev)
        bph = blocks_per_head(V, w, rw, lpr)
        launch = cuda_build.Launch(kern, B * HV * bph, 32 * w, self.dev,
                                   template=cuda_build.params_template(self.values),
                                   pdl=self.pdl > 0)
        self.launches[vec16] = launch
        return launch

    def with_pointers(self, p, scale):
        """Launch from gdnzoo.decode's data pointers (gdnzoo.contract.POINTERS order: q, k, v,
        state, A_log, a, dt_bias, b, out, new_state; new_state's 0 in place) when they are
        16-byte aligned; False: call with the tensors instead."""
        if not (self.strides_aligned and (p[0] | p[1] | p[3] | p[9]) & 15 == 0):
            return False
        launch = self.vec16
        try:
            buf, _, argv = launch._tls.b
        except AttributeError:
            buf, _, argv = launch.buffers()
        cuda_build.HEAD.pack_into(buf, cuda_build.HEAD_OFFSET, p[3], 0, 0, p[0], p[1], p[2],
                                  p[5], p[7], p[4], p[9] if self.dest else p[3], p[8], p[6], 0,
                                  0, 0)
        if launch.pdl is None:
            cuda_build.launch_raw(launch.func, launch.grid, launch.block, launch.dev, argv,
                                  launch.shared)     # dynamic: the K-first GDN_STAGED's tile
        else:
            cuda_build.launch_raw_pdl(launch.pdl, launch.func, launch.dev, argv)
        return True

    def launch(self, q, k, v, state, A_log, a, dt_bias, b, out, new_state, idx=0, new_idx=0,
               inter=0, inter_idx=0, accepted=0):
        """Launch for these tensors (16-byte loads when they, and the intermediate states'
        pointer ``inter``, are aligned), their data pointers and the index pointers given
        written into this thread's parameter block (GdnParams' HEAD_FIELDS, one pack_into).
        Warm dense calls skip it (:meth:`with_pointers`)."""
        qp, kp, sp, np_ = q.data_ptr(), k.data_ptr(), state.data_ptr(), new_state.data_ptr()
        if self.strides_aligned and (qp | kp | sp | np_ | inter) & 15 == 0:
            launch = self.vec16
        else:
            launch = self.launches.get(False) or self.make(False)
        try:
            buf, _, argv = launch._tls.b
        except AttributeError:
            buf, _, argv = launch.buffers()
        cuda_build.HEAD.pack_into(buf, cuda_build.HEAD_OFFSET, sp, idx, accepted, qp, kp,
                                  v.data_ptr(), a.data_ptr(), b.data_ptr(), A_log.data_ptr(),
                                  np_, out.data_ptr(), dt_bias.data_ptr(), inter_idx, new_idx,
                                  inter)
        if launch.pdl is None:
            cuda_build.launch_raw(launch.func, launch.grid, launch.block, launch.dev, argv,
                                  launch.shared)     # dynamic: the K-first GDN_STAGED's tile
        else:
            cuda_build.launch_raw_pdl(launch.pdl, launch.func, launch.dev, argv)

    def __call__(self, c):
        """Launch for a decode call record of this signature: its index tensors' pointers and
        the intermediate, intermediate-index and accepted-count pointers (those tensors change
        between calls) written into the parameter block with the data pointers.  A
        16-byte-aligned launch needs the intermediate states aligned too."""
        pool, ver = c.pool, c.verify
        if ver is None:
            if pool is None:
                self.launch(c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b, c.out,
                            c.new_state)
            else:
                self.launch(c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b, c.out,
                            c.new_state, pool.read.data_ptr(), pool.write.data_ptr())
            return
        self.launch(c.q, c.k, c.v, c.state, c.A_log, c.a, c.dt_bias, c.b, c.out, c.new_state,
                    0 if pool is None else pool.read.data_ptr(),
                    0 if pool is None else pool.write.data_ptr(),
                    0 if ver.states is None else ver.states.data_ptr(),
                    0 if ver.indices is None else ver.indices.data_ptr(),
                    0 if ver.accepted is None else ver.accepted.data_ptr())


def pool_key(state, new_state, pool):
    """What a pool launcher depends on beyond the dense signature (None: no pool)."""
    if pool is None:
        return None
    return (pool.same_indices, pool.read.dtype, pool.write.dtype, pool.null_slot,
            state.shape[0], new_state.shape[0])


def bind(call, *, config=None):
    """A launcher for every decode call record with this one's shapes, strides, dtypes, scale
    and mode (in place or destination passing: each has its own table; a state pool; a verify
    call) and its level of programmatic dependent launch (0 off, 1 wait-first, 2 state-early;
    see the module docstring); ``config`` overrides the table (see :data:`CONFIG`)."""
    c = call
    if c.pdl not in (0, 1, 2):
        raise ValueError(f"cuda-v4: pdl must be 0 (off), 1 (wait) or 2 (early), got {c.pdl!r}")
    args = c.positional() if c.g is None else c[:4] + gate_tensors(c) + c[8:12]
    form = gate_form(c)
    if config is not None:
        config = full_config(config)             # a dict by name too: the key must hash
    key = (cuda_build.signature_key(*args), config, pool_key(c.state, c.new_state, c.pool),
           verify_key(c.verify), c.pdl) + tuple(sorted(form.items()))
    bound = _binds.get(key)
    if bound is None:
        if len(_binds) >= 4096:
            _binds.clear()
        bound = _binds[key] = Bound(*args, config, c.pool, c.verify, c.pdl, form)
    return bound if c.g is None else with_gates(bound)


def with_gates(bound):
    """The launcher of a precomputed-gates record: ``bound`` (built for the GDN_GATES form)
    called with g and beta where a and b go and zeros for A_log and dt_bias, so that the
    raw-gate launcher stays as it was."""
    def launch(c):
        z, g, _, beta = gate_tensors(c)
        bound(c._replace(A_log=z, a=g, dt_bias=z, b=beta))
    return launch


_ZEROS: dict = {}                # (device, HV) -> fp32 zeros: A_log and dt_bias with g, beta


def gate_tensors(c) -> tuple:
    """(A_log, a, dt_bias, b) as the kernel reads them for a record with the precomputed
    gates: zeros for A_log and dt_bias (so a + dt_bias is g), g and beta where a and b go."""
    key = (c.g.device, c.problem.HV)
    z = _ZEROS.get(key)
    if z is None:
        z = _ZEROS[key] = torch.zeros(c.problem.HV, dtype=torch.float32, device=c.g.device)
    return z, c.g, z, c.beta


def gate_form(c) -> dict:
    """The kernel's GDN_GATES and GDN_NEG defines of a record, only those that are on, and
    ``kfirst`` for a K-first state (:class:`Bound` runs cuda_v4_kfirst.cu)."""
    return {n: 1 for n, on in (("gates", c.g is not None), ("neg", c.allow_neg_eigval),
                               ("kfirst", c.problem.k_first)) if on}


def run(call, *, config=None):
    """Backend entry point for a decode call record; ``config``: launch fields in place of the
    table's (:data:`CONFIG`, by name or in its order, trailing ones defaulted)."""
    bind(call, config=config)(call)

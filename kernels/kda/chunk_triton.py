"""Triton chunked KDA forward (``../shared/REFERENCE.md`` section 1), with a recompute-from-inputs backward.

Kernels (all fixed-configuration, so they run under ``TRITON_INTERPRET=1`` on a CPU), chunk C = 64 split
into four 16-token sub-blocks; each kernel works through K (or V) in tiles so that its registers stay small:

1. ``_prep_kernel``, per (chunk, value head): the gate (softplus "unbounded" or sigmoid lower bound) and the
   chunk-local cumulative sum G (fp32, stored), G_last; with ``SCORES2_NORMS`` off also the inverse L2 norms of
   the q, k rows (stored, applied by every later consumer, so normalised q, k are never rounded to 16 bits).
2. ``_scores2_kernel`` (``scores_triton.py``), per (chunk, value head): ``Akk`` / ``Aqk`` over K tiles of 16
   (the off-diagonal blocks as one batched tensor-core dot a tile, the diagonal blocks in fp32 through each block's
   first row; by default from the raw q, k rows, whose inverse norms the same loop forms and stores, the scores
   scaled by them after it: ``SCORES2_NORMS``), then in the same program:
3. ``T = (I + Akk)^-1`` in place by blocked forward substitution, and
4. ``W = T (beta K Gamma)``, ``U = T (beta V)``, and with them ``qg = scale Q Gamma`` and ``kg = K exp(G_last - G)``
   (for 16-bit inputs the exponent is a difference of the stored fp32 prefix sums; for fp32 inputs the prep kernel
   also writes it as a suffix sum of g into kg's buffer, which keeps the final state fp32-accurate: with sharp gates
   the difference lost ~1e-5 of it).
5. ``_state_kernel``, one program per (sequence, value head, block of value columns): the sequential
   pass over chunks with the fp32 state in registers; writes the state entering each chunk (``h``),
   ``Vnew = U - W S`` and the final state.
6. ``_output_kernel``, one program per (chunk, value head, block of value columns), fully parallel:
   ``O = qg h + tril(Aqk) Vnew``.

With few (sequence, value head) pairs the forward runs kernels 2, 5 and 6 in pieces along time (``pieces.py``): each
piece's state pass on a side stream beside the next piece's scores, the same arithmetic.

:func:`chunk_kda_fwd_intermediates` returns every intermediate (:class:`KDAFwdState`) of the core op (q, k
normalised, g the log-decay), as the backward reads them.

Scratch is laid out per chunk, padded to C rows: padded rows have g = 0 (so G carries the last valid
value and every exponent stays <= 0) and zero k, q, v, beta, which makes their W, U, Vnew and kg rows
zero. Per-chunk intermediates are stored in the input dtype (fp32 for fp32 inputs); the state is
fp32. All varlen bookkeeping is a host-side table of chunks (token start, length) and of sequences
(first chunk, number of chunks); dense batches are treated as B equal-length sequences. Offsets that
can exceed 2^31 are int64.

Backward (:class:`ChunkKDAFunction`, used when a gradient is needed): the forward runs the same kernels, L2 norm
and gate inside them (the scores and prep kernels), and keeps the per-chunk intermediates, the inverse norms of q,
k and the raw q, k, g; the backward runs ``chunk_triton_bwd.chunk_kda_bwd_triton`` on the raw q, k with those
norms and takes the gate's backward inside its inter kernel (``BWD_FUSED_L2``, ``BWD_FUSED_GATE``; else it
recomputes normalised q, k and runs the gate's backward with ``prep_triton.py``'s kernels), then the L2 norm's
backward.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.backend import interpreting, sm_count
from kernels.kda import pieces as kda_pieces
from kernels.kda.chunk_bwd_torch import CHUNK, chunk_tables
from kernels.kda.chunk_triton_bwd import BwdPrep, bwd_reads_g, chunk_kda_bwd_triton
from kernels.kda.pieces import Relaunch, fwd_pieces, piece_tables, run_pieces
from kernels.kda.prep_triton import (
    _gate,
    gate_bwd,
    gate_fwd,
    l2norm_bwd,
    l2norm_fwd,
    qk_rows,
    qkv_base,
    qkv_dv_view,
    qkv_l2_grad,
    token_rows,
)
from kernels.kda.scores_triton import _scores2_kernel
from kernels.kda.state_common import _chunk_head_ids, _load_state, _mm, _state_program, chunk_head_grid, state_block_v

SUB = 16


@triton.jit
def _prep_norms(q_ptr, k_ptr, rq_ptr, rk_ptr, bos, rows, rm, sc, i_h, QS: tl.constexpr, K: tl.constexpr,
                C: tl.constexpr, BKP: tl.constexpr):
    """Store the inverse L2 norms of the chunk's q and k rows (fp32, eps 1e-6 under the root), K tile by K tile."""
    qk_off = (bos + rows)[:, None] * QS + i_h * K
    sq = tl.zeros([C], dtype=tl.float32)
    sk = tl.zeros([C], dtype=tl.float32)
    for k0 in range(0, K, BKP):
        ck = k0 + tl.arange(0, BKP)
        m = rm[:, None] & (ck < K)[None, :]
        x = tl.load(q_ptr + qk_off + ck[None, :], mask=m, other=0.0).to(tl.float32)
        sq += tl.sum(x * x, 1)
        x = tl.load(k_ptr + qk_off + ck[None, :], mask=m, other=0.0).to(tl.float32)
        sk += tl.sum(x * x, 1)
    tl.store(rq_ptr + sc * C + rows, 1.0 / tl.sqrt(sq + 1e-6))
    tl.store(rk_ptr + sc * C + rows, 1.0 / tl.sqrt(sk + 1e-6))


@triton.jit
def _prep_gate_tile(g_ptr, alog_ptr, dtb_ptr, lb, G_ptr, gl_ptr, E_ptr, bos, rows, rm, sc, i_hv, ck,
                    HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr, GATE: tl.constexpr, LOWER: tl.constexpr,
                    HAS_DTB: tl.constexpr, SUFFIX: tl.constexpr):
    """One key-column tile ``ck`` of the chunk: the gate of raw g (or g as given), G = cumsum(g) and G_last stored;
    with ``SUFFIX`` also ``G_last - G`` as a suffix sum into ``E_ptr``. G_last is G's last row, stored by the
    threads that hold it (rows past a short chunk's end hold g = 0, so the last row is the chunk's total). Until
    session 24 it was a column sum of g: the cross-warp reduction took the kernel from 56 to 72 registers and
    from 0.117 to 0.156 ms at 1 x 8192 x 32 (H200, call2)."""
    cm = ck < K
    m = rm[:, None] & cm[None, :]
    g = tl.load(g_ptr + (bos + rows)[:, None] * (HV * K) + i_hv * K + ck[None, :], mask=m, other=0.0)
    g = g.to(tl.float32)
    if GATE:
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
        dtb = tl.zeros([ck.shape[0]], dtype=tl.float32)
        if HAS_DTB:
            dtb = tl.load(dtb_ptr + i_hv * K + ck, mask=cm, other=0.0).to(tl.float32)
        g = tl.where(m, _gate(g + dtb[None, :], a_log, lb, LOWER), 0.0)
    G = tl.cumsum(g, 0)
    last = (rows == C - 1)[:, None] & cm[None, :]
    tl.store(gl_ptr + sc * K + (rows * 0)[:, None] + ck[None, :], G, mask=last)
    off = sc * (C * K) + rows[:, None] * K + ck[None, :]
    tl.store(G_ptr + off, G, mask=cm[None, :])
    if SUFFIX:
        tl.store(E_ptr + off, tl.cumsum(g, 0, reverse=True) - g, mask=cm[None, :])


@triton.jit
def _prep_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
    alog_ptr,
    dtb_ptr,
    lb,
    cbos_ptr,
    clen_ptr,
    G_ptr,
    gl_ptr,
    rq_ptr,
    rk_ptr,
    E_ptr,
    QS: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    C: tl.constexpr,
    BKP: tl.constexpr,
    GATE: tl.constexpr,
    LOWER: tl.constexpr,
    HAS_DTB: tl.constexpr,
    L2: tl.constexpr,
    SUFFIX: tl.constexpr,
    HEADS_FIRST: tl.constexpr = False,
):
    """Per (chunk, value head): inverse row norms of q, k (L2, a first pass over K), then K tile by K tile the gate,
    G = cumsum(g) (fp32) and G_last; q and k tokens ``QS`` elements apart. (qg and kg come from the scores kernel's
    W / U loop: written here, they took this kernel to 162 registers and 0.33 ms at 1 x 8192 x 32, against 72 and
    0.18 ms without; H200, session 20.) ``SUFFIX`` (fp32 inputs): also kg's exponent ``G_last - G`` as a suffix sum
    of g, into ``E_ptr`` (kg's fp32 buffer, which the W / U loop then overwrites with kg). (One program for
    the norms and one per key tile took the forward from 1.111 to 1.128 ms: H200, session 21, removed. Both K loops
    as straight-line code: 80 registers against 88 but 0.193 against 0.154 ms at 1 x 8192 x 32; H200, session 23,
    removed. Session 24, H200, 1 x 8192 x 32 (call1, call2: with G_last as a column sum, then from G's last row):
    the norms inside the gate's K loop 0.145 against 0.155 ms, then 0.114 against 0.117 (2 x 16384 x 16: 0.218
    against 0.213); the norms over 64 / 128-column tiles 0.152 / 0.152 (197 / 166 registers); the cumsum as a dot
    with a triangular ones matrix (tf32x3 / two tf32 dots of g's high and low parts) 0.218 / 0.175; all removed. Timing
    probes placed the kernel's time before the G_last change: gate pass alone 0.128 ms, norm pass alone 0.050; after
    it the gate pass alone took 0.080.)"""
    i_c, i_hv = _chunk_head_ids(0, HEADS_FIRST)
    i_h = i_hv // (HV // H)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    rows = tl.arange(0, C)
    rm = rows < n
    sc = i_c.to(tl.int64) * HV + i_hv
    if L2:
        _prep_norms(q_ptr, k_ptr, rq_ptr, rk_ptr, bos, rows, rm, sc, i_h, QS, K, C, BKP)
    for k0 in range(0, K, BKP):
        _prep_gate_tile(g_ptr, alog_ptr, dtb_ptr, lb, G_ptr, gl_ptr, E_ptr, bos, rows, rm, sc, i_hv,
                        k0 + tl.arange(0, BKP), HV, K, C, GATE, LOWER, HAS_DTB, SUFFIX)


@triton.jit
def _state_kernel(
    W_ptr,
    U_ptr,
    kg_ptr,
    gl_ptr,
    h0_ptr,
    h_ptr,
    vn_ptr,
    ht_ptr,
    sc0_ptr,
    snc_ptr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    HAS_H0: tl.constexpr,
    FP32: tl.constexpr,
):
    i_nh, i_hv, c0, nc, rows, ck, cv, kmask, vmask, smask, s_off = _state_program(sc0_ptr, snc_ptr, HV, K, V, BK, BV, C)
    S = _load_state(h0_ptr, i_nh, s_off, smask, HAS_H0, K, V, BK, BV)
    for c in range(0, nc):
        sc = (c0 + c).to(tl.int64) * HV + i_hv
        Sd = S.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + sc * (K * V) + s_off, Sd, mask=smask)
        w = tl.load(W_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        u = tl.load(U_ptr + sc * (C * V) + rows[:, None] * V + cv[None, :], mask=vmask[None, :], other=0.0)
        vn = u.to(tl.float32) - _mm(w, Sd, FP32)
        vnd = vn.to(vn_ptr.dtype.element_ty)
        tl.store(vn_ptr + sc * (C * V) + rows[:, None] * V + cv[None, :], vnd, mask=vmask[None, :])
        kg = tl.load(kg_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        gl = tl.load(gl_ptr + sc * K + ck, mask=kmask, other=0.0)
        S = S * tl.exp(gl)[:, None] + _mm(tl.trans(kg), vnd, FP32)
    tl.store(ht_ptr + i_nh.to(tl.int64) * (K * V) + s_off, S, mask=smask)


@triton.jit
def _output_kernel(
    qg_ptr,
    h_ptr,
    Aqk_ptr,
    vn_ptr,
    o_ptr,
    cbos_ptr,
    clen_ptr,
    cidx_ptr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    FP32: tl.constexpr,
    HEADS_FIRST: tl.constexpr = False,
    HAS_CIDX: tl.constexpr = False,
):
    i_v = tl.program_id(0)
    i_c, i_hv = _chunk_head_ids(1, HEADS_FIRST)
    if HAS_CIDX:  # a subset of the chunks (pieces.py)
        i_c = tl.load(cidx_ptr + i_c)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    sc = i_c.to(tl.int64) * HV + i_hv
    rows = tl.arange(0, C)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    kmask = ck < K
    vmask = cv < V
    qg = tl.load(qg_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
    h = tl.load(h_ptr + sc * (K * V) + ck[:, None] * V + cv[None, :], mask=kmask[:, None] & vmask[None, :], other=0.0)
    a = tl.load(
        Aqk_ptr + sc * (C * C) + rows[:, None] * C + rows[None, :], mask=rows[:, None] >= rows[None, :], other=0.0
    )
    vn = tl.load(vn_ptr + sc * (C * V) + rows[:, None] * V + cv[None, :], mask=vmask[None, :], other=0.0)
    o = _mm(qg, h, FP32) + _mm(a, vn, FP32)
    tl.store(
        o_ptr + (bos + rows)[:, None] * (HV * V) + i_hv * V + cv[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=(rows < n)[:, None] & vmask[None, :],
    )


def _tables(T: int, B: int, cu_seqlens: torch.Tensor | None, device: torch.device):
    """Chunk table (token start, length) and sequence table (first chunk, number of chunks) of
    :func:`chunk_tables`, each at least one entry long (a kernel needs a valid pointer even with no chunk)."""
    cbos, clen, s0, snc = chunk_tables(T, B, cu_seqlens, device)
    at_least_one = lambda x: x if x.numel() else torch.zeros(1, dtype=torch.int32, device=device)  # noqa: E731
    return cbos.numel(), [at_least_one(cbos), at_least_one(clen)], [at_least_one(s0), at_least_one(snc)]


PREP_BK = 32  # key columns per step of the prep kernel (norms, gate, cumsum)
PREP_LAUNCH = (4, 2)  # num_warps, num_stages
# fp32 inputs: kg's exponent G_last - G as a suffix sum of g (a second scan in the prep kernel, stored in kg's buffer)
# rather than a difference of the stored prefix sums, which lost up to ~1e-5 of the final state with sharp gates
# (H200, session 20 call6: max 9.2e-6 against 2.5e-7). 16-bit inputs always take the difference (bf16 errors equal).
FP32_KG_SUFFIX = True
SCORES2_BK = 16  # key columns per step of the Akk / Aqk accumulation
SCORES2_MAXNREG: int | None = 168  # 3 CTAs of 4 warps per SM (sm_90a, K = V = 128); None: ptxas chooses
# num_warps, num_stages of the scores + solve + W / U kernel (H200, 1 x 8192 x 32, session 19 call2 with the row-load
# solve: s1 0.713 ms, s2 0.594, s3 0.571; an H100 in session 5 with the earlier kernel had s1 0.745, s2 0.809)
SCORES2_LAUNCH = (4, 3)
INTRA_PREC16 = "tf32"  # tl.dot precision of the Akk / Aqk, solve and W / U dots for 16-bit inputs (fp32: ieee)
INTRA_DIAG_PREC16 = "tf32x3"  # the diagonal blocks' dots for 16-bit inputs: fp32-grade on tensor cores (fp32: ieee)
# Diagonal 16 x 16 blocks of Akk / Aqk go through their sub-block's first row (one batched dot) in every K tile
# whose largest |G_i - G_ref| within the block is <= this; other tiles go pairwise in fp32. At 60, exp(+-60)
# leaves ~1e-10 of a unit-norm key above fp32's smallest normal; a negative value sends every tile pairwise (the
# tests compare both paths).
INTRA_SPAN_MAX = 60.0
# the solve's four diagonal 16 x 16 inverses: 1 products of powers over 8 x 8 halves as six batched dots
# (INTRA_DIAG_PREC16 / ieee), 0 forward substitution (15 steps, four cross-warp reductions each). H200, session 24
# call5: scores kernel 0.642 -> 0.562 ms at 1 x 8192 x 32, 1.259 -> 1.108 at 2 x 16384 x 16; the identity in their
# place (a timing probe, call4) 0.496 against 0.608
SCORES2_DIAG_INV = 1
# the q, k rows' inverse L2 norms from the scores kernel's K loop (raw rows accumulated, the scores scaled after it)
# rather than a first pass over q, k in the prep kernel, which then reads only g. H100, session 38 (sweep_kda_fwd,
# training-path forward, call1 1x8192x32 / call2 8x4096x6): 1.011 / 0.743 ms against 1.067 / 0.778 (prep 0.144 ->
# 0.085 / 0.111 -> 0.065, scores 0.563 -> 0.557 / 0.399 -> 0.410)
SCORES2_NORMS = True
SCORES2_NORMS_STAGES = 2  # num_stages of the scores kernel with SCORES2_NORMS (3 stages: 144 B of spills, 2: none)
WU_B = 32  # key / value columns per step of the W / U part of the scores kernel
# value columns per program of the sequential state pass; None: by the number of (sequence, head) pairs
# (state_common.state_block_v; a fixed 16 before session 22)
STATE_BV: int | None = None
# the widest width needs this many programs an SM (state_block_v's fill). 0.6 since session 33 (1.0 before): at the
# small hybrid's 8 x 4096 x 6 (48 pairs: 96 programs at 64 columns for 132 SMs) the kernel took 0.138 ms at 64 against
# 0.200 at 16 (H200, call1, sweep_kda_fwd --gates init --beta fp32); at 1 x 8192 x 32 (64 programs at 64 columns) 16
# stays (session 22)
STATE_FILL = 0.6
# stages of a program of 64 columns or more when there are more programs than SMs (two resident an SM; STATE_LAUNCH's
# otherwise). H200, session 33 call2 (forward state kernel, ms, 3 / 2 stages): 8x2048x16 (256 programs) 0.154 / 0.127,
# 4x4096x32 (256) 0.298 / 0.247; at the model's 8x4096x6 (96 programs) 0.139 / 0.167; at 16 columns 3 stays (1x8192x32
# 0.208 / 0.266, 8x4096x6 0.200 / 0.153 at fill 1 is the one exception)
STATE_STAGES_WIDE_MANY = 2
STATE_LAUNCH = (4, 3)  # num_warps, num_stages (sweep: s3 0.232 ms, s2 0.289)
OUT_BV = 64  # value columns per program of the output kernel
OUT_WARPS = 4
# grid order of the per-(chunk, value head) kernels (state_common.chunk_head_grid): heads first, the programs running
# together read whole token rows of q, k, v, g and write neighbouring slabs; chunks first (False), a head's rows of
# neighbouring chunks (the order before session 23). H200, session 23 call2 (sweep_kda_fwd), forward chunks first ->
# all heads first: 1.099 -> 1.084 ms at 1 x 8192 x 32 (prep 0.167 -> 0.155), 1.082 -> 1.061 at 8 x 2048 x 16 (prep
# 0.166 -> 0.155, scores 0.648 -> 0.641, output 0.104 -> 0.101); outputs bit-equal
PREP_HEADS_FIRST = True
SCORES2_HEADS_FIRST = True
OUT_HEADS_FIRST = True


def state_stages(bv: int, programs: int, device: torch.device) -> int:
    """Pipeline stages of the forward state pass at ``bv`` value columns a program and ``programs`` programs."""
    wide_many = bv >= 64 and device.type == "cuda" and programs > sm_count(device)
    return STATE_STAGES_WIDE_MANY if wide_many else STATE_LAUNCH[1]


@functools.cache
def _has_maxnreg() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return any(f.name == "maxnreg" for f in dataclasses.fields(CUDAOptions))
    except Exception:  # noqa: BLE001 - no NVIDIA backend: run without the cap
        return False


def _maxnreg(n: int | None) -> dict:
    """``maxnreg`` launch option where this Triton's CUDA backend has it (not under the interpreter); None: no cap."""
    return {"maxnreg": n} if n and not interpreting() and _has_maxnreg() else {}


class KDAFwdState(NamedTuple):
    """Forward outputs and per-chunk intermediates (the kda-fwd / kda-bwd contract, ``[NC, HV, C, X]`` slabs).

    o [B, T, HV, V] (v's dtype); ht [N, HV, K, V] fp32; G [NC, HV, C, K] fp32 chunk-local cumsum of g;
    Gl [NC, HV, K] fp32 (G's last row); Aqk [NC, HV, C, C] lower incl. diagonal, upper part zero;
    T [NC, HV, C, C] = (I + Akk)^-1 with its unit diagonal; W, qg, kg [NC, HV, C, K]; U, vn [NC, HV, C, V];
    h [NC, HV, K, V] the state entering each chunk (all in the scratch dtype: fp32 for fp32 inputs, else the
    input dtype, T and G always fp32); cbos, clen [NC] int32 chunk token start and length; s0, snc [N] int32
    first chunk and number of chunks per sequence.
    """

    o: torch.Tensor
    ht: torch.Tensor
    G: torch.Tensor
    Gl: torch.Tensor
    Aqk: torch.Tensor
    T: torch.Tensor
    W: torch.Tensor
    U: torch.Tensor
    qg: torch.Tensor
    kg: torch.Tensor
    h: torch.Tensor
    vn: torch.Tensor
    cbos: torch.Tensor
    clen: torch.Tensor
    s0: torch.Tensor
    snc: torch.Tensor
    rq: torch.Tensor | None = None  # [NC, HV, C] fp32 inverse L2 norms of q (in-kernel L2 norm only)
    rk: torch.Tensor | None = None  # likewise of k


def _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags, keep_u: bool = True) -> KDAFwdState:
    """Run the forward kernels (prep, scores + solve + W/U, state pass, output; the last three in pieces along time
    when :func:`pieces.fwd_pieces` says so) and return every intermediate.
    ``keep_u=False`` (inference): the state pass writes Vnew over U (same rows and columns, read before written by
    the same program), so the returned ``U`` is Vnew and one [NC, HV, C, V] scratch tensor is saved."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    fp32 = q.dtype == torch.float32 or v.dtype == torch.float32
    q, k, qs = qk_rows(q, k)
    g, beta = g.contiguous(), beta.contiguous()
    v, vs = token_rows(v)
    nch, (cbos, clen), (s0, snc) = _tables(T, B, cu_seqlens, dev)
    N = s0.numel() if cu_seqlens is not None else B
    BK, BV = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    sdt = torch.float32 if fp32 else v.dtype
    nc1 = max(nch, 1)
    qg = torch.empty(nc1, HV, CHUNK, K, dtype=sdt, device=dev)
    kg, W = torch.empty_like(qg), torch.empty_like(qg)
    U = torch.empty(nc1, HV, CHUNK, V, dtype=sdt, device=dev)
    vn = torch.empty_like(U) if keep_u else U
    Aqk = torch.empty(nc1, HV, CHUNK, CHUNK, dtype=sdt, device=dev)
    gl = torch.empty(nc1, HV, K, dtype=torch.float32, device=dev)
    h = torch.empty(nc1, HV, K, V, dtype=sdt, device=dev)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)  # a pointer the kernels never read (flags off)
    G = torch.empty(nc1, HV, CHUNK, K, dtype=torch.float32, device=dev)
    Tm = torch.empty(nc1, HV, CHUNK, CHUNK, dtype=torch.float32, device=dev)
    Akk = Tm  # the solve runs in place
    rq, rk = (torch.empty(nc1, HV, CHUNK, dtype=torch.float32, device=dev) if use_l2 else dummy for _ in range(2))
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    norms_in_scores = use_l2 and SCORES2_NORMS
    if nch:
        grid, hf = chunk_head_grid(nch, HV, PREP_HEADS_FIRST)
        _prep_kernel[grid](
            q, k, g, A_log if use_gate else dummy, dt_bias if (use_gate and dt_bias is not None) else dummy,
            float(lower_bound) if lower_bound is not None else 0.0, cbos, clen, G_ptr=G, gl_ptr=gl, rq_ptr=rq,
            rk_ptr=rk, E_ptr=kg, QS=qs, H=H, HV=HV, K=K, C=CHUNK, BKP=min(BK, PREP_BK), GATE=use_gate,
            LOWER=lower_bound is not None, HAS_DTB=dt_bias is not None, L2=use_l2 and not norms_in_scores,
            SUFFIX=fp32 and FP32_KG_SUFFIX, HEADS_FIRST=hf, num_warps=PREP_LAUNCH[0], num_stages=PREP_LAUNCH[1],
        )
    scores_args = dict(
        q_ptr=q, k_ptr=k, beta_ptr=beta, G_ptr=G, rq_ptr=rq, rk_ptr=rk, cbos_ptr=cbos, clen_ptr=clen, Aqk_ptr=Aqk,
        Akk_ptr=Akk, T_ptr=Tm, v_ptr=v, W_ptr=W, U_ptr=U, qg_ptr=qg, kg_ptr=kg, scale=scale, QS=qs, VS=vs, H=H, HV=HV,
        K=K, V=V, C=CHUNK, S=SUB, BKS=SCORES2_BK, BKW=min(BK, WU_B), BVW=min(BV, WU_B), L2=use_l2,
        PREC="ieee" if fp32 else INTRA_PREC16, DPREC="ieee" if fp32 else INTRA_DIAG_PREC16,
        SUFFIX=fp32 and FP32_KG_SUFFIX, span_max=INTRA_SPAN_MAX, DINV=SCORES2_DIAG_INV, NORMS=norms_in_scores,
    )
    scores_opts = dict(num_warps=SCORES2_LAUNCH[0], **_maxnreg(SCORES2_MAXNREG),
                       num_stages=SCORES2_NORMS_STAGES if norms_in_scores else SCORES2_LAUNCH[1])
    pieces = fwd_pieces(None if cu_seqlens is not None else nch // B, N * HV, V, dev) if nch else 1
    # the pieces' state passes run beside other kernels: their own width (pieces.PIECE_STATE_BV) unless STATE_BV set
    bvs = state_block_v(STATE_BV if pieces == 1 or STATE_BV else kda_pieces.PIECE_STATE_BV, V, N * HV, q.device,
                        fill=STATE_FILL)
    state_args = dict(W_ptr=W, U_ptr=U, kg_ptr=kg, gl_ptr=gl, h_ptr=h, vn_ptr=vn, HV=HV, K=K, V=V, BK=BK, BV=bvs,
                      C=CHUNK, FP32=fp32)
    state_opts = dict(num_warps=STATE_LAUNCH[0], num_stages=state_stages(bvs, triton.cdiv(V, bvs) * N * HV, q.device))
    state_grid = (triton.cdiv(V, bvs), N * HV)
    bvo = min(BV, OUT_BV)
    out_args = dict(qg_ptr=qg, h_ptr=h, Aqk_ptr=Aqk, vn_ptr=vn, o_ptr=o, cbos_ptr=cbos, clen_ptr=clen, HV=HV, K=K,
                    V=V, BK=BK, BV=bvo, C=CHUNK, FP32=fp32)
    out_opts = dict(num_warps=OUT_WARPS)

    def chunk_grid(cidx: torch.Tensor | None, heads_first: bool, lead: tuple = ()) -> tuple[tuple, dict]:
        """A per-(chunk, value head) kernel's grid over every chunk, or over the chunks ``cidx`` lists, and the
        arguments that say which."""
        grid, hf = chunk_head_grid(nch if cidx is None else cidx.numel(), HV, heads_first, lead)
        return grid, dict(cidx_ptr=dummy if cidx is None else cidx, HAS_CIDX=cidx is not None, HEADS_FIRST=hf)

    h0 = initial_state.contiguous() if initial_state is not None else dummy
    lead = (triton.cdiv(V, bvo),)
    if pieces == 1:
        if nch:
            grid, which = chunk_grid(None, SCORES2_HEADS_FIRST)
            _scores2_kernel[grid](**scores_args, **which, **scores_opts)
        _state_kernel[state_grid](**state_args, h0_ptr=h0, ht_ptr=ht, sc0_ptr=s0, snc_ptr=snc,
                                  HAS_H0=initial_state is not None, **state_opts)
        if nch:
            grid, which = chunk_grid(None, OUT_HEADS_FIRST, lead)
            _output_kernel[grid](**out_args, **which, **out_opts)
    else:  # pieces along time: each piece's state pass beside the next piece's scores (pieces.py)
        tab = piece_tables(B, nch // B, pieces, dev)
        hts = [torch.empty_like(ht) for _ in range(pieces - 1)] + [ht]  # each piece's final states
        scores, state, out = (Relaunch(kern, **o) for kern, o in ((_scores2_kernel, scores_opts),
                                                                   (_state_kernel, state_opts),
                                                                   (_output_kernel, out_opts)))
        run_pieces(
            pieces,
            dev,
            lambda j: scores(*chunk_grid(tab.cidx[j], SCORES2_HEADS_FIRST), **scores_args),
            lambda j: state(state_grid, dict(h0_ptr=hts[j - 1] if j else h0, ht_ptr=hts[j], sc0_ptr=tab.s0[j],
                                             snc_ptr=tab.nc[j], HAS_H0=j > 0 or initial_state is not None),
                            **state_args),
            lambda j: out(*chunk_grid(tab.cidx[j], OUT_HEADS_FIRST, lead), **out_args),
        )
    rn = (rq, rk) if use_l2 else (None, None)
    return KDAFwdState(o, ht, G, gl, Aqk, Tm, W, U, qg, kg, h, vn, cbos, clen, s0, snc, *rn)


def chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    """Forward only. Returns o [B, T, HV, V] (v's dtype) and the final state [N, HV, K, V] fp32."""
    st = _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags, keep_u=False)
    return st.o, st.ht


def chunk_kda_fwd_intermediates(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> KDAFwdState:
    """Forward on the core path (q, k already normalised, g already the log-decay), keeping the per-chunk
    intermediates the backward needs (see :class:`KDAFwdState`). q, k [B, T, H, K]; v [B, T, HV, V];
    g [B, T, HV, K]; beta [B, T, HV]; initial_state [N, HV, K, V] or None; cu_seqlens [N + 1] or None."""
    return _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, (False, False, None, None, None))


# KDAFwdState fields the backward reads (o, ht and U are not kept; rq, rk are saved beside them)
_SAVED = ("G", "Gl", "Aqk", "T", "W", "qg", "kg", "h", "vn", "cbos", "clen", "s0", "snc")
# The training backward's L2 norm and gate inside the core backward's kernels (session 36; False: session 35's path).
# BWD_FUSED_L2: the core backward reads the raw q, k rows (in place) with the forward's inverse norms instead of
# normalised copies made by two L2 kernels: the dY kernel scales dAqk, dAkk by the norms, so the pair kernel's sums
# need none and divide dq, dk by them once; the inter kernel scales its q, k tiles; the L2 backward forms the norms
# again from q, k in its own pass.
# BWD_FUSED_GATE: the inter kernel takes the gate's backward on its dg tile and writes d g_raw, with per-program
# partial sums of dA_log and d dt_bias (reduced by column_sum), instead of a gate-backward kernel of its own.
BWD_FUSED_L2 = True
BWD_FUSED_GATE = True


class ChunkKDAFunction(torch.autograd.Function):
    """The op with its L2 norm and gate inside the forward's prep kernel (the forward-only path's kernels), keeping
    the per-chunk intermediates (about 11 [B, T, HV, 128]-sized bf16 tensors' worth at K = V = 128) and the raw
    q, k, g: the forward never writes normalised q, k or the fp32 log-decay (two passes over q|k and one over g
    fewer than normalising and gating first), and its q, k reach the scores unrounded; it also keeps the prep
    kernel's fp32 inverse norms of q, k (8 B a token and head). The backward runs the core backward
    ``chunk_kda_bwd_triton`` on the raw q, k with those norms (``BWD_FUSED_L2``; else on bf16 normalised copies from
    :func:`l2norm_fwd`) and with the gate's backward inside it (``BWD_FUSED_GATE``; else :func:`gate_bwd` after it),
    recomputing the log-decay only where the core backward reads it (:func:`bwd_reads_g`: not for 16-bit inputs
    since session 33), then the L2 norm's backward. With ``qkv`` (q, k, v the thirds of one ``[B, T, 3 H K]``
    tensor, :func:`qkv_base`) d(qkv) is one tensor written in place (q, k, v get None)."""

    @staticmethod
    def forward(ctx, qkv, q, k, v, g, beta, initial_state, A_log, dt_bias, scale, cu_seqlens, flags):
        use_l2, use_gate, lower_bound = flags
        st = _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, (use_l2, use_gate, A_log, dt_bias, lower_bound))
        ctx.save_for_backward(qkv, q, k, v, g, beta, A_log, dt_bias, st.rq, st.rk, *(getattr(st, f) for f in _SAVED))
        ctx.scale, ctx.flags = scale, flags
        ctx.h0_dtype = initial_state.dtype if initial_state is not None else None
        ctx.set_materialize_grads(False)  # an unused final state's gradient stays None (no zero-filled [N, HV, K, V])
        return st.o, st.ht

    @staticmethod
    def backward(ctx, do, dht):
        qkv, q, k, v, g, beta, A_log, dt_bias, rqf, rkf, *saved = ctx.saved_tensors
        if do is None:  # only the final state reaches the loss
            do = torch.zeros_like(v)
        use_l2, use_gate, lower_bound = ctx.flags
        st = KDAFwdState(o=None, ht=None, U=None, **dict(zip(_SAVED, saved)))
        fused_l2 = use_l2 and BWD_FUSED_L2  # raw rows and the forward's norms; the L2 backward forms them again
        (qn, rq), (kn, rk) = (l2norm_fwd(x) if use_l2 and not fused_l2 else (x, None) for x in (q, k))
        # the fp32 log-decay only where the core backward reads it (else its G from the forward is all it needs)
        fp32 = st.qg.dtype == torch.float32
        gn = (gate_fwd(g, A_log, dt_bias, lower_bound) if bwd_reads_g(fp32) else None) if use_gate else g
        dqkv = None if qkv is None else torch.empty_like(qkv)  # the KDA backward writes dv into its v third
        dv_out = None if qkv is None else qkv_dv_view(dqkv, v.shape[2], v.shape[3])
        prep = BwdPrep(*((rqf, rkf) if fused_l2 else (None, None)),
                       gate=(g, A_log, dt_bias, lower_bound) if use_gate and BWD_FUSED_GATE else None)
        gr = chunk_kda_bwd_triton(qn, kn, v, gn, beta, ctx.scale, st, do, dht, dv_out, prep)
        dh0 = gr.dh0.to(ctx.h0_dtype) if ctx.h0_dtype is not None else None
        if prep.gate is not None:  # the inter kernel took the gate's backward: dg is d g_raw already
            dg, dA, ddtb = gr.dg, gr.dA_log, gr.ddt_bias
        elif use_gate:
            dg, dA, ddtb = gate_bwd(g, A_log, dt_bias, lower_bound, gr.dg)
        else:
            dg, dA, ddtb = gr.dg.to(g.dtype), None, None
        dbeta = gr.dbeta.to(beta.dtype)
        if qkv is not None:  # L2 norm on the thirds of one q|k|v tensor: its gradient in one pass
            dqkv = qkv_l2_grad(qkv, q.shape[2], q.shape[3], (gr.dq, rq), (gr.dk, rk), None, dqkv)
            return dqkv, None, None, None, dg, dbeta, dh0, dA, ddtb, None, None, None
        dq, dk = (l2norm_bwd(x, r, dx) if use_l2 else dx.to(x.dtype) for x, r, dx in ((q, rq, gr.dq), (k, rk, gr.dk)))
        return None, dq, dk, gr.dv.to(v.dtype), dg, dbeta, dh0, dA, ddtb, None, None, None


def chunk_kda_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    """Forward only (:func:`chunk_kda_fwd_triton`) when no gradient is needed; otherwise :class:`ChunkKDAFunction`
    (the same forward kernels, keeping what the backward needs), with the q|k|v tensor when q, k, v are its thirds
    and the L2 norm is on."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    ins = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ins)):
        return chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags)
    qkv = qkv_base(q, k, v) if use_l2 else None
    if not use_gate:
        A_log = dt_bias = None
    return ChunkKDAFunction.apply(qkv, q, k, v, g, beta, initial_state, A_log, dt_bias, scale, cu_seqlens,
                                  (use_l2, use_gate, lower_bound))

"""Triton chunked KDA forward (``../shared/REFERENCE.md`` section 1), with a recompute-from-inputs backward.

Kernels (all fixed-configuration, so they run under ``TRITON_INTERPRET=1`` on a CPU), chunk C = 64 split
into four 16-token sub-blocks; each kernel works through K (or V) in tiles so that its registers stay small:

1. ``_prep_kernel``, per (chunk, value head): optional inverse L2 norms of the q, k rows (stored, applied
   by every later consumer, so normalised q, k are never rounded to 16 bits); the gate (softplus
   "unbounded" or sigmoid lower bound) and the chunk-local cumulative sum G (fp32, stored), G_last,
   ``qg = scale Q Gamma`` and ``kg = K exp(G_last - G)`` with the exponent as a suffix sum of g (not a
   difference of two large prefix sums, which lost ~1e-5 of the final state with sharp gates).
2. ``_scores2_kernel``, per (chunk, value head): ``Akk`` / ``Aqk`` over K tiles of 16: the six
   off-diagonal 16 x 16 blocks as three masked [64, 16] x [16, 64] tensor-core dots (one per reference row
   ``16 I``, I = 1..3) into one [64, 64] accumulator, the decays factored through the reference
   (``exp(G_i - G_ref) * exp(min(G_ref - G_j, 0))``, both exponents <= 0 where kept; tf32 for bf16/fp16 inputs,
   ``ieee`` fp32 for fp32 inputs); the four diagonal blocks in fp32 (tf32x3 or ``ieee``), each through its own
   first row, as one batched [4, 16, 16] dot in every K tile whose largest ``|G_i - G_ref|`` inside a block is
   <= ``INTRA_SPAN_MAX`` (60: ``exp(+-60)`` stays far inside fp32), pairwise in tiles with sharper gates
   (``where`` before ``exp``); then, in
   the same program, ``T = (I + Akk)^-1`` in place (3.) and W and U (4.). (The earlier split versions of 2.-4.
   were removed; ``README.md`` says where they were measured.)
3. ``_solve_chunk`` (in ``_scores2_kernel``): ``T = (I + Akk)^-1`` by blocked
   forward substitution (the four diagonal 16 x 16 inverses in one interleaved 15-step loop, then
   ``T_IJ = -T_II sum_{J<=M<I} A_IM T_MJ`` as 16 x 16 dots), T stored fp32; Akk lives in T's buffer (all reads
   precede a barrier before the stores).
4. ``_wu_chunk`` (in ``_scores2_kernel``), per (chunk, value head):
   ``W = T (beta K Gamma)``, ``U = T (beta V)`` as [64, 64] x [64, 32] dots, tile by tile.
5. ``_state_kernel``, one program per (sequence, value head, block of value columns): the sequential
   pass over chunks with the fp32 state in registers; writes the state entering each chunk (``h``),
   ``Vnew = U - W S`` and the final state.
6. ``_output_kernel``, one program per (chunk, value head, block of value columns), fully parallel:
   ``O = qg h + tril(Aqk) Vnew``.

:func:`chunk_kda_fwd_intermediates` returns every intermediate (:class:`KDAFwdState`) for the backward.

Scratch is laid out per chunk, padded to C rows: padded rows have g = 0 (so G carries the last valid
value and every exponent stays <= 0) and zero k, q, v, beta, which makes their W, U, Vnew and kg rows
zero. Per-chunk intermediates are stored in the input dtype (fp32 for fp32 inputs); the state is
fp32. All varlen bookkeeping is a host-side table of chunks (token start, length) and of sequences
(first chunk, number of chunks); dense batches are treated as B equal-length sequences. Offsets that
can exceed 2^31 are int64.

Backward (:class:`ChunkKDAFunction`, used when a gradient is needed): the L2 norm and the gate are applied
outside the Function as Triton autograd functions (``prep_triton.py``); the Function's forward keeps the per-chunk
intermediates (``chunk_kda_fwd_intermediates``) and its backward is ``chunk_triton_bwd.chunk_kda_bwd_triton``
(Triton reverse state pass; see that file for what else is Triton).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.kda.chunk_bwd_torch import CHUNK, chunk_tables
from kernels.kda.chunk_triton_bwd import chunk_kda_bwd_triton
from kernels.kda.prep_triton import _gate, kda_gate_triton, l2norm_qkv_triton, l2norm_triton, qkv_base, token_rows

SUB = 16


@triton.jit
def _inv_diag4(A0, A1, A2, A3, r16, S: tl.constexpr):
    """(I + A_II)^-1 for four strictly-lower 16 x 16 blocks, forward substitution interleaved (fp32)."""
    eye = tl.where(r16[:, None] == r16[None, :], 1.0, 0.0)
    X0, X1, X2, X3 = eye, eye, eye, eye
    for i in range(1, S):
        sel = r16[:, None] == i
        e_i = tl.where(r16 == i, 1.0, 0.0)
        a0 = tl.sum(tl.where(sel, A0, 0.0), 0)
        a1 = tl.sum(tl.where(sel, A1, 0.0), 0)
        a2 = tl.sum(tl.where(sel, A2, 0.0), 0)
        a3 = tl.sum(tl.where(sel, A3, 0.0), 0)
        X0 = tl.where(sel, (e_i - tl.sum(a0[:, None] * X0, 0))[None, :], X0)
        X1 = tl.where(sel, (e_i - tl.sum(a1[:, None] * X1, 0))[None, :], X1)
        X2 = tl.where(sel, (e_i - tl.sum(a2[:, None] * X2, 0))[None, :], X2)
        X3 = tl.where(sel, (e_i - tl.sum(a3[:, None] * X3, 0))[None, :], X3)
    return X0, X1, X2, X3


@triton.jit
def _inv_diag4_rows(Akk_ptr, a_base, r16, C: tl.constexpr, S: tl.constexpr):
    """:func:`_inv_diag4` with row i of each block loaded from the chunk's Akk slab (``a_base``, row stride C; L1-hot)
    instead of picked out of the register tile by a masked reduction: one cross-thread reduction a step and block
    instead of two (``SOLVE_ROW_LOADS``)."""
    eye = tl.where(r16[:, None] == r16[None, :], 1.0, 0.0)
    X0, X1, X2, X3 = eye, eye, eye, eye
    for i in range(1, S):
        sel = r16[:, None] == i
        e_i = tl.where(r16 == i, 1.0, 0.0)
        row = a_base + i * C + r16  # row i of diagonal block 0; block J's is J * S rows and columns further
        a0 = tl.load(Akk_ptr + row, mask=r16 < i, other=0.0)
        a1 = tl.load(Akk_ptr + row + S * (C + 1), mask=r16 < i, other=0.0)
        a2 = tl.load(Akk_ptr + row + 2 * S * (C + 1), mask=r16 < i, other=0.0)
        a3 = tl.load(Akk_ptr + row + 3 * S * (C + 1), mask=r16 < i, other=0.0)
        X0 = tl.where(sel, (e_i - tl.sum(a0[:, None] * X0, 0))[None, :], X0)
        X1 = tl.where(sel, (e_i - tl.sum(a1[:, None] * X1, 0))[None, :], X1)
        X2 = tl.where(sel, (e_i - tl.sum(a2[:, None] * X2, 0))[None, :], X2)
        X3 = tl.where(sel, (e_i - tl.sum(a3[:, None] * X3, 0))[None, :], X3)
    return X0, X1, X2, X3


@triton.jit
def _store_rows(ptr, base, x, r, cols, ncol: tl.constexpr, W: tl.constexpr):
    """Store x [16, B*] into rows r of a per-chunk slab [C, ncol] at ``base`` (row stride W)."""
    tl.store(ptr + base + r[:, None] * W + cols[None, :], x.to(ptr.dtype.element_ty), mask=(cols < ncol)[None, :])


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
    qg_ptr,
    kg_ptr,
    rq_ptr,
    rk_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    C: tl.constexpr,
    BKP: tl.constexpr,
    GATE: tl.constexpr,
    LOWER: tl.constexpr,
    HAS_DTB: tl.constexpr,
    L2: tl.constexpr,
):
    """Per (chunk, value head): inverse row norms of q, k (L2), the gate, G = cumsum(g) (fp32), G_last,
    ``qg = scale q exp(G)`` and ``kg = k exp(G_last - G)`` (exponent as a suffix sum of g), K tile by K tile."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    rows = tl.arange(0, C)
    rm = rows < n
    sc = i_c.to(tl.int64) * HV + i_hv
    qk_off = (bos + rows)[:, None] * (H * K) + i_h * K
    rq = tl.full([C], 1.0, tl.float32)
    rk = tl.full([C], 1.0, tl.float32)
    if L2:
        sq = tl.zeros([C], dtype=tl.float32)
        sk = tl.zeros([C], dtype=tl.float32)
        for k0 in range(0, K, BKP):
            ck = k0 + tl.arange(0, BKP)
            m = rm[:, None] & (ck < K)[None, :]
            x = tl.load(q_ptr + qk_off + ck[None, :], mask=m, other=0.0).to(tl.float32)
            sq += tl.sum(x * x, 1)
            x = tl.load(k_ptr + qk_off + ck[None, :], mask=m, other=0.0).to(tl.float32)
            sk += tl.sum(x * x, 1)
        rq = 1.0 / tl.sqrt(sq + 1e-6)
        rk = 1.0 / tl.sqrt(sk + 1e-6)
        tl.store(rq_ptr + sc * C + rows, rq)
        tl.store(rk_ptr + sc * C + rows, rk)
    a_log = 0.0
    if GATE:
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
    for k0 in range(0, K, BKP):
        ck = k0 + tl.arange(0, BKP)
        cm = ck < K
        m = rm[:, None] & cm[None, :]
        g = tl.load(g_ptr + (bos + rows)[:, None] * (HV * K) + i_hv * K + ck[None, :], mask=m, other=0.0)
        g = g.to(tl.float32)
        if GATE:
            dtb = tl.zeros([BKP], dtype=tl.float32)
            if HAS_DTB:
                dtb = tl.load(dtb_ptr + i_hv * K + ck, mask=cm, other=0.0).to(tl.float32)
            g = tl.where(m, _gate(g + dtb[None, :], a_log, lb, LOWER), 0.0)
        G = tl.cumsum(g, 0)
        E = tl.cumsum(g, 0, reverse=True) - g  # G_last - G as a suffix sum
        tl.store(gl_ptr + sc * K + ck, tl.sum(g, 0), mask=cm)
        off = sc * (C * K) + rows[:, None] * K + ck[None, :]
        tl.store(G_ptr + off, G, mask=cm[None, :])
        x = tl.load(q_ptr + qk_off + ck[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(qg_ptr + off, (x * (rq * scale)[:, None] * tl.exp(G)).to(qg_ptr.dtype.element_ty), mask=cm[None, :])
        x = tl.load(k_ptr + qk_off + ck[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(kg_ptr + off, (x * rk[:, None] * tl.exp(E)).to(kg_ptr.dtype.element_ty), mask=cm[None, :])


@triton.jit
def _load_tile(ptr, off, r, ck, n, K: tl.constexpr, rinv_ptr, rb, L2: tl.constexpr):
    """Rows r (< n valid) of a [*, K] tensor at ``off`` (row stride given by the caller) as fp32 [16, BKS],
    times the inverse row norms at ``rinv_ptr + rb + r`` when L2."""
    x = tl.load(ptr + off + ck[None, :], mask=(r < n)[:, None] & (ck < K)[None, :], other=0.0).to(tl.float32)
    if L2:
        x = x * tl.load(rinv_ptr + rb + r)[:, None]
    return x


@triton.jit
def _scores_program(cbos_ptr, clen_ptr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
                    S: tl.constexpr):
    """A (chunk, value head) program's set-up: ``(i_hv, bos, n, sc, rows, loc, first, qk_base, g_base, rb)``: the
    value head, the chunk's first token and length, its slab index, row indices, each row's place in its sub-block
    and that sub-block's first row, and the bases of q / k, of G and of the per-row norms."""
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    sc = i_c.to(tl.int64) * HV + i_hv
    rows = tl.arange(0, C)
    loc = rows % S
    return i_hv, bos, n, sc, rows, loc, rows - loc, bos * (H * K) + i_h * K, sc * (C * K), sc * C


@triton.jit
def _chunk_tile(q_ptr, k_ptr, G_ptr, rq_ptr, rk_ptr, qk_base, g_base, rb, rows, first, ck, n, H: tl.constexpr,
                K: tl.constexpr, L2: tl.constexpr):
    """One K tile of a chunk for the scores: k, q (fp32, normalised when ``L2``), G, ``Gd = G - G_first`` (G less
    its sub-block's first row) and ``k e^Gd``, ``q e^Gd``."""
    kf = _load_tile(k_ptr, qk_base + rows[:, None] * (H * K), rows, ck, n, K, rk_ptr, rb, L2)
    qf = _load_tile(q_ptr, qk_base + rows[:, None] * (H * K), rows, ck, n, K, rq_ptr, rb, L2)
    cm = (ck < K)[None, :]
    Gf = tl.load(G_ptr + g_base + rows[:, None] * K + ck[None, :], mask=cm, other=0.0)
    Gd = Gf - tl.load(G_ptr + g_base + first[:, None] * K + ck[None, :], mask=cm, other=0.0)
    e = tl.exp(Gd)
    return kf, qf, Gf, Gd, kf * e, qf * e


@triton.jit
def _diag_step(kf, qf, kl, ql, Gf, Gd, dkk, dqk, k_ptr, G_ptr, rk_ptr, qk_base, g_base, rb, first, loc, ck, n, span_max,
               H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, S: tl.constexpr, BKS: tl.constexpr,
               L2: tl.constexpr, DPREC: tl.constexpr):
    """One K tile's share of the four diagonal 16 x 16 blocks ``dkk``, ``dqk`` ([4, 16, 16] fp32): one batched dot
    through each block's first row where the tile's gates allow (``|Gd| <= span_max``), else pairwise."""
    NB: tl.constexpr = C // S
    if tl.max(tl.max(tl.abs(Gd), 1), 0) <= span_max:  # the diagonal blocks through their first rows
        R3 = tl.permute(tl.reshape(kf * tl.exp(-Gd), (NB, S, BKS)), (0, 2, 1))
        dkk = tl.dot(tl.reshape(kl, (NB, S, BKS)), R3, dkk, input_precision=DPREC)
        dqk = tl.dot(tl.reshape(ql, (NB, S, BKS)), R3, dqk, input_precision=DPREC)
    else:  # pairwise, column j of every diagonal block at once
        cm = (ck < K)[None, :]
        for j in range(0, S):
            src = first + j
            kc = _load_tile(k_ptr, qk_base + src[:, None] * (H * K), src, ck, n, K, rk_ptr, rb, L2)
            Gc = tl.load(G_ptr + g_base + src[:, None] * K + ck[None, :], mask=cm, other=0.0)
            kc = kc * tl.exp(tl.where((loc >= j)[:, None], Gf - Gc, 0.0))
            at = tl.arange(0, S)[None, None, :] == j
            dkk = tl.where(at, dkk + tl.reshape(tl.sum(kf * kc, 1), (NB, S))[:, :, None], dkk)
            dqk = tl.where(at, dqk + tl.reshape(tl.sum(qf * kc, 1), (NB, S))[:, :, None], dqk)
    return dkk, dqk


@triton.jit
def _store_diag(Akk_ptr, Aqk_ptr, a_off, first, loc, dkk, dqk, b, scale, C: tl.constexpr, S: tl.constexpr):
    """Store the diagonal blocks: Akk's strictly below the diagonal (times beta ``b``), Aqk's on and below it
    (times ``scale``); ``a_off`` the chunk's row offsets ``[C, 1]``."""
    r16 = tl.arange(0, S)
    d_off = a_off + first[:, None] + r16[None, :]  # diagonal block of row i: columns 16 (i // 16) + r
    D = tl.reshape(dkk, (C, S))
    tl.store(Akk_ptr + d_off, tl.where(r16[None, :] < loc[:, None], D * b, 0.0))
    D = tl.reshape(dqk, (C, S))
    tl.store(Aqk_ptr + d_off, tl.where(r16[None, :] <= loc[:, None], D * scale, 0.0).to(Aqk_ptr.dtype.element_ty))


@triton.jit
def _scores2_kernel(
    q_ptr,
    k_ptr,
    beta_ptr,
    G_ptr,
    rq_ptr,
    rk_ptr,
    cbos_ptr,
    clen_ptr,
    Aqk_ptr,
    Akk_ptr,
    T_ptr,
    v_ptr,
    W_ptr,
    U_ptr,
    scale,
    span_max,
    VS,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    S: tl.constexpr,
    BKS: tl.constexpr,
    BKW: tl.constexpr,
    BVW: tl.constexpr,
    L2: tl.constexpr,
    PREC: tl.constexpr,
    DPREC: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Per (chunk, value head): Akk (fp32) and Aqk, accumulated over K tiles of BKS columns; then
    ``T = (I + Akk)^-1`` (:func:`_solve_chunk`, after a barrier: Akk is re-read from global memory, L1/L2-hot)
    and W and U (:func:`_wu_chunk`, after another barrier).

    Off-diagonal blocks (I, J < I): one batched [4, 16, BKS] x [4, BKS, C] tensor-core dot per K tile, batch I
    the rows of sub-block I against the reference row ``16 I``: left operand ``k_i exp(G_i - G_ref(i))`` (each
    row's own sub-block's reference, the same tile the diagonal uses), right ``k_j exp(min(G_ref(I) - G_j, 0))``:
    both exponents <= 0 where kept (the clamp only touches discarded columns; sub-block 0's rows are computed and
    discarded). It replaced three [C, BKS] x [BKS, C] dots masked to one sub-block's rows each (1.709 -> 1.583 ms
    training forward at 1 x 8192 x 32, session 18 call2).
    Diagonal blocks in fp32, all four as one batched [4, 16, BKS] x [4, BKS, 16] dot per K tile through each
    block's first row (``k_i e^{G_i - G_f}`` times ``k_j e^{G_f - G_j}``, ``DPREC``: tf32x3 for 16-bit inputs,
    ``ieee`` for fp32) where the tile's largest ``|G_i - G_f|`` inside a block is <= ``span_max`` (so both factors
    stay far inside fp32's range), else pairwise (step j: key row ``16 (i // 16) + j`` for every row i, ``where``
    before ``exp``), into [4, 16, 16] accumulators. Writes every block of Aqk (zero above the diagonal) and the
    lower blocks of Akk (zero on and above the diagonal)."""
    i_hv, bos, n, sc, rows, loc, first, qk_base, g_base, rb = _scores_program(cbos_ptr, clen_ptr, H, HV, K, C, S)
    blk = rows // S
    NB: tl.constexpr = C // S
    akk3 = tl.zeros([NB, S, C], dtype=tl.float32)  # the off-diagonal blocks: [sub-block, row, column]
    aqk3 = tl.zeros([NB, S, C], dtype=tl.float32)
    dkk = tl.zeros([NB, S, S], dtype=tl.float32)  # the diagonal blocks, batched: [block, row, column]
    dqk = tl.zeros([NB, S, S], dtype=tl.float32)
    for k0 in range(0, K, BKS):
        ck = k0 + tl.arange(0, BKS)
        kf, qf, Gf, Gd, kl, ql = _chunk_tile(q_ptr, k_ptr, G_ptr, rq_ptr, rk_ptr, qk_base, g_base, rb, rows, first, ck,
                                             n, H, K, L2)
        # each sub-block's rows against its own reference's right operand (block 0's rows are discarded)
        ref = tl.load(G_ptr + g_base + (tl.arange(0, NB) * S)[:, None] * K + ck[None, :], mask=(ck < K)[None, :],
                      other=0.0)
        R3 = tl.permute(kf[None, :, :] * tl.exp(tl.minimum(ref[:, None, :] - Gf[None, :, :], 0.0)), (0, 2, 1))
        akk3 = tl.dot(tl.reshape(kl, (NB, S, BKS)), R3, akk3, input_precision=PREC)
        aqk3 = tl.dot(tl.reshape(ql, (NB, S, BKS)), R3, aqk3, input_precision=PREC)
        dkk, dqk = _diag_step(kf, qf, kl, ql, Gf, Gd, dkk, dqk, k_ptr, G_ptr, rk_ptr, qk_base, g_base, rb, first, loc,
                              ck, n, span_max, H, K, C, S, BKS, L2, DPREC)
    akk = tl.reshape(akk3, (C, C))
    aqk = tl.reshape(aqk3, (C, C))
    a_off = sc * (C * C) + rows[:, None] * C
    b = tl.load(beta_ptr + (bos + rows) * HV + i_hv, mask=rows < n, other=0.0).to(tl.float32)[:, None]
    before = blk[None, :] < blk[:, None]  # column's sub-block before the row's
    tl.store(Akk_ptr + a_off + rows[None, :], akk * b, mask=before)
    outside = blk[None, :] != blk[:, None]
    tl.store(
        Aqk_ptr + a_off + rows[None, :], tl.where(before, aqk * scale, 0.0).to(Aqk_ptr.dtype.element_ty), mask=outside
    )
    _store_diag(Akk_ptr, Aqk_ptr, a_off, first, loc, dkk, dqk, b, scale, C, S)
    tl.debug_barrier()
    _solve_chunk(Akk_ptr, T_ptr, sc * (C * C), C, S, PREC, ROWS)
    tl.debug_barrier()
    _wu_chunk(
        k_ptr, v_ptr, beta_ptr, G_ptr, rk_ptr, T_ptr, W_ptr, U_ptr, i_hv, bos, n, sc, VS, H, HV, K, V, C, BKW, BVW, L2,
        PREC,
    )


@triton.jit
def _load_blk(ptr, base, I: tl.constexpr, J: tl.constexpr, r16, C: tl.constexpr, S: tl.constexpr):
    """Sub-block (I, J) of a [C, C] fp32 slab."""
    return tl.load(ptr + base + (I * S + r16)[:, None] * C + (J * S + r16)[None, :])


@triton.jit
def _solve_chunk(Akk_ptr, T_ptr, a_base, C: tl.constexpr, S: tl.constexpr, PREC: tl.constexpr, ROWS: tl.constexpr):
    """T = (I + Akk)^-1 of one chunk by blocked forward substitution: the four diagonal 16 x 16 inverses
    interleaved, then ``T_IJ = -T_II sum_{J<=M<I} A_IM T_MJ``. Writes T (fp32, zero above). Reads only the lower
    blocks of Akk, all before a barrier that precedes every store, so Akk may live in T's buffer (in place)."""
    r16 = tl.arange(0, S)
    r0, r1, r2, r3 = r16, S + r16, 2 * S + r16, 3 * S + r16
    if ROWS:
        T00, T11, T22, T33 = _inv_diag4_rows(Akk_ptr, a_base, r16, C, S)
    else:
        T00, T11, T22, T33 = _inv_diag4(
            _load_blk(Akk_ptr, a_base, 0, 0, r16, C, S),
            _load_blk(Akk_ptr, a_base, 1, 1, r16, C, S),
            _load_blk(Akk_ptr, a_base, 2, 2, r16, C, S),
            _load_blk(Akk_ptr, a_base, 3, 3, r16, C, S),
            r16,
            S,
        )
    A10 = _load_blk(Akk_ptr, a_base, 1, 0, r16, C, S)
    A21 = _load_blk(Akk_ptr, a_base, 2, 1, r16, C, S)
    A32 = _load_blk(Akk_ptr, a_base, 3, 2, r16, C, S)
    T10 = -tl.dot(T11, tl.dot(A10, T00, input_precision=PREC), input_precision=PREC)
    T21 = -tl.dot(T22, tl.dot(A21, T11, input_precision=PREC), input_precision=PREC)
    T32 = -tl.dot(T33, tl.dot(A32, T22, input_precision=PREC), input_precision=PREC)
    X = tl.dot(_load_blk(Akk_ptr, a_base, 2, 0, r16, C, S), T00, input_precision=PREC)
    T20 = -tl.dot(T22, tl.dot(A21, T10, X, input_precision=PREC), input_precision=PREC)
    A31 = _load_blk(Akk_ptr, a_base, 3, 1, r16, C, S)
    X = tl.dot(A31, T11, input_precision=PREC)
    T31 = -tl.dot(T33, tl.dot(A32, T21, X, input_precision=PREC), input_precision=PREC)
    X = tl.dot(_load_blk(Akk_ptr, a_base, 3, 0, r16, C, S), T00, input_precision=PREC)
    X = tl.dot(A32, T20, tl.dot(A31, T10, X, input_precision=PREC), input_precision=PREC)
    T30 = -tl.dot(T33, X, input_precision=PREC)
    tl.debug_barrier()
    zero = tl.zeros([S, S], dtype=tl.float32)
    _store_rows(T_ptr, a_base, T00, r0, r0, C, C)
    _store_rows(T_ptr, a_base, zero, r0, r1, C, C)
    _store_rows(T_ptr, a_base, zero, r0, r2, C, C)
    _store_rows(T_ptr, a_base, zero, r0, r3, C, C)
    _store_rows(T_ptr, a_base, T10, r1, r0, C, C)
    _store_rows(T_ptr, a_base, T11, r1, r1, C, C)
    _store_rows(T_ptr, a_base, zero, r1, r2, C, C)
    _store_rows(T_ptr, a_base, zero, r1, r3, C, C)
    _store_rows(T_ptr, a_base, T20, r2, r0, C, C)
    _store_rows(T_ptr, a_base, T21, r2, r1, C, C)
    _store_rows(T_ptr, a_base, T22, r2, r2, C, C)
    _store_rows(T_ptr, a_base, zero, r2, r3, C, C)
    _store_rows(T_ptr, a_base, T30, r3, r0, C, C)
    _store_rows(T_ptr, a_base, T31, r3, r1, C, C)
    _store_rows(T_ptr, a_base, T32, r3, r2, C, C)
    _store_rows(T_ptr, a_base, T33, r3, r3, C, C)


@triton.jit
def _wu_chunk(
    k_ptr,
    v_ptr,
    beta_ptr,
    G_ptr,
    rk_ptr,
    T_ptr,
    W_ptr,
    U_ptr,
    i_hv,
    bos,
    n,
    sc,
    VS,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    BKW: tl.constexpr,
    BVW: tl.constexpr,
    L2: tl.constexpr,
    PREC: tl.constexpr,
):
    """``W = T (beta K exp(G))`` and ``U = T (beta V)`` of one chunk as [64, 64] x [64, B*] dots, K tile by K tile,
    then V tile by V tile (T fp32 read back from ``T_ptr``; tf32 for 16-bit inputs, ``ieee`` for fp32). v's rows
    are ``VS`` elements apart (:func:`token_rows`)."""
    i_h = i_hv // (HV // H)
    rows = tl.arange(0, C)
    rm = rows < n
    Tm = tl.load(T_ptr + sc * (C * C) + rows[:, None] * C + rows[None, :])
    b = tl.load(beta_ptr + (bos + rows) * HV + i_hv, mask=rm, other=0.0).to(tl.float32)
    bk = b
    if L2:
        bk = b * tl.load(rk_ptr + sc * C + rows)
    for k0 in range(0, K, BKW):
        ck = k0 + tl.arange(0, BKW)
        cm = (ck < K)[None, :]
        off = sc * (C * K) + rows[:, None] * K + ck[None, :]
        x = tl.load(k_ptr + (bos + rows)[:, None] * (H * K) + i_h * K + ck[None, :], mask=rm[:, None] & cm, other=0.0)
        x = x.to(tl.float32) * bk[:, None] * tl.exp(tl.load(G_ptr + off, mask=cm, other=0.0))
        tl.store(W_ptr + off, tl.dot(Tm, x, input_precision=PREC).to(W_ptr.dtype.element_ty), mask=cm)
    for v0 in range(0, V, BVW):
        cv = v0 + tl.arange(0, BVW)
        cm = (cv < V)[None, :]
        y = tl.load(v_ptr + (bos + rows)[:, None] * VS + i_hv * V + cv[None, :], mask=rm[:, None] & cm, other=0.0)
        y = y.to(tl.float32) * b[:, None]
        off = sc * (C * V) + rows[:, None] * V + cv[None, :]
        tl.store(U_ptr + off, tl.dot(Tm, y, input_precision=PREC).to(U_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _mm(a, b, FP32: tl.constexpr):
    """fp32 ``ieee`` dot for fp32 inputs, else a tensor-core dot in the operands' (16-bit) dtype."""
    if FP32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


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
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_hv = i_nh % HV
    c0 = tl.load(sc0_ptr + i_n)
    nc = tl.load(snc_ptr + i_n)
    rows = tl.arange(0, C)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    kmask = ck < K
    vmask = cv < V
    smask = kmask[:, None] & vmask[None, :]
    s_off = ck[:, None] * V + cv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + i_nh.to(tl.int64) * (K * V) + s_off, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
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
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    FP32: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_c = tl.program_id(1)
    i_hv = tl.program_id(2)
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


PREP_BK = 32  # key columns per step of the gate / cumsum / qg, kg kernel
PREP_LAUNCH = (4, 2)  # num_warps, num_stages
SCORES2_BK = 16  # key columns per step of the Akk / Aqk accumulation
SCORES2_MAXNREG: int | None = 168  # 3 CTAs of 4 warps per SM (sm_90a, K = V = 128); None: ptxas chooses
SCORES2_LAUNCH = (4, 1)  # num_warps, num_stages of the scores + solve + W / U kernel (sweep: s1 0.745 ms, s2 0.809)
INTRA_PREC16 = "tf32"  # tl.dot precision of the Akk / Aqk, solve and W / U dots for 16-bit inputs (fp32: ieee)
INTRA_DIAG_PREC16 = "tf32x3"  # the diagonal blocks' dots for 16-bit inputs: fp32-grade on tensor cores (fp32: ieee)
# Diagonal 16 x 16 blocks of Akk / Aqk go through their sub-block's first row (one batched dot) in every K tile
# whose largest |G_i - G_ref| within the block is <= this; other tiles go pairwise in fp32. At 60, exp(+-60)
# leaves ~1e-10 of a unit-norm key above fp32's smallest normal; a negative value sends every tile pairwise (the
# tests compare both paths).
INTRA_SPAN_MAX = 60.0
WU_B = 32  # key / value columns per step of the W / U part of the scores kernel
SOLVE_ROW_LOADS = False  # the 16 x 16 diagonal inverses read row i of Akk from memory (not timed yet), else pick it
# out of the register tile by a masked reduction
STATE_BV = 16  # value columns per program of the sequential state pass (sweeps: 0.217-0.218 ms, 32: 0.232)
STATE_LAUNCH = (4, 3)  # num_warps, num_stages (sweep: s3 0.232 ms, s2 0.289)
OUT_BV = 64  # value columns per program of the output kernel
OUT_WARPS = 4


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _has_maxnreg() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return any(f.name == "maxnreg" for f in dataclasses.fields(CUDAOptions))
    except Exception:  # noqa: BLE001 - no NVIDIA backend: run without the cap
        return False


def _maxnreg(n: int | None) -> dict:
    """``maxnreg`` launch option where this Triton's CUDA backend has it (not under the interpreter); None: no cap."""
    return {"maxnreg": n} if n and not _interpreting() and _has_maxnreg() else {}


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


def _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags, keep_u: bool = True) -> KDAFwdState:
    """Run the forward kernels (prep, scores + solve + W/U, state pass, output) and return every intermediate.
    ``keep_u=False`` (inference): the state pass writes Vnew over U (same rows and columns, read before written by
    the same program), so the returned ``U`` is Vnew and one [NC, HV, C, V] scratch tensor is saved."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    fp32 = q.dtype == torch.float32 or v.dtype == torch.float32
    q, k, g, beta = (x.contiguous() for x in (q, k, g, beta))
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
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    G = torch.empty(nc1, HV, CHUNK, K, dtype=torch.float32, device=dev)
    Tm = torch.empty(nc1, HV, CHUNK, CHUNK, dtype=torch.float32, device=dev)
    Akk = Tm  # the solve runs in place
    rq, rk = (torch.empty(nc1, HV, CHUNK, dtype=torch.float32, device=dev) if use_l2 else dummy for _ in range(2))
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    if nch:
        cbc = dict(cbos_ptr=cbos, clen_ptr=clen)
        dprec = "ieee" if fp32 else INTRA_DIAG_PREC16
        _prep_kernel[(nch, HV)](
            q,
            k,
            g,
            A_log if use_gate else dummy,
            dt_bias if (use_gate and dt_bias is not None) else dummy,
            float(lower_bound) if lower_bound is not None else 0.0,
            **cbc,
            G_ptr=G,
            gl_ptr=gl,
            qg_ptr=qg,
            kg_ptr=kg,
            rq_ptr=rq,
            rk_ptr=rk,
            scale=scale,
            H=H,
            HV=HV,
            K=K,
            C=CHUNK,
            BKP=min(BK, PREP_BK),
            GATE=use_gate,
            LOWER=lower_bound is not None,
            HAS_DTB=dt_bias is not None,
            L2=use_l2,
            num_warps=PREP_LAUNCH[0],
            num_stages=PREP_LAUNCH[1],
        )
        prec = "ieee" if fp32 else INTRA_PREC16
        _scores2_kernel[(nch, HV)](
            q,
            k,
            beta,
            G,
            rq,
            rk,
            **cbc,
            Aqk_ptr=Aqk,
            Akk_ptr=Akk,
            T_ptr=Tm,
            v_ptr=v,
            W_ptr=W,
            U_ptr=U,
            scale=scale,
            VS=vs,
            H=H,
            HV=HV,
            K=K,
            V=V,
            C=CHUNK,
            S=SUB,
            BKS=SCORES2_BK,
            BKW=min(BK, WU_B),
            BVW=min(BV, WU_B),
            L2=use_l2,
            PREC=prec,
            DPREC=dprec,
            ROWS=SOLVE_ROW_LOADS,
            span_max=INTRA_SPAN_MAX,
            num_warps=SCORES2_LAUNCH[0],
            num_stages=SCORES2_LAUNCH[1],
            **_maxnreg(SCORES2_MAXNREG),
        )
    h0 = initial_state.contiguous() if initial_state is not None else dummy
    bvs = min(BV, STATE_BV)
    _state_kernel[(triton.cdiv(V, bvs), N * HV)](
        W,
        U,
        kg,
        gl,
        h0,
        h,
        vn,
        ht,
        s0,
        snc,
        HV=HV,
        K=K,
        V=V,
        BK=BK,
        BV=bvs,
        C=CHUNK,
        HAS_H0=initial_state is not None,
        FP32=fp32,
        num_warps=STATE_LAUNCH[0],
        num_stages=STATE_LAUNCH[1],
    )
    if nch:
        bvo = min(BV, OUT_BV)
        _output_kernel[(triton.cdiv(V, bvo), nch, HV)](
            qg,
            h,
            Aqk,
            vn,
            o,
            cbos,
            clen,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BV=bvo,
            C=CHUNK,
            FP32=fp32,
            num_warps=OUT_WARPS,
        )
    return KDAFwdState(o, ht, G, gl, Aqk, Tm, W, U, qg, kg, h, vn, cbos, clen, s0, snc)


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


# KDAFwdState fields the backward reads (o, ht and U are not kept)
_SAVED = ("G", "Gl", "Aqk", "T", "W", "qg", "kg", "h", "vn", "cbos", "clen", "s0", "snc")


class ChunkKDAFunction(torch.autograd.Function):
    """Core op (q, k already normalised, g the log-decay): Triton forward keeping its per-chunk intermediates
    (about 11 [B, T, HV, 128]-sized bf16 tensors' worth at K = V = 128), manual backward ``chunk_kda_bwd_triton``."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, cu_seqlens):
        st = chunk_kda_fwd_intermediates(q, k, v, g, beta, scale, initial_state, cu_seqlens)
        ctx.save_for_backward(q, k, v, g, beta, *(getattr(st, f) for f in _SAVED))
        ctx.scale = scale
        ctx.h0_dtype = initial_state.dtype if initial_state is not None else None
        return st.o, st.ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, *saved = ctx.saved_tensors
        kept = dict(zip(_SAVED, saved))
        st = KDAFwdState(o=None, ht=None, U=None, **kept)
        gr = chunk_kda_bwd_triton(q, k, v, g, beta, ctx.scale, st, do, dht)
        dh0 = gr.dh0.to(ctx.h0_dtype) if ctx.h0_dtype is not None else None
        cast = (gr.dq.to(q.dtype), gr.dk.to(k.dtype), gr.dv.to(v.dtype), gr.dg.to(g.dtype), gr.dbeta.to(beta.dtype))
        return (*cast, dh0, None, None)


def chunk_kda_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    """Forward only (in-kernel L2 norm / gate) when no gradient is needed; otherwise the L2 norm (fp32, cast back to
    q's dtype) and the gate as Triton autograd functions (``prep_triton.py``), then :class:`ChunkKDAFunction` on the
    core op."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    ins = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ins)):
        return chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags)
    if use_l2:
        qkv = qkv_base(q, k, v)  # views of one q|k|v tensor: their gradients go into one tensor, no concatenation
        q, k, v = l2norm_qkv_triton(qkv, q.shape[2], q.shape[3]) if qkv is not None else \
            (l2norm_triton(q), l2norm_triton(k), v)
    if use_gate:
        g = kda_gate_triton(g, A_log, dt_bias, lower_bound)
    return ChunkKDAFunction.apply(q, k, v, g, beta, initial_state, scale, cu_seqlens)

"""Triton kernel of the chunked KDA forward's second step (``chunk_triton.py`` launches it): per (chunk, value head)
the scores ``Akk`` / ``Aqk``, the solve ``T = (I + Akk)^-1`` and ``W``, ``U``, in one program.

- Scores over K tiles of 16 (:func:`_scores2_kernel`): the six off-diagonal 16 x 16 blocks as one batched
  [4, 16, 16] x [4, 16, 64] tensor-core dot per tile (batch I: the rows of sub-block I against reference row
  ``16 I``; the decays factored through it, ``exp(G_i - G_ref) * exp(min(G_ref - G_j, 0))``, both exponents <= 0
  where kept; tf32 for bf16/fp16 inputs, ``ieee`` fp32 for fp32 inputs); the four diagonal blocks in fp32 (tf32x3
  or ``ieee``), each through its own first row, as one batched [4, 16, 16] dot in every K tile whose largest
  ``|G_i - G_ref|`` inside a block is <= ``span_max`` (60: ``exp(+-60)`` stays far inside fp32), pairwise in tiles
  with sharper gates (``where`` before ``exp``).
- :func:`_solve_chunk`: ``T = (I + Akk)^-1`` by blocked forward substitution: the four diagonal 16 x 16 inverses as
  products of powers over 8 x 8 halves (:func:`_inv_diag4_products`, six batched dots; or, ``DINV = 0``, by
  substitution in one interleaved 15-step loop reading Akk's rows from memory), then
  ``T_IJ = -T_II sum_{J<=M<I} A_IM T_MJ`` as 16 x 16 dots, T stored fp32; Akk lives in T's buffer (all reads precede
  a barrier before the stores).
- :func:`_wu_chunk`: ``W = T (beta K Gamma)``, ``U = T (beta V)`` as [64, 64] x [64, 32] dots, tile by tile.

(The earlier split versions were removed; ``README.md`` says where they were measured.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.kda.state_common import _chunk_head_ids


@triton.jit
def _inv_diag4(Akk_ptr, a_base, r16, C: tl.constexpr, S: tl.constexpr):
    """(I + A_II)^-1 for the four strictly-lower 16 x 16 diagonal blocks of the Akk slab at ``a_base``, forward
    substitution interleaved (fp32); step i reads row i of each block from memory (L1-hot: just stored by this
    program). Picking the row out of a register tile by a masked reduction instead cost 0.10 ms of 0.82 at
    1 x 8192 x 32 (H200, session 19 call2), one full-tile reduction a step."""
    eye = tl.where(r16[:, None] == r16[None, :], 1.0, 0.0)
    X0, X1, X2, X3 = eye, eye, eye, eye
    for i in range(1, S):
        sel = r16[:, None] == i
        e_i = tl.where(r16 == i, 1.0, 0.0)
        row = a_base + i * C  # row i of diagonal block 0; block J's is J * S rows and columns further
        a0 = tl.load(Akk_ptr + row + r16, mask=r16 < i, other=0.0)
        a1 = tl.load(Akk_ptr + row + S * (C + 1) + r16, mask=r16 < i, other=0.0)
        a2 = tl.load(Akk_ptr + row + 2 * S * (C + 1) + r16, mask=r16 < i, other=0.0)
        a3 = tl.load(Akk_ptr + row + 3 * S * (C + 1) + r16, mask=r16 < i, other=0.0)
        X0 = tl.where(sel, (e_i - tl.sum(a0[:, None] * X0, 0))[None, :], X0)
        X1 = tl.where(sel, (e_i - tl.sum(a1[:, None] * X1, 0))[None, :], X1)
        X2 = tl.where(sel, (e_i - tl.sum(a2[:, None] * X2, 0))[None, :], X2)
        X3 = tl.where(sel, (e_i - tl.sum(a3[:, None] * X3, 0))[None, :], X3)
    return X0, X1, X2, X3


@triton.jit
def _inv_diag4_products(Akk_ptr, a_base, C: tl.constexpr, S: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 for the four strictly-lower 16 x 16 diagonal blocks A as batched [4, 16, 16] dots, no reductions or
    barriers (the substitution's 15 steps take four cross-warp reductions each). Each block is split into its two
    8 x 8 diagonal blocks ``Ab`` (nilpotent: Ab^8 = 0) and the rest ``Ao``: ``X = (I + Ab)^-1`` is the series
    ``sum_k (-Ab)^k = (I - Ab)(I + Ab^2)(I + Ab^4)``, and ``(I + Ab + Ao)^-1 = X - X Ao X`` (``(X Ao)^2 = 0``).
    Six dots. Over whole 16 x 16 blocks, ``(I - A)(I + A^2)(I + A^4)(I + A^8)``, the powers' binomial-sized entries
    cancel: with keys mostly along one direction, beta = 1 and no decay, that form loses ~1e-4 (relative) in fp32,
    the 8 x 8 split ~1e-6 and the substitution ~1e-7 (``scripts/kda_diag_inverse_errors.py``, the same arithmetic in
    PyTorch); ``test_correlated_keys_fp32`` fails the whole-block form at 1.2e-4 > 1e-5."""
    NB: tl.constexpr = C // S
    blk = tl.arange(0, NB)[:, None, None] * S
    r = tl.arange(0, S)[None, :, None]
    c = tl.arange(0, S)[None, None, :]
    A = tl.load(Akk_ptr + a_base + (blk + r) * C + blk + c)
    half: tl.constexpr = S // 2
    Ab = tl.where(r // half == c // half, A, 0.0)
    A2 = tl.dot(Ab, Ab, input_precision=PREC)
    X = tl.where(r == c, 1.0, 0.0) - Ab
    X = tl.dot(X, A2, X, input_precision=PREC)
    X = tl.dot(X, tl.dot(A2, A2, input_precision=PREC), X, input_precision=PREC)
    X = tl.dot(-X, tl.dot(A - Ab, X, input_precision=PREC), X, input_precision=PREC)
    even, odd = tl.split(tl.reshape(tl.permute(X, (1, 2, 0)), (S, S, 2, 2)))  # blocks 0, 2 and 1, 3
    X0, X2 = tl.split(even)
    X1, X3 = tl.split(odd)
    return X0, X1, X2, X3


@triton.jit
def _store_rows(ptr, base, x, r, cols, ncol: tl.constexpr, W: tl.constexpr):
    """Store x [16, B*] into rows r of a per-chunk slab [C, ncol] at ``base`` (row stride W)."""
    tl.store(ptr + base + r[:, None] * W + cols[None, :], x.to(ptr.dtype.element_ty), mask=(cols < ncol)[None, :])


@triton.jit
def _load_tile(ptr, off, r, ck, n, K: tl.constexpr, rinv_ptr, rb, L2: tl.constexpr):
    """Rows r (< n valid) of a [*, K] tensor at ``off`` (row stride given by the caller) as fp32 [16, BKS],
    times the inverse row norms at ``rinv_ptr + rb + r`` when L2."""
    x = tl.load(ptr + off + ck[None, :], mask=(r < n)[:, None] & (ck < K)[None, :], other=0.0).to(tl.float32)
    if L2:
        x = x * tl.load(rinv_ptr + rb + r)[:, None]
    return x


@triton.jit
def _scores_program(cbos_ptr, clen_ptr, cidx_ptr, QS: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, C: tl.constexpr, S: tl.constexpr, HEADS_FIRST: tl.constexpr,
                    HAS_CIDX: tl.constexpr):
    """A (chunk, value head) program's set-up: ``(i_hv, bos, n, sc, rows, loc, first, qk_base, g_base, rb)``: the
    value head, the chunk's first token and length, its slab index, row indices, each row's place in its sub-block
    and that sub-block's first row, and the bases of q / k (tokens ``QS`` elements apart), of G and of the per-row
    norms. ``HAS_CIDX``: the grid covers a subset of the chunks, whose indices ``cidx_ptr`` lists (``pieces.py``)."""
    i_c, i_hv = _chunk_head_ids(0, HEADS_FIRST)
    if HAS_CIDX:
        i_c = tl.load(cidx_ptr + i_c)
    i_h = i_hv // (HV // H)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    sc = i_c.to(tl.int64) * HV + i_hv
    rows = tl.arange(0, C)
    loc = rows % S
    return i_hv, bos, n, sc, rows, loc, rows - loc, bos * QS + i_h * K, sc * (C * K), sc * C


@triton.jit
def _chunk_tile(q_ptr, k_ptr, G_ptr, rq_ptr, rk_ptr, qk_base, g_base, rb, rows, first, ck, n, QS: tl.constexpr,
                K: tl.constexpr, L2: tl.constexpr):
    """One K tile of a chunk for the scores: k, q (fp32, normalised when ``L2``), G, ``Gd = G - G_first`` (G less
    its sub-block's first row) and ``k e^Gd``, ``q e^Gd``."""
    kf = _load_tile(k_ptr, qk_base + rows[:, None] * QS, rows, ck, n, K, rk_ptr, rb, L2)
    qf = _load_tile(q_ptr, qk_base + rows[:, None] * QS, rows, ck, n, K, rq_ptr, rb, L2)
    cm = (ck < K)[None, :]
    Gf = tl.load(G_ptr + g_base + rows[:, None] * K + ck[None, :], mask=cm, other=0.0)
    Gd = Gf - tl.load(G_ptr + g_base + first[:, None] * K + ck[None, :], mask=cm, other=0.0)
    e = tl.exp(Gd)
    return kf, qf, Gf, Gd, kf * e, qf * e


@triton.jit
def _diag_step(kf, qf, kl, ql, Gf, Gd, dkk, dqk, k_ptr, G_ptr, rk_ptr, qk_base, g_base, rb, first, loc, ck, n, fast,
               QS: tl.constexpr, K: tl.constexpr, C: tl.constexpr, S: tl.constexpr, BKS: tl.constexpr,
               L2: tl.constexpr, DPREC: tl.constexpr):
    """One K tile's share of the four diagonal 16 x 16 blocks ``dkk``, ``dqk`` ([4, 16, 16] fp32): one batched dot
    through each block's first row where the tile's gates allow (``fast``: ``|Gd| <= span_max``), else pairwise.
    The check, a reduction of the tile across warps, costs: without it (a timing probe, wrong where a tile needs the
    pairwise path) the scores kernel took 0.450 against 0.562 ms at 1 x 8192 x 32 (H200, session 24 call5). All
    tiles' spans from one pass before the loop (one reduction, then a number a tile read back after a barrier) took
    0.640 and gave NaN on the GPU (fast flags wrong; not understood, interpreter tests passed): removed. The
    pairwise path after the loop instead of this branch (a sharp tile's fast-path operand zeroed, its bit set, a
    second loop over those tiles) took 0.602 against 0.551 ms (session 25 call1): removed. With the gate in the
    kernel (G non-increasing), one decision per (chunk, head) from each sub-block's first and last rows over all K
    (the tile checks only where it failed) took 0.600 against 0.571 ms (session 31 call6): removed."""
    NB: tl.constexpr = C // S
    if fast:  # the diagonal blocks through their first rows
        R3 = tl.permute(tl.reshape(kf * tl.exp(-Gd), (NB, S, BKS)), (0, 2, 1))  # k e^-Gd, per block transposed
        dkk = tl.dot(tl.reshape(kl, (NB, S, BKS)), R3, dkk, input_precision=DPREC)
        dqk = tl.dot(tl.reshape(ql, (NB, S, BKS)), R3, dqk, input_precision=DPREC)
    else:  # pairwise, column j of every diagonal block at once
        cm = (ck < K)[None, :]
        for j in range(0, S):
            src = first + j
            kc = _load_tile(k_ptr, qk_base + src[:, None] * QS, src, ck, n, K, rk_ptr, rb, L2)
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
    cidx_ptr,
    Aqk_ptr,
    Akk_ptr,
    T_ptr,
    v_ptr,
    W_ptr,
    U_ptr,
    qg_ptr,
    kg_ptr,
    scale,
    span_max,
    VS,
    QS: tl.constexpr,
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
    SUFFIX: tl.constexpr = False,
    HEADS_FIRST: tl.constexpr = False,
    DINV: tl.constexpr = 1,
    NORMS: tl.constexpr = False,
    HAS_CIDX: tl.constexpr = False,
):
    """Per (chunk, value head): Akk (fp32) and Aqk, accumulated over K tiles of BKS columns; then
    ``T = (I + Akk)^-1`` (:func:`_solve_chunk`, after a barrier: Akk is re-read from global memory, L1/L2-hot)
    and W and U (:func:`_wu_chunk`, after another barrier).

    Off-diagonal blocks (I, J < I): one batched [4, 16, BKS] x [4, BKS, C] tensor-core dot per K tile, batch I
    the rows of sub-block I against the reference row ``16 I``: left operand ``k_i exp(G_i - G_ref(i))`` (each
    row's own sub-block's reference, the same tile the diagonal uses), right ``k_j exp(min(G_ref(I) - G_j, 0))``:
    both exponents <= 0 where kept (the clamp only touches discarded columns; sub-block 0's rows are computed and
    discarded). It replaced three [C, BKS] x [BKS, C] dots masked to one sub-block's rows each (1.709 -> 1.583 ms
    training forward at 1 x 8192 x 32, session 18 call2; per sub-block [16, BKS] x [BKS, C] dots instead, with
    fewer accumulator registers, took the forward from 1.111 to 1.329 ms: H200, session 21, removed).
    Diagonal blocks in fp32, all four as one batched [4, 16, BKS] x [4, BKS, 16] dot per K tile through each
    block's first row (``k_i e^{G_i - G_f}`` times ``k_j e^{G_f - G_j}``, ``DPREC``: tf32x3 for 16-bit inputs,
    ``ieee`` for fp32) where the tile's largest ``|G_i - G_f|`` inside a block is <= ``span_max`` (so both factors
    stay far inside fp32's range), else pairwise (step j: key row ``16 (i // 16) + j`` for every row i, ``where``
    before ``exp``), into [4, 16, 16] accumulators. Writes every block of Aqk (zero above the diagonal) and the
    lower blocks of Akk (zero on and above the diagonal).

    ``NORMS`` (with ``L2``; else the prep kernel stored them): the inverse L2 norms of the q, k rows come from the
    score loop (sums of squares of the raw tiles it loads): every score is bilinear in its two rows, so the
    accumulators take the raw rows and are scaled by ``rq_i rk_j`` / ``rk_i rk_j`` after the loop; the norms are
    stored for the W / U part (after a barrier) and the backward. Raw rows cannot overflow the fast diagonal path
    where it matters: a kept entry's terms are ``q_i k_j e^(G_i - G_j)`` with ``G_i <= G_j``, at most ``|q| |k|``;
    only the discarded entries above the diagonal carry ``e^span``, and ``where`` drops them whatever they hold.
    (Session 38 also built the gate and G in the score loop, with no prep kernel: 1.37 against 1.01 ms at
    1 x 8192 x 32 on an H100; removed, ``kernels/kda/README.md``.)"""
    i_hv, bos, n, sc, rows, loc, first, qk_base, g_base, rb = _scores_program(cbos_ptr, clen_ptr, cidx_ptr, QS, H, HV, K,
                                                                              C, S, HEADS_FIRST, HAS_CIDX)
    blk = rows // S
    NB: tl.constexpr = C // S
    akk3 = tl.zeros([NB, S, C], dtype=tl.float32)  # the off-diagonal blocks: [sub-block, row, column]
    aqk3 = tl.zeros([NB, S, C], dtype=tl.float32)
    dkk = tl.zeros([NB, S, S], dtype=tl.float32)  # the diagonal blocks, batched: [block, row, column]
    dqk = tl.zeros([NB, S, S], dtype=tl.float32)
    TILE_L2: tl.constexpr = L2 and not NORMS  # tiles scaled by stored norms as they load
    if NORMS:
        sq = tl.zeros([C], dtype=tl.float32)
        sk = tl.zeros([C], dtype=tl.float32)
    for k0 in range(0, K, BKS):
        ck = k0 + tl.arange(0, BKS)
        kf, qf, Gf, Gd, kl, ql = _chunk_tile(q_ptr, k_ptr, G_ptr, rq_ptr, rk_ptr, qk_base, g_base, rb, rows, first, ck,
                                             n, QS, K, TILE_L2)
        if NORMS:
            sq += tl.sum(qf * qf, 1)
            sk += tl.sum(kf * kf, 1)
        # each sub-block's rows against its own reference's right operand (block 0's rows are discarded)
        ref = tl.load(G_ptr + g_base + (tl.arange(0, NB) * S)[:, None] * K + ck[None, :],
                      mask=(ck < K)[None, :], other=0.0)
        R3 = tl.permute(kf[None, :, :] * tl.exp(tl.minimum(ref[:, None, :] - Gf[None, :, :], 0.0)), (0, 2, 1))
        akk3 = tl.dot(tl.reshape(kl, (NB, S, BKS)), R3, akk3, input_precision=PREC)
        aqk3 = tl.dot(tl.reshape(ql, (NB, S, BKS)), R3, aqk3, input_precision=PREC)
        fast = tl.max(tl.max(tl.abs(Gd), 1), 0) <= span_max  # a reduction across warps: see _diag_step
        dkk, dqk = _diag_step(kf, qf, kl, ql, Gf, Gd, dkk, dqk, k_ptr, G_ptr, rk_ptr, qk_base, g_base, rb, first,
                              loc, ck, n, fast, QS, K, C, S, BKS, TILE_L2, DPREC)
    a_off = sc * (C * C) + rows[:, None] * C
    b = tl.load(beta_ptr + (bos + rows) * HV + i_hv, mask=rows < n, other=0.0).to(tl.float32)[:, None]
    akk = tl.reshape(akk3, (C, C))
    aqk = tl.reshape(aqk3, (C, C))
    if NORMS:
        rq = 1.0 / tl.sqrt(sq + 1e-6)
        rk = 1.0 / tl.sqrt(sk + 1e-6)
        tl.store(rq_ptr + rb + rows, rq)
        tl.store(rk_ptr + rb + rows, rk)
        akk = akk * (rk[:, None] * rk[None, :])
        aqk = aqk * (rq[:, None] * rk[None, :])
        rk3 = tl.reshape(rk, (NB, S))
        dkk = dkk * (rk3[:, :, None] * rk3[:, None, :])
        dqk = dqk * (tl.reshape(rq, (NB, S))[:, :, None] * rk3[:, None, :])
    before = blk[None, :] < blk[:, None]  # column's sub-block before the row's
    tl.store(Akk_ptr + a_off + rows[None, :], akk * b, mask=before)
    outside = blk[None, :] != blk[:, None]
    tl.store(Aqk_ptr + a_off + rows[None, :], tl.where(before, aqk * scale, 0.0).to(Aqk_ptr.dtype.element_ty),
             mask=outside)
    _store_diag(Akk_ptr, Aqk_ptr, a_off, first, loc, dkk, dqk, b, scale, C, S)
    tl.debug_barrier()
    _solve_chunk(Akk_ptr, T_ptr, sc * (C * C), C, S, PREC, DINV, DPREC)
    tl.debug_barrier()
    _wu_chunk(
        q_ptr, k_ptr, v_ptr, beta_ptr, G_ptr, rq_ptr, rk_ptr, T_ptr, W_ptr, U_ptr, qg_ptr, kg_ptr, scale, i_hv, bos, n,
        sc, VS, QS, H, HV, K, V, C, BKW, BVW, L2, PREC, SUFFIX,
    )


@triton.jit
def _load_blk(ptr, base, I: tl.constexpr, J: tl.constexpr, r16, C: tl.constexpr, S: tl.constexpr):
    """Sub-block (I, J) of a [C, C] fp32 slab."""
    return tl.load(ptr + base + (I * S + r16)[:, None] * C + (J * S + r16)[None, :])


@triton.jit
def _solve_chunk(Akk_ptr, T_ptr, a_base, C: tl.constexpr, S: tl.constexpr, PREC: tl.constexpr,
                 DINV: tl.constexpr = 1, DPREC: tl.constexpr = "ieee"):
    """T = (I + Akk)^-1 of one chunk by blocked forward substitution: the four diagonal 16 x 16 inverses (``DINV``
    1: products of powers in ``DPREC``; 0: substitution, interleaved), then ``T_IJ = -T_II sum_{J<=M<I} A_IM T_MJ``.
    Writes T (fp32, zero above). Reads only the lower
    blocks of Akk, all before a barrier that precedes every store, so Akk may live in T's buffer (in place)."""
    r16 = tl.arange(0, S)
    r0, r1, r2, r3 = r16, S + r16, 2 * S + r16, 3 * S + r16
    if DINV == 1:  # products of powers, DPREC
        T00, T11, T22, T33 = _inv_diag4_products(Akk_ptr, a_base, C, S, DPREC)
    else:
        T00, T11, T22, T33 = _inv_diag4(Akk_ptr, a_base, r16, C, S)
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
    q_ptr,
    k_ptr,
    v_ptr,
    beta_ptr,
    G_ptr,
    rq_ptr,
    rk_ptr,
    T_ptr,
    W_ptr,
    U_ptr,
    qg_ptr,
    kg_ptr,
    scale,
    i_hv,
    bos,
    n,
    sc,
    VS,
    QS: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    BKW: tl.constexpr,
    BVW: tl.constexpr,
    L2: tl.constexpr,
    PREC: tl.constexpr,
    SUFFIX: tl.constexpr,
):
    """``W = T (beta K exp(G))`` and ``U = T (beta V)`` of one chunk as [64, 64] x [64, B*] dots, K tile by K tile,
    then V tile by V tile (T fp32 read back from ``T_ptr``; tf32 for 16-bit inputs, ``ieee`` for fp32). k's rows
    are ``QS`` elements apart, v's ``VS`` (:func:`token_rows`). The K tiles also store ``qg = scale q exp(G)`` and
    ``kg = k exp(G_last - G)`` (q, k normalised when ``L2``; G_last is G's row C - 1, which padded rows' zero gates
    carry): this loop loads k and G anyway, and the prep kernel ran at 162 registers while it wrote them. ``SUFFIX``
    (fp32 inputs): kg's exponent is read from kg's own buffer, where the prep kernel stored it as a suffix sum of g
    (each element read before this program overwrites it)."""
    i_h = i_hv // (HV // H)
    rows = tl.arange(0, C)
    rm = rows < n
    Tm = tl.load(T_ptr + sc * (C * C) + rows[:, None] * C + rows[None, :])
    b = tl.load(beta_ptr + (bos + rows) * HV + i_hv, mask=rm, other=0.0).to(tl.float32)
    rk = tl.full([C], 1.0, tl.float32)
    rq = tl.full([C], 1.0, tl.float32)
    if L2:
        rk = tl.load(rk_ptr + sc * C + rows)
        rq = tl.load(rq_ptr + sc * C + rows)
    bk = b * rk
    qk_off = (bos + rows)[:, None] * QS + i_h * K
    for k0 in range(0, K, BKW):
        ck = k0 + tl.arange(0, BKW)
        cm = (ck < K)[None, :]
        off = sc * (C * K) + rows[:, None] * K + ck[None, :]
        Gt = tl.load(G_ptr + off, mask=cm, other=0.0)
        eG = tl.exp(Gt)
        x = tl.load(k_ptr + qk_off + ck[None, :], mask=rm[:, None] & cm, other=0.0).to(tl.float32)
        if SUFFIX:
            e = tl.load(kg_ptr + off, mask=cm, other=0.0)
        else:
            e = tl.load(G_ptr + sc * (C * K) + (C - 1) * K + ck, mask=ck < K, other=0.0)[None, :] - Gt
        tl.store(kg_ptr + off, (x * rk[:, None] * tl.exp(e)).to(kg_ptr.dtype.element_ty), mask=cm)
        y = tl.load(q_ptr + qk_off + ck[None, :], mask=rm[:, None] & cm, other=0.0).to(tl.float32)
        tl.store(qg_ptr + off, (y * (rq * scale)[:, None] * eG).to(qg_ptr.dtype.element_ty), mask=cm)
        x = x * bk[:, None] * eG
        tl.store(W_ptr + off, tl.dot(Tm, x, input_precision=PREC).to(W_ptr.dtype.element_ty), mask=cm)
    for v0 in range(0, V, BVW):
        cv = v0 + tl.arange(0, BVW)
        cm = (cv < V)[None, :]
        y = tl.load(v_ptr + (bos + rows)[:, None] * VS + i_hv * V + cv[None, :], mask=rm[:, None] & cm, other=0.0)
        y = y.to(tl.float32) * b[:, None]
        off = sc * (C * V) + rows[:, None] * V + cv[None, :]
        tl.store(U_ptr + off, tl.dot(Tm, y, input_precision=PREC).to(U_ptr.dtype.element_ty), mask=cm)

"""Triton kernel of the KDA chunked backward's intra-chunk score gradients, ``_bwd_intra_pair_kernel`` (kernel 3 of
``chunk_triton_bwd.py``, whose launcher and tile constants it follows), with its pieces: per (block of key channels,
row block of 16, chunk x value head), the gradients of the intra-chunk scores Aqk, Akk through each row block's first
and last rows, the diagonal block as fp32 dots or pairwise. Also the program set-up (``_chunk_head``) that the inter
kernel shares. See ``README.md`` ("Backward") for the tiling and the measured times.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _chunk_head(pid, cbos_ptr, clen_ptr, H: tl.constexpr, HV: tl.constexpr):
    """Program index over (chunk x value head) -> (flat index as int64, value head, its q/k head, first token,
    valid rows of the chunk)."""
    i_hv = pid % HV
    c = pid // HV
    return pid.to(tl.int64), i_hv, i_hv // (HV // H), tl.load(cbos_ptr + c).to(tl.int64), tl.load(clen_ptr + c)



@triton.jit
def _rows16(ptr, base, r, ck, kmask, K: tl.constexpr):
    """Rows r of a per-chunk fp32 slab [C, K] at ``base``, columns ck: [16, BK] (0 outside K)."""
    return tl.load(ptr + base + r[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)



@triton.jit
def _tok(ptr, bos, r, n, stride, col0, cols, cmask):
    """Rows ``r`` (valid below ``n``) of a token-layout tensor, row stride ``stride``, columns ``col0 + cols``:
    ``[len(r), len(cols)]`` in fp32, 0 on padded rows and masked columns."""
    m = (r < n)[:, None] & cmask[None, :]
    return tl.load(ptr + (bos + r)[:, None] * stride + col0 + cols[None, :], mask=m, other=0.0).to(tl.float32)



@triton.jit
def _pair_diag(q_ptr, k_ptr, b_ptr, G_ptr, dAq_ptr, dAk_ptr, daq, dak, dkq, dkk, GI, bos, first, n, base, abase, rI, ck,
               kmask, i_h, i_hv, scale, QS: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
               S: tl.constexpr, UNROLL: tl.constexpr):
    """The diagonal block's part of :func:`_bwd_intra_pair_kernel`'s four gradients, pairwise in fp32 as outer
    products (16 steps, no reductions; ``UNROLL`` of them unrolled, ``BWD_PAIR_UNROLL``), for gates too sharp to
    factor through a reference row."""
    r16 = tl.arange(0, S)
    # step j is key j for the rows i >= j and query j for the keys i <= j (exponents masked to 0 outside, where dA
    # is 0; rows past the sequence load zeros)
    for j in tl.range(0, S, loop_unroll_factor=UNROLL):
        t = bos + first + j
        ok = kmask & (ck * 0 + first + j < n)  # (a vector mask: the interpreter rejects scalar ones)
        kj = tl.load(k_ptr + t * QS + i_h * K + ck, mask=ok, other=0.0).to(tl.float32)
        qj = tl.load(q_ptr + t * QS + i_h * K + ck, mask=ok, other=0.0).to(tl.float32)
        bj = tl.load(b_ptr + t * HV + i_hv + ck * 0, mask=ok, other=0.0).to(tl.float32)  # beta_j in every lane
        Gj = tl.load(G_ptr + base + (first + j) * K + ck, mask=kmask, other=0.0)
        e_lo = tl.exp(tl.where(r16[:, None] >= j, GI - Gj[None, :], 0.0))
        e_up = tl.exp(tl.where(r16[:, None] <= j, Gj[None, :] - GI, 0.0))
        col = abase + rI * C + first + j  # dA[i, j]
        row = abase + (first + j) * C + rI  # dA[j, i]
        daq += tl.load(dAq_ptr + col)[:, None] * e_lo * kj[None, :]
        dak += tl.load(dAk_ptr + col)[:, None] * e_lo * kj[None, :]
        dkq += tl.load(dAq_ptr + row)[:, None] * e_up * (scale * qj)[None, :]
        dkk += tl.load(dAk_ptr + row)[:, None] * e_up * (bj * kj)[None, :]
    return daq, dak, dkq, dkk


@triton.jit
def _pair_blocks(q_ptr, k_ptr, b_ptr, G_ptr, dAq_ptr, dAk_ptr, G_f, G_l, I, bos, n, base, abase, rI, ck, kmask, i_h,
                 i_hv, scale, QS: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
                 BK: tl.constexpr, PREC: tl.constexpr):
    """The off-diagonal part of :func:`_bwd_intra_pair_kernel`'s four gradients one 16-row sub-block J at a time:
    ``[16, 16] x [16, BK]`` dots for the J before I (through I's first row) and the J after I and inside the
    sequence (through its last row), each J's k, q, G loaded only when used. Returns the sums before the
    ``e^{G_i - G_f}`` / ``e^{G_l - G_i}`` row factors."""
    r16 = tl.arange(0, S)
    daq = tl.zeros([S, BK], dtype=tl.float32)
    dak = tl.zeros([S, BK], dtype=tl.float32)
    dkq = tl.zeros([S, BK], dtype=tl.float32)
    dkk = tl.zeros([S, BK], dtype=tl.float32)
    for J in tl.static_range(C // S):
        rJ = J * S + r16
        if J < I:
            kd = _tok(k_ptr, bos, rJ, n, QS, i_h * K, ck, kmask) * tl.exp(G_f[None, :] - _rows16(G_ptr, base, rJ, ck,
                                                                                                    kmask, K))
            blk = abase + rI[:, None] * C + rJ[None, :]  # dA[i in I, j in J]
            daq = tl.dot(tl.load(dAq_ptr + blk), kd, daq, input_precision=PREC)
            dak = tl.dot(tl.load(dAk_ptr + blk), kd, dak, input_precision=PREC)
        if J > I:
            if J * S < n:
                e = tl.exp(_rows16(G_ptr, base, rJ, ck, kmask, K) - G_l[None, :])
                bJ = tl.load(b_ptr + (bos + rJ) * HV + i_hv, mask=rJ < n, other=0.0).to(tl.float32)
                blk = abase + rJ[:, None] * C + rI[None, :]  # dA[i in J, j in I]
                qa = _tok(q_ptr, bos, rJ, n, QS, i_h * K, ck, kmask) * e * scale
                ka = _tok(k_ptr, bos, rJ, n, QS, i_h * K, ck, kmask) * e * bJ[:, None]
                dkq = tl.dot(tl.trans(tl.load(dAq_ptr + blk)), qa, dkq, input_precision=PREC)
                dkk = tl.dot(tl.trans(tl.load(dAk_ptr + blk)), ka, dkk, input_precision=PREC)
    return daq, dak, dkq, dkk


@triton.jit
def _pair_row_block(q_ptr, k_ptr, rq_ptr, rk_ptr, b_ptr, G_ptr, dAq_ptr, dAk_ptr, dq_ptr, dk_ptr, dg_ptr, db_ptr, scale,
                    n_tok, span_max, I, i_k, sc, i_hv, i_h, bos, n, QS: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, BK: tl.constexpr, C: tl.constexpr, S: tl.constexpr, PREC: tl.constexpr,
                    DPREC: tl.constexpr, UNROLL: tl.constexpr, L2: tl.constexpr):
    """:func:`_bwd_intra_pair_kernel`'s work for row block I of one chunk and block of key channels."""
    r16 = tl.arange(0, S)
    ck = i_k * BK + tl.arange(0, BK)
    kmask = ck < K
    base = sc * (C * K)
    abase = sc * (C * C)
    GS = HV * K
    first = I * S
    last = I * S + S - 1
    G_f = tl.load(G_ptr + base + first * K + ck, mask=kmask, other=0.0)
    G_l = tl.load(G_ptr + base + last * K + ck, mask=kmask, other=0.0)
    # rows of I
    rI = first + r16
    GI = _rows16(G_ptr, base, rI, ck, kmask, K)
    qI = _tok(q_ptr, bos, rI, n, QS, i_h * K, ck, kmask)
    kI = _tok(k_ptr, bos, rI, n, QS, i_h * K, ck, kmask)
    bI = tl.load(b_ptr + (bos + rI) * HV + i_hv, mask=rI < n, other=0.0).to(tl.float32)
    e_f = tl.exp(GI - G_f[None, :])
    e_l = tl.exp(G_l[None, :] - GI)
    daq, dak, dkq, dkk = _pair_blocks(q_ptr, k_ptr, b_ptr, G_ptr, dAq_ptr, dAk_ptr, G_f, G_l, I, bos, n, base, abase, rI,
                                      ck, kmask, i_h, i_hv, scale, QS, HV, K, C, S, BK, PREC)
    daq, dak, dkq, dkk = daq * e_f, dak * e_f, dkq * e_l, dkk * e_l
    # diagonal block: through I's first / last row as fp32 16 x 16 dots when |G_i - G_f| <= span_max inside I
    # (every exponent then within +-span_max, far inside fp32's range), else pairwise
    fast = tl.max(tl.max(tl.abs(GI - G_f[None, :]), 1), 0) <= span_max
    if fast:
        d_off = abase + rI[:, None] * C + rI[None, :]  # dA[i in I, j in I]
        kf = kI * tl.exp(G_f[None, :] - GI)
        daq += tl.dot(tl.load(dAq_ptr + d_off), kf, input_precision=DPREC) * e_f
        dak += tl.dot(tl.load(dAk_ptr + d_off), kf, input_precision=DPREC) * e_f
        el = tl.exp(GI - G_l[None, :])
        dkq += tl.dot(tl.trans(tl.load(dAq_ptr + d_off)), qI * el * scale, input_precision=DPREC) * e_l
        dkk += tl.dot(tl.trans(tl.load(dAk_ptr + d_off)), kI * el * bI[:, None], input_precision=DPREC) * e_l
    else:
        daq, dak, dkq, dkk = _pair_diag(q_ptr, k_ptr, b_ptr, G_ptr, dAq_ptr, dAk_ptr, daq, dak, dkq, dkk, GI, bos, first,
                                        n, base, abase, rI, ck, kmask, i_h, i_hv, scale, QS, HV, K, C, S, UNROLL)
    m = (rI < n)[:, None] & kmask[None, :]
    off = (bos + rI)[:, None] * GS + i_hv * K + ck[None, :]
    dq = scale * daq
    dk = dkq + dkk + bI[:, None] * dak
    if L2:  # raw rows and dA scaled by the norms (the dY kernel): the sums are row i's norm times the gradients
        dq = dq / tl.load(rq_ptr + sc * C + rI)[:, None]  # of the normalised rows; dG and dbeta need no change
        dk = dk / tl.load(rk_ptr + sc * C + rI)[:, None]
    tl.store(dq_ptr + off, dq, mask=m)
    tl.store(dk_ptr + off, dk, mask=m)
    tl.store(dg_ptr + off, scale * qI * daq - kI * dkq + bI[:, None] * kI * dak - kI * dkk, mask=m)
    tl.store(db_ptr + i_k * n_tok + (bos + rI) * HV + i_hv, tl.sum(kI * dak, 1), mask=rI < n)


@triton.jit
def _bwd_intra_pair_kernel(
    q_ptr,
    k_ptr,
    rq_ptr,
    rk_ptr,
    b_ptr,
    G_ptr,
    dAq_ptr,
    dAk_ptr,
    cbos_ptr,
    clen_ptr,
    dq_ptr,
    dk_ptr,
    dg_ptr,
    db_ptr,
    scale,
    n_tok,
    span_max,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    C: tl.constexpr,
    S: tl.constexpr,
    PREC: tl.constexpr,
    DPREC: tl.constexpr,
    QS: tl.constexpr,
    UNROLL: tl.constexpr = 1,
    L2: tl.constexpr = False,
):
    """Per (block of key channels, row block I of S = 16 rows, chunk x value head): the gradients of ``Aqk = scale
    q_i.k_j e^{G_i - G_j}`` and ``Akk = beta_i k_i.k_j e^{G_i - G_j}`` for the rows of I, given dAqk (lower) and
    dAkk (strictly lower). The row gradients ``daq, dak`` from every key before I go through I's first row ``G_f``
    (``e^{G_i - G_j} = e^{G_i - G_f} e^{G_f - G_j}``), the column gradients ``dkq, dkk`` from every query after I
    through I's last row ``G_l``, one ``[S, S] x [S, BK]`` dot per sub-block before / after I
    (:func:`_pair_blocks`; one ``[S, C] x [C, BK]`` dot each over the whole chunk masked to those rows before session
    25, see ``BWD_LAUNCH``). Every exponent is <= 0, and where a factor underflows the exact product is smaller still. The
    diagonal block goes through the same two rows as fp32 16 x 16 dots (``DPREC``, ieee by default; exponents in
    [0, span]) when the largest ``|G_i - G_f|`` inside I is <= ``span_max`` (a tf32 diagonal inside the off-diagonal
    dots put dA_log's error against fp64 at 5.6e-2, session 5 call3); with
    sharper gates it is pairwise in fp32 as outer products (:func:`_pair_diag`, 16 steps, no reductions).
    Writes the intra-chunk
    parts in token layout: dq, dk, dG (not yet cumulated; ``_bwd_inter_kernel`` adds the rest) and dbeta's K part
    (slot ``i_k``). q, k rows are ``QS`` elements apart. With ``L2`` they are the raw rows and dAqk, dAkk come scaled
    by the forward's inverse norms (``dAqk[i, j] rq_i rk_j``, ``dAkk[i, j] rk_i rk_j``, :func:`_bwd_dy_kernel`), so
    every sum is the normalised rows' one times row i's norm: dG and dbeta's part come out as they are, and dq, dk
    are divided by ``rq_i``, ``rk_i`` (``[NC, HV, C]``) once, as they are stored."""
    I = tl.program_id(1)
    sc, i_hv, i_h, bos, n = _chunk_head(tl.program_id(2), cbos_ptr, clen_ptr, H, HV)
    if I * S < n:  # (a block of padded rows: nothing to write)
        _pair_row_block(q_ptr, k_ptr, rq_ptr, rk_ptr, b_ptr, G_ptr, dAq_ptr, dAk_ptr, dq_ptr, dk_ptr, dg_ptr, db_ptr,
                        scale, n_tok, span_max, I, tl.program_id(0), sc, i_hv, i_h, bos, n, QS, HV, K,
                        BK, C, S, PREC, DPREC, UNROLL, L2)

"""Triton chunked KDA forward (``../shared/REFERENCE.md`` section 1), with a recompute-from-inputs backward.

Kernels (all fixed-configuration, so they run under ``TRITON_INTERPRET=1`` on a CPU), chunk C = 64 split
into four 16-token sub-blocks:

1. ``_intra_kernel``, one program per (chunk, value head), everything for the chunk in registers:
   optional L2 norm of q, k rows; the gate (softplus "unbounded" or sigmoid lower bound) and the
   chunk-local cumulative sum G, in fp32, one sub-block at a time with a running carry;
   ``Akk`` / ``Aqk`` by 16 x 16 sub-blocks: pairs ``J < I`` factored through the first row of ``I``
   (``exp(G_i - G_ref) * exp(G_ref - G_j)``, both exponents <= 0) as tensor-core dots (tf32 for
   bf16/fp16 inputs, ``ieee`` fp32 for fp32 inputs), diagonal sub-blocks pairwise in fp32 (masked
   with ``where`` before ``exp``); ``T = (I + Akk)^-1`` by blocked forward substitution: the four
   diagonal 16 x 16 inverses in one interleaved 15-step loop, then the off-diagonal blocks
   ``T_IJ = -T_II sum_{J<=M<I} A_IM T_MJ``; ``W = T (beta K Gamma)``, ``U = T (beta V)``. It writes
   W, U, ``qg = scale Q Gamma``, ``kg = K exp(G_last - G)``, ``Aqk`` (lower blocks only) and ``G_last``.
2. ``_state_kernel``, one program per (sequence, value head, block of value columns): the sequential
   pass over chunks with the fp32 state in registers; writes the state entering each chunk (``h``),
   ``Vnew = U - W S`` and the final state.
3. ``_output_kernel``, one program per (chunk, value head, block of value columns), fully parallel:
   ``O = qg h + tril(Aqk) Vnew``.

Scratch is laid out per chunk, padded to C rows: padded rows have g = 0 (so G carries the last valid
value and every exponent stays <= 0) and zero k, q, v, beta, which makes their W, U, Vnew and kg rows
zero. Per-chunk intermediates are stored in the input dtype (fp32 for fp32 inputs); the state is
fp32. All varlen bookkeeping is a host-side table of chunks (token start, length) and of sequences
(first chunk, number of chunks); dense batches are treated as B equal-length sequences. Offsets that
can exceed 2^31 are int64.

Backward (:class:`ChunkKDAFunction`, used when a gradient is needed): the L2 norm and the gate are applied in
PyTorch (autograd) outside the Function; the Function's forward keeps the per-chunk intermediates
(``chunk_kda_fwd_intermediates``) and its backward is ``chunk_triton_bwd.chunk_kda_bwd_triton`` (Triton reverse
state pass; see that file for what else is Triton).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.kda.chunk_triton_bwd import chunk_kda_bwd_triton
from kernels.kda.naive import kda_gate_ref, l2norm_ref

CHUNK = 64
SUB = 16


@triton.jit
def _gate(x, a_log, lb, LOWER: tl.constexpr):
    """fp32 gate: lower-bound sigmoid form or -exp(A_log) * softplus (identity above 20)."""
    a = tl.exp(a_log)
    if LOWER:
        return lb * tl.sigmoid(a * x)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return -a * sp


@triton.jit
def _load_qk(ptr, bos, n, r, ck, i_h, H: tl.constexpr, K: tl.constexpr, L2: tl.constexpr):
    """Rows r (< n valid) of q or k for head i_h as fp32 [16, BK]; optional L2 norm (eps 1e-6 under sqrt)."""
    m = (r < n)[:, None] & (ck < K)[None, :]
    x = tl.load(ptr + (bos + r)[:, None] * (H * K) + i_h * K + ck[None, :], mask=m, other=0.0).to(tl.float32)
    if L2:
        x = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def _load_g(
    g_ptr,
    bos,
    n,
    r,
    ck,
    i_hv,
    a_log,
    dtb,
    lb,
    HV: tl.constexpr,
    K: tl.constexpr,
    GATE: tl.constexpr,
    LOWER: tl.constexpr,
):
    """Log-decays of rows r as fp32 [16, BK]; 0 on padded rows and columns."""
    m = (r < n)[:, None] & (ck < K)[None, :]
    g = tl.load(g_ptr + (bos + r)[:, None] * (HV * K) + i_hv * K + ck[None, :], mask=m, other=0.0).to(tl.float32)
    if GATE:
        g = tl.where(m, _gate(g + dtb[None, :], a_log, lb, LOWER), 0.0)
    return g


@triton.jit
def _offdiag(q_i, k_i, G_i, k_j, G_j, ref, b_i, scale, PREC: tl.constexpr):
    """Sub-block pair J < I: (beta_i k_i . k_j, scale q_i . k_j) with decays factored through row ``ref``."""
    e_i = tl.exp(G_i - ref[None, :])
    kj = tl.trans(k_j * tl.exp(ref[None, :] - G_j))
    akk = tl.dot(k_i * e_i, kj, input_precision=PREC) * b_i[:, None]
    aqk = tl.dot(q_i * e_i, kj, input_precision=PREC) * scale
    return akk, aqk


@triton.jit
def _diag(q_i, k_i, G_i, b_i, scale, r16, S: tl.constexpr):
    """Diagonal sub-block, pairwise in fp32: Akk strictly lower (times beta_i), Aqk lower (times scale)."""
    akk = tl.zeros([S, S], dtype=tl.float32)
    aqk = tl.zeros([S, S], dtype=tl.float32)
    for j in range(S):
        sel = r16[:, None] == j
        k_j = tl.sum(tl.where(sel, k_i, 0.0), 0)
        G_j = tl.sum(tl.where(sel, G_i, 0.0), 0)
        kd = k_j[None, :] * tl.exp(tl.where(r16[:, None] >= j, G_i - G_j[None, :], 0.0))
        akk = tl.where(r16[None, :] == j, tl.sum(k_i * kd, 1)[:, None], akk)
        aqk = tl.where(r16[None, :] == j, tl.sum(q_i * kd, 1)[:, None], aqk)
    akk = tl.where(r16[:, None] > r16[None, :], akk * b_i[:, None], 0.0)
    aqk = tl.where(r16[:, None] >= r16[None, :], aqk * scale, 0.0)
    return akk, aqk


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
def _store_rows(ptr, base, x, r, cols, ncol: tl.constexpr, W: tl.constexpr):
    """Store x [16, B*] into rows r of a per-chunk slab [C, ncol] at ``base`` (row stride W)."""
    tl.store(ptr + base + r[:, None] * W + cols[None, :], x.to(ptr.dtype.element_ty), mask=(cols < ncol)[None, :])


@triton.jit
def _load_bv(v_ptr, beta_ptr, bos, n, r, cv, i_hv, HV: tl.constexpr, V: tl.constexpr):
    """beta_r * v_r as fp32 [16, BV] (zero on padded rows)."""
    rm = r < n
    b = tl.load(beta_ptr + (bos + r) * HV + i_hv, mask=rm, other=0.0).to(tl.float32)
    m = rm[:, None] & (cv < V)[None, :]
    v = tl.load(v_ptr + (bos + r)[:, None] * (HV * V) + i_hv * V + cv[None, :], mask=m, other=0.0).to(tl.float32)
    return v * b[:, None]


@triton.jit
def _intra_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    alog_ptr,
    dtb_ptr,
    lb,
    cbos_ptr,
    clen_ptr,
    qg_ptr,
    kg_ptr,
    W_ptr,
    U_ptr,
    Aqk_ptr,
    gl_ptr,
    G_ptr,
    T_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    S: tl.constexpr,
    GATE: tl.constexpr,
    LOWER: tl.constexpr,
    HAS_DTB: tl.constexpr,
    L2: tl.constexpr,
    PREC: tl.constexpr,
    STORE_GT: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    r16 = tl.arange(0, S)
    ck = tl.arange(0, BK)
    cv = tl.arange(0, BV)
    r0, r1, r2, r3 = r16, S + r16, 2 * S + r16, 3 * S + r16
    a_log = 0.0
    dtb = tl.zeros([BK], dtype=tl.float32)
    if GATE:
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
        if HAS_DTB:
            dtb = tl.load(dtb_ptr + i_hv * K + ck, mask=ck < K, other=0.0).to(tl.float32)
    # chunk-local cumulative gate, one sub-block at a time (fp32)
    g0 = _load_g(g_ptr, bos, n, r0, ck, i_hv, a_log, dtb, lb, HV, K, GATE, LOWER)
    G0 = tl.cumsum(g0, 0)
    c1 = tl.sum(g0, 0)
    g1 = _load_g(g_ptr, bos, n, r1, ck, i_hv, a_log, dtb, lb, HV, K, GATE, LOWER)
    G1 = c1[None, :] + tl.cumsum(g1, 0)
    c2 = c1 + tl.sum(g1, 0)
    g2 = _load_g(g_ptr, bos, n, r2, ck, i_hv, a_log, dtb, lb, HV, K, GATE, LOWER)
    G2 = c2[None, :] + tl.cumsum(g2, 0)
    c3 = c2 + tl.sum(g2, 0)
    g3 = _load_g(g_ptr, bos, n, r3, ck, i_hv, a_log, dtb, lb, HV, K, GATE, LOWER)
    G3 = c3[None, :] + tl.cumsum(g3, 0)
    gl = c3 + tl.sum(g3, 0)
    # gl - G as suffix sums of g (accurate to its own size, unlike a difference of two large prefix sums)
    t2 = tl.sum(g3, 0)
    t1 = t2 + tl.sum(g2, 0)
    t0 = t1 + tl.sum(g1, 0)
    E0 = tl.cumsum(g0, 0, reverse=True) - g0 + t0[None, :]
    E1 = tl.cumsum(g1, 0, reverse=True) - g1 + t1[None, :]
    E2 = tl.cumsum(g2, 0, reverse=True) - g2 + t2[None, :]
    E3 = tl.cumsum(g3, 0, reverse=True) - g3
    sc = i_c.to(tl.int64) * HV + i_hv  # scratch slab index
    tl.store(gl_ptr + sc * K + ck, gl, mask=ck < K)
    k0 = _load_qk(k_ptr, bos, n, r0, ck, i_h, H, K, L2)
    k1 = _load_qk(k_ptr, bos, n, r1, ck, i_h, H, K, L2)
    k2 = _load_qk(k_ptr, bos, n, r2, ck, i_h, H, K, L2)
    k3 = _load_qk(k_ptr, bos, n, r3, ck, i_h, H, K, L2)
    b0 = tl.load(beta_ptr + (bos + r0) * HV + i_hv, mask=r0 < n, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + (bos + r1) * HV + i_hv, mask=r1 < n, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + (bos + r2) * HV + i_hv, mask=r2 < n, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + (bos + r3) * HV + i_hv, mask=r3 < n, other=0.0).to(tl.float32)
    ck_base = sc * (C * K)
    a_base = sc * (C * C)
    if STORE_GT:
        _store_rows(G_ptr, ck_base, G0, r0, ck, K, K)
        _store_rows(G_ptr, ck_base, G1, r1, ck, K, K)
        _store_rows(G_ptr, ck_base, G2, r2, ck, K, K)
        _store_rows(G_ptr, ck_base, G3, r3, ck, K, K)
    # sub-block row 0
    q = _load_qk(q_ptr, bos, n, r0, ck, i_h, H, K, L2)
    _store_rows(qg_ptr, ck_base, q * tl.exp(G0) * scale, r0, ck, K, K)
    _store_rows(kg_ptr, ck_base, k0 * tl.exp(E0), r0, ck, K, K)
    A00, Q00 = _diag(q, k0, G0, b0, scale, r16, S)
    _store_rows(Aqk_ptr, a_base, Q00, r0, r0, C, C)
    # sub-block row 1
    q = _load_qk(q_ptr, bos, n, r1, ck, i_h, H, K, L2)
    _store_rows(qg_ptr, ck_base, q * tl.exp(G1) * scale, r1, ck, K, K)
    _store_rows(kg_ptr, ck_base, k1 * tl.exp(E1), r1, ck, K, K)
    ref = tl.sum(tl.where(r16[:, None] == 0, G1, 0.0), 0)
    A10, Q10 = _offdiag(q, k1, G1, k0, G0, ref, b1, scale, PREC)
    A11, Q11 = _diag(q, k1, G1, b1, scale, r16, S)
    _store_rows(Aqk_ptr, a_base, Q10, r1, r0, C, C)
    _store_rows(Aqk_ptr, a_base, Q11, r1, r1, C, C)
    # sub-block row 2
    q = _load_qk(q_ptr, bos, n, r2, ck, i_h, H, K, L2)
    _store_rows(qg_ptr, ck_base, q * tl.exp(G2) * scale, r2, ck, K, K)
    _store_rows(kg_ptr, ck_base, k2 * tl.exp(E2), r2, ck, K, K)
    ref = tl.sum(tl.where(r16[:, None] == 0, G2, 0.0), 0)
    A20, Q20 = _offdiag(q, k2, G2, k0, G0, ref, b2, scale, PREC)
    A21, Q21 = _offdiag(q, k2, G2, k1, G1, ref, b2, scale, PREC)
    A22, Q22 = _diag(q, k2, G2, b2, scale, r16, S)
    _store_rows(Aqk_ptr, a_base, Q20, r2, r0, C, C)
    _store_rows(Aqk_ptr, a_base, Q21, r2, r1, C, C)
    _store_rows(Aqk_ptr, a_base, Q22, r2, r2, C, C)
    # sub-block row 3
    q = _load_qk(q_ptr, bos, n, r3, ck, i_h, H, K, L2)
    _store_rows(qg_ptr, ck_base, q * tl.exp(G3) * scale, r3, ck, K, K)
    _store_rows(kg_ptr, ck_base, k3 * tl.exp(E3), r3, ck, K, K)
    ref = tl.sum(tl.where(r16[:, None] == 0, G3, 0.0), 0)
    A30, Q30 = _offdiag(q, k3, G3, k0, G0, ref, b3, scale, PREC)
    A31, Q31 = _offdiag(q, k3, G3, k1, G1, ref, b3, scale, PREC)
    A32, Q32 = _offdiag(q, k3, G3, k2, G2, ref, b3, scale, PREC)
    A33, Q33 = _diag(q, k3, G3, b3, scale, r16, S)
    _store_rows(Aqk_ptr, a_base, Q30, r3, r0, C, C)
    _store_rows(Aqk_ptr, a_base, Q31, r3, r1, C, C)
    _store_rows(Aqk_ptr, a_base, Q32, r3, r2, C, C)
    _store_rows(Aqk_ptr, a_base, Q33, r3, r3, C, C)
    # T = (I + Akk)^-1: diagonal inverses, then T_IJ = -T_II sum_{J<=M<I} A_IM T_MJ
    T00, T11, T22, T33 = _inv_diag4(A00, A11, A22, A33, r16, S)
    T10 = -tl.dot(T11, tl.dot(A10, T00, input_precision=PREC), input_precision=PREC)
    T21 = -tl.dot(T22, tl.dot(A21, T11, input_precision=PREC), input_precision=PREC)
    T32 = -tl.dot(T33, tl.dot(A32, T22, input_precision=PREC), input_precision=PREC)
    T20 = -tl.dot(
        T22, tl.dot(A20, T00, input_precision=PREC) + tl.dot(A21, T10, input_precision=PREC), input_precision=PREC
    )
    T31 = -tl.dot(
        T33, tl.dot(A31, T11, input_precision=PREC) + tl.dot(A32, T21, input_precision=PREC), input_precision=PREC
    )
    T30 = -tl.dot(
        T33,
        tl.dot(A30, T00, input_precision=PREC)
        + tl.dot(A31, T10, input_precision=PREC)
        + tl.dot(A32, T20, input_precision=PREC),
        input_precision=PREC,
    )
    if STORE_GT:
        z = tl.zeros([S, S], dtype=tl.float32)
        _store_rows(T_ptr, a_base, T00, r0, r0, C, C)
        _store_rows(T_ptr, a_base, z, r0, r1, C, C)
        _store_rows(T_ptr, a_base, z, r0, r2, C, C)
        _store_rows(T_ptr, a_base, z, r0, r3, C, C)
        _store_rows(T_ptr, a_base, T10, r1, r0, C, C)
        _store_rows(T_ptr, a_base, T11, r1, r1, C, C)
        _store_rows(T_ptr, a_base, z, r1, r2, C, C)
        _store_rows(T_ptr, a_base, z, r1, r3, C, C)
        _store_rows(T_ptr, a_base, T20, r2, r0, C, C)
        _store_rows(T_ptr, a_base, T21, r2, r1, C, C)
        _store_rows(T_ptr, a_base, T22, r2, r2, C, C)
        _store_rows(T_ptr, a_base, z, r2, r3, C, C)
        _store_rows(T_ptr, a_base, T30, r3, r0, C, C)
        _store_rows(T_ptr, a_base, T31, r3, r1, C, C)
        _store_rows(T_ptr, a_base, T32, r3, r2, C, C)
        _store_rows(T_ptr, a_base, T33, r3, r3, C, C)
    # W = T (beta K Gamma)
    x0 = k0 * tl.exp(G0) * b0[:, None]
    x1 = k1 * tl.exp(G1) * b1[:, None]
    x2 = k2 * tl.exp(G2) * b2[:, None]
    x3 = k3 * tl.exp(G3) * b3[:, None]
    _store_rows(W_ptr, ck_base, tl.dot(T00, x0, input_precision=PREC), r0, ck, K, K)
    w = tl.dot(T10, x0, input_precision=PREC) + tl.dot(T11, x1, input_precision=PREC)
    _store_rows(W_ptr, ck_base, w, r1, ck, K, K)
    w = tl.dot(T20, x0, input_precision=PREC) + tl.dot(T21, x1, input_precision=PREC)
    w += tl.dot(T22, x2, input_precision=PREC)
    _store_rows(W_ptr, ck_base, w, r2, ck, K, K)
    w = tl.dot(T30, x0, input_precision=PREC) + tl.dot(T31, x1, input_precision=PREC)
    w += tl.dot(T32, x2, input_precision=PREC) + tl.dot(T33, x3, input_precision=PREC)
    _store_rows(W_ptr, ck_base, w, r3, ck, K, K)
    # U = T (beta V)
    y0 = _load_bv(v_ptr, beta_ptr, bos, n, r0, cv, i_hv, HV, V)
    y1 = _load_bv(v_ptr, beta_ptr, bos, n, r1, cv, i_hv, HV, V)
    y2 = _load_bv(v_ptr, beta_ptr, bos, n, r2, cv, i_hv, HV, V)
    y3 = _load_bv(v_ptr, beta_ptr, bos, n, r3, cv, i_hv, HV, V)
    cu_base = sc * (C * V)
    _store_rows(U_ptr, cu_base, tl.dot(T00, y0, input_precision=PREC), r0, cv, V, V)
    u = tl.dot(T10, y0, input_precision=PREC) + tl.dot(T11, y1, input_precision=PREC)
    _store_rows(U_ptr, cu_base, u, r1, cv, V, V)
    u = tl.dot(T20, y0, input_precision=PREC) + tl.dot(T21, y1, input_precision=PREC)
    u += tl.dot(T22, y2, input_precision=PREC)
    _store_rows(U_ptr, cu_base, u, r2, cv, V, V)
    u = tl.dot(T30, y0, input_precision=PREC) + tl.dot(T31, y1, input_precision=PREC)
    u += tl.dot(T32, y2, input_precision=PREC) + tl.dot(T33, y3, input_precision=PREC)
    _store_rows(U_ptr, cu_base, u, r3, cv, V, V)


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
    """Chunk table (token start, length) and sequence table (first chunk, number of chunks)."""
    if cu_seqlens is None:
        bounds = [(b * T, (b + 1) * T) for b in range(B)]
    else:
        cs = [int(c) for c in cu_seqlens.tolist()]
        bounds = list(zip(cs[:-1], cs[1:]))
    cbos, clen, s0, snc = [], [], [], []
    for bos, eos in bounds:
        s0.append(len(cbos))
        for t in range(bos, eos, CHUNK):
            cbos.append(t)
            clen.append(min(CHUNK, eos - t))
        snc.append(len(cbos) - s0[-1])
    as_t = lambda x: torch.tensor(x if x else [0], dtype=torch.int32, device=device)
    return len(cbos), [as_t(x) for x in (cbos, clen)], [as_t(x) for x in (s0, snc)]


STATE_BV = 32  # value columns per program of the sequential state pass
OUT_BV = 64  # value columns per program of the output kernel


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


def _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags, keep: bool) -> KDAFwdState:
    """Run the forward kernels; ``keep`` also stores G and T (and zeroes Aqk's upper part) for the backward."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    fp32 = q.dtype == torch.float32 or v.dtype == torch.float32
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    nch, (cbos, clen), (s0, snc) = _tables(T, B, cu_seqlens, dev)
    N = s0.numel() if cu_seqlens is not None else B
    BK, BV = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    sdt = torch.float32 if fp32 else v.dtype
    nc1 = max(nch, 1)
    qg = torch.empty(nc1, HV, CHUNK, K, dtype=sdt, device=dev)
    kg, W = torch.empty_like(qg), torch.empty_like(qg)
    U = torch.empty(nc1, HV, CHUNK, V, dtype=sdt, device=dev)
    vn = torch.empty_like(U)
    Aqk = (torch.zeros if keep else torch.empty)(nc1, HV, CHUNK, CHUNK, dtype=sdt, device=dev)
    gl = torch.empty(nc1, HV, K, dtype=torch.float32, device=dev)
    h = torch.empty(nc1, HV, K, V, dtype=sdt, device=dev)
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    G = torch.empty(nc1, HV, CHUNK, K, dtype=torch.float32, device=dev) if keep else dummy
    Tm = torch.empty(nc1, HV, CHUNK, CHUNK, dtype=torch.float32, device=dev) if keep else dummy
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    if nch:
        _intra_kernel[(nch, HV)](
            q,
            k,
            v,
            g,
            beta,
            A_log if use_gate else dummy,
            dt_bias if (use_gate and dt_bias is not None) else dummy,
            float(lower_bound) if lower_bound is not None else 0.0,
            cbos,
            clen,
            qg,
            kg,
            W,
            U,
            Aqk,
            gl,
            G,
            Tm,
            scale,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BV=BV,
            C=CHUNK,
            S=SUB,
            GATE=use_gate,
            LOWER=lower_bound is not None,
            HAS_DTB=dt_bias is not None,
            L2=use_l2,
            PREC="ieee" if fp32 else "tf32",
            STORE_GT=keep,
            num_warps=4 if BK * BV <= 64 * 64 else 8,
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
        num_warps=4,
        num_stages=2,
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
            num_warps=4,
        )
    return KDAFwdState(o, ht, G, gl, Aqk, Tm, W, U, qg, kg, h, vn, cbos, clen, s0, snc)


def chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    """Forward only. Returns o [B, T, HV, V] (v's dtype) and the final state [N, HV, K, V] fp32."""
    st = _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags, keep=False)
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
    return _fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens, (False, False, None, None, None), keep=True)


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
    q's dtype) and the gate in PyTorch autograd, then :class:`ChunkKDAFunction` on the core op."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    ins = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    if not (torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in ins)):
        return chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags)
    if use_l2:
        q, k = l2norm_ref(q.float()).to(q.dtype), l2norm_ref(k.float()).to(k.dtype)
    if use_gate:
        g = kda_gate_ref(g, A_log, dt_bias, lower_bound)
    return ChunkKDAFunction.apply(q, k, v, g, beta, initial_state, scale, cu_seqlens)

"""Triton kernels of the KDA chunked backward (``../shared/REFERENCE.md`` section 1; the maths and its reference
implementation are in ``chunk_bwd_torch.py``, whose notation this file follows).

Kernels (fixed configurations, no autotuning, so they run under ``TRITON_INTERPRET=1`` on a CPU), chained by
:func:`chunk_kda_bwd_triton`:

1. ``_bwd_state_kernel``, one program per (block of value columns, sequence x value head): the reverse pass over
   the sequence's chunks with the gradient of the state ``dS`` (fp32 ``[K, BV]``) in registers. Per chunk, last
   to first: store ``dH[c] = dS``; ``dVnew = Aqk^T dO + kg dS`` (both stored in the 16-bit inputs' dtype,
   ``BWD_DH_16BIT`` / ``BWD_DVN_16BIT``, else fp32); ``dS <- e^{Gl} dS + qg^T dO - W^T dVnew``. The final ``dS``
   is ``dh0``. Columns of V are independent, so tiling over V is exact.
2. ``_bwd_dy_kernel``, one program per (chunk, value head): ``dY = T^T dVnew``, ``dv``, dbeta's V part, ``dAqk``,
   ``dAkk``.
3. ``_bwd_intra_pair_kernel`` (``pair_triton_bwd.py``), one program per (key block, row block of 16, chunk x value
   head): the gradients of the intra-chunk scores Aqk, Akk.
4. ``_bwd_inter_kernel``, one program per (key block, chunk x value head): the reductions over V, the chain rule
   through the gated tensors, the in-chunk reverse cumulative sum; final dq, dk, dg.

The training path (``chunk_triton.ChunkKDAFunction``) may hand :func:`chunk_kda_bwd_triton` a :class:`BwdPrep`:
the raw q, k rows with the forward's inverse L2 norms (kernel 2 scales dA by them, kernel 3 divides its dq, dk once,
kernel 4 scales its q, k tiles) and the gate's inputs (kernel 4 then writes d g_raw, with partial sums of dA_log and
d dt_bias).

Tensor-core dots take the scratch dtype (bf16/fp16) with fp32 accumulation (``tf32`` for fp32 operands); fp32 inputs
use ``ieee`` dots. See ``README.md`` ("Backward") for the tiling and the measured times.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.colsum import column_sum
from kernels.kda.chunk_bwd_torch import KDAGrads
from kernels.kda.pair_triton_bwd import _bwd_intra_pair_kernel, _chunk_head
from kernels.kda.prep_triton import _gate_args, _gate_grad, gate_param_grads, qk_rows, token_rows
from kernels.kda.state_common import _load_state, _mm, _state_program, state_block_v

# value columns per program of the reverse state pass; None: state_block_v's choice among BWD_STATE_BV_CHOICES
# (a fixed 32 before session 22; 16 was slower at both shapes swept)
BWD_STATE_BV: int | None = None
BWD_STATE_BV_CHOICES = (64, 32)
# the widest choice needs this many programs an SM (state_block_v's fill). H200, session 27 call6 (sweep_kda_bwd,
# backward alone; dH and dVnew in bf16): 8 x 4096 x 6 (48 pairs: 96 programs at 64 columns for 132 SMs) 2.167 ms at
# 64 against 2.283 at 32; 1 x 8192 x 32 (64 programs at 64) 2.949 at 64 against 2.904 at 32. 1.0 until then
BWD_STATE_FILL = 0.6
# True: the reverse state pass stores dH (the state gradient entering each chunk, read once by the inter kernel) in
# the 16-bit inputs' dtype instead of fp32, as fla stores its dh (half of 268 MB written and read at 1 x 8192 x 32;
# fla's chunk_gated_delta_rule_bwd_kernel_dhu took 0.214 ms against our 0.363, session 25 call2). H200, session 27
# call2 (sweep_kda_bwd): backward 3.157 / 3.165 -> 3.143 ms at 1 x 8192 x 32, 2.467 / 2.471 -> 2.445 at the
# model's 8 x 4096 x 6 (init gates, fp32 beta); errors against fp64 unchanged to two digits. fp32 inputs keep fp32
BWD_DH_16BIT = True
# True: the reverse state pass stores dVnew, and the dY kernel dY over it, in the 16-bit inputs' dtype, as fla stores
# its dv (the state pass already rounds dVnew so for its own recursion; the dY kernel keeps its fp32 dY for dv, dbeta
# and dAkk, so only the inter kernel's dX = -dY h^T reads the rounded one, as a 16-bit dot). H200, session 27 call4
# (sweep_kda_bwd): backward 3.044 -> 2.872 ms at 1 x 8192 x 32, 2.372 -> 2.256 at the model's 8 x 4096 x 6 (init
# gates, fp32 beta); errors against fp64 of dq, dk, dg unchanged, dv 2.9e-3 -> 3.3e-3 and dbeta 3.0e-3 -> 3.3e-3
# (3.3e-3 -> 3.7e-3, 2.9e-3 -> 3.4e-3 at 8 x 4096 x 6). fp32 inputs always keep fp32. Session 33 (call6) also handed
# the pair kernel's dq, dk parts to the inter kernel in bf16: backward 1.816 -> 1.800 / 1.803 ms at 8x4096x6, 2.811 ->
# 2.905 / 2.901 at 1x8192x32, dq / dk errors against fp64 up ~4%; removed.
BWD_DVN_16BIT = True


@triton.jit
def _bwd_state_kernel(
    qg_ptr,
    kg_ptr,
    W_ptr,
    Aqk_ptr,
    gl_ptr,
    do_ptr,
    dht_ptr,
    dH_ptr,
    dvn_ptr,
    dh0_ptr,
    cbos_ptr,
    clen_ptr,
    sc0_ptr,
    snc_ptr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    HAS_DHT: tl.constexpr,
    FP32: tl.constexpr,
):
    i_nh, i_hv, c0, nc, rows, ck, cv, kmask, vmask, smask, s_off = _state_program(sc0_ptr, snc_ptr, HV, K, V, BK, BV, C)
    dS = _load_state(dht_ptr, i_nh, s_off, smask, HAS_DHT, K, V, BK, BV)
    for i in range(0, nc):
        c = c0 + nc - 1 - i
        sc = c.to(tl.int64) * HV + i_hv
        tl.store(dH_ptr + sc * (K * V) + s_off, dS.to(dH_ptr.dtype.element_ty), mask=smask)
        bos = tl.load(cbos_ptr + c).to(tl.int64)
        n = tl.load(clen_ptr + c)
        do = tl.load(
            do_ptr + (bos + rows)[:, None] * (HV * V) + i_hv * V + cv[None, :],
            mask=(rows < n)[:, None] & vmask[None, :],
            other=0.0,
        ).to(qg_ptr.dtype.element_ty)
        a = tl.load(Aqk_ptr + sc * (C * C) + rows[:, None] * C + rows[None, :])
        kg = tl.load(kg_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        dv = _mm(tl.trans(a), do, FP32) + _mm(kg, dS.to(kg_ptr.dtype.element_ty), FP32)
        tl.store(dvn_ptr + sc * (C * V) + rows[:, None] * V + cv[None, :], dv.to(dvn_ptr.dtype.element_ty),
                 mask=vmask[None, :])
        qg = tl.load(qg_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        w = tl.load(W_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        gl = tl.load(gl_ptr + sc * K + ck, mask=kmask, other=0.0)
        dS = dS * tl.exp(gl)[:, None] + _mm(tl.trans(qg), do, FP32)
        dS -= _mm(tl.trans(w), dv.to(W_ptr.dtype.element_ty), FP32)
    tl.store(dh0_ptr + i_nh.to(tl.int64) * (K * V) + s_off, dS, mask=smask)


@triton.jit
def _fdot(a, b, PREC: tl.constexpr):
    """fp32-operand dot (``ieee`` for fp32 inputs, ``tf32`` for 16-bit ones) with fp32 accumulation."""
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)


@triton.jit
def _bwd_dy_kernel(
    T_ptr,
    do_ptr,
    vn_ptr,
    v_ptr,
    b_ptr,
    dy_ptr,
    dv_ptr,
    db_ptr,
    dAq_ptr,
    dAk_ptr,
    cbos_ptr,
    clen_ptr,
    rq_ptr,
    rk_ptr,
    VS,
    DVS,
    HV: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    FP32: tl.constexpr,
    PREC: tl.constexpr,
    L2: tl.constexpr = False,
):
    """Per (chunk, value head), looping over blocks of V: ``dY = T^T dVnew`` (overwrites dVnew in ``dy_ptr``),
    ``dv = beta dY`` and dbeta's V part ``sum_v v dY`` (token layout; v and dv at token strides ``VS``, ``DVS``),
    ``dAqk = lower(dO Vnew^T)`` and ``dAkk = strict_lower(-dY Vnew^T)`` (``[C, C]`` fp32; with ``L2`` scaled by the
    forward's inverse norms ``rq, rk [NC, HV, C]`` as ``dAqk[i, j] rq_i rk_j``, ``dAkk[i, j] rk_i rk_j``, for the pair
    kernel's raw q, k rows)."""
    sc = tl.program_id(0).to(tl.int64)
    c = tl.program_id(0) // HV
    i_hv = tl.program_id(0) % HV
    bos = tl.load(cbos_ptr + c).to(tl.int64)
    n = tl.load(clen_ptr + c)
    rows = tl.arange(0, C)
    rmask = rows < n
    Tm = tl.load(T_ptr + sc * (C * C) + rows[:, None] * C + rows[None, :])
    beta = tl.load(b_ptr + (bos + rows) * HV + i_hv, mask=rmask, other=0.0).to(tl.float32)
    daq = tl.zeros([C, C], dtype=tl.float32)
    dak = tl.zeros([C, C], dtype=tl.float32)
    dbv = tl.zeros([C], dtype=tl.float32)
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        vmask = cv < V
        coff = sc * (C * V) + rows[:, None] * V + cv[None, :]
        toff = (bos + rows)[:, None] * (HV * V) + i_hv * V + cv[None, :]
        tmask = rmask[:, None] & vmask[None, :]
        dvn = tl.load(dy_ptr + coff, mask=vmask[None, :], other=0.0)
        vn = tl.load(vn_ptr + coff, mask=vmask[None, :], other=0.0)
        do = tl.load(do_ptr + toff, mask=tmask, other=0.0).to(vn_ptr.dtype.element_ty)
        vv = tl.load(v_ptr + (bos + rows)[:, None] * VS + i_hv * V + cv[None, :], mask=tmask, other=0.0).to(tl.float32)
        dy = _fdot(tl.trans(Tm), dvn, PREC)
        tl.store(dy_ptr + coff, dy.to(dy_ptr.dtype.element_ty), mask=vmask[None, :])
        tl.store(dv_ptr + (bos + rows)[:, None] * DVS + i_hv * V + cv[None, :], dy * beta[:, None], mask=tmask)
        dbv += tl.sum(vv * dy, 1)
        daq += _mm(do, tl.trans(vn), FP32)
        dak -= _fdot(dy, tl.trans(vn), PREC)
    tl.store(db_ptr + (bos + rows) * HV + i_hv, dbv, mask=rmask)
    if L2:
        rk = tl.load(rk_ptr + sc * C + rows)
        daq *= tl.load(rq_ptr + sc * C + rows)[:, None] * rk[None, :]
        dak *= rk[:, None] * rk[None, :]
    aoff = sc * (C * C) + rows[:, None] * C + rows[None, :]
    tl.store(dAq_ptr + aoff, tl.where(rows[:, None] >= rows[None, :], daq, 0.0))
    tl.store(dAk_ptr + aoff, tl.where(rows[:, None] > rows[None, :], dak, 0.0))


@triton.jit
def _bwd_inter_kernel(
    q_ptr,
    k_ptr,
    rq_ptr,
    rk_ptr,
    g_ptr,
    b_ptr,
    G_ptr,
    gl_ptr,
    do_ptr,
    vn_ptr,
    dy_ptr,
    h_ptr,
    dH_ptr,
    cbos_ptr,
    clen_ptr,
    dq_ptr,
    dk_ptr,
    dg_ptr,
    dq_out,
    dk_out,
    dg_out,
    db_ptr,
    x_ptr,
    alog_ptr,
    dtb_ptr,
    pa_ptr,
    pb_ptr,
    lb,
    scale,
    n_tok,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    FP32: tl.constexpr,
    PREC: tl.constexpr,
    QS: tl.constexpr,
    EE_DIFF: tl.constexpr = False,
    L2: tl.constexpr = False,
    GATE: tl.constexpr = False,
    LOWER: tl.constexpr = False,
    HAS_DTB: tl.constexpr = False,
):
    """Per (block of key channels, chunk x value head), after ``_bwd_intra_pair_kernel``: the reductions over V as
    whole-chunk dots (``dqg = dO h^T``, ``dkg = Vnew dH^T``, ``dX = -dY h^T``, ``[C, BK]``) and ``dGl = e^Gl sum_v
    dH h + sum_i kg_i dkg_i``; the chain rule through ``qg = scale q e^G``, ``kg = k e^E`` (``E_i = sum_{t > i}
    g_t``) and ``X = beta k e^G`` added to the intra-chunk parts in dq, dk, dG (fp32, read); the in-chunk
    reverse cumulative sum of dG plus dGl on every row gives dg. The totals go to ``dq_out``, ``dk_out``,
    ``dg_out`` (the fp32 inputs themselves, or tensors in the gradients' dtypes). dbeta's part ``sum_k k e^G dX``
    goes to slot ``i_k`` of ``db_ptr`` (the caller offsets it past the pairwise kernel's slots). q, k rows are ``QS``
    elements apart; ``L2``: raw rows, normalised by the forward's inverse norms ``rq, rk [NC, HV, C]``. ``GATE``: dg
    goes on through the gate's backward (``prep_triton._gate_grad`` at ``x = g_raw + dt_bias``), so ``dg_out`` gets
    d g_raw, ``pa [K / BK, NC x HV]`` this program's sum of dA_log and ``pb [NC x HV, K]`` its column sums of
    d dt_bias."""
    i_k = tl.program_id(0)
    sc, i_hv, i_h, bos, n = _chunk_head(tl.program_id(1), cbos_ptr, clen_ptr, H, HV)
    rows = tl.arange(0, C)
    rmask = rows < n
    ck = i_k * BK + tl.arange(0, BK)
    kmask = ck < K
    GS = HV * K
    dqg = tl.zeros([C, BK], dtype=tl.float32)
    dkg = tl.zeros([C, BK], dtype=tl.float32)
    dX = tl.zeros([C, BK], dtype=tl.float32)
    dgl = tl.zeros([BK], dtype=tl.float32)
    for v0 in range(0, V, BV):
        cv = v0 + tl.arange(0, BV)
        vmask = cv < V
        hm = kmask[:, None] & vmask[None, :]
        hoff = sc * (K * V) + ck[:, None] * V + cv[None, :]
        ht = tl.load(h_ptr + hoff, mask=hm, other=0.0)
        dht = tl.load(dH_ptr + hoff, mask=hm, other=0.0)
        roff = sc * (C * V) + rows[:, None] * V + cv[None, :]
        vn = tl.load(vn_ptr + roff, mask=vmask[None, :], other=0.0)
        dy = tl.load(dy_ptr + roff, mask=vmask[None, :], other=0.0)
        do = tl.load(
            do_ptr + (bos + rows)[:, None] * (HV * V) + i_hv * V + cv[None, :],
            mask=rmask[:, None] & vmask[None, :],
            other=0.0,
        ).to(h_ptr.dtype.element_ty)
        dgl += tl.sum(dht * ht.to(tl.float32), 1)
        dqg += _mm(do, tl.trans(ht), FP32)
        if dH_ptr.dtype.element_ty == vn_ptr.dtype.element_ty:  # (BWD_DH_16BIT, or fp32 inputs)
            dkg += _mm(vn, tl.trans(dht), FP32)
        else:
            dkg += _fdot(vn, tl.trans(dht), PREC)
        if dy_ptr.dtype.element_ty == h_ptr.dtype.element_ty:  # (BWD_DVN_16BIT, or fp32 inputs)
            dX -= _mm(dy, tl.trans(ht), FP32)
        else:
            dX -= _fdot(dy, tl.trans(ht), PREC)
    m = rmask[:, None] & kmask[None, :]
    qk_off = (bos + rows)[:, None] * QS + i_h * K + ck[None, :]
    off = (bos + rows)[:, None] * GS + i_hv * K + ck[None, :]
    kk = tl.load(k_ptr + qk_off, mask=m, other=0.0).to(tl.float32)
    qq = tl.load(q_ptr + qk_off, mask=m, other=0.0).to(tl.float32)
    if L2:
        kk = kk * tl.load(rk_ptr + sc * C + rows)[:, None]
        qq = qq * tl.load(rq_ptr + sc * C + rows)[:, None]
    Gt = tl.load(G_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
    eG = tl.exp(Gt)
    gl = tl.load(gl_ptr + sc * K + ck, mask=kmask, other=0.0)
    if EE_DIFF:  # kg's exponent as the forward's 16-bit path forms it: G_last - G (no scan of g)
        eE = tl.exp(gl[None, :] - Gt)
    else:  # a suffix sum of g
        gg = tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32)
        eE = tl.exp(tl.cumsum(gg, 0, reverse=True) - gg)
    bb = tl.load(b_ptr + (bos + rows) * HV + i_hv, mask=rmask, other=0.0).to(tl.float32)
    qe = scale * qq * eG  # d qg / d G
    kE = kk * eE
    X = bb[:, None] * kk * eG
    dq = tl.load(dq_ptr + off, mask=m, other=0.0) + scale * eG * dqg
    dk = tl.load(dk_ptr + off, mask=m, other=0.0) + bb[:, None] * eG * dX + eE * dkg
    dG = tl.load(dg_ptr + off, mask=m, other=0.0) + qe * dqg - kE * dkg + X * dX
    dgl = dgl * tl.exp(gl) + tl.sum(kE * dkg, 0)
    tl.store(dq_out + off, dq.to(dq_out.dtype.element_ty), mask=m)
    tl.store(dk_out + off, dk.to(dk_out.dtype.element_ty), mask=m)
    dG = tl.cumsum(dG, 0, reverse=True) + dgl[None, :]
    if GATE:
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        if HAS_DTB:
            x += tl.load(dtb_ptr + i_hv * K + ck, mask=kmask, other=0.0).to(tl.float32)[None, :]
        dG, da = _gate_grad(x, dG, tl.exp(tl.load(alog_ptr + i_hv).to(tl.float32)), lb, LOWER)
        dG = tl.where(m, dG, 0.0)
        tl.store(pa_ptr + i_k * tl.num_programs(1) + sc, tl.sum(tl.sum(tl.where(m, da, 0.0), 1), 0))
        tl.store(pb_ptr + sc * K + ck, tl.sum(dG, 0), mask=kmask)
    tl.store(dg_out + off, dG.to(dg_out.dtype.element_ty), mask=m)
    tl.store(db_ptr + i_k * n_tok + (bos + rows) * HV + i_hv, tl.sum(kk * eG * dX, 1), mask=rmask)


def bwd_state_pass_triton(st, do: torch.Tensor, dht: torch.Tensor | None):
    """Reverse pass on the GPU (or interpreter): (dVnew [NC,HV,C,V] fp32 (16-bit inputs with ``BWD_DVN_16BIT``:
    their dtype), dH [NC,HV,K,V] fp32 (16-bit inputs with ``BWD_DH_16BIT``: their dtype), dh0 [N,HV,K,V] fp32).

    ``st`` is a ``KDAFwdState`` (scratch dtype tensors); do ``[B, T, HV, V]`` in the token layout; dht or None.
    """
    NC, HV, C, K = st.qg.shape
    V = st.vn.shape[-1]
    N = st.s0.numel()
    dev = do.device
    fp32 = st.qg.dtype == torch.float32
    do = do.contiguous()
    dH = torch.empty(NC, HV, K, V, dtype=st.qg.dtype if BWD_DH_16BIT else torch.float32, device=dev)
    dvn = torch.empty(NC, HV, C, V, dtype=st.qg.dtype if BWD_DVN_16BIT else torch.float32, device=dev)
    dh0 = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    BK = max(16, triton.next_power_of_2(K))
    BV = state_block_v(BWD_STATE_BV, V, N * HV, dev, BWD_STATE_BV_CHOICES, BWD_STATE_FILL)
    _bwd_state_kernel[(triton.cdiv(V, BV), N * HV)](
        st.qg,
        st.kg,
        st.W,
        st.Aqk,
        st.Gl,
        do,
        dht.contiguous() if dht is not None else dh0,
        dH,
        dvn,
        dh0,
        st.cbos,
        st.clen,
        st.s0,
        st.snc,
        HV=HV,
        K=K,
        V=V,
        BK=BK,
        BV=BV,
        C=C,
        HAS_DHT=dht is not None,
        FP32=fp32,
        num_warps=BWD_LAUNCH["state"][0],
        num_stages=BWD_LAUNCH["state"][1],
    )
    return dvn, dH, dh0


# key channels per program of the pairwise kernel: 64 at 2 warps since session 32 (backward alone, H200, calls 6-7:
# 2.104 -> 1.835 ms at 8x4096x6 with init gates and fp32 beta, 2.840 -> 2.570 / 2.861 -> 2.730 at 1x8192x32 with fp32
# / bf16 beta; 64 at 4 / 1 warps 2.179 / 2.927 at 8x4096x6; the hybrid's step, pair kernel 8.68 -> 6.29 ms)
BWD_PAIR_BK = 64
# steps of the pair kernel's pairwise diagonal path (sharp gates) unrolled (tl.range's loop_unroll_factor; 1: none),
# for 16-bit and for fp32 beta (the untaken path's form changes how the whole kernel compiles). H200, backward alone,
# ms, 1 / 4 (8x4096x6 with --gates init, no block pairwise): at 32 channels, 4 warps, beta bf16 1x8192x32 3.140 / 3.135
# (s25 call6), 8x4096x6 2.404 / 2.637 (s26); beta fp32 8x4096x6 2.699 / 2.466 (s26 call4; step's pair kernel 10.80 /
# 8.68, s26 call3); at 64 channels, 2 warps, fp32 beta 1.835 / 1.854, 2.570 / 2.638 at 1x8192x32 (s32 call7). All 16
# steps as a tl.static_range (every step's loads hoisted): 4.146 ms at 1x8192x32 (s25 call6; removed).
BWD_PAIR_UNROLL = (1, 1)
# the pair kernel's diagonal blocks join its dots when |G_i - G_ref| <= this in the block (as INTRA_SPAN_MAX); < 0: none
BWD_SPAN_MAX = 60.0
BWD_DIAG_PREC16 = "ieee"  # the diagonal blocks' dots for 16-bit inputs (call6: tf32x3 same time, tf32 dg error 1.7x)
BWD_INTER_BK = 32  # key channels per program of the inter-chunk (reductions over V) kernel
BWD_INTER_BV = 64  # value columns per loop step of the inter-chunk kernel
# kg's exponent E = G_last - G in the inter kernel: "never" a suffix sum of g (a reverse scan, g loaded), "16bit" the
# difference of the stored prefix sums for 16-bit inputs (fp32 keeps the scan: FP32_KG_SUFFIX), "always" (tests). H200,
# s25 call1, backward at 1x8192x32: 3.368 / 3.372 ms "never", 3.202 "16bit" (sweep setting "inter ee scan")
BWD_EE_FROM_G = "16bit"
BWD_DY_BV = 32  # value columns per loop step of the dY kernel
# (num_warps, num_stages) of each backward launch; ptxas (sm_90a, bf16, K = V = 128, ptxas_regs.py): no spills but
# the pair kernel's at 64 channels / 2 warps (session 32, Triton 3.9: 255 registers, 316 bytes; faster regardless).
# The pair kernel: until session 25 2 warps, whole-chunk [C, BK] tiles and the pairwise diagonal path's 16 steps
# unrolled: 255 registers and 1 KB of spills (9.5 M local-memory requests a step under Nsight Compute, call2).
# Backward alone at 1 x 8192 x 32 / 8 x 2048 x 16 (H200, session 25 call3, sweep_kda_bwd.py): 3.357 / 3.337 ms so,
# 3.209 / 3.126 with the path as a loop, 3.214 / 3.150 with also one sub-block at a time, 3.105 / 3.016 with that
# at 4 warps (136 registers; at 64 key channels 3.281 / 3.202, at 16 4.544 / 4.449). dY / inter at 1 / 3 stages since
# s27 call6 (1x8192x32 / 8x4096x6, init gates): dY s1 2.886 / 2.274 ms, s3 2.886 / 2.277; inter s3 2.873 / 2.262,
# s1 2.921 / 2.283; both at s2 2.908 / 2.291. At 8x4096x6, s33 call1: inter / dY / state at 2 or 8 warps slower.
BWD_LAUNCH = dict(state=(4, 2), dy=(4, 1), pair=(2, 1), inter=(4, 3))


def bwd_reads_g(fp32: bool) -> bool:
    """Whether the backward reads the log-decay g itself (the inter kernel's suffix sum), not only G from the
    forward: with 16-bit (``fp32`` False) inputs and ``BWD_EE_FROM_G == "16bit"`` it does not, and g may be None."""
    return not (BWD_EE_FROM_G == "always" or (BWD_EE_FROM_G == "16bit" and not fp32))


class BwdPrep(NamedTuple):
    """What the training path hands the core backward so that it also takes the L2 norm's and the gate's parts:
    ``rq, rk`` the forward's fp32 inverse norms ``[NC, HV, C]`` (q, k are then the raw rows; the kernels normalise
    them as they load them, so no normalised copy is made) or None; ``gate`` = ``(g_raw, A_log, dt_bias,
    lower_bound)`` (dg then comes back as d g_raw, with dA_log and d dt_bias) or None."""

    rq: torch.Tensor | None = None
    rk: torch.Tensor | None = None
    gate: tuple | None = None


def bwd_intra_triton(q, k, v, g, beta, scale: float, st, do, dvn, dH, dv_out: torch.Tensor | None = None,
                     prep: BwdPrep | None = None) -> tuple:
    """Chunk-local backward after the reverse state pass: ``_bwd_dy_kernel``, ``_bwd_intra_pair_kernel``, then
    ``_bwd_inter_kernel``.

    q, k ``[B, T, H, K]``, v, do ``[B, T, HV, V]``, g ``[B, T, HV, K]`` (None where :func:`bwd_reads_g` is False:
    dg then comes back in fp32), beta ``[B, T, HV]`` (token layout); ``st``
    the forward intermediates; dvn ``[NC, HV, C, V]`` (overwritten with ``dY = T^T dVnew``) and dH
    ``[NC, HV, K, V]`` from :func:`bwd_state_pass_triton` (fp32, or the 16-bit inputs' dtype: ``BWD_DVN_16BIT``,
    ``BWD_DH_16BIT``). Returns dq, dk ``[B, T, H, K]``, dv ``[B, T, HV, V]``,
    dg ``[B, T, HV, K]`` in the dtypes of q, k, v, g (written so by the kernels: no cast passes; with grouped heads
    HV > H, dq and dk are summed over a head's value heads in fp32 first), and dbeta ``[B, T, HV]`` in fp32.
    ``dv_out``: where dv goes (``[B, T, HV, V]`` in v's dtype, each token's ``HV x V`` block contiguous and one token
    stride, e.g. the v third of the q|k|v gradient), else a new tensor. ``prep`` (:class:`BwdPrep`): the raw q, k
    with their inverse norms, and the gate's backward inside the inter kernel; then dg is d g_raw (g_raw's dtype)
    and the last item ``(dA_log, d dt_bias or None)``, else None.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NC, C = st.qg.shape[0], st.qg.shape[2]
    dev = q.device
    fp32 = st.qg.dtype == torch.float32
    prec = "ieee" if fp32 else "tf32"
    if g is None and bwd_reads_g(fp32):
        raise ValueError("kernels/kda/chunk_triton_bwd.py: g is None but the inter kernel reads it (BWD_EE_FROM_G)")
    prep = prep or BwdPrep()
    l2 = prep.rq is not None
    q, k, qs = qk_rows(q, k)
    beta, do = beta.contiguous(), do.contiguous()
    g = g.contiguous() if g is not None else None
    v, vs = token_rows(v)
    bk_pair = min(BWD_PAIR_BK, max(16, triton.next_power_of_2(K)))
    bk_inter = min(BWD_INTER_BK, max(16, triton.next_power_of_2(K)))
    BV = min(BWD_INTER_BV, max(16, triton.next_power_of_2(V)))
    nkt_pair, nkt_inter = triton.cdiv(K, bk_pair), triton.cdiv(K, bk_inter)
    f32 = dict(dtype=torch.float32, device=dev)
    n_tok = B * T * HV
    dv, dvs = _dv_rows(dv_out, (B, T, HV, V), v.dtype, dev)
    # dbeta partial sums: the pairwise kernel's K blocks, the inter kernel's K blocks, the dY kernel's V part
    db = torch.empty(nkt_pair + nkt_inter + 1, B, T, HV, **f32)
    dAq = torch.empty(NC, HV, C, C, **f32)
    dAk = torch.empty_like(dAq)
    dqv, dkv, dg = (torch.empty(B, T, HV, K, **f32) for _ in range(3))  # fp32 partial sums (pair -> inter)
    rq, rk = (prep.rq, prep.rk) if l2 else (st.G, st.G)  # (never read without L2)
    _bwd_dy_kernel[(NC * HV,)](
        st.T,
        do,
        st.vn,
        v,
        beta,
        dvn,
        dv,
        db[-1],
        dAq,
        dAk,
        st.cbos,
        st.clen,
        rq,
        rk,
        vs,
        dvs,
        HV=HV,
        V=V,
        BV=min(BWD_DY_BV, BV),
        C=C,
        FP32=fp32,
        PREC=prec,
        L2=l2,
        num_warps=BWD_LAUNCH["dy"][0],
        num_stages=BWD_LAUNCH["dy"][1],
    )
    S = 16
    _bwd_intra_pair_kernel[(nkt_pair, C // S, NC * HV)](
        q,
        k,
        rq,
        rk,
        beta,
        st.G,
        dAq,
        dAk,
        st.cbos,
        st.clen,
        dqv,
        dkv,
        dg,
        db,
        scale,
        n_tok,
        BWD_SPAN_MAX,
        H=H,
        HV=HV,
        K=K,
        BK=bk_pair,
        C=C,
        S=S,
        PREC=prec,
        DPREC="ieee" if fp32 else BWD_DIAG_PREC16,
        QS=qs,
        UNROLL=BWD_PAIR_UNROLL[beta.dtype == torch.float32],
        L2=l2,
        num_warps=BWD_LAUNCH["pair"][0],
        num_stages=BWD_LAUNCH["pair"][1],
    )
    # dA is dead once the pairwise kernel is queued: its blocks go back to the caching allocator (stream-ordered)
    # before the outputs are allocated, so they reuse them instead of raising the peak
    del dAq, dAk
    grouped = HV != H
    dq_out = dqv if grouped or q.dtype == torch.float32 else torch.empty(B, T, H, K, dtype=q.dtype, device=dev)
    dk_out = dkv if grouped or k.dtype == torch.float32 else torch.empty(B, T, H, K, dtype=k.dtype, device=dev)
    gate_args, gate_flags = _inter_gate(prep.gate, nkt_inter, NC * HV, K, st.G)
    if prep.gate is not None:
        dg_out = torch.empty(B, T, HV, K, dtype=prep.gate[0].dtype, device=dev)  # d g_raw
    elif g is not None and g.dtype != torch.float32:
        dg_out = torch.empty(B, T, HV, K, dtype=g.dtype, device=dev)
    else:
        dg_out = dg
    # (without g, EE_DIFF: the kernel never reads its pointer, which G stands in for)
    _bwd_inter_kernel[(nkt_inter, NC * HV)](
        q, k, rq, rk, g if g is not None else st.G, beta, st.G, st.Gl, do, st.vn, dvn, st.h, dH, st.cbos, st.clen,
        dqv, dkv, dg, dq_out, dk_out, dg_out, db[nkt_pair:], *gate_args, scale, n_tok,
        H=H, HV=HV, K=K, V=V, BK=bk_inter, BV=BV, C=C, FP32=fp32, PREC=prec, QS=qs, EE_DIFF=not bwd_reads_g(fp32),
        L2=l2, **gate_flags, num_warps=BWD_LAUNCH["inter"][0], num_stages=BWD_LAUNCH["inter"][1],
    )
    if grouped:
        dq_out, dk_out = (x.view(B, T, H, HV // H, K).sum(3).to(y.dtype) for x, y in ((dqv, q), (dkv, k)))
    gate_grads = None
    if prep.gate is not None:  # the partial sums [K / BK x NC, HV] and [NC, HV, K], as the gate kernel's
        _, A_log, dt_bias, _ = prep.gate
        gate_grads = gate_param_grads(gate_args[3].view(-1, HV), gate_args[4].view(-1, HV, K), A_log, dt_bias)
    return dq_out, dk_out, dv, dg_out, column_sum(db), gate_grads


def _inter_gate(gate: tuple | None, nk: int, nch: int, K: int, dummy: torch.Tensor) -> tuple[tuple, dict]:
    """The inter kernel's gate arguments for ``BwdPrep.gate``: ``(g_raw, A_log, dt_bias, pa, pb, lower bound)`` with
    ``pa [nk, nch]``, ``pb [nch, K]`` its fp32 partial-sum buffers, and its constants; or inert ones (``dummy`` for
    the pointers, never read)."""
    if gate is None:
        return (dummy,) * 5 + (0.0,), {}
    x, A_log, dt_bias, lower_bound = gate
    xc, a_log, dtb, lb, _, _, kw = _gate_args(x, A_log, dt_bias, lower_bound)
    # every program writes its entries, empty chunks included (the forward keeps at least one chunk a head)
    pa = torch.empty(nk, nch, dtype=torch.float32, device=x.device)
    pb = torch.empty(nch, K, dtype=torch.float32, device=x.device)
    return (xc, a_log, dtb, pa, pb, lb), dict(GATE=True, LOWER=kw["LOWER"], HAS_DTB=kw["HAS_DTB"])


def chunk_kda_bwd_triton(q, k, v, g, beta, scale: float, st, do: torch.Tensor, dht: torch.Tensor | None,
                         dv_out: torch.Tensor | None = None, prep: BwdPrep | None = None) -> KDAGrads:
    """Backward of the core op (q, k normalised ``[B, T, H, K]``, g the log-decay ``[B, T, HV, K]``) from the forward
    intermediates ``st`` (``KDAFwdState`` of ``chunk_kda_fwd_intermediates``). do ``[B, T, HV, V]``; dht
    ``[N, HV, K, V]`` or None; ``dv_out``: where dv goes (see :func:`bwd_intra_triton`). Returns :class:`KDAGrads`:
    dq, dk, dv, dg in the inputs' dtypes, dbeta and dh0 in fp32. Four kernels, no per-chunk copies of the inputs."""
    dvn, dH, dh0 = bwd_state_pass_triton(st, do, dht)
    *grads, gate = bwd_intra_triton(q, k, v, g, beta, scale, st, do, dvn, dH, dv_out, prep)
    return KDAGrads(*grads, dh0, *(gate or ()))


def _dv_rows(dv_out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, dev: torch.device
             ) -> tuple[torch.Tensor, int]:
    """dv's buffer and token stride: ``dv_out`` when given (checked), else a new contiguous tensor."""
    B, T, HV, V = shape
    if dv_out is None:
        return torch.empty(shape, dtype=dtype, device=dev), HV * V
    s = dv_out.stride()
    if dv_out.shape != shape or dv_out.dtype != dtype or s[3] != 1 or s[2] != V or (B > 1 and s[0] != T * s[1]):
        raise ValueError(f"kernels/kda/chunk_triton_bwd.py: dv_out must be {tuple(shape)} {dtype} with each token's "
                         f"HV x V block contiguous and one token stride, got {tuple(dv_out.shape)} {dv_out.dtype} "
                         f"strides {s}")
    return dv_out, s[1]

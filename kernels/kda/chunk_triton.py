"""Triton chunked KDA forward (``../shared/REFERENCE.md`` section 1), with a recompute-from-inputs backward.

Kernels (all fixed-configuration, so they run under ``TRITON_INTERPRET=1`` on a CPU):

1. ``_l2norm_kernel``: optional in-kernel L2 norm of q and k rows (fp32 maths, stored in the input dtype).
2. ``_prep_kernel``, one program per (chunk, value head):
   gate (softplus "unbounded" or sigmoid lower bound) in fp32 -> chunk-local cumulative sum G (fp32);
   intra-chunk scores in 16-row sub-blocks: pairs of sub-blocks ``J < I`` factored through the first row
   of ``I`` (both exponents <= 0), diagonal sub-blocks pairwise in fp32, one key column at a time;
   the unit-lower-triangular solve ``T = (I + Akk)^-1`` by forward substitution in fp32;
   ``W = T (beta K Gamma)``, ``U = T (beta V)``.
3. ``_state_out_kernel``, one program per (sequence, value head, block of value columns): the sequential
   pass over chunks with the fp32 state in registers, fused with the output
   ``O = (scale Q Gamma) S + Aqk Vnew``.

Scratch is laid out per chunk, padded to C rows: padded rows have g = 0 (so G carries the last valid
value and every exponent stays <= 0) and zero k, q, v, beta. All varlen bookkeeping is a host-side table
of chunks (token start, length) and of sequences (first chunk, number of chunks, first token); dense
batches are treated as B equal-length sequences. Offsets that can exceed 2^31 are int64.

Backward (:class:`ChunkKDAFunction`): recomputes from the saved inputs through the PyTorch chunked
implementation (``chunk_torch.py``) and autograd; no per-chunk states or O(T^2) buffers are saved from
the forward. This backward is not a Triton kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kda.chunk_torch import chunk_kda_torch, pack_varlen, unpack_varlen
from kernels.kda.naive import kda_gate_ref, l2norm_ref

CHUNK = 64
SUB = 16


@triton.jit
def _l2norm_kernel(x_ptr, y_ptr, R, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    m = (rows[:, None] < R) & (cols[None, :] < D)
    off = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gate(x, a_log, lb, LOWER: tl.constexpr):
    """fp32 gate: lower-bound sigmoid form or -exp(A_log) * softplus (identity above 20)."""
    a = tl.exp(a_log)
    if LOWER:
        return lb * tl.sigmoid(a * x)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    return -a * sp


@triton.jit
def _dot(a, b, FP32: tl.constexpr):
    if FP32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))


@triton.jit
def _prep_kernel(
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
    G_ptr,
    Akk_ptr,
    Aqk_ptr,
    W_ptr,
    U_ptr,
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
    FP32: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos = tl.load(cbos_ptr + i_c).to(tl.int64)
    n = tl.load(clen_ptr + i_c)
    rows = tl.arange(0, C)
    ck = tl.arange(0, BK)
    cv = tl.arange(0, BV)
    rmask = rows < n
    kmask = ck < K
    mk = rmask[:, None] & kmask[None, :]
    # gate and chunk-local cumulative sum (fp32); padded rows get g = 0
    g = tl.load(g_ptr + (bos + rows)[:, None] * (HV * K) + i_hv * K + ck[None, :], mask=mk, other=0.0).to(tl.float32)
    if GATE:
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
        if HAS_DTB:
            g = g + tl.load(dtb_ptr + i_hv * K + ck, mask=kmask, other=0.0).to(tl.float32)[None, :]
        g = tl.where(mk, _gate(g, a_log, lb, LOWER), 0.0)
    G = tl.cumsum(g, 0)
    sc = i_c.to(tl.int64) * HV + i_hv  # scratch slab index
    G_base = G_ptr + sc * (C * K)
    tl.store(G_base + rows[:, None] * K + ck[None, :], G, mask=kmask[None, :])
    tl.debug_barrier()
    A_base = sc * (C * C)
    r16 = tl.arange(0, S)
    for I in tl.static_range(C // S):
        ri = I * S + r16
        mi = (ri < n)[:, None] & kmask[None, :]
        qk_off = (bos + ri)[:, None] * (H * K) + i_h * K + ck[None, :]
        q_i = tl.load(q_ptr + qk_off, mask=mi, other=0.0).to(tl.float32)
        k_i = tl.load(k_ptr + qk_off, mask=mi, other=0.0).to(tl.float32)
        G_i = tl.load(G_base + ri[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        b_i = tl.load(beta_ptr + (bos + ri) * HV + i_hv, mask=ri < n, other=0.0).to(tl.float32)
        ref = tl.load(G_base + (I * S) * K + ck, mask=kmask, other=0.0)
        q_dec = q_i * tl.exp(G_i - ref[None, :])
        k_dec = k_i * tl.exp(G_i - ref[None, :])
        for J in tl.static_range(C // S):
            rj = J * S + r16
            if J < I:
                mj = (rj < n)[:, None] & kmask[None, :]
                k_j = tl.load(k_ptr + (bos + rj)[:, None] * (H * K) + i_h * K + ck[None, :], mask=mj, other=0.0)
                G_j = tl.load(G_base + rj[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
                kj_dec = tl.trans(k_j.to(tl.float32) * tl.exp(ref[None, :] - G_j))
                akk = tl.dot(k_dec, kj_dec, input_precision="ieee") * b_i[:, None]
                aqk = tl.dot(q_dec, kj_dec, input_precision="ieee") * scale
            elif J == I:
                akk = tl.zeros([S, S], dtype=tl.float32)
                aqk = tl.zeros([S, S], dtype=tl.float32)
                for j in tl.static_range(S):
                    rj1 = I * S + j
                    k_j = tl.load(
                        k_ptr + (bos + rj1) * (H * K) + i_h * K + ck, mask=kmask & ((ck * 0 + rj1) < n), other=0.0
                    )
                    G_j = tl.load(G_base + rj1 * K + ck, mask=kmask, other=0.0)
                    e = tl.where(r16[:, None] >= j, G_i - G_j[None, :], 0.0)
                    kd = k_j.to(tl.float32)[None, :] * tl.exp(e)
                    ckk = tl.sum(k_i * kd, 1)
                    cqk = tl.sum(q_i * kd, 1)
                    akk = tl.where(r16[None, :] == j, ckk[:, None], akk)
                    aqk = tl.where(r16[None, :] == j, cqk[:, None], aqk)
                akk = tl.where(r16[:, None] > r16[None, :], akk * b_i[:, None], 0.0)
                aqk = tl.where(r16[:, None] >= r16[None, :], aqk * scale, 0.0)
            else:
                akk = tl.zeros([S, S], dtype=tl.float32)
                aqk = tl.zeros([S, S], dtype=tl.float32)
            a_off = A_base + ri[:, None] * C + rj[None, :]
            tl.store(Akk_ptr + a_off, akk)
            tl.store(Aqk_ptr + a_off, aqk)
    tl.debug_barrier()
    # T = (I + Akk)^-1 by forward substitution, fp32
    A = tl.load(Akk_ptr + A_base + rows[:, None] * C + rows[None, :])
    X = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for i in range(1, C):
        a_i = tl.sum(tl.where(rows[:, None] == i, A, 0.0), 0)
        x_i = tl.where(rows == i, 1.0, 0.0) - tl.sum(a_i[:, None] * X, 0)
        X = tl.where(rows[:, None] == i, x_i[None, :], X)
    b = tl.load(beta_ptr + (bos + rows) * HV + i_hv, mask=rmask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + (bos + rows)[:, None] * (H * K) + i_h * K + ck[None, :], mask=mk, other=0.0).to(tl.float32)
    w = tl.dot(X, k * tl.exp(G) * b[:, None], input_precision="ieee")
    tl.store(W_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], w.to(W_ptr.dtype.element_ty), mask=kmask[None, :])
    mv = rmask[:, None] & (cv[None, :] < V)
    vv = tl.load(v_ptr + (bos + rows)[:, None] * (HV * V) + i_hv * V + cv[None, :], mask=mv, other=0.0)
    u = tl.dot(X, vv.to(tl.float32) * b[:, None], input_precision="ieee")
    tl.store(
        U_ptr + sc * (C * V) + rows[:, None] * V + cv[None, :], u.to(U_ptr.dtype.element_ty), mask=(cv < V)[None, :]
    )


@triton.jit
def _state_out_kernel(
    q_ptr,
    k_ptr,
    G_ptr,
    Aqk_ptr,
    W_ptr,
    U_ptr,
    h0_ptr,
    o_ptr,
    ht_ptr,
    sc0_ptr,
    snc_ptr,
    sbos_ptr,
    slen_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    C: tl.constexpr,
    HAS_H0: tl.constexpr,
    FP32: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    c0 = tl.load(sc0_ptr + i_n)
    nc = tl.load(snc_ptr + i_n)
    bos = tl.load(sbos_ptr + i_n).to(tl.int64)
    L = tl.load(slen_ptr + i_n)
    rows = tl.arange(0, C)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    kmask = ck < K
    vmask = cv < V
    s_off = (i_n.to(tl.int64) * HV + i_hv) * (K * V) + ck[:, None] * V + cv[None, :]
    smask = kmask[:, None] & vmask[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_off, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    for c in range(0, nc):
        sc = (c0 + c).to(tl.int64) * HV + i_hv
        t0 = c * C
        rmask = (t0 + rows) < L
        mk = rmask[:, None] & kmask[None, :]
        tok = bos + t0 + rows
        G = tl.load(G_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        g_last = tl.load(G_ptr + sc * (C * K) + (C - 1) * K + ck, mask=kmask, other=0.0)
        w = tl.load(W_ptr + sc * (C * K) + rows[:, None] * K + ck[None, :], mask=kmask[None, :], other=0.0)
        u = tl.load(U_ptr + sc * (C * V) + rows[:, None] * V + cv[None, :], mask=vmask[None, :], other=0.0)
        v_new = u.to(tl.float32) - _dot(w, S, FP32)
        q = tl.load(q_ptr + tok[:, None] * (H * K) + i_h * K + ck[None, :], mask=mk, other=0.0).to(tl.float32)
        aqk = tl.load(Aqk_ptr + sc * (C * C) + rows[:, None] * C + rows[None, :])
        o = _dot(q * scale * tl.exp(G), S, FP32) + _dot(aqk, v_new, FP32)
        tl.store(
            o_ptr + tok[:, None] * (HV * V) + i_hv * V + cv[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=rmask[:, None] & vmask[None, :],
        )
        k = tl.load(k_ptr + tok[:, None] * (H * K) + i_h * K + ck[None, :], mask=mk, other=0.0).to(tl.float32)
        k_tail = k * tl.exp(g_last[None, :] - G)
        S = S * tl.exp(g_last)[:, None] + _dot(tl.trans(k_tail), v_new, FP32)
    tl.store(ht_ptr + s_off, S, mask=smask)


def _tables(T: int, B: int, cu_seqlens: torch.Tensor | None, device: torch.device):
    """Chunk table (token start, length) and sequence table (first chunk, chunks, first token, length)."""
    if cu_seqlens is None:
        bounds = [(b * T, (b + 1) * T) for b in range(B)]
    else:
        cs = [int(c) for c in cu_seqlens.tolist()]
        bounds = list(zip(cs[:-1], cs[1:]))
    cbos, clen, s0, snc, sbos, slen = [], [], [], [], [], []
    for bos, eos in bounds:
        s0.append(len(cbos))
        for t in range(bos, eos, CHUNK):
            cbos.append(t)
            clen.append(min(CHUNK, eos - t))
        snc.append(len(cbos) - s0[-1])
        sbos.append(bos)
        slen.append(eos - bos)
    as_t = lambda x: torch.tensor(x if x else [0], dtype=torch.int32, device=device)
    return len(cbos), [as_t(x) for x in (cbos, clen)], [as_t(x) for x in (s0, snc, sbos, slen)]


def l2norm_triton(x: torch.Tensor) -> torch.Tensor:
    D = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    R = xc.numel() // D
    ROWS = 16
    if R:
        _l2norm_kernel[(triton.cdiv(R, ROWS),)](xc, y, R, D=D, BD=triton.next_power_of_2(D), ROWS=ROWS)
    return y


def chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    """Forward only. Returns o [B, T, HV, V] (v's dtype) and the final state [N, HV, K, V] fp32."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    fp32 = q.dtype == torch.float32 or v.dtype == torch.float32
    if use_l2:
        q, k = l2norm_triton(q), l2norm_triton(k)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    nch, (cbos, clen), (s0, snc, sbos, slen) = _tables(T, B, cu_seqlens, dev)
    N = s0.numel() if cu_seqlens is not None else B
    BK, BV = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    sdt = torch.float32 if fp32 else v.dtype
    G = torch.empty(max(nch, 1), HV, CHUNK, K, dtype=torch.float32, device=dev)
    Akk = torch.empty(max(nch, 1), HV, CHUNK, CHUNK, dtype=torch.float32, device=dev)
    Aqk = torch.empty_like(Akk)
    W = torch.empty(max(nch, 1), HV, CHUNK, K, dtype=sdt, device=dev)
    U = torch.empty(max(nch, 1), HV, CHUNK, V, dtype=sdt, device=dev)
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    if nch:
        _prep_kernel[(nch, HV)](
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
            G,
            Akk,
            Aqk,
            W,
            U,
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
            FP32=fp32,
            num_warps=4,
        )
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    h0 = initial_state.contiguous() if initial_state is not None else dummy
    BVs = min(BV, 32) if not fp32 else min(BV, 32)
    _state_out_kernel[(N, HV, triton.cdiv(V, BVs))](
        q,
        k,
        G,
        Aqk,
        W,
        U,
        h0,
        o,
        ht,
        s0,
        snc,
        sbos,
        slen,
        scale,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=BK,
        BV=BVs,
        C=CHUNK,
        HAS_H0=initial_state is not None,
        FP32=fp32,
        num_warps=4,
    )
    return o, ht


def _torch_reference_path(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    """The same function through the PyTorch chunked path (used to recompute in backward)."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    cdt = torch.float32
    q, k = q.to(cdt), k.to(cdt)
    if use_l2:
        q, k = l2norm_ref(q), l2norm_ref(k)
    if use_gate:
        g = kda_gate_ref(g, A_log, dt_bias, lower_bound)
    HV, H = v.shape[2], q.shape[2]
    if HV > H:
        q, k = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
    if cu_seqlens is None:
        return chunk_kda_torch(q, k, v, g, beta, scale, initial_state)
    packed = [pack_varlen(x, cu_seqlens) for x in (q, k, v, g.to(cdt), beta)]
    o, S = chunk_kda_torch(*(p[0] for p in packed), scale, initial_state)
    return unpack_varlen(o, packed[0][1]), S


class ChunkKDAFunction(torch.autograd.Function):
    """Triton forward; backward recomputes through the PyTorch chunked path from the saved inputs."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, A_log, dt_bias, scale, cu_seqlens, use_l2, use_gate, lower_bound):
        flags = (use_l2, use_gate, A_log, dt_bias, lower_bound)
        o, ht = chunk_kda_fwd_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags)
        ctx.save_for_backward(q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens)
        ctx.meta = (scale, use_l2, use_gate, lower_bound)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0, A_log, dt_bias, cu = ctx.saved_tensors
        scale, use_l2, use_gate, lower_bound = ctx.meta
        inputs = [q, k, v, g, beta, h0, A_log, dt_bias]
        need = [x is not None and ctx.needs_input_grad[i] for i, x in enumerate(inputs)]
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(nd) if x is not None else None for x, nd in zip(inputs, need)]
            flags = (use_l2, use_gate, leaves[6], leaves[7], lower_bound)
            o, ht = _torch_reference_path(*leaves[:5], scale, leaves[5], cu, flags)
            outs, grads_in = [o], [do]
            if dht is not None:
                outs.append(ht)
                grads_in.append(dht)
            wrt = [x for x, nd in zip(leaves, need) if nd]
            got = iter(torch.autograd.grad(outs, wrt, grads_in, allow_unused=True)) if wrt else iter(())
        grads = [next(got) if nd else None for nd in need]
        return (*grads, None, None, None, None, None)


def chunk_kda_triton(q, k, v, g, beta, scale, initial_state, cu_seqlens, flags):
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    return ChunkKDAFunction.apply(
        q, k, v, g, beta, initial_state, A_log, dt_bias, scale, cu_seqlens, use_l2, use_gate, lower_bound
    )

"""Triton fused recurrent KDA (decode): the token loop of ``../shared/REFERENCE.md`` section 1 in one kernel.

One program per (sequence, value head, block of value columns) holds its ``[K, BV]`` fp32 slice of the state in
registers (BV = 32, 4 warps; a one-warp BV = 8 launch measured 313 vs 123 us on an H100 at batch 64, H 32, and was
removed) for all of the sequence's tokens; per token it applies the optional in-kernel L2 norm of q and k and the
optional gate, decays the key rows, makes the delta-rule update on the decayed state and reads out
``o = S^T (scale q)``. The state comes from ``initial_state[n]`` or, with ``ssm_state_indices``, from
``pool[ssm_state_indices[n]]`` (written back in place into the same slot).
Fixed configuration (runs under ``TRITON_INTERPRET=1``). Forward only: decode needs no gradient.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.kda.prep_triton import _gate

DECODE_BV = 32  # value columns per program (4 warps)


@triton.jit
def _recurrent_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    alog_ptr,
    dtb_ptr,
    lb,
    h0_ptr,
    idx_ptr,
    o_ptr,
    ht_ptr,
    sbos_ptr,
    slen_ptr,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2: tl.constexpr,
    GATE: tl.constexpr,
    LOWER: tl.constexpr,
    HAS_DTB: tl.constexpr,
    HAS_H0: tl.constexpr,
    HAS_IDX: tl.constexpr,
    STORE: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos = tl.load(sbos_ptr + i_n).to(tl.int64)
    L = tl.load(slen_ptr + i_n)
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    kmask = ck < K
    vmask = cv < V
    smask = kmask[:, None] & vmask[None, :]
    slot = i_n.to(tl.int64)
    if HAS_IDX:
        slot = tl.load(idx_ptr + i_n).to(tl.int64)
    s_off = (slot * HV + i_hv) * (K * V) + ck[:, None] * V + cv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_off, mask=smask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    if GATE:
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
        if HAS_DTB:
            dtb = tl.load(dtb_ptr + i_hv * K + ck, mask=kmask, other=0.0).to(tl.float32)
    for t in range(0, L):
        tok = bos + t
        q = tl.load(q_ptr + tok * (H * K) + i_h * K + ck, mask=kmask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + tok * (H * K) + i_h * K + ck, mask=kmask, other=0.0).to(tl.float32)
        if L2:
            q = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
        g = tl.load(g_ptr + tok * (HV * K) + i_hv * K + ck, mask=kmask, other=0.0).to(tl.float32)
        if GATE:
            if HAS_DTB:
                g = g + dtb
            g = tl.where(kmask, _gate(g, a_log, lb, LOWER), 0.0)
        b = tl.load(beta_ptr + tok * HV + i_hv).to(tl.float32)
        v = tl.load(v_ptr + tok * (HV * V) + i_hv * V + cv, mask=vmask, other=0.0).to(tl.float32)
        S = S * tl.exp(g)[:, None]
        u = v - tl.sum(S * k[:, None], 0)
        S = S + (b * k)[:, None] * u[None, :]
        o = tl.sum(S * (q * scale)[:, None], 0)
        tl.store(o_ptr + tok * (HV * V) + i_hv * V + cv, o.to(o_ptr.dtype.element_ty), mask=vmask)
    if STORE:
        tl.store(ht_ptr + s_off, S, mask=smask)


@functools.lru_cache(maxsize=64)
def _dense_tables(B: int, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read-only launch tables of a dense ``[B, T]`` batch: sequence starts, lengths and a 1-element fp32 stand-in for
    absent pointer arguments. Cached: decode calls with the same ``B, T`` every token and is launch-bound, and these
    were 4 of a KDA layer's ~50 host operators a token."""
    sbos = torch.arange(B, dtype=torch.int32, device=device) * T
    return sbos, torch.full((B,), T, dtype=torch.int32, device=device), _dummy(device)


@functools.lru_cache(maxsize=16)
def _dummy(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.float32, device=device)


def fused_recurrent_kda_triton(
    q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, ssm_state_indices, flags
):
    """Returns o [B, T, HV, V] (v's dtype) and the final state ([N, HV, K, V] fp32, or the updated pool)."""
    use_l2, use_gate, A_log, dt_bias, lower_bound = flags
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    if cu_seqlens is None:
        sbos, slen, dummy = _dense_tables(B, T, dev)
    else:
        cs = cu_seqlens.to(device=dev, dtype=torch.int32)
        sbos, slen, dummy = cs[:-1].contiguous(), (cs[1:] - cs[:-1]).contiguous(), _dummy(dev)
    N = sbos.numel()
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=dev)
    pool = ssm_state_indices is not None
    if pool:
        ht = initial_state
    else:
        ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=dev)
    BK = max(16, triton.next_power_of_2(K))
    BV = min(max(16, triton.next_power_of_2(V)), DECODE_BV)  # [K, 32] state slices
    if N:
        _recurrent_kernel[(N, HV, triton.cdiv(V, BV))](
            q,
            k,
            v,
            g,
            beta,
            A_log if use_gate else dummy,
            dt_bias if (use_gate and dt_bias is not None) else dummy,
            float(lower_bound) if lower_bound is not None else 0.0,
            initial_state.contiguous() if initial_state is not None else dummy,
            ssm_state_indices.to(device=dev, dtype=torch.int32) if pool else sbos,
            o,
            ht,
            sbos,
            slen,
            scale,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BV=BV,
            L2=use_l2,
            GATE=use_gate,
            LOWER=lower_bound is not None,
            HAS_DTB=dt_bias is not None,
            HAS_H0=initial_state is not None,
            HAS_IDX=pool,
            STORE=output_final_state or not pool,
            num_warps=4,
        )
    if not output_final_state:
        return o, None
    return o, ht

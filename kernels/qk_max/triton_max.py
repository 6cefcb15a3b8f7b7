"""Fused Triton pass for the per-head max pre-softmax logit (GPU; also runs under ``TRITON_INTERPRET=1``).

Same contract as :func:`kernels.qk_max.chunked.max_logits_per_head_chunked` (the reference it is tested
against). One program per (batch, head, block of BLOCK_M queries) streams key blocks, computes
``scale * q . k`` in fp32 registers, applies the causal / same-segment / key-padding masks and keeps the
row max; nothing of the ``T x S`` matrix is written. Per-program maxima ``[B, H, n_blocks]`` are reduced
with ``amax`` afterwards (deterministic, no float atomics).
Packed sequences are given as one segment id per token (from ``cu_seqlens``) plus, per token, the key
window ``[lo, hi)`` of its segment within its batch row: a query block only streams the key blocks between
its first row's ``lo`` and its last row's ``hi``, so the work is the sum over documents of ``len^2`` rather than
``(B*T)^2`` (the skipped blocks hold no visible pair, so the result is the same).
"""

from __future__ import annotations

import os
import weakref

import torch
import triton
import triton.language as tl


@triton.jit
def _qk_max_kernel(
    q_ptr, k_ptr, seg_ptr, lo_ptr, hi_ptr, kmask_ptr, out_ptr, scale,
    T, S, H, D, n_mblocks,
    sqb, sqt, sqh, skb, sks, skh,
    CAUSAL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < T
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    if IEEE:
        q = q.to(tl.float32)
    if HAS_SEG:
        seg_q = tl.load(seg_ptr + b * T + offs_m, mask=m_ok, other=-1)
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    n_start = 0
    n_end = S
    if CAUSAL:
        n_end = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    if HAS_SEG:  # rows are in segment order: the block's keys lie in [lo(first row), hi(last row))
        m_last = tl.minimum((pid_m + 1) * BLOCK_M, T) - 1
        n_start = (tl.load(lo_ptr + b * T + pid_m * BLOCK_M) // BLOCK_N) * BLOCK_N
        n_end = tl.minimum(n_end, tl.load(hi_ptr + b * T + m_last))
    for n0 in range(n_start, n_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S
        k = tl.load(k_ptr + b * skb + h * skh + offs_n[:, None] * sks + offs_d[None, :],
                    mask=n_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        if IEEE:
            logits = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        else:  # 16-bit inputs: exact products, fp32 accumulation on the tensor cores
            logits = tl.dot(q, tl.trans(k)) * scale
        vis = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            vis = vis & (offs_n[None, :] <= offs_m[:, None] + (S - T))
        if HAS_SEG:
            seg_k = tl.load(seg_ptr + b * S + offs_n, mask=n_ok, other=-2)
            vis = vis & (seg_q[:, None] == seg_k[None, :])
        if HAS_KMASK:
            km = tl.load(kmask_ptr + b * S + offs_n, mask=n_ok, other=0)
            vis = vis & (km[None, :] != 0)
        logits = tl.where(vis, logits, float("-inf"))
        row_max = tl.maximum(row_max, tl.max(logits, axis=1))
    tl.store(out_ptr + pid_bh * n_mblocks + pid_m, tl.max(row_max, axis=0))


_WINDOWS: list[tuple[weakref.ref, int, int, int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = []


def cached_segment_windows(cu_seqlens: torch.Tensor, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`segment_windows`, computed once per ``cu_seqlens`` tensor (identity and in-place version) and shape:
    every layer of one forward passes the same bounds, and the windows cost ~10 small kernels each time."""
    try:
        version = cu_seqlens._version
    except RuntimeError:  # an inference-mode tensor has no version counter: never cached
        return segment_windows(cu_seqlens, B, T)
    for ref, ver, b, t, windows in _WINDOWS:
        if ref() is cu_seqlens and ver == version and (b, t) == (B, T):
            return windows
    windows = segment_windows(cu_seqlens, B, T)
    _WINDOWS[:] = [e for e in _WINDOWS if e[0]() is not None][-3:] + [(weakref.ref(cu_seqlens), version, B, T, windows)]
    return windows


def segment_windows(cu_seqlens: torch.Tensor, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token of the flattened ``[B*T]`` axis: its segment index and its segment's key window ``[lo, hi)``
    clipped to its own batch row, in row coordinates (int32 ``[B*T]`` each; no host synchronisation)."""
    bounds = cu_seqlens.to(torch.long)
    pos = torch.arange(B * T, device=bounds.device)
    seg = torch.searchsorted(bounds[1:], pos, right=True).clamp_(max=bounds.numel() - 2)
    row0 = pos - pos % T
    lo = torch.maximum(bounds[seg], row0) - row0
    hi = torch.minimum(bounds[seg + 1], row0 + T) - row0
    return seg.to(torch.int32), lo.to(torch.int32), hi.to(torch.int32)


def max_logits_per_head_triton(
    q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
    cu_seqlens: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
    block_m: int | None = None, block_n: int = 64,
) -> torch.Tensor:
    """Per-head max of ``scale * q_i . k_j`` over visible pairs; fp32 ``[H]``; inputs already validated.

    bf16/fp16 q and k (same dtype) go through the tensor cores (bf16 x bf16 products are exact in fp32, sums in
    fp32: the fp32 reference up to summation order) in 128-row query blocks; anything else is cast to fp32 and
    multiplied in IEEE fp32 (64-row blocks), as are all inputs under ``TRITON_INTERPRET=1``."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    B, T, H, D = q.shape
    S = k.shape[1]
    seg = lo = hi = None
    if cu_seqlens is not None:
        cu = cu_seqlens if cu_seqlens.device == q.device else cu_seqlens.to(q.device)
        seg, lo, hi = cached_segment_windows(cu, B, T)
    kmask = key_padding_mask.to(device=q.device, dtype=torch.int32).contiguous() if key_padding_mask is not None else None
    # the interpreter's 16-bit tl.dot returns garbage (triton 3.x on CPU): it takes the fp32 path
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    ieee = interpreted or not (q.dtype == k.dtype and q.dtype in (torch.bfloat16, torch.float16))
    block_m = block_m or (64 if ieee else 128)
    n_mblocks = triton.cdiv(T, block_m)
    partial = torch.full((B * H, n_mblocks), float("-inf"), dtype=torch.float32, device=q.device)
    if T == 0 or S == 0:
        return torch.full((H,), float("-inf"), dtype=torch.float32, device=q.device)
    dummy = partial
    _qk_max_kernel[(n_mblocks, B * H)](
        q, k, *(t if t is not None else dummy for t in (seg, lo, hi)), kmask if kmask is not None else dummy, partial, float(scale),
        T, S, H, D, n_mblocks,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        CAUSAL=causal, HAS_SEG=seg is not None, HAS_KMASK=kmask is not None, IEEE=ieee,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(D)),
        num_warps=4 if ieee else 8,
    )
    return partial.view(B, H, n_mblocks).amax(dim=(0, 2))

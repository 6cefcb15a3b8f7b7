"""Per-head max pre-softmax logit over visible pairs: the statistic QK-Clip needs (Kimi K2, MuonClip).

Flash-attention kernels do not return the row max, so this is a separate pass over q and k that never
materialises the whole ``T x S`` logit matrix. Public entry point: :func:`max_logits_per_head`.

- ``naive.py``: full-matrix fp64 specification (tests only).
- ``chunked.py``: PyTorch, chunked over query rows and packed segments (CPU, and GPU fallback).
- ``triton_max.py``: fused Triton pass (GPU; also runs under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os

import torch

from kernels.backend import require_triton_device
from kernels.host_ints import host_ints
from kernels.qk_max.chunked import max_logits_per_head_chunked
from kernels.qk_max.naive import max_logits_per_head_naive

__all__ = ["max_logits_per_head", "max_logits_per_head_chunked", "max_logits_per_head_naive"]

_BACKENDS = (None, "torch", "triton")


def _check_inputs(
    q: torch.Tensor, k: torch.Tensor, causal: bool, cu_seqlens: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
) -> None:
    where = "kernels/qk_max.max_logits_per_head"
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"{where}: q [B,T,H,D] and k [B,S,H,D] must be 4-D, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"{where}: q {tuple(q.shape)} and k {tuple(k.shape)} must share B, H and D")
    B, T, _, _ = q.shape
    S = k.shape[1]
    if cu_seqlens is not None:
        if T != S:
            raise ValueError(f"{where}: cu_seqlens needs T == S, got q {tuple(q.shape)}, k {tuple(k.shape)}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"{where}: cu_seqlens must be 1-D [N+1], got shape {tuple(cu_seqlens.shape)}")
        c = host_ints(cu_seqlens)
        if c[0] != 0 or c[-1] != B * T or any(b < a for a, b in zip(c[:-1], c[1:])):
            raise ValueError(f"{where}: cu_seqlens must rise from 0 to B*T={B * T}, got {c}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (B, S):
        raise ValueError(f"{where}: key_padding_mask must be [B, S]=({B}, {S}), got {tuple(key_padding_mask.shape)}")


@torch.compiler.disable  # host-side bounds (host_ints) and per-segment loops: runs eagerly inside compiled regions
def max_logits_per_head(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    causal: bool,
    cu_seqlens: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Per-head max of ``scale * q_i . k_j`` over the visible pairs of the batch.

    Args:
        q: ``[B, T, H, D]`` queries (any float dtype; maths in fp32).
        k: ``[B, S, H, D]`` keys (same B, H, D; expand GQA/MLA shared keys to H heads first).
        scale: softmax scale (e.g. ``D ** -0.5``).
        causal: key j visible from query i iff ``j <= i + (S - T)`` (bottom-right aligned).
        cu_seqlens: optional int ``[N + 1]`` segment bounds over the flattened ``B * T`` tokens
            (``T == S``); only pairs inside one segment are visible (block-diagonal).
        key_padding_mask: optional ``[B, S]`` bool/int, True/1 = real key; masked keys are invisible.
        backend: ``None`` (reads ``KVL_QK_MAX_BACKEND``, else Triton on CUDA, PyTorch on CPU),
            ``"torch"`` or ``"triton"``.

    Returns:
        fp32 ``[H]``; ``-inf`` for a head with no visible pair. No gradient.

    Example:
        >>> q = torch.randn(2, 16, 4, 8); k = torch.randn(2, 16, 4, 8)
        >>> max_logits_per_head(q, k, 8 ** -0.5, causal=True).shape
        torch.Size([4])
    """
    _check_inputs(q, k, causal, cu_seqlens, key_padding_mask)
    if backend not in _BACKENDS:
        raise ValueError(f"kernels/qk_max: backend must be one of {_BACKENDS}, got {backend!r}")
    backend = backend or os.environ.get("KVL_QK_MAX_BACKEND") or ("triton" if q.is_cuda else "torch")
    if backend not in _BACKENDS:
        raise ValueError(f"kernels/qk_max: KVL_QK_MAX_BACKEND must be one of {_BACKENDS[1:]}, got {backend!r}")
    if backend == "triton":
        require_triton_device(q.device, "max_logits_per_head (kernels/qk_max)")
    with torch.no_grad():
        if backend == "triton":
            from kernels.qk_max.triton_max import max_logits_per_head_triton

            return max_logits_per_head_triton(q, k, scale, causal, cu_seqlens, key_padding_mask)
        return max_logits_per_head_chunked(q, k, scale, causal, cu_seqlens, key_padding_mask)

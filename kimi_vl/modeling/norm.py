"""RMSNorm and the per-head gated RMSNorm of the KDA output (Kimi Linear; T5/LLaMA RMSNorm); the token embedding.

Numerics follow transformers' ``kimi_linear``: statistics in fp32; ``RMSNorm`` casts back to the input
dtype before the gain, ``GatedRMSNorm`` keeps the gain and the sigmoid gate in fp32. The maths lives in
``kernels.norm`` (fused Triton kernels on CUDA, the PyTorch reference elsewhere; ``KVL_NORM_BACKEND``).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.embedding import embedding
from kernels.norm import gated_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm (one gain of size V shared by heads) times ``sigmoid(gate)``: ``[..., H, V] -> [..., H, V]``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` (same parameter, state dict and options) whose weight gradient comes from
    ``kernels.embedding``'s deterministic kernels on CUDA (``KVL_EMBEDDING_BACKEND``); with ``padding_idx``,
    ``max_norm``, ``scale_grad_by_freq`` or ``sparse`` set it is plain ``nn.Embedding``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if (self.padding_idx is not None or self.max_norm is not None or self.scale_grad_by_freq
                or self.sparse):
            return super().forward(ids)
        return embedding(ids, self.weight)

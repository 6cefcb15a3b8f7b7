"""RMSNorm and the per-head gated RMSNorm of the KDA output (Kimi Linear; T5/LLaMA RMSNorm).

Numerics follow transformers' ``kimi_linear``: statistics in fp32; ``RMSNorm`` casts back to the input
dtype before the gain, ``GatedRMSNorm`` keeps the gain and the sigmoid gate in fp32. The maths lives in
``kernels.norm`` (fused Triton kernels on CUDA, the PyTorch reference elsewhere; ``KVL_NORM_BACKEND``).
"""

from __future__ import annotations

import torch
from torch import nn

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

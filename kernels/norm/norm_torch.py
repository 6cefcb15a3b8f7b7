"""PyTorch RMSNorm, gated RMSNorm, LayerNorm and SwiGLU activation: the references of ``norm_triton.py`` and the CPU path.

Numerics follow transformers' ``kimi_linear`` (``kimi_vl/modeling/norm.py`` states them): statistics in fp32;
``rms_norm`` rounds the normalised input to the input dtype before the gain; ``gated_rms_norm`` keeps the gain
and the sigmoid gate in fp32 and rounds once; ``silu_mul`` is ``silu(gate) * up`` in the input dtype.
Shapes: x ``[..., D]``, weight ``[D]``, gate like x; ``gate_up [..., 2I] -> [..., I]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps)).to(x.dtype)`` over the last dim."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def gated_rms_norm_torch(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``(weight * x / sqrt(mean(x^2) + eps) * sigmoid(gate))`` in fp32, rounded to x's dtype once."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf * torch.sigmoid(gate.float())).to(x.dtype)


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate_up[..., :I]) * gate_up[..., I:]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def layer_norm_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.layer_norm`` over the last dim in fp32 (statistics, gain and bias), rounded to x's dtype once."""
    return F.layer_norm(x.float(), x.shape[-1:], weight.float(), bias.float(), eps).to(x.dtype)

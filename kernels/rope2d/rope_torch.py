"""PyTorch rotate-half RoPE with per-token ``cos/sin`` tables: the reference of ``rope_triton.py`` and the CPU path.

``out = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``, computed in
fp32 (each product and the sum rounded separately) and cast back to x's dtype once. The 2-D structure of MoonViT's
RoPE lives entirely in ``cos/sin`` (``vision_encoder/rope_2d.py`` builds them); this maths is the same as
``vision_encoder.rope_2d.apply_rope_2d``, which calls it.

Shapes: x ``[..., H, D]``; cos, sin ``[..., D]`` (x's leading dims), fp32.
"""

from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., H, D]`` with ``cos/sin [..., D]`` (computed in fp32, cast back to ``x.dtype``)."""
    xf = x.float()
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return (xf * c + _rotate_half(xf) * s).to(x.dtype)

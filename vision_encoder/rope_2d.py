"""2-D rotary position embedding for MoonViT (REFERENCE.md section 5), in the layout of transformers'
``Kimi_K25VisionRotaryEmbedding`` so converted checkpoints need no weight permutation.

Frequencies ``f_j = theta^(-4j / D)`` for ``j < D/4`` (the same ladder for rows and columns). Rotate-half
layout: channel ``c`` pairs with ``c + D/2``; for ``c < D/2`` the angle is ``col * f_{c//2}`` when ``c`` is
even and ``row * f_{c//2}`` when odd. Half the rotary pairs therefore encode the column, half the row.

Shapes: ``P`` = packed patches, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

import torch

from kernels.rope2d.rope_torch import rope_torch


def rope_inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """``[D/4]`` fp32 inverse frequencies."""
    half = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half))


def patch_positions(grid_thw: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """``[P, 2]`` long (row, col) of every packed patch: row-major per frame, repeated over ``t``.

    The readable per-chunk reference; the model takes the same positions, as (col, row), from the host-built
    ``packed_tables`` (tested equal)."""
    parts = []
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h, device=device).repeat_interleave(w)
        cols = torch.arange(w, device=device).repeat(h)
        parts.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
    if not parts:
        return torch.zeros(0, 2, dtype=torch.long, device=device)
    return torch.cat(parts)


def rope_cos_sin(positions_P2: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``cos, sin`` of shape ``[P, D]`` for (row, col) positions."""
    freqs = positions_P2[:, :, None].float() * inv_freq.to(positions_P2.device)[None, None, :]  # [P, 2, D/4]
    angles = freqs.flip(1).transpose(1, 2).reshape(positions_P2.shape[0], -1)  # [P, D/2]: col, row, col, row...
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rope_cos_sin_colrow(colrow_P2: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_cos_sin` of (col, row) positions of any integer dtype, in three ops (multiply, cos, sin): the
    ``[P, 2, D/4, 2]`` angle grid (both halves; col and row interleaved) is one broadcast product, and
    ``int * fp32`` rounds exactly like ``positions.float() * inv_freq``."""
    P, J = colrow_P2.shape[0], inv_freq.numel()
    freq = inv_freq.to(colrow_P2.device).view(1, 1, J, 1).expand(1, 2, J, 2)
    angles = (colrow_P2.view(P, 1, 1, 2) * freq).reshape(P, 4 * J)
    return angles.cos(), angles.sin()


def apply_rope_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., H, D]`` with ``cos/sin [..., D]`` (computed in fp32, cast back to ``x.dtype``).

    The reference and the CPU path (``kernels.rope2d.rope_torch``); the encoder rotates q and k together with
    ``kernels.rope2d.rope_2d``, whose Triton kernel is bit-identical to this."""
    return rope_torch(x, cos, sin)

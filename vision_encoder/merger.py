"""Temporal pooling + 2x2 patch merge, and the MoonViT -> LLM projector (REFERENCE.md section 5).

Checked against transformers' ``kimi_k25`` (``get_vision_temporal_merge_index`` + ``Kimi_K25MultimodalProjection``):
the encoder output of a chunk ``(t, h, w)`` is averaged over ``t``; each 2x2 block of neighbouring patches
becomes one token whose 4 patch vectors are ordered (row, col) = (0,0), (0,1), (1,0), (1,1); tokens are in
row-major order of the blocks. The projector applies LayerNorm to each patch vector (width ``w``), then
concatenates the 4 vectors (``4w``) and runs ``Linear(4w, 4w) -> GELU (exact) -> Linear(4w, d_lm)``.

Shapes: ``P`` packed patches, ``N`` merged tokens, ``K = merge**2``, ``D`` vision width.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def merge_index(grid_thw: torch.Tensor, merge: int, device: torch.device | None = None) -> torch.Tensor:
    """``[N, t, K]`` long: for each merged token, the packed indices of its ``t x K`` source patches.

    All chunks in one call must share ``t`` (the gather needs a rectangular index); ``temporal_merge``
    splits by ``t``.
    """
    rows, start = [], 0
    for t, h, w in grid_thw.tolist():
        if h % merge or w % merge:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) is not divisible by merge size {merge}")
        idx = torch.arange(start, start + t * h * w, device=device).view(t, h // merge, merge, w // merge, merge)
        rows.append(idx.permute(1, 3, 0, 2, 4).reshape(-1, t, merge * merge))
        start += t * h * w
    return torch.cat(rows)


def temporal_merge(hidden_PD: torch.Tensor, grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """Mean over time then group 2x2 neighbours: ``[P, D] -> [N, K, D]`` in chunk order."""
    ts = grid_thw[:, 0].tolist()
    if len(set(ts)) <= 1:
        return hidden_PD[merge_index(grid_thw, merge, hidden_PD.device)].mean(dim=1)
    sizes = grid_thw.prod(-1).tolist()
    out = []
    for piece, g in zip(torch.split(hidden_PD, sizes), grid_thw):
        out.append(piece[merge_index(g[None], merge, piece.device)].mean(dim=1))
    return torch.cat(out)


class MoonViTProjector(nn.Module):
    """``[N, K, D] -> [N, d_lm]``: per-patch LayerNorm, concat the K patches, Linear -> GELU -> Linear."""

    def __init__(self, vision_width: int, merge: int, out_width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.merged = vision_width * merge * merge
        self.pre_norm = nn.LayerNorm(vision_width, eps=eps)
        self.fc1 = nn.Linear(self.merged, self.merged)
        self.fc2 = nn.Linear(self.merged, out_width)

    def forward(self, merged_NKD: torch.Tensor) -> torch.Tensor:
        x = self.pre_norm(merged_NKD).reshape(merged_NKD.shape[0], self.merged)
        return self.fc2(F.gelu(self.fc1(x)))

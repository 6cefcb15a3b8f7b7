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

from vision_encoder.layer_norm import LayerNorm
from vision_encoder.packed_tables import PackedTables, packed_tables


def merge_index(grid_thw: torch.Tensor, merge: int, device: torch.device | None = None) -> torch.Tensor:
    """``[N, t, K]`` long: for each merged token, the packed indices of its ``t x K`` source patches.

    The readable per-chunk reference of the merge tables in ``packed_tables`` (tested equal). All chunks in one
    call must share ``t`` (the gather needs a rectangular index).
    """
    rows, start = [], 0
    for t, h, w in grid_thw.tolist():
        if h % merge or w % merge:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) is not divisible by merge size {merge}")
        idx = torch.arange(start, start + t * h * w, device=device).view(t, h // merge, merge, w // merge, merge)
        rows.append(idx.permute(1, 3, 0, 2, 4).reshape(-1, t, merge * merge))
        start += t * h * w
    return torch.cat(rows)


def temporal_merge(hidden_PD: torch.Tensor, grid_thw: torch.Tensor, merge: int,
                   tables: PackedTables | None = None) -> torch.Tensor:
    """Mean over time then group 2x2 neighbours: ``[P, D] -> [N, K, D]`` in chunk order.

    One gather (and one mean) per distinct ``t`` with the host-built indices of ``tables`` (built here when not
    given), then, when the chunks have more than one ``t``, one gather back into chunk order."""
    if tables is None:
        tables = packed_tables(grid_thw, merge, None, hidden_PD.device)
    K, D = merge * merge, hidden_PD.shape[-1]
    groups = []
    for t, index in tables.merge_groups:
        picked = hidden_PD.index_select(0, index)
        groups.append(picked.view(-1, K, D) if t == 1 else picked.view(-1, t, K, D).mean(dim=1))
    if tables.merge_order_N is None:
        return groups[0]
    return torch.cat(groups).index_select(0, tables.merge_order_N)


class MoonViTProjector(nn.Module):
    """``[N, K, D] -> [N, d_lm]``: per-patch LayerNorm, concat the K patches, Linear -> GELU -> Linear."""

    def __init__(self, vision_width: int, merge: int, out_width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.merged = vision_width * merge * merge
        self.pre_norm = LayerNorm(vision_width, eps=eps)
        self.fc1 = nn.Linear(self.merged, self.merged)
        self.fc2 = nn.Linear(self.merged, out_width)

    def forward(self, merged_NKD: torch.Tensor, row_bucket: int = 0) -> torch.Tensor:
        """``row_bucket > 1``: the two matmuls run on the rows padded with zeros up to a multiple of it (a few
        GEMM shapes instead of a new one per batch: ``MoonViTConfig.row_bucket``); the padding is dropped."""
        n = merged_NKD.shape[0]
        x = self.pre_norm(merged_NKD).reshape(n, self.merged)
        if row_bucket > 1 and n % row_bucket:
            x = F.pad(x, (0, 0, 0, row_bucket - n % row_bucket))
        return self.fc2(F.gelu(self.fc1(x)))[:n]

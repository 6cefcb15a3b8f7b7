"""Host-built index tables of a packed MoonViT batch (``vision_encoder.packed_tables``) == the per-chunk references.

The encoder used to build positions, the position-embedding assembly and the temporal merge with device ops per
chunk; the tables replace them, and these tests pin the replacement to the readable per-chunk code: bit-identical
indices, the position term and the learned table's gradient to fp32 rounding (the resampling GEMMs run at padded
shapes, a gather's backward sums in another order).
"""

from __future__ import annotations

import pytest
import torch

from vision_encoder.config import moonvit_config
from vision_encoder.merger import merge_index, temporal_merge
from vision_encoder.model import MoonViT
from vision_encoder.packed_tables import grid_key, host_tables, packed_tables
from vision_encoder.rope_2d import patch_positions, rope_cos_sin, rope_cos_sin_colrow, rope_inv_freq

GRIDS = [
    [[1, 2, 2]],
    [[1, 4, 6], [1, 2, 2], [1, 4, 6], [1, 10, 2]],
    [[4, 4, 6], [2, 4, 6], [1, 2, 8], [3, 6, 4], [1, 4, 6], [4, 2, 2]],
    [[2, 8, 8], [2, 8, 8]],
]


def _per_chunk_position_term(pos_emb, grid: torch.Tensor) -> torch.Tensor:
    """The encoder's former ``MoonViTPositionEmbedding.forward``: one resample per size, a time add per video."""
    parts = []
    for t, h, w in grid.tolist():
        pos = pos_emb.spatial(h, w)
        if t > 1:
            pos = pos[None] + pos_emb.time_table[1:t + 1, None, :].to(pos.dtype)
        parts.append(pos.reshape(t * h * w, -1))
    return torch.cat(parts)


@pytest.mark.parametrize("grid", GRIDS)
def test_tables_equal_the_per_chunk_references(grid) -> None:
    grid = torch.tensor(grid)
    tables = packed_tables(grid, 2, (8, 8), "cpu")
    assert torch.equal(tables.colrow_P2.long(), patch_positions(grid).flip(-1))
    lengths = grid.prod(-1)
    assert tables.cu_seqlens.tolist() == [0] + lengths.cumsum(0).tolist() == tables.cu_seqlens_host()
    assert torch.equal(tables.segment_P.long(), torch.repeat_interleave(torch.arange(len(grid)), lengths))
    assert (tables.time_P is None) == bool((grid[:, 0] == 1).all())
    for t, index in tables.merge_groups:
        chunks = grid[grid[:, 0] == t]
        assert index.numel() == int(chunks.prod(-1).sum())
    inv = rope_inv_freq(16)
    for a, b in zip(rope_cos_sin_colrow(tables.colrow_P2, inv), rope_cos_sin(patch_positions(grid), inv)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("grid", GRIDS)
def test_temporal_merge_equals_per_chunk_gather(grid) -> None:
    grid = torch.tensor(grid)
    hidden = torch.randn(int(grid.prod(-1).sum()), 5)
    ref = torch.cat([piece[merge_index(g[None], 2)].mean(dim=1)
                     for piece, g in zip(torch.split(hidden, grid.prod(-1).tolist()), grid)])
    assert torch.equal(temporal_merge(hidden, grid, 2), ref)


@pytest.mark.parametrize("grid", GRIDS)
def test_position_term_equals_per_chunk_assembly(grid) -> None:
    torch.manual_seed(0)
    model = MoonViT(moonvit_config("debug", pos_emb_height=8, pos_emb_width=8))
    with torch.no_grad():
        model.pos_emb.table.normal_()
    grid = torch.tensor(grid)
    got = model.pos_emb(grid)
    ref = _per_chunk_position_term(model.pos_emb, grid)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)  # GEMMs of padded shapes: fp32 rounding only
    dy = torch.randn_like(ref)
    (g_got,) = torch.autograd.grad((got * dy).sum(), model.pos_emb.table)
    (g_ref,) = torch.autograd.grad((ref * dy).sum(), model.pos_emb.table)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-6, atol=1e-6)


def test_tables_are_cached_by_grid_and_bounded() -> None:
    grid = torch.tensor(GRIDS[2])
    first = packed_tables(grid, 2, (8, 8), "cpu")
    again = packed_tables(grid_key(grid), 2, (8, 8), "cpu")
    assert first.host is again.host
    assert host_tables.cache_info().maxsize is not None


def test_bad_grids_raise() -> None:
    with pytest.raises(ValueError, match="not divisible by merge size 2"):
        packed_tables(torch.tensor([[1, 3, 4]]), 2, (8, 8), "cpu")
    with pytest.raises(ValueError, match="empty dimension"):
        packed_tables(torch.tensor([[1, 0, 4]]), 2, (8, 8), "cpu")

"""The KDA chunk tables: values, the per-bounds cache, 16-byte aligned views, usable for autograd when first built
under inference mode."""

from __future__ import annotations

import torch

from kernels.kda.chunk_bwd_torch import chunk_tables


def test_chunk_tables_values_cache_alignment():
    cu = torch.tensor([0, 1, 70, 80, 210], dtype=torch.int32)
    cbos, clen, s0, snc = chunk_tables(210, 1, cu, torch.device("cpu"))
    assert cbos.tolist() == [0, 1, 65, 70, 80, 144, 208]
    assert clen.tolist() == [1, 64, 5, 10, 64, 64, 2]
    assert s0.tolist() == [0, 1, 3, 4] and snc.tolist() == [1, 2, 1, 3]
    assert all(t.data_ptr() % 16 == 0 for t in (cbos, clen, s0, snc))
    again = chunk_tables(210, 1, cu.clone(), torch.device("cpu"))  # same bounds, another tensor: cached
    assert all(a is b for a, b in zip(again, (cbos, clen, s0, snc)))
    dense = chunk_tables(130, 2, None, torch.device("cpu"))
    assert dense[0].tolist() == [0, 64, 128, 130, 194, 258] and dense[3].tolist() == [3, 3]


def test_chunk_tables_built_in_inference_mode_are_normal_tensors():
    with torch.inference_mode():
        tables = chunk_tables(77, 3, None, torch.device("cpu"))
    assert not any(t.is_inference() for t in tables)

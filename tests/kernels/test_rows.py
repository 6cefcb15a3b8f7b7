"""kernels.rows.scale_rows_ on plain tensors (the DTensor case: tests/model/test_fsdp2_attnres.py)."""

from __future__ import annotations

import pytest
import torch

from kernels.rows import scale_rows_


@pytest.mark.parametrize("shape", [(6, 4), (6,), (6, 2, 3)])
def test_scale_rows_multiplies_each_row_and_leaves_ones_exact(shape) -> None:
    w = torch.randn(shape, dtype=torch.bfloat16)
    scale = torch.tensor([1.0, 0.5, 1.0, 0.25, 1.0, 0.1])
    want = w * scale.to(torch.bfloat16).reshape(-1, *([1] * (w.dim() - 1)))
    before = w.clone()
    scale_rows_(w, scale)
    assert torch.equal(w, want)
    assert torch.equal(w[scale == 1.0], before[scale == 1.0])  # a factor of 1.0 is exact


def test_scale_rows_names_a_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"scale_R must be \[6\]"):
        scale_rows_(torch.ones(6, 4), torch.ones(5))

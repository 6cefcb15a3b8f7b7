"""``MoonViTConfig.row_bucket``: padding the packed rows (one extra attention segment) and the projector's rows up
to a multiple of the bucket changes no output, no gradient and no QK-Clip statistic; it only changes the GEMM
shapes (tested by watching the rows that reach the MLP)."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms

from vision_encoder.config import MoonViTConfig, moonvit_config
from vision_encoder.model import MoonViT
from vision_encoder.packed_tables import packed_tables, padded_rows

GRID = torch.tensor([[1, 2, 2], [4, 4, 6], [1, 6, 2], [1, 2, 40]])  # 4 + 96 + 12 + 80 = 192 patches


def _run(row_bucket: int, backend: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model = MoonViT(moonvit_config("debug", out_hidden_size=24, row_bucket=row_bucket)).to(device).train()
    for block in model.blocks:
        block.attn.track_max_logits = True
    rows_seen = []
    model.blocks[0].fc1.register_forward_hook(lambda m, a, out: rows_seen.append(a[0].shape[0]))
    torch.manual_seed(1)
    pv = torch.randn(int(GRID.prod(-1).sum()), 3, 14, 14, device=device)
    with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        out = model(pv, GRID, backend=backend)
        loss = out.projected.float().square().mean() + out.last_hidden_state.float().mean()
    loss.backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters()}
    logits = torch.stack([b.attn.max_logits_H for b in model.blocks])
    return out, grads, logits, rows_seen[0]


def _compare(backend: str, device: str, dtype: torch.dtype, tol: float) -> None:
    plain, plain_grads, plain_logits, plain_rows = _run(0, backend, device, dtype)
    padded, padded_grads, padded_logits, padded_rows_seen = _run(128, backend, device, dtype)
    assert plain_rows == 192 and padded_rows_seen == 256  # the trunk really ran on padded rows
    assert padded.last_hidden_state.shape == plain.last_hidden_state.shape
    assert padded.projected.shape == plain.projected.shape
    assert_rel_rms(padded.projected, plain.projected, tol, "projected")
    assert_rel_rms(padded.last_hidden_state, plain.last_hidden_state, tol, "last_hidden_state")
    for name, g in plain_grads.items():
        assert_rel_rms(padded_grads[name], g, tol, f"grad {name}")
    assert_rel_rms(padded_logits, plain_logits, tol, "QK max logits")


def test_row_bucket_changes_nothing_but_the_shapes() -> None:
    _compare("loop", "cpu", torch.float32, 1e-5)


def test_masked_backend_ignores_row_bucket() -> None:
    _, _, _, rows = _run(128, "masked")
    assert rows == 192


@pytest.mark.gpu
def test_row_bucket_varlen_on_gpu() -> None:
    _compare("varlen", "cuda", torch.bfloat16, 2e-2)


def test_padding_segment_tables() -> None:
    tables = packed_tables(GRID, 2, (8, 8), "cpu", row_bucket=64)
    assert tables.total == 192 and tables.padded_total == 192  # already a multiple: no padding segment
    assert tables.cu_seqlens_padded is None
    tables = packed_tables(GRID, 2, (8, 8), "cpu", row_bucket=128)
    assert tables.padded_total == 256 == padded_rows(192, 128)
    assert tables.cu_seqlens_padded.tolist() == tables.cu_seqlens.tolist() + [256]
    assert tables.cu_seqlens_padded_host() == tables.cu_seqlens_padded.tolist()
    assert packed_tables(GRID, 2, (8, 8), "cpu").cu_seqlens_padded is None


def test_row_bucket_must_fit_the_merge() -> None:
    with pytest.raises(ValueError, match="row_bucket"):
        MoonViTConfig(row_bucket=6)
    with pytest.raises(ValueError, match="row_bucket"):
        MoonViTConfig(row_bucket=-4)

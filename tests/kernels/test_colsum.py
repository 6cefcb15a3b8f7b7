"""``kernels.colsum.column_sum``: the one-launch column sum of per-program partials (Triton; the interpreter on a
CPU) against ATen's ``sum(0)``, for the shapes its callers use, in fp32 and fp64 and with the cast to a
parameter's dtype folded in; and the backward paths that use it."""

from __future__ import annotations

import pytest
import torch
from kvl_testing import assert_rel_rms, interpret_without_gpu, kernel_device

from kernels.colsum import colsum_blocks, column_sum


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    interpret_without_gpu(monkeypatch)


# (rows, trailing shape): a row and a column each, blocks' remainders, the AttnRes query (264 x 768), norm gains
# (1024 x 768 at 8 x 4096 tokens, here fewer rows), the conv weight [P, D, W], KDA dbeta slots [3, B, T, HV]
SHAPES = [(1, (5,)), (70, (100,)), (264, (768,)), (300, (33,)), (257, (16, 4)), (3, (2, 40, 6)), (2, (1,))]


@pytest.mark.parametrize(("p", "rest"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_sum_equals_sum0(p, rest, dtype):
    x = torch.randn(p, *rest, generator=torch.Generator().manual_seed(p), dtype=dtype).to(kernel_device())
    got = column_sum(x)
    assert got.shape == rest and got.dtype == dtype
    assert_rel_rms(got, x.double().sum(0), 1e-6 if dtype == torch.float32 else 1e-12, "column sum")


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16, torch.float32])
def test_column_sum_writes_the_requested_dtype(out):
    """The cast to a parameter's dtype happens in the kernel's store: on a GPU the same as summing, then casting;
    the interpreter truncates fp32 to 16 bits instead of rounding to nearest, so there within one unit."""
    x = torch.randn(97, 130, generator=torch.Generator().manual_seed(1)).to(kernel_device())
    got, ref = column_sum(x, out), column_sum(x).to(out)
    assert got.dtype == out
    if x.is_cuda:
        assert torch.equal(got, ref)
    else:
        assert ((got.float() - ref.float()).abs() <= torch.finfo(out).eps * ref.float().abs()).all()


def test_column_sum_of_no_rows_is_zeros():
    x = torch.empty(0, 7, device=kernel_device())
    assert torch.equal(column_sum(x, torch.bfloat16), torch.zeros(7, dtype=torch.bfloat16, device=x.device))


def test_column_sum_rejects_bad_input():
    with pytest.raises(ValueError, match="fp32 or fp64"):
        column_sum(torch.ones(3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        column_sum(torch.ones(4, 3, device=kernel_device()).t())


def test_blocks_cover_tall_and_wide_partials():
    """Tall partials take many rows a loop step, few rows wide column blocks; a tile holds at most 4096 elements."""
    assert colsum_blocks(1024, 768) == (256, 16)
    assert colsum_blocks(4, 196608) == (4, 1024)
    assert colsum_blocks(1024, 6) == (256, 16)
    for p, x in [(1, 1), (3, 5), (264, 768), (5000, 3)]:
        bp, bx = colsum_blocks(p, x)
        assert bp * bx <= 4096 and bp >= 1 and bx >= 16

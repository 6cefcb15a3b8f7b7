"""kernels.linear.shared_input_linear against separate F.linear calls (values and every gradient)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.linear import shared_input_linear


def _case(dtype, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 12, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    ws = [torch.randn(n, 12, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for n in (9, 3, 1)]
    bs = [torch.randn(n, generator=g, dtype=torch.float64).to(dtype).requires_grad_() if bias and i != 1 else None
          for i, n in enumerate((9, 3, 1))]
    return x, ws, bs


@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_separate_linears(bias) -> None:
    x, ws, bs = _case(torch.float64, bias)
    got = shared_input_linear(x, ws, bs)
    want = [F.linear(x, w, b) for w, b in zip(ws, bs)]
    dys = [torch.randn_like(y) for y in want]
    leaves = [x, *ws, *(b for b in bs if b is not None)]
    g_got = torch.autograd.grad(got, leaves, dys)
    g_want = torch.autograd.grad(want, leaves, dys)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_got, g_want):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_gradcheck_fp64() -> None:
    x, ws, bs = _case(torch.float64, True, seed=1)
    assert torch.autograd.gradcheck(lambda x, *p: shared_input_linear(x, p[:3], [p[3], None, p[4]]),
                                    (x, *ws, bs[0], bs[2]))


def test_unused_output_gets_no_weight_gradient() -> None:
    x, ws, _ = _case(torch.float32, False)
    ys = shared_input_linear(x, ws)
    (ys[0].sum() + ys[2].sum()).backward()
    assert ws[1].grad is None and ws[0].grad is not None and x.grad is not None
    assert torch.allclose(x.grad, ws[0].sum(0).expand_as(x) + ws[2].sum(0).expand_as(x), atol=1e-5)


def test_autocast_bf16_matches_linear_under_autocast() -> None:
    x, ws, bs = _case(torch.float32, True, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = shared_input_linear(x, ws, bs)
        want = [F.linear(x, w, b) for w, b in zip(ws, bs)]
    assert all(a.dtype == torch.bfloat16 and torch.equal(a, b) for a, b in zip(got, want))
    leaves = [x, *ws]
    dys = [torch.ones_like(y) for y in want]
    for a, b in zip(torch.autograd.grad(got, leaves, dys), torch.autograd.grad(want, leaves, dys)):
        assert a.dtype == b.dtype == torch.float32
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-2)


def test_bad_weight_shape_is_named() -> None:
    with pytest.raises(ValueError, match=r"weights\[1\] must be \[N, 12\]"):
        shared_input_linear(torch.ones(3, 12), [torch.ones(4, 12), torch.ones(4, 11)])

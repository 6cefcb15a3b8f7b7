"""Pure Muon maths: Newton-Schulz vs fp64, singular-value range, update RMS, momentum, AdamW half."""

from __future__ import annotations

import pytest
import torch

from kimi_vl.optim.adamw import adamw_update_, adamw_update_foreach_
from kimi_vl.optim.muon import (
    measured_rms_correction,
    momentum_update_,
    newton_schulz5,
    newton_schulz5_reference,
    rms_match_scale,
)


@pytest.mark.parametrize("shape", [(16, 16), (8, 40), (40, 8), (3, 24, 10)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 4e-2)])
def test_ns_matches_fp64_polynomial(shape: tuple[int, ...], dtype: torch.dtype, tol: float) -> None:
    G = torch.randn(*shape)
    got = newton_schulz5(G, dtype=dtype)
    assert got.shape == G.shape and got.dtype == dtype
    want = torch.stack([newton_schulz5_reference(g) for g in G.reshape(-1, *shape[-2:])]).reshape(shape)
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < tol, f"{shape} {dtype}: rel err {err:.2e}"


def test_batched_equals_one_at_a_time() -> None:
    G = torch.randn(5, 12, 20)
    batched = newton_schulz5(G, dtype=torch.float32)
    single = torch.stack([newton_schulz5(g, dtype=torch.float32) for g in G])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(64, 96), (64, 192), (448, 64), (32, 224)])
def test_singular_values_in_range(shape: tuple[int, int]) -> None:
    O = newton_schulz5(torch.randn(*shape), dtype=torch.bfloat16).double()
    sv = torch.linalg.svdvals(O)
    lo, hi = torch.quantile(sv, 0.01).item(), torch.quantile(sv, 0.99).item()
    assert 0.6 <= lo and hi <= 1.25, f"{shape}: 1-99% singular values [{lo:.3f}, {hi:.3f}]"


def test_square_gaussian_low_tail_is_documented() -> None:
    """Square Gaussian inputs have near-zero singular values that 5 steps cannot lift to 0.6 (1% quantile ~0.45)."""
    sv = torch.linalg.svdvals(newton_schulz5(torch.randn(64, 64)).double())
    assert 0.3 < torch.quantile(sv, 0.01).item() < 0.6 and sv.max().item() <= 1.25


@pytest.mark.parametrize("ratio", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("tall", [False, True])
def test_update_rms_is_point_two(ratio: int, tall: bool) -> None:
    """Exact orthogonal factor: 0.2 exactly; NS + measured: 0.2 +- 10%; NS + shape-only: 0.15-0.21 (documented)."""
    A, B = (64 * ratio, 64) if tall else (64, 64 * ratio)
    G = torch.randn(A, B, dtype=torch.float64)
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    exact = (rms_match_scale(A, B) * U @ Vh).pow(2).mean().sqrt().item()
    assert abs(exact - 0.2) < 1e-9
    O = newton_schulz5(G.float(), dtype=torch.bfloat16).float().unsqueeze(0)
    rms_shape = (rms_match_scale(A, B) * O).pow(2).mean().sqrt().item()
    rms_measured = (rms_match_scale(A, B) * measured_rms_correction(O) * O).pow(2).mean().sqrt().item()
    assert abs(rms_measured - 0.2) <= 0.02, f"{A}x{B}: measured update RMS {rms_measured:.4f}"
    assert 0.15 <= rms_shape <= 0.21, f"{A}x{B}: shape-only update RMS {rms_shape:.4f}"


def test_ns_handles_zero_and_rejects_bad_rank() -> None:
    assert torch.equal(newton_schulz5(torch.zeros(4, 6), dtype=torch.float32), torch.zeros(4, 6))
    with pytest.raises(ValueError, match="newton_schulz5"):
        newton_schulz5(torch.zeros(2, 2, 2, 2))


def test_momentum_and_nesterov() -> None:
    buf, g = torch.ones(3), torch.full((3,), 2.0)
    u = momentum_update_(buf, g, 0.5, nesterov=False)
    assert torch.equal(buf, torch.full((3,), 2.5)) and u is buf
    buf = torch.ones(3)
    u = momentum_update_(buf, g, 0.5, nesterov=True)
    assert torch.equal(u, torch.full((3,), 2.0 + 0.5 * 2.5))


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_half_equals_torch_adamw_exactly(foreach: bool) -> None:
    shapes = [(7,), (5, 3), (2, 3, 4)]
    ref = [torch.randn(s, requires_grad=True) for s in shapes]
    mine = [p.detach().clone() for p in ref]
    hyper = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = torch.optim.AdamW(ref, foreach=False, **hyper)
    m = [torch.zeros_like(p) for p in mine]
    v = [torch.zeros_like(p) for p in mine]
    for step in range(1, 6):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        opt.step()
        if foreach:
            adamw_update_foreach_(mine, grads, m, v, float(step), **hyper)
        else:
            for p, g, a, b in zip(mine, grads, m, v):
                adamw_update_(p, g, a, b, float(step), **hyper)
    for p, q in zip(ref, mine):
        assert torch.equal(p.detach(), q), "AdamW half differs from torch.optim.AdamW"

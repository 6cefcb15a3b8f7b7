"""Short convolution: vs F.conv1d, varlen == per-sequence, state/cache chaining, decode == full."""

from __future__ import annotations

import pytest
import torch

from kernels.short_conv import causal_conv1d, causal_conv1d_ref, causal_conv1d_update


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("T", [1, 3, 17])
def test_matches_conv1d_reference(T, activation):
    x, w, b = torch.randn(2, T, 6), torch.randn(6, 4), torch.randn(6)
    s0 = torch.randn(2, 6, 3)
    for state in (None, s0):
        y, _ = causal_conv1d(x, w, b, activation=activation, initial_state=state)
        assert torch.allclose(y, causal_conv1d_ref(x, w, b, activation, state), atol=1e-6)


def test_varlen_equals_per_sequence_with_states_and_grads():
    lens = [1, 2, 9, 0, 5]
    cu = torch.tensor([0, 1, 3, 12, 12, 17])
    x = torch.randn(1, 17, 5, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    s0 = torch.randn(len(lens), 5, 3, requires_grad=True)
    y, fs = causal_conv1d(x, w, None, cu_seqlens=cu, initial_state=s0, output_final_state=True)
    (y.square().sum() + fs.square().sum()).backward()
    gx, gw, gs = x.grad.clone(), w.grad.clone(), s0.grad.clone()
    w_sum = torch.zeros_like(w)
    for n in range(len(lens)):
        a, e = int(cu[n]), int(cu[n + 1])
        xn = x.detach()[:, a:e].clone().requires_grad_()
        sn = s0.detach()[n : n + 1].clone().requires_grad_()
        wn = w.detach().clone().requires_grad_()
        yn, fn = causal_conv1d(xn, wn, None, initial_state=sn, output_final_state=True)
        (yn.square().sum() + fn.square().sum()).backward()
        assert torch.allclose(y[:, a:e], yn, atol=1e-6) and torch.allclose(fs[n], fn[0], atol=1e-6)
        assert torch.allclose(gx[:, a:e], xn.grad, atol=1e-5) and torch.allclose(gs[n], sn.grad[0], atol=1e-5)
        w_sum += wn.grad
    assert torch.allclose(gw, w_sum, atol=1e-4)


def test_final_state_is_last_inputs_and_chains():
    x, w = torch.randn(1, 10, 3), torch.randn(3, 4)
    y_full, _ = causal_conv1d(x, w)
    y1, s1 = causal_conv1d(x[:, :6], w, output_final_state=True)
    assert torch.equal(s1[0], x[0, 3:6].T)
    y2, _ = causal_conv1d(x[:, 6:], w, initial_state=s1)
    assert torch.allclose(torch.cat([y1, y2], 1), y_full, atol=1e-6)


def test_decode_steps_equal_full_sequence():
    x, w, b = torch.randn(2, 8, 4), torch.randn(4, 4), torch.randn(4)
    y_full, _ = causal_conv1d(x, w, b)
    state = torch.zeros(2, 4, 3)
    for t in range(8):
        y, state = causal_conv1d_update(x[:, t], state, w, b)
        assert torch.allclose(y, y_full[:, t], atol=1e-6)


def test_errors_name_shapes():
    with pytest.raises(ValueError, match="weight must be"):
        causal_conv1d(torch.randn(1, 4, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match="state must be"):
        causal_conv1d_update(torch.randn(2, 3), torch.randn(2, 3, 2), torch.randn(3, 4))
    with pytest.raises(ValueError, match="batch size must be 1"):
        causal_conv1d(torch.randn(2, 4, 3), torch.randn(3, 4), cu_seqlens=torch.tensor([0, 4]))

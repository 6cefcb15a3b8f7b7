"""The advantage, the masking rule, the penalty, the clipped variant, the length penalty and Toggle."""

import pytest
import torch

from rl.objective import (
    group_advantages,
    grpo_clipped_loss,
    is_budget_phase,
    k15_length_penalty,
    k25_policy_loss,
    kl_k3,
    length_budget,
    toggle_rewards,
    token_entropy,
)


def test_group_advantage_is_reward_minus_group_mean():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    a = group_advantages(r)
    torch.testing.assert_close(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    assert group_advantages(r, normalize_std=True)[0].abs().max() == pytest.approx(1.0, rel=1e-4)
    with pytest.raises(ValueError, match=r"\[P, K\]"):
        group_advantages(torch.zeros(4))


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("adv_sign", [1.0, -1.0])
def test_tokens_outside_alpha_beta_get_exactly_zero_gradient(adv_sign):
    old = torch.zeros(2, 4, dtype=torch.float64) - 1.0
    #            log rho:  0     +2(out)  -2(out)  0.5
    logp = _leaf([[-1.0, 1.0, -3.0, -0.5], [-1.2, -0.9, -1.0, -1.0]])
    mask = torch.ones(2, 4)
    adv = torch.tensor([adv_sign, -adv_sign], dtype=torch.float64)
    loss, stats = k25_policy_loss(logp, old, adv, mask, alpha=-1.0, beta=1.0, tau=0.3)
    loss.backward()
    g = logp.grad
    assert g[0, 1].item() == 0.0 and g[0, 2].item() == 0.0
    assert (g[0, [0, 3]] != 0).all() and (g[1] != 0).all()
    assert stats["masked_share"].item() == pytest.approx(2 / 8)


def test_k25_loss_hand_value_and_normalisation_by_all_tokens():
    old = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64)
    logp = _leaf([[0.5, -0.2, 9.0]])  # last token is padding
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([2.0], dtype=torch.float64)
    tau = 0.4
    loss, _ = k25_policy_loss(logp, old, adv, mask, alpha=-1.0, beta=1.0, tau=tau)
    expected = -((0.5 * 2 - tau / 2 * 0.25) + (-0.2 * 2 - tau / 2 * 0.04)) / 2
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    # d/dlogp of -(1/N)[logp*A - tau/2 (logp-old)^2] = -(A - tau*(logp-old))/N
    torch.testing.assert_close(logp.grad, torch.tensor([[-(2 - tau * 0.5) / 2, -(2 + tau * 0.2) / 2, 0.0]]).double())


def test_penalty_is_zero_with_zero_gradient_at_rho_one():
    old = torch.randn(3, 5, dtype=torch.float64)
    logp = old.clone().requires_grad_(True)
    mask = torch.ones(3, 5)
    zero_adv = torch.zeros(3, dtype=torch.float64)
    loss, stats = k25_policy_loss(logp, old, zero_adv, mask, tau=1.0)
    loss.backward()
    assert stats["penalty"].item() == 0.0 and loss.item() == 0.0
    assert logp.grad.abs().max().item() == 0.0
    # away from rho = 1 the penalty is tau/2 (log rho)^2 per token
    loss2, stats2 = k25_policy_loss(old + 0.5, old, zero_adv, mask, tau=1.0)
    assert stats2["penalty"].item() == pytest.approx(0.125)
    assert loss2.item() == pytest.approx(0.125)


def test_k25_rejects_bad_shapes_and_bounds():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        k25_policy_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="alpha"):
        k25_policy_loss(x, x, torch.zeros(2), x, alpha=0.1, beta=1.0)


def test_grpo_clip_removes_gradient_only_beyond_the_clip():
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = _leaf([[0.0, 0.5, -0.5]])  # rho = 1, 1.65, 0.61
    mask = torch.ones(1, 3)
    loss, stats = grpo_clipped_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), mask, 0.2, 0.2)
    loss.backward()
    assert logp.grad[0, 1].item() == 0.0  # positive advantage, rho above 1 + eps: clipped
    assert logp.grad[0, 0].item() != 0.0 and logp.grad[0, 2].item() != 0.0
    assert stats["masked_share"].item() == pytest.approx(1 / 3)


def test_k15_length_penalty_hand_case():
    lengths = torch.tensor([[10, 20, 30], [5, 5, 5]])
    correct = torch.tensor([[1, 0, 1], [1, 1, 0]])
    lp = k15_length_penalty(lengths, correct)
    # lambda = 0.5 - (len - 10)/20 -> 0.5, 0, -0.5 ; incorrect -> min(0, lambda)
    torch.testing.assert_close(lp, torch.tensor([[0.5, 0.0, -0.5], [0.0, 0.0, 0.0]]))
    lp2 = k15_length_penalty(torch.tensor([[10, 30]]), torch.tensor([[0, 0]]))
    torch.testing.assert_close(lp2, torch.tensor([[0.0, -0.5]]))


def test_toggle_budget():
    assert length_budget(torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0]), 50) == 30.0
    assert [is_budget_phase(s, 2) for s in range(6)] == [False, False, True, True, False, False]
    rewards = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    lengths = torch.tensor([[10, 50, 50, 20], [50, 10, 10, 10]])
    correct = rewards > 0
    out = toggle_rewards(rewards, lengths, correct, budget=30.0, rare_solve_rate=0.25)
    # group 0 solves 3/4 (common): the long correct answer loses its reward; group 1 solves 1/4 (rare): kept
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]))


def test_kl_and_entropy():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    assert kl_k3(logp, logp, torch.ones(1, 2)).item() == 0.0
    assert kl_k3(logp, logp - 0.3, torch.ones(1, 2)).item() > 0
    uniform = torch.zeros(1, 2, 8)
    assert token_entropy(uniform, torch.ones(1, 2)).item() == pytest.approx(torch.log(torch.tensor(8.0)).item())

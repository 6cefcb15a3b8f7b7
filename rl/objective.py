"""RL objectives as pure functions: the K2.5 token-masked policy loss, a GRPO-style clipped variant,
group-mean advantages, k1.5's length penalty and the Toggle length budget.

Shapes: P prompts, K responses per prompt (a *group*), B = P * K response rows, T response tokens
(right-padded). ``logp_BT`` are log-probabilities of the sampled tokens, ``mask_BT`` is 1 on real
response tokens and 0 on padding, ``adv_B`` one advantage per response.

Sources: Kimi K2.5 report (section 6 of ../shared/REFERENCE.md) - token-level loss with group-mean
baseline, zero gradient for tokens whose log-ratio leaves [alpha, beta], squared log-ratio penalty
tau, normalised by the total number of response tokens; Kimi k1.5 (length penalty); Toggle (length
budget phases); DeepSeekMath GRPO / PPO (clipped surrogate).
"""

from __future__ import annotations

import torch


def group_advantages(rewards_PK: torch.Tensor, normalize_std: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """``A_j = r_j - mean_k r_k`` within each group (row); with ``normalize_std`` divided by ``std_k r_k + eps``
    (GRPO). rewards ``[P, K]`` -> advantages ``[P, K]``. A group where every reward is equal gets A = 0."""
    if rewards_PK.dim() != 2:
        raise ValueError(f"group_advantages: rewards must be [P, K], got shape {tuple(rewards_PK.shape)}")
    adv = rewards_PK - rewards_PK.mean(dim=1, keepdim=True)
    if normalize_std:
        adv = adv / (rewards_PK.std(dim=1, keepdim=True, unbiased=False) + eps)
    return adv


def _check(logp_BT: torch.Tensor, old_BT: torch.Tensor, adv_B: torch.Tensor, mask_BT: torch.Tensor, name: str) -> None:
    if logp_BT.shape != old_BT.shape or logp_BT.shape != mask_BT.shape or logp_BT.dim() != 2:
        raise ValueError(
            f"{name}: logp, old_logp and mask must share one [B, T] shape; got {tuple(logp_BT.shape)}, "
            f"{tuple(old_BT.shape)}, {tuple(mask_BT.shape)}"
        )
    if adv_B.shape != logp_BT.shape[:1]:
        raise ValueError(f"{name}: advantages must be [B] = [{logp_BT.shape[0]}], got {tuple(adv_B.shape)}")


def ratio_mask(log_rho_BT: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """``m = 1[alpha <= log rho <= beta]`` as float (no gradient)."""
    return ((log_rho_BT >= alpha) & (log_rho_BT <= beta)).to(log_rho_BT.dtype).detach()


def k25_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    alpha: float = -1.0,
    beta: float = 1.0,
    tau: float = 0.1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The K2.5 token-level loss (to *minimise*; the report's objective with the sign flipped).

    ``log rho_ij = log pi_theta(y_ij) - log pi_old(y_ij)``, ``m_ij = 1[alpha <= log rho_ij <= beta]`` and
    ``N = sum_ij mask_ij`` (all response tokens, masked-out ones included):

        loss = -(1/N) sum_j sum_i mask_ij * m_ij * [ log pi_theta(y_ij) * A_j - tau/2 * (log rho_ij)^2 ]

    ``m`` multiplies the whole per-token term, so a token outside [alpha, beta] gets exactly zero gradient
    whatever the sign of ``A_j`` (the penalty included: the report states zero gradient for such tokens).
    The penalty and its gradient vanish at rho = 1. Returns the loss and detached statistics
    (``masked_share``: share of response tokens with m = 0; ``mean_log_ratio``; ``penalty``).
    """
    _check(logp_BT, old_logp_BT, adv_B, mask_BT, "k25_policy_loss")
    if not alpha <= 0.0 <= beta:
        raise ValueError(f"k25_policy_loss: need alpha <= 0 <= beta, got alpha={alpha}, beta={beta}")
    mask = mask_BT.to(logp_BT.dtype)
    n_tokens = mask.sum().clamp_min(1.0)
    log_rho = logp_BT - old_logp_BT.detach()
    keep = ratio_mask(log_rho, alpha, beta) * mask
    pg = logp_BT * adv_B.detach()[:, None]
    penalty = 0.5 * tau * log_rho.pow(2)
    loss = -(keep * (pg - penalty)).sum() / n_tokens
    stats = {
        "masked_share": ((1.0 - keep) * mask).sum().detach() / n_tokens,
        "mean_log_ratio": (log_rho * mask).sum().detach() / n_tokens,
        "penalty": (penalty * keep).sum().detach() / n_tokens,
    }
    return loss, stats


def grpo_clipped_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO/GRPO clipped surrogate, token level, normalised by the total number of response tokens N:

        loss = -(1/N) sum_ij mask_ij * min(rho_ij A_j, clip(rho_ij, 1 - eps_low, 1 + eps_high) A_j)

    ``masked_share`` reports the share of tokens whose gradient the clip removes."""
    _check(logp_BT, old_logp_BT, adv_B, mask_BT, "grpo_clipped_loss")
    mask = mask_BT.to(logp_BT.dtype)
    n_tokens = mask.sum().clamp_min(1.0)
    rho = torch.exp(logp_BT - old_logp_BT.detach())
    adv = adv_B.detach()[:, None]
    unclipped = rho * adv
    clipped = rho.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -(torch.minimum(unclipped, clipped) * mask).sum() / n_tokens
    clipped_away = (clipped < unclipped).to(mask.dtype) * mask
    stats = {
        "masked_share": clipped_away.sum().detach() / n_tokens,
        "mean_log_ratio": (torch.log(rho) * mask).sum().detach() / n_tokens,
        "penalty": torch.zeros((), dtype=logp_BT.dtype),
    }
    return loss, stats


def k15_length_penalty(lengths_PK: torch.Tensor, correct_PK: torch.Tensor) -> torch.Tensor:
    """Kimi k1.5 length reward per response, within each group of K:

        lambda_j = 0.5 - (len_j - min_len) / (max_len - min_len)
        len_reward_j = lambda_j if correct_j else min(0, lambda_j)

    A group whose responses all have the same length gets 0. Shapes ``[P, K]`` -> ``[P, K]`` (float).
    The trainer adds ``weight * len_reward`` to the task reward."""
    if lengths_PK.shape != correct_PK.shape or lengths_PK.dim() != 2:
        raise ValueError(
            f"k15_length_penalty: lengths and correct must both be [P, K], got "
            f"{tuple(lengths_PK.shape)} and {tuple(correct_PK.shape)}"
        )
    lengths = lengths_PK.to(torch.float64)
    lo = lengths.min(dim=1, keepdim=True).values
    hi = lengths.max(dim=1, keepdim=True).values
    span = hi - lo
    lam = torch.where(span > 0, 0.5 - (lengths - lo) / torch.where(span > 0, span, 1.0), torch.zeros_like(lengths))
    return torch.where(correct_PK.bool(), lam, lam.clamp(max=0.0)).to(torch.float32)


def length_budget(correct_lengths: torch.Tensor, percentile: float) -> float:
    """Toggle's budget: the ``percentile`` (0-100) of the lengths of correct responses, frozen once at the start."""
    if correct_lengths.numel() == 0:
        raise ValueError("length_budget: no correct responses to take a percentile of")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"length_budget: percentile must be in [0, 100], got {percentile}")
    return float(torch.quantile(correct_lengths.to(torch.float64), percentile / 100.0))


def is_budget_phase(step: int, phase_steps: int) -> bool:
    """Toggle alternates free and budget phases of ``phase_steps`` steps, starting free: phase ``step // phase_steps``
    is a budget phase when odd."""
    if phase_steps <= 0:
        raise ValueError(f"is_budget_phase: phase_steps must be > 0, got {phase_steps}")
    return (step // phase_steps) % 2 == 1


def toggle_rewards(
    rewards_PK: torch.Tensor,
    lengths_PK: torch.Tensor,
    correct_PK: torch.Tensor,
    budget: float,
    rare_solve_rate: float,
) -> torch.Tensor:
    """Toggle's budget-phase reward: a correct response longer than ``budget`` keeps its reward only on prompts
    the model solves rarely (group solve rate ``mean_k correct <= rare_solve_rate``); otherwise it gets 0:

        r'_j = 0 if correct_j and len_j > budget and solve_rate > rare_solve_rate else r_j
    """
    if not rewards_PK.shape == lengths_PK.shape == correct_PK.shape:
        raise ValueError(
            f"toggle_rewards: rewards, lengths, correct must share [P, K]; got {tuple(rewards_PK.shape)}, "
            f"{tuple(lengths_PK.shape)}, {tuple(correct_PK.shape)}"
        )
    correct = correct_PK.bool()
    solve_rate = correct.float().mean(dim=1, keepdim=True)
    drop = correct & (lengths_PK > budget) & (solve_rate > rare_solve_rate)
    return torch.where(drop, torch.zeros_like(rewards_PK), rewards_PK)


def kl_k3(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(pi || pi_ref) on tokens sampled from pi:
    ``mean over tokens of exp(d) - 1 - d`` with ``d = log pi_ref - log pi`` (>= 0, unbiased)."""
    d = ref_logp_BT - logp_BT
    mask = mask_BT.to(logp_BT.dtype)
    return ((torch.exp(d) - 1.0 - d) * mask).sum() / mask.sum().clamp_min(1.0)


def token_entropy(logits_BTV: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean over response tokens of ``H = -sum_v p_v log p_v`` with ``p = softmax(logits)``."""
    logp = torch.log_softmax(logits_BTV.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    mask = mask_BT.to(ent.dtype)
    return (ent * mask).sum() / mask.sum().clamp_min(1.0)


__all__ = [
    "group_advantages",
    "grpo_clipped_loss",
    "is_budget_phase",
    "k15_length_penalty",
    "k25_policy_loss",
    "kl_k3",
    "length_budget",
    "ratio_mask",
    "toggle_rewards",
    "token_entropy",
]

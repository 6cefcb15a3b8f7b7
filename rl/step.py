"""One RL step's maths on sampled groups: rewards (with k1.5 length penalty / Toggle), advantages, and the
gradient of the chosen objective accumulated group by group.

Shapes: P groups (prompts) of K responses; per group ``[K, T]`` response tensors (see :mod:`rl.rollout`).
Groups with equal prompt length form one forward (a bucket); a bucket's loss is scaled by ``N_b / N``
(its response tokens over the batch's), so the accumulated
gradient equals the objective normalised by the total number of response tokens N of the batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from rl.config import ObjectiveCfg
from rl.objective import (
    group_advantages,
    grpo_clipped_loss,
    is_budget_phase,
    k15_length_penalty,
    k25_policy_loss,
    kl_k3,
    toggle_rewards,
    token_entropy,
)
from rl.rewards import compute_reward
from rl.rollout import Group, batch_media, recompute_logprobs


@dataclass
class ScoredBatch:
    rewards_PK: torch.Tensor  # task rewards in [0, 1]
    parsed_PK: torch.Tensor  # bool
    lengths_PK: torch.Tensor  # long, response tokens
    families: list[str]  # [P]

    def correct(self, threshold: float) -> torch.Tensor:
        return self.rewards_PK >= threshold


def score_groups(groups: list[Group]) -> ScoredBatch:
    """Reward every response with its family's reward function (unparseable -> 0, flagged)."""
    rewards, parsed = [], []
    for g in groups:
        results = [
            compute_reward(g.prompt.family, text, g.prompt.answer, **g.prompt.reward_options) for text in g.texts
        ]
        rewards.append([r.reward for r in results])
        parsed.append([r.parsed for r in results])
    return ScoredBatch(
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(parsed, dtype=torch.bool),
        torch.stack([g.lengths for g in groups]),
        [g.prompt.family for g in groups],
    )


def shaped_rewards(batch: ScoredBatch, cfg: ObjectiveCfg, step: int, budget: float | None) -> torch.Tensor:
    """Task reward, then Toggle (in budget phases, with a frozen ``budget``), then + weight * k1.5 length reward."""
    rewards = batch.rewards_PK
    correct = batch.correct(cfg.correct_threshold)
    if cfg.toggle_phase_steps > 0 and budget is not None and is_budget_phase(step, cfg.toggle_phase_steps):
        rewards = toggle_rewards(rewards, batch.lengths_PK, correct, budget, cfg.toggle_rare_solve_rate)
    if cfg.length_penalty_weight:
        rewards = rewards + cfg.length_penalty_weight * k15_length_penalty(batch.lengths_PK, correct)
    return rewards


def family_means(values_PK: torch.Tensor, families: list[str], prefix: str) -> dict[str, float]:
    """``{prefix/<family>: mean over that family's responses}``."""
    by_family: dict[str, list[torch.Tensor]] = defaultdict(list)
    for row, fam in zip(values_PK, families):
        by_family[fam].append(row)
    return {f"{prefix}/{fam}": torch.cat(rows).float().mean().item() for fam, rows in by_family.items()}


def _objective(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg: ObjectiveCfg):
    if cfg.kind == "k25":
        return k25_policy_loss(logp, old, adv, mask, cfg.alpha, cfg.beta, cfg.tau)
    return grpo_clipped_loss(logp, old, adv, mask, cfg.eps_low, cfg.eps_high)


def _pad_cat(tensors: list[torch.Tensor], value: float) -> torch.Tensor:
    """Concatenate ``[K, T_i]`` tensors along rows, right-padding to the longest T with ``value``."""
    t = max(x.shape[1] for x in tensors)
    return torch.cat([torch.nn.functional.pad(x, (0, t - x.shape[1]), value=value) for x in tensors], dim=0)


def _buckets(groups: list[Group]) -> list[list[int]]:
    """Indices of groups with equal prompt length (one forward each)."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by_len[len(g.prompt.input_ids)].append(i)
    return list(by_len.values())


def accumulate_policy_gradient(
    model: Any,
    groups: list[Group],
    adv_PK: torch.Tensor,
    cfg: ObjectiveCfg,
    temperature: float,
    backward: Any = None,
    ref_model: Any = None,
    pad_id: int = 0,
) -> dict[str, float]:
    """Recompute log-probs with grad (one forward per bucket of equal-length prompts), backpropagate each
    bucket's share of the objective, return statistics (``loss``, ``masked_share``, ``entropy``, and
    ``kl_to_init`` when ``ref_model`` is given). ``backward(loss)`` defaults to ``loss.backward()``."""
    backward = backward or (lambda loss: loss.backward())
    n_total = sum(float(g.mask_KT.sum()) for g in groups)
    totals: dict[str, float] = defaultdict(float)
    for idx in _buckets(groups):
        bucket = [groups[i] for i in idx]
        mask = _pad_cat([g.mask_KT for g in bucket], 0.0)  # [R, T]
        n_b = float(mask.sum())
        if n_b == 0:
            continue
        ids = _pad_cat([g.response_ids_KT for g in bucket], pad_id)
        old = _pad_cat([g.logprobs_KT for g in bucket], 0.0)
        prompt_rows = torch.tensor([g.prompt.input_ids for g in bucket for _ in range(g.mask_KT.shape[0])])
        k = bucket[0].mask_KT.shape[0]
        media = batch_media([g.prompt.media for g in bucket], k)
        adv = adv_PK[idx].reshape(-1)
        logp, logits = recompute_logprobs(model, prompt_rows, ids, media, temperature, with_logits=True)
        mask, old, adv = mask.to(logp.device), old.to(logp.device), adv.to(logp.device)
        loss, stats = _objective(logp, old, adv, mask, cfg)
        w = n_b / n_total
        backward(loss * w)
        totals["loss"] += loss.item() * w
        totals["masked_share"] += stats["masked_share"].item() * w
        totals["entropy"] += token_entropy(logits.detach(), mask).item() * w
        if ref_model is not None:
            with torch.no_grad():
                ref, _ = recompute_logprobs(ref_model, prompt_rows, ids, media, temperature)
            totals["kl_to_init"] += kl_k3(logp.detach(), ref, mask).item() * w
    return dict(totals)


def advantages(rewards_PK: torch.Tensor, cfg: ObjectiveCfg) -> torch.Tensor:
    return group_advantages(rewards_PK, normalize_std=cfg.normalize_std)


__all__ = ["ScoredBatch", "accumulate_policy_gradient", "advantages", "family_means", "score_groups", "shaped_rewards"]

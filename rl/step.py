"""One RL step's maths on sampled groups: rewards (with k1.5 length penalty / Toggle), advantages, and the
gradient of the chosen objective accumulated group by group.

Shapes: P groups (prompts) of K responses; per group ``[K, T]`` response tensors (see :mod:`rl.rollout`).
The update's forwards take response rows of any groups and prompt lengths together (left-padded prompts,
masked padding; :func:`rl.rollout.recompute_logprobs`), in micro-batches of at most
``ObjectiveCfg.micro_batch_rows`` rows (0: all rows in one); a micro-batch's loss is scaled by ``N_b / N``
(its response tokens over the batch's), so the accumulated gradient equals the objective normalised by the
total number of response tokens N of the batch, whatever the micro-batching. A micro-batch holds each of its
prompts once with its media (``MicroBatch.row_prompt`` maps rows to prompts), so a model that splices media
itself (``embed_multimodal``) runs the vision tower once per prompt, not once per response row.
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
from rl.rollout import Group, prompt_batches, recompute_logprobs


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


@dataclass
class MicroBatch:
    """Response rows ``(group, row)`` of one update forward, their tensors cut to the longest response ``T``.

    A prompt appears once (``U`` distinct prompts, in order of first row) with its media; ``row_prompt`` maps each
    row to its prompt, so the forward can encode a prompt's media once for all of its rows."""

    prompts: list[list[int]]  # [U] distinct prompts' ids
    media: list[dict[str, torch.Tensor]]  # [U] their media
    row_prompt: list[int]  # [R] row -> index into prompts
    ids_RT: torch.Tensor  # long, pad_id after each response
    old_RT: torch.Tensor  # sampling log-probs, 0 on padding
    mask_RT: torch.Tensor  # 1 on response tokens
    adv_R: torch.Tensor

    def row_prompts(self) -> list[list[int]]:
        """``[R]`` every row's prompt ids."""
        return [self.prompts[u] for u in self.row_prompt]


def micro_batches(groups: list[Group], adv_PK: torch.Tensor, max_rows: int, pad_id: int) -> list[MicroBatch]:
    """Every response row of ``groups`` (rows sorted by prompt length, so a micro-batch pads little), at most
    ``max_rows`` rows per micro-batch (0: one micro-batch); rows with no response token are left out."""
    rows = [(p, j) for p, g in enumerate(groups) for j in range(g.mask_KT.shape[0]) if g.mask_KT[j].any()]
    chunks = prompt_batches([len(groups[p].prompt.input_ids) for p, _ in rows], 1, max_rows)
    return [_micro_batch(groups, adv_PK, [rows[i] for i in chunk], pad_id) for chunk in chunks if chunk]


def _micro_batch(groups: list[Group], adv_PK: torch.Tensor, rows: list[tuple[int, int]], pad_id: int) -> MicroBatch:
    t = max(int(groups[p].lengths[j]) for p, j in rows)

    def cut(name: str, value: float) -> torch.Tensor:
        parts = [getattr(groups[p], name)[j, :t] for p, j in rows]
        return torch.stack([torch.nn.functional.pad(x, (0, t - x.shape[0]), value=value) for x in parts])

    unique = list(dict.fromkeys(p for p, _ in rows))  # groups of this micro-batch, in order of first row
    position = {p: u for u, p in enumerate(unique)}
    prompts = [list(groups[p].prompt.input_ids) for p in unique]
    media = [dict(groups[p].prompt.media) for p in unique]
    adv = torch.stack([adv_PK[p, j] for p, j in rows])
    return MicroBatch(prompts, media, [position[p] for p, _ in rows], cut("response_ids_KT", pad_id),
                      cut("logprobs_KT", 0.0), cut("mask_KT", 0.0), adv)  # fmt: skip


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
    """Recompute log-probs with grad (one forward per micro-batch of ``cfg.micro_batch_rows`` rows, prompts of
    any lengths together), backpropagate each micro-batch's share of the objective, return statistics
    (``loss``, ``masked_share``, ``entropy``, and ``kl_to_init`` when ``ref_model`` is given).
    ``backward(loss)`` defaults to ``loss.backward()``."""
    backward = backward or (lambda loss: loss.backward())
    n_total = sum(float(g.mask_KT.sum()) for g in groups)
    totals: dict[str, float] = defaultdict(float)
    for mb in micro_batches(groups, adv_PK, cfg.micro_batch_rows, pad_id):
        w = float(mb.mask_RT.sum()) / n_total
        args = (mb.prompts, mb.ids_RT, mb.media, temperature)
        kwargs = dict(response_mask_RT=mb.mask_RT, pad_id=pad_id, row_prompt=mb.row_prompt)
        logp, logits = recompute_logprobs(model, *args, with_logits=True, **kwargs)
        mask, old, adv = (x.to(logp.device) for x in (mb.mask_RT, mb.old_RT, mb.adv_R))
        loss, stats = _objective(logp, old, adv, mask, cfg)
        backward(loss * w)
        totals["loss"] += loss.item() * w
        totals["masked_share"] += stats["masked_share"].item() * w
        totals["entropy"] += token_entropy(logits.detach(), mask).item() * w
        if ref_model is not None:
            with torch.no_grad():
                ref, _ = recompute_logprobs(ref_model, *args, **kwargs)
            totals["kl_to_init"] += kl_k3(logp.detach(), ref, mask).item() * w
    return dict(totals)


def advantages(rewards_PK: torch.Tensor, cfg: ObjectiveCfg) -> torch.Tensor:
    return group_advantages(rewards_PK, normalize_std=cfg.normalize_std)


__all__ = [
    "MicroBatch",
    "ScoredBatch",
    "accumulate_policy_gradient",
    "advantages",
    "family_means",
    "micro_batches",
    "score_groups",
    "shaped_rewards",
]

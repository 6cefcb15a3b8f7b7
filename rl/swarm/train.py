"""Training the orchestrator: a project tokenizer and model for the swarm, an optional imitation warm start, and
PARL reinforcement learning through the RL stage's objective.

- :func:`build_tokenizer` trains a small byte-level BPE (``data_pipelines.tokenizer.train_tokenizer``, with the
  chat and tool-call special tokens) on rendered scripted transcripts of wide and deep tasks.
- :func:`build_model` makes a ``KimiVLForCausalLM`` of a flavor (``tiny`` / ``debug``) over that vocabulary.
- :func:`warm_start` is next-token cross-entropy on the assistant tokens of scripted orchestrator transcripts, a
  ``swarm_share`` of them from :class:`~rl.swarm.policies.ScriptedSwarmOrchestrator` and the rest from the
  single-agent script, so that the initial policy already writes tool calls and mixes both strategies (AdamW,
  by default with the learning rate decayed linearly to 0).
- :func:`rl_step` runs ``k`` episodes per task with the model as orchestrator (sub-agents: a frozen policy),
  rewards each episode with PARL (:mod:`rl.swarm.parl`), takes group-mean advantages
  (:func:`rl.objective.group_advantages`) and treats every orchestrator turn of an episode as one response row
  carrying that episode's advantage; :func:`rl.step.accumulate_policy_gradient` then applies the K2.5 token-level
  objective (:func:`rl.objective.k25_policy_loss`, normalised by the total response tokens of the batch). A step
  whose every group has equal rewards (all advantages 0) makes no optimizer step: with AdamW the update would not
  be zero (momentum of earlier steps, and the squared log-ratio penalty's ~1e-7 gradient normalised to a full
  ``lr``-sized step), so the policy would drift with no signal.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from data_pipelines.tokenizer import render_chat, train_tokenizer
from rl.config import ObjectiveCfg
from rl.objective import group_advantages
from rl.rollout import Group, Prompt, SamplingConfig
from rl.step import accumulate_policy_gradient
from rl.swarm.envs import SceneTask, make_deep_task, make_wide_task
from rl.swarm.metrics import episode_metrics
from rl.swarm.parl import PARLConfig, parl_terms
from rl.swarm.policies import ModelPolicy, ScriptedSwarmOrchestrator, scripted_single_agent, scripted_worker
from rl.swarm.runtime import Episode, Policy, RuntimeConfig, SwarmRuntime

TRAIN_SEED_OFFSET = 1_000_000  # training tasks use seeds >= this; evaluation tasks use small seeds


def transcript_text(ep: Episode) -> str:
    """The orchestrator's whole conversation of an episode, rendered like the model sees it."""
    messages = ep.stages[-1].messages + [{"role": "assistant", "content": ep.stages[-1].text}]
    return "".join(p[0] for p in render_chat(messages, train_on="none"))


def scripted_episodes(n: int, n_scenes: int, swarm_share: float, workers: int, seed: int) -> list[Episode]:
    """``n`` scripted wide-task episodes, a ``swarm_share`` of them decomposed into ``workers`` sub-agents."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = make_wide_task(TRAIN_SEED_OFFSET + seed * 100_003 + i, n_scenes=n_scenes)
        if rng.random() < swarm_share:
            out.append(SwarmRuntime(ScriptedSwarmOrchestrator(workers), scripted_worker).run(task))
        else:
            out.append(SwarmRuntime(scripted_single_agent, None, RuntimeConfig(allow_subagents=False)).run(task))
    return out


def build_tokenizer(out_dir: str | Path, vocab_size: int = 1024, n_transcripts: int = 200) -> Any:
    """A BPE tokenizer with the project's special tokens, trained on scripted wide/deep transcripts."""
    texts = [transcript_text(ep) for ep in scripted_episodes(n_transcripts, 8, 0.5, 2, seed=7)]
    for i in range(n_transcripts // 4):
        task = make_deep_task(TRAIN_SEED_OFFSET + i, depth=3)
        texts.append(transcript_text(SwarmRuntime(ScriptedSwarmOrchestrator(2), scripted_worker).run(task)))
        texts += task.scenes
    return train_tokenizer(texts, out_dir, vocab_size=vocab_size)


def build_model(tokenizer: Any, flavor: str, seed: int) -> torch.nn.Module:
    from kimi_vl import KimiVLConfig, KimiVLForCausalLM

    vocab = tokenizer.get_vocab()
    torch.manual_seed(seed)
    cfg = KimiVLConfig.from_flavor(flavor, vocab_size=max(len(vocab), 256), pad_token_id=vocab["<|pad|>"],
                                   eos_token_id=vocab["<|endoftext|>"])  # fmt: skip
    return KimiVLForCausalLM(cfg)


def sft_example(ep: Episode, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one orchestrator transcript; labels are -100 outside assistant turns."""
    messages = ep.stages[-1].messages + [{"role": "assistant", "content": ep.stages[-1].text}]
    ids, labels = [], []
    for text, trainable, _ in render_chat(messages, train_on="assistant"):
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        labels += piece if trainable else [-100] * len(piece)
    return ids, labels


@dataclass
class WarmStartCfg:
    examples: int = 128
    steps: int = 60
    batch_size: int = 8
    lr: float = 3e-3
    # "linear": lr * (1 - step / steps). Measured on the tiny model (80 steps): the constant rate ended at loss
    # ~0.09 and at 80% <|im_end|> right after the second "functions.assign_task", so 0/13 sampled swarm turns
    # were well-formed; linear decay ends at ~0.04, that token at 1%, and 4/16 swarm turns well-formed.
    lr_schedule: Literal["constant", "linear"] = "linear"
    n_scenes: int = 4
    workers: int = 2
    swarm_share: float = 0.5

    def lr_at(self, step: int) -> float:
        if self.lr_schedule not in ("constant", "linear"):
            raise ValueError(f"WarmStartCfg.lr_schedule must be 'constant' or 'linear', got {self.lr_schedule!r}")
        return self.lr if self.lr_schedule == "constant" else self.lr * (1.0 - step / self.steps)


def warm_start(model: torch.nn.Module, tokenizer: Any, cfg: WarmStartCfg, seed: int) -> list[float]:
    """Imitation on scripted orchestrator transcripts (see the module docstring); returns the loss per step."""
    data = [sft_example(ep, tokenizer) for ep in
            scripted_episodes(cfg.examples, cfg.n_scenes, cfg.swarm_share, cfg.workers, seed)]  # fmt: skip
    pad = tokenizer.get_vocab()["<|pad|>"]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng, losses = random.Random(seed), []
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        batch = rng.sample(data, min(cfg.batch_size, len(data)))
        length = max(len(ids) for ids, _ in batch)
        ids_BL = torch.tensor([ids + [pad] * (length - len(ids)) for ids, _ in batch])
        labels_BL = torch.tensor([lab + [-100] * (length - len(lab)) for _, lab in batch])
        mask_BL = (torch.arange(length)[None, :] < torch.tensor([len(i) for i, _ in batch])[:, None]).long()
        logits = model(input_ids=ids_BL, attention_mask=mask_BL, use_cache=False).logits  # [B, L, V]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels_BL[:, 1:].flatten(),
                                                 ignore_index=-100)  # fmt: skip
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


@dataclass
class SwarmRLCfg:
    steps: int = 6
    tasks_per_step: int = 2
    k: int = 4  # episodes per task (one group)
    lr: float = 1e-3
    n_scenes: int = 4
    objective: ObjectiveCfg = field(default_factory=ObjectiveCfg)
    parl: PARLConfig = field(default_factory=PARLConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=96))
    runtime: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(max_orchestrator_steps=8,
                                                                         max_total_steps=24))  # fmt: skip


def run_episodes(policy: ModelPolicy, subagent: Policy, runtime_cfg: RuntimeConfig,
                 tasks: Sequence[SceneTask], k: int) -> list[list[tuple[Episode, list]]]:  # fmt: skip
    """``k`` episodes per task with the model as orchestrator; each with the model turns it sampled."""
    runtime = SwarmRuntime(policy, subagent, runtime_cfg)
    out = []
    for task in tasks:
        row = []
        for _ in range(k):
            policy.turns = []
            ep = runtime.run(task)
            row.append((ep, list(policy.turns)))
        out.append(row)
    return out


def _turn_groups(rollouts: list[list[tuple[Episode, list]]], adv_PK: torch.Tensor) -> tuple[list[Group], torch.Tensor]:
    """Every orchestrator turn as a one-row group, with its episode's advantage ``[n_turns, 1]``."""
    groups, adv = [], []
    for p, row in enumerate(rollouts):
        for k, (_, turns) in enumerate(row):
            for t in turns:
                n = t.response_ids.numel()
                groups.append(Group(Prompt(t.prompt_ids, "swarm", None), t.response_ids[None], t.logprobs[None],
                                    torch.ones(1, n), [t.text], ["eos"]))  # fmt: skip
                adv.append(adv_PK[p, k])
    return groups, torch.tensor(adv, dtype=torch.float32)[:, None]


def rl_step(model: torch.nn.Module, policy: ModelPolicy, opt: torch.optim.Optimizer, cfg: SwarmRLCfg, step: int,
            seed: int) -> dict[str, float]:  # fmt: skip
    """One PARL update on ``tasks_per_step`` fresh wide tasks; returns the step's metrics."""
    rng = random.Random(seed * 7919 + step)
    tasks = [make_wide_task(TRAIN_SEED_OFFSET + rng.getrandbits(30), n_scenes=cfg.n_scenes)
             for _ in range(cfg.tasks_per_step)]  # fmt: skip
    model.eval()
    rollouts = run_episodes(policy, scripted_worker, cfg.runtime, tasks, cfg.k)
    terms = [[parl_terms(ep, cfg.parl, step) for ep, _ in row] for row in rollouts]
    rewards_PK = torch.tensor([[t.total for t in row] for row in terms], dtype=torch.float32)
    adv_PK = group_advantages(rewards_PK, normalize_std=cfg.objective.normalize_std)
    groups, adv = _turn_groups(rollouts, adv_PK)
    model.train()
    opt.zero_grad(set_to_none=True)
    pad = policy.pad_id
    stats = accumulate_policy_gradient(model, groups, adv, cfg.objective, cfg.sampling.temperature, pad_id=pad)
    skipped = not bool(adv_PK.abs().gt(0).any())
    if skipped:  # no learning signal: an Adam step would still move the weights (momentum, normalised noise)
        opt.zero_grad(set_to_none=True)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    flat = [t for row in terms for t in row]
    eps = [episode_metrics(ep) for row in rollouts for ep, _ in row]
    return {
        "step": step,
        "reward": rewards_PK.mean().item(),
        "r_parallel": sum(t.r_parallel for t in flat) / len(flat),
        "r_finish": sum(t.r_finish for t in flat) / len(flat),
        "outcome": sum(t.r_outcome for t in flat) / len(flat),
        "lambda1": flat[0].lambda1,
        "lambda2": flat[0].lambda2,
        "serial_collapse": sum(m["serial_collapse"] for m in eps) / len(eps),
        "skipped_update": float(skipped),
        "malformed_turn_share": sum(m["malformed_turns"] for m in eps) / max(1, sum(m["orchestrator_steps"]
                                                                               for m in eps)),  # fmt: skip
        **{k: float(v) for k, v in stats.items()},
    }


__all__ = [
    "SwarmRLCfg",
    "WarmStartCfg",
    "build_model",
    "build_tokenizer",
    "rl_step",
    "run_episodes",
    "scripted_episodes",
    "sft_example",
    "transcript_text",
    "warm_start",
]

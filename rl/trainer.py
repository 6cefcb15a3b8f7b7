"""The RL trainer: sample K responses per prompt, reward them, update the policy with the K2.5 objective
(or the GRPO clipped variant), log one JSON line per step, evaluate held-out pass@1 every ``eval_every``
steps, checkpoint resumably and export ``<output_dir>/final`` like the training app.

Entry points: ``kimi-vl rl --config kimi_vl/configs/debug_rl.yaml [key=value ...]``,
``python -m rl --config ...`` and ``accelerate launch -m rl --config ...`` (each rank samples its own
prompts; DDP averages the gradients).

Metrics per step (``<output_dir>/metrics.jsonl``): ``reward``, ``reward/<family>``, ``response_len``,
``unparsed_share``, ``masked_share`` (tokens with zero gradient from the [alpha, beta] mask or the clip),
``kl_to_init`` (k3 estimate against a frozen copy of the initial policy), ``entropy``, ``loss``,
``update_tokens`` (cumulative), ``time_rollout_s``, ``time_update_s``; every ``eval_every`` steps (and at
step 0 and the last step) on the held-out prompts: ``eval/reward``, ``eval/pass@1``, ``eval/reward/<family>``,
``eval/unparsed_share``, ``eval/response_len``. A family is the reward family of the prompt (for the synthetic
world its QA category: ``count``, ``color``, ``ocr``, ...; see :mod:`rl.synth_source`).

Python entry point (e.g. for a quickstart stage): :func:`run_rl` ``(cfg) -> <output_dir>/final``.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kimi_vl.logs import MetricsWriter, print0
from kimi_vl.runconfig import save_config
from kimi_vl.train.checkpoint import (
    architecture,
    export_pretrained,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)
from kimi_vl.train.config import CONFIG_DIR, load_run_config
from kimi_vl.train.teardown import end_run
from rl.build import build_model, build_source, check_inputs
from rl.config import RLRunConfig
from rl.objective import length_budget
from rl.rollout import Group, Prompt, SamplingConfig, sample_groups
from rl.step import accumulate_policy_gradient, advantages, family_means, score_groups, shaped_rewards
from rl.tasks import Tokenizer


def build_optimizer(cfg: RLRunConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    from kimi_vl.optim.builder import OptimConfig
    from kimi_vl.optim.builder import build_optimizer as build_kimi_optimizer

    kimi_cfg = OptimConfig(name="muonclip", lr=o.lr, weight_decay=o.weight_decay, betas=o.betas, **o.extra)
    return build_kimi_optimizer(model, kimi_cfg)


class SamplerState:
    """The prompt RNG and the token sampler's generator (on the model's device: ``torch.multinomial`` needs
    its generator where the probabilities are), saved with each checkpoint."""

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.rng = random.Random(seed)
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.gen.set_state(state["gen"])


def rollout(model: Any, tokenizer: Tokenizer, prompts: list[Prompt], k: int, sampling: SamplingConfig,
            gen: torch.Generator) -> list[Group]:  # fmt: skip
    """One group of ``k`` responses per prompt, sampled in eval mode without gradients."""
    was_training = model.training
    model.eval()
    eos_ids = getattr(tokenizer, "eos_ids", [tokenizer.eos_token_id])
    groups = sample_groups(model, prompts, k, sampling, eos_ids, tokenizer.pad_token_id, tokenizer.decode, gen,
                           getattr(tokenizer, "banned_ids", ()))
    model.train(was_training)
    return groups


def evaluate(model: Any, tokenizer: Tokenizer, prompts: list[Prompt], cfg: RLRunConfig) -> dict[str, float]:
    """Held-out reward and pass@1 (one sample per prompt, ``rollout.eval_sampling``, fixed seed)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed + 12345)
    batch = score_groups(rollout(model, tokenizer, prompts, 1, cfg.rollout.eval_sampling, gen))
    correct = batch.correct(cfg.objective.correct_threshold).float()
    out = {"eval/reward": batch.rewards_PK.mean().item(), "eval/pass@1": correct.mean().item(),
           "eval/unparsed_share": 1.0 - batch.parsed_PK.float().mean().item(),
           "eval/response_len": batch.lengths_PK.float().mean().item()}
    out.update(family_means(batch.rewards_PK, batch.families, "eval/reward"))
    return out


class RLTrainer:
    """Holds the policy, its frozen initial copy, the optimizer and the prompt source for one run."""

    def __init__(self, cfg: RLRunConfig, accelerator: Any = None):
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        self.cfg = cfg
        # As in the training app: under DDP each rank keeps its own QK-Clip max-logit buffers, and parameters that get
        # no gradient in a step (the vision tower on text prompts, idle MoE experts) must not stop the run.
        ddp = DistributedDataParallelKwargs(broadcast_buffers=False, find_unused_parameters=True)
        self.acc = accelerator or Accelerator(cpu=cfg.cpu, kwargs_handlers=[ddp])
        self.tokenizer, self.source = build_source(cfg)
        model = build_model(cfg, self.tokenizer).train()  # exports load in eval mode; MoE counts need train
        self.ref = copy.deepcopy(model).eval().requires_grad_(False).to(self.acc.device) if cfg.kl_to_init else None
        self.model, self.optimizer = self.acc.prepare(model, build_optimizer(cfg, model))
        self.sampler = SamplerState(cfg.seed + 1000 * self.acc.process_index, self.acc.device)
        self.acc.register_for_checkpointing(self.sampler)
        self.heldout = self.source.heldout(cfg.data.heldout_prompts)
        self.step, self.update_tokens, self.budget = 0, 0, None
        self.out = Path(cfg.output_dir)
        self.metrics = MetricsWriter(self.out)

    def resume(self) -> None:
        path = resolve_resume(self.cfg.resume, self.out)
        if path is None:
            return
        state = load_checkpoint(self.acc, path, architecture(self.acc.unwrap_model(self.model).config))
        self.step, self.update_tokens, self.budget = state["step"], state["update_tokens"], state.get("budget")
        print0(f"rl: resumed from {path} at step {self.step}")

    def _done(self) -> bool:
        cap = self.cfg.max_update_tokens
        return self.step >= self.cfg.max_steps or (cap is not None and self.update_tokens >= cap)

    def train_step(self) -> dict[str, float]:
        cfg, t0 = self.cfg, time.time()
        prompts = self.source.sample(cfg.rollout.prompts_per_step, self.sampler.rng)
        groups = rollout(self.model, self.tokenizer, prompts, cfg.rollout.k, cfg.rollout.sampling, self.sampler.gen)
        batch = score_groups(groups)
        if cfg.objective.toggle_phase_steps > 0 and self.budget is None:
            correct_lengths = batch.lengths_PK[batch.correct(cfg.objective.correct_threshold)]
            self.budget = (
                length_budget(correct_lengths, cfg.objective.toggle_percentile) if correct_lengths.numel() else None
            )
        adv = advantages(shaped_rewards(batch, cfg.objective, self.step, self.budget), cfg.objective)
        t1 = time.time()
        stats: dict[str, float] = {}
        for update in range(cfg.objective.updates_per_batch):
            ref = self.ref if update == 0 else None
            stats_u = accumulate_policy_gradient(self.model, groups, adv, cfg.objective,
                                                 cfg.rollout.sampling.temperature, self.acc.backward, ref,
                                                 self.tokenizer.pad_token_id)  # fmt: skip
            stats = stats or stats_u
            if cfg.optim.grad_clip > 0:
                self.acc.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            unwrapped = self.acc.unwrap_model(self.model)
            if hasattr(unwrapped, "update_moe_bias"):  # aux-loss-free MoE balancing, as in the training loop
                stats.update(unwrapped.update_moe_bias())
        self.step += 1
        self.update_tokens += int(batch.lengths_PK.sum()) * cfg.objective.updates_per_batch
        return {
            "reward": batch.rewards_PK.mean().item(),
            **family_means(batch.rewards_PK, batch.families, "reward"),
            "response_len": batch.lengths_PK.float().mean().item(),
            "unparsed_share": 1.0 - batch.parsed_PK.float().mean().item(),
            **stats,
            "update_tokens": self.update_tokens,
            "time_rollout_s": t1 - t0,
            "time_update_s": time.time() - t1,
            "gen_tokens_per_s": int(batch.lengths_PK.sum()) / max(t1 - t0, 1e-9),
        }

    def save(self) -> None:
        state = {"update_tokens": self.update_tokens, "budget": self.budget,
                 "architecture": architecture(self.acc.unwrap_model(self.model).config)}
        save_checkpoint(self.acc, self.out, self.step, state, keep_last=self.cfg.keep_last)

    def train(self) -> list[dict]:
        """Run to ``max_steps`` (or ``max_update_tokens``); return the logged records."""
        save_config(self.cfg, self.out / "config.yaml")
        self.resume()
        records = []
        if self.step == 0:
            records.append(self.metrics.log(0, evaluate(self.model, self.tokenizer, self.heldout, self.cfg)))
        while not self._done():
            record = self.train_step()
            if self.step % self.cfg.eval_every == 0 or self._done():
                record.update(evaluate(self.model, self.tokenizer, self.heldout, self.cfg))
            records.append(self.metrics.log(self.step, record))
            print0(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in records[-1].items()
                            if k in ("step", "reward", "response_len", "eval/reward", "kl_to_init")))  # fmt: skip
            if self.step % self.cfg.checkpoint_every == 0 or self._done():
                self.save()
        if self.acc.is_main_process:
            export_pretrained(self.acc.unwrap_model(self.model), self.out / "final",
                              getattr(self.tokenizer, "tokenizer", None),
                              extra_files={"rl_config.yaml": (self.out / "config.yaml").read_text()})  # fmt: skip
        self.acc.wait_for_everyone()
        return records

    def close(self) -> None:
        """End the run (``kimi_vl/train/teardown.py``: the DDP wrapper goes before the process group); the trainer
        cannot train afterwards."""
        self.model = self.optimizer = None
        end_run(self.acc)


def run_rl(cfg: RLRunConfig, accelerator: Any = None) -> Path:
    """Run the RL stage of ``cfg`` (resuming if a checkpoint exists); return the export folder
    ``<output_dir>/final`` (model, tokenizer when the run has one, ``rl_config.yaml``). A caller's ``accelerator``
    is left open; one made here is closed (``RLTrainer.close``)."""
    trainer = RLTrainer(cfg, accelerator)
    trainer.train()
    if accelerator is None:
        trainer.close()
    return Path(cfg.output_dir) / "final"


def main(argv: Sequence[str] | None = None) -> int:
    """``kimi-vl rl --config FILE [key=value ...]``."""
    parser = argparse.ArgumentParser(prog="kimi-vl rl", description="vision RL with verifiable rewards (K2.5)")
    parser.add_argument("--config", required=True, help=f"a YAML file or the name of a shipped config ({CONFIG_DIR}, "
                        "e.g. tiny_rl)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_steps=10")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    cfg = load_run_config(RLRunConfig, args.config, args.overrides, check_inputs, parser.prog)
    if cfg is None:
        return 2
    run_rl(cfg)
    return 0


__all__ = ["RLTrainer", "build_model", "build_optimizer", "build_source", "evaluate", "main", "rollout", "run_rl"]

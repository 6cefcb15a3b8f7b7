"""Run config of the RL stage (YAML -> these dataclasses through :mod:`kimi_vl.runconfig`).

Top-level keys follow the training app: ``output_dir``, ``max_steps``, ``seed``, ``init_from`` (an exported
model folder, e.g. ``<sft run>/final``, as written by ``kimi-vl train``; null builds a fresh model from ``model``),
``resume``. ``data.path`` takes the training app's conventions (a dataset folder or ``synth:PRESET[:SEED]``);
the tokenizer is ``data.tokenizer``, else the one exported with ``init_from``, else ``<data root>/tokenizer``.
``data.source`` picks the prompts: ``vision`` (images / video of the synthetic world), ``text`` (the text-RL
control arm: text_mirror problems) or ``letter_count`` (a character-level toy for fast tests).
``max_update_tokens`` stops the run once that many response tokens went into updates: give the vision arm
and the text-RL control arm the same value to compare them at equal update tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rl.rollout import SamplingConfig


@dataclass
class ModelCfg:
    """A fresh model (when ``init_from`` is null): kimi_vl ``flavor`` (+ ``vision_flavor`` tower), or
    ``backend: transformers`` (a random KimiLinearForCausalLM; letter_count only)."""

    backend: Literal["kimi_vl", "transformers"] = "kimi_vl"
    flavor: str = "debug"
    vision_flavor: str | None = "debug"  # None: text-only model (letter_count / text source)
    overrides: dict[str, Any] = field(default_factory=dict)  # config fields replacing the flavor's


@dataclass
class DataCfg:
    source: Literal["vision", "text", "letter_count"] = "vision"
    path: str = "synth:tiny"  # a folder written by `kimi-vl data synth`, or synth:PRESET[:SEED] (built once, cached)
    tokenizer: str | None = None  # default: the init_from export's tokenizer, else <data root>/tokenizer
    reward_families: list[str] = field(default_factory=list)  # data families to train on (empty: all of the source)
    categories: list[str] = field(default_factory=list)  # QA categories to keep (empty: all), e.g. [count]
    max_patches: int = 256  # per-image patch budget of the processor (as the training app's data.max_patches)
    heldout_prompts: int = 64
    # letter_count only
    letters: str = "ab"
    alphabet: str | None = None  # the character tokenizer's alphabet (None: its default)
    min_len: int = 2
    max_len: int = 6


@dataclass
class RolloutCfg:
    prompts_per_step: int = 8
    k: int = 8
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval_sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.3))


@dataclass
class ObjectiveCfg:
    kind: Literal["k25", "grpo"] = "k25"
    alpha: float = -1.0
    beta: float = 1.0
    tau: float = 0.1
    eps_low: float = 0.2
    eps_high: float = 0.2
    normalize_std: bool = False
    updates_per_batch: int = 1  # optimizer steps on one rollout batch (pi_old = the sampling policy)
    # response rows per forward/backward of the update (bounds memory; 0: all rows of the step at once). 8 was the
    # fastest on the 2-core CPU (rl/README.md, "Batching"); a GPU may prefer more
    micro_batch_rows: int = 8
    length_penalty_weight: float = 0.0  # k1.5 length reward, added to the task reward
    correct_threshold: float = 1.0  # reward >= this counts as correct (length penalty, Toggle, pass@1)
    toggle_phase_steps: int = 0  # > 0 turns on Toggle budget phases of this many steps
    toggle_percentile: float = 50.0
    toggle_rare_solve_rate: float = 0.25


@dataclass
class OptimCfg:
    name: Literal["adamw", "muonclip"] = "adamw"
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)  # passed to kimi_vl.optim.build_optimizer


@dataclass
class RLRunConfig:
    output_dir: str
    max_steps: int = 100
    seed: int = 0
    init_from: str | None = None
    resume: str | None = "auto"
    max_update_tokens: int | None = None
    eval_every: int = 10
    checkpoint_every: int = 50
    keep_last: int = 2
    kl_to_init: bool = True  # keep a frozen copy of the initial policy for the KL metric
    cpu: bool = False
    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    rollout: RolloutCfg = field(default_factory=RolloutCfg)
    objective: ObjectiveCfg = field(default_factory=ObjectiveCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)


__all__ = ["DataCfg", "ModelCfg", "ObjectiveCfg", "OptimCfg", "RLRunConfig", "RolloutCfg"]

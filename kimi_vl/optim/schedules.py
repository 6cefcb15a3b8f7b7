"""Learning-rate multipliers: linear warmup, then constant, WSD (warmup-stable-decay) or cosine.

Source: Moonlight / Kimi K2 use WSD; cosine is the common baseline. ``lr_multiplier(step)`` is the factor
applied to each param group's base lr before optimizer step ``step`` (0-based), as ``LambdaLR`` does.

- warmup: ``(step + 1) / warmup_steps`` for ``step < warmup_steps`` (the first step already moves).
- constant: 1.
- wsd: 1 until the last ``decay_fraction * total_steps`` steps, then linear down to ``min_lr_ratio``.
- cosine: ``min + (1 - min) * (1 + cos(pi * progress)) / 2`` over the steps after warmup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

ScheduleName = Literal["constant", "wsd", "cosine"]


@dataclass(frozen=True)
class Schedule:
    name: ScheduleName = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    decay_fraction: float = 0.2
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        where = "kimi_vl/optim/schedules.py"
        if self.name not in ("constant", "wsd", "cosine"):
            raise ValueError(f"{where}: schedule must be constant, wsd or cosine, got {self.name!r}")
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1 or not 0 < self.decay_fraction <= 1:
            raise ValueError(f"{where}: bad schedule {self}")
        if self.name != "constant" and self.total_steps <= self.warmup_steps:
            raise ValueError(f"{where}: {self.name} needs total_steps > warmup_steps, got {self}")


def lr_multiplier(step: int, s: Schedule) -> float:
    """Factor on the base learning rate at 0-based optimizer step ``step``."""
    if step < s.warmup_steps:
        return (step + 1) / s.warmup_steps
    if s.name == "constant":
        return 1.0
    if s.name == "wsd":
        decay_steps = max(1, round(s.decay_fraction * s.total_steps))
        decay_start = max(s.warmup_steps, s.total_steps - decay_steps)
        if step < decay_start:
            return 1.0
        frac = min(1.0, (step - decay_start) / max(1, s.total_steps - decay_start))
        return 1.0 - (1.0 - s.min_lr_ratio) * frac
    progress = min(1.0, (step - s.warmup_steps) / (s.total_steps - s.warmup_steps))
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, s: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over every param group (call ``scheduler.step()`` after each ``optimizer.step()``)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, s))

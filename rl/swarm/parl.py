"""PARL reward for the orchestrator: ``R = lambda1(t) * r_parallel + lambda2(t) * r_finish + r_outcome``, with
both lambdas annealed to zero (K2.5 Agent Swarm; the report publishes neither the term forms nor the schedule,
so the forms below are this project's choice).

Let ``n`` = number of sub-agent instances the episode ran from *well-formed* orchestrator turns (executed
``assign_task`` calls of turns without a parse error or a rejected call; a created but never assigned agent does
not count), ``f`` = how many of them returned a final message within their step budget, ``C`` =
``parallel_cap``. The runtime still runs the complete calls before a broken one, but such a turn earns no
shaping credit: otherwise a turn cut off after its first ``assign_task`` (an early ``<|im_end|>``) is paid
``r_parallel`` and ``r_finish`` and RL learns to end the turn ever earlier, down to a turn with no call at all
(measured on the tiny model: serial collapse 0.38 -> 1.0 after one step, see ``rl/swarm/README.md``).

- ``r_parallel = min(n, C) / C``: rewards instantiating sub-agents at all (counters *serial collapse*, an
  orchestrator that does everything itself); it saturates at ``C`` so spawning more is not rewarded;
- ``r_finish = f / n`` (0 when ``n = 0``): the share of sub-tasks completed, so spawning agents that fail (bad
  prompts, unknown tools, out of budget) lowers the reward - it counters the spawning of useless agents that
  ``r_parallel`` alone would invite; it is 0 without sub-agents, so it never rewards serial episodes;
- ``r_outcome`` = the environment's verifiable score in [0, 1].

Schedules (:class:`AnnealSchedule`): ``lambda(t) = start`` for ``t < hold_steps``, then decays to 0 over
``anneal_steps`` steps - linearly, ``start * (1 - u)``, or by a half cosine, ``start * (1 + cos(pi u)) / 2``,
with ``u = (t - hold_steps) / anneal_steps``; ``lambda(t) = 0`` for ``t >= hold_steps + anneal_steps``. Once
both are 0 the reward is the outcome alone, so the final policy is optimised for the task, not for spawning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from rl.swarm.runtime import Episode, SubagentRun


@dataclass
class AnnealSchedule:
    start: float = 0.0
    hold_steps: int = 0
    anneal_steps: int = 100
    kind: Literal["linear", "cosine"] = "linear"

    def __post_init__(self) -> None:
        if self.start < 0 or self.hold_steps < 0 or self.anneal_steps < 1:
            raise ValueError(f"AnnealSchedule: need start >= 0, hold_steps >= 0, anneal_steps >= 1; got {self}")
        if self.kind not in ("linear", "cosine"):
            raise ValueError(f"AnnealSchedule.kind must be 'linear' or 'cosine', got {self.kind!r}")

    def value(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"AnnealSchedule.value: step must be >= 0, got {step}")
        if step < self.hold_steps:
            return self.start
        u = (step - self.hold_steps) / self.anneal_steps
        if u >= 1.0:
            return 0.0
        if self.kind == "linear":
            return self.start * (1.0 - u)
        return self.start * 0.5 * (1.0 + math.cos(math.pi * u))


@dataclass
class PARLConfig:
    lambda1: AnnealSchedule = field(default_factory=lambda: AnnealSchedule(start=0.3))  # r_parallel
    lambda2: AnnealSchedule = field(default_factory=lambda: AnnealSchedule(start=0.3))  # r_finish
    parallel_cap: int = 4

    def __post_init__(self) -> None:
        if self.parallel_cap < 1:
            raise ValueError(f"PARLConfig.parallel_cap must be >= 1, got {self.parallel_cap}")


@dataclass(frozen=True)
class PARLTerms:
    r_parallel: float
    r_finish: float
    r_outcome: float
    lambda1: float
    lambda2: float

    @property
    def total(self) -> float:
        return self.lambda1 * self.r_parallel + self.lambda2 * self.r_finish + self.r_outcome


def r_parallel(n_instances: int, cap: int) -> float:
    """``min(n, cap) / cap``."""
    if n_instances < 0 or cap < 1:
        raise ValueError(f"r_parallel: need n_instances >= 0 and cap >= 1, got {n_instances}, {cap}")
    return min(n_instances, cap) / cap


def r_finish(n_finished: int, n_instances: int) -> float:
    """``f / n`` (0 when n = 0)."""
    if not 0 <= n_finished <= n_instances:
        raise ValueError(f"r_finish: need 0 <= n_finished <= n_instances, got {n_finished}, {n_instances}")
    return n_finished / n_instances if n_instances else 0.0


def credited_runs(ep: Episode) -> list[SubagentRun]:
    """The sub-agent runs of the episode's well-formed orchestrator turns (``n_errors == 0``)."""
    return [r for st in ep.stages if st.n_errors == 0 for r in st.runs]


def parl_terms(ep: Episode, cfg: PARLConfig, step: int) -> PARLTerms:
    """The reward terms of one episode at training step ``step`` (shaping counts :func:`credited_runs` only)."""
    runs = credited_runs(ep)
    n, f = len(runs), sum(r.finished for r in runs)
    return PARLTerms(r_parallel(n, cfg.parallel_cap), r_finish(f, n), ep.outcome,
                     cfg.lambda1.value(step), cfg.lambda2.value(step))  # fmt: skip


__all__ = ["AnnealSchedule", "PARLConfig", "PARLTerms", "credited_runs", "parl_terms", "r_finish", "r_parallel"]

"""Swarm episode metrics (K2.5 Agent Swarm latency proxy) and their aggregation.

Per episode, with stages s = 1..S (one orchestrator turn each) and the sub-agent runs r started in stage s:

- ``critical_steps = sum_s (1 + max_{r in s} steps_r)`` (``max`` over no runs = 0): the latency proxy of
  K2.5 (main-agent step + the longest concurrent sub-agent, per stage);
- ``total_steps = S + sum_{s,r} steps_r``: every policy call (the compute);
- ``wall_s``: measured wall-clock of the episode (sub-agents of one stage really run concurrently);
- ``serial_collapse = 1`` when no sub-agent ran in the episode (no ``assign_task`` executed);
- ``subagents_created``, ``subagent_runs`` (instances), ``finished_runs``;
- ``outcome`` (the environment's verifiable score), ``malformed_turns`` (orchestrator turns with at least one
  parse error or rejected call), ``answered`` (the episode ended with a final message).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl.swarm.runtime import Episode

METRICS = ("critical_steps", "total_steps", "orchestrator_steps", "wall_s", "serial_collapse", "subagents_created",
           "subagent_runs", "finished_runs", "outcome", "malformed_turns", "answered")  # fmt: skip


def critical_steps(ep: Episode) -> int:
    return sum(1 + max((r.steps for r in st.runs), default=0) for st in ep.stages)


def total_steps(ep: Episode) -> int:
    return len(ep.stages) + sum(r.steps for st in ep.stages for r in st.runs)


def episode_metrics(ep: Episode) -> dict[str, float]:
    runs = [r for st in ep.stages for r in st.runs]
    return {
        "critical_steps": float(critical_steps(ep)),
        "total_steps": float(total_steps(ep)),
        "orchestrator_steps": float(len(ep.stages)),
        "wall_s": ep.wall_s,
        "serial_collapse": float(not runs),
        "subagents_created": float(len(ep.created)),
        "subagent_runs": float(len(runs)),
        "finished_runs": float(sum(r.finished for r in runs)),
        "outcome": ep.outcome,
        "malformed_turns": float(sum(st.n_errors > 0 for st in ep.stages)),
        "answered": float(ep.stop_reason == "answer"),
    }


def metric_matrix(episodes_SQ: Sequence[Sequence[Episode]], name: str) -> np.ndarray:
    """``[S, Q]`` matrix of one metric over seeds (or repeats) x tasks, for :mod:`eval.stats`."""
    if name not in METRICS:
        raise ValueError(f"metric_matrix: unknown metric '{name}' (known: {METRICS})")
    return np.array([[episode_metrics(ep)[name] for ep in row] for row in episodes_SQ], dtype=np.float64)


def mean_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """The mean of every metric over a flat list of episodes."""
    if not episodes:
        raise ValueError("mean_metrics: no episodes")
    rows = [episode_metrics(ep) for ep in episodes]
    return {k: float(np.mean([r[k] for r in rows])) for k in METRICS}


__all__ = ["METRICS", "critical_steps", "episode_metrics", "mean_metrics", "metric_matrix", "total_steps"]

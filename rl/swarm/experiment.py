"""The swarm experiment: single agent vs swarm on the wide task at an equal step budget, and the serial-collapse
rate of a trained orchestrator with and without ``r_parallel``. Writes ``swarm_wide.json``, ``swarm_wide.md``
and ``swarm_wide.png`` to ``report_dir``.

Parts (each labelled in the report with the policy that produced its numbers):

1. ``scripted`` - rule-based policies (:mod:`rl.swarm.policies`): the single agent reads every scene itself; the
   swarm orchestrator always splits the scenes over ``workers`` scripted sub-agents. Every policy call sleeps
   ``latency_s`` (a *simulated* decode time) so that wall-clock reflects real thread concurrency. Repeats x tasks
   matrices go through :func:`eval.stats.bootstrap_score` / :func:`eval.stats.bootstrap_delta` (95% CIs). Also a
   sweep over the number of workers and the deep task as a control where decomposition cannot help.
2. ``model_init`` - the ``flavor`` model, randomly initialised, as orchestrator (scripted frozen sub-agents), in
   the single-agent and the swarm runtime at the same budget: real wall-clock, malformed-turn share.
3. ``rl`` - the same model after a short imitation warm start, then ``rl.steps`` PARL updates in two arms from
   the same weights: ``with_r_parallel`` (``lambda1`` annealed from ``rl_lambda1``) and ``without_r_parallel``
   (``lambda1 = 0``); serial-collapse rate on held-out tasks before and after, with CIs.

Run: ``python -m rl.swarm.experiment --config kimi_vl/configs/experiments/swarm_wide.yaml [key=value ...]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eval.stats import bootstrap_delta, bootstrap_score
from kimi_vl.runconfig import ConfigError, load_config
from rl.config import ObjectiveCfg
from rl.rollout import SamplingConfig
from rl.swarm.envs import SceneTask, make_deep_task, make_wide_task
from rl.swarm.metrics import METRICS, episode_metrics, metric_matrix
from rl.swarm.parl import AnnealSchedule, PARLConfig
from rl.swarm.policies import Delayed, ModelPolicy, ScriptedSwarmOrchestrator, scripted_single_agent, scripted_worker
from rl.swarm.runtime import Episode, RuntimeConfig, SwarmRuntime
from rl.swarm.train import SwarmRLCfg, WarmStartCfg, build_model, build_tokenizer, rl_step, run_episodes, warm_start


@dataclass
class ScriptedCfg:
    n_tasks: int = 32
    repeats: int = 3
    n_scenes: int = 16
    workers: int = 4
    latency_s: float = 0.01
    worker_sweep: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    deep_depth: int = 6
    deep_scenes: int = 12


@dataclass
class ModelInitCfg:
    n_tasks: int = 6
    n_scenes: int = 16
    max_new_tokens: int = 32
    max_orchestrator_steps: int = 17


@dataclass
class RLExpCfg:
    enabled: bool = True
    warm: WarmStartCfg = field(default_factory=WarmStartCfg)
    steps: int = 5
    tasks_per_step: int = 2
    k: int = 4
    lr: float = 1e-3
    n_scenes: int = 4
    rl_lambda1: float = 0.5
    rl_lambda2: float = 0.3
    anneal_steps: int = 10
    parallel_cap: int = 2
    max_new_tokens: int = 128
    eval_tasks: int = 8
    objective: ObjectiveCfg = field(default_factory=ObjectiveCfg)


@dataclass
class SwarmExperimentCfg:
    report_dir: str = "docs/results/swarm"
    name: str = "swarm_wide"
    machine: str = "unknown"
    date: str = "unknown"
    seed: int = 0
    flavor: str = "tiny"
    step_budget: int = 40  # max_total_steps of every episode, both arms
    max_orchestrator_steps: int = 24
    subagent_max_steps: int = 17  # a worker may read 16 scenes and answer
    n_boot: int = 2000
    scripted: ScriptedCfg = field(default_factory=ScriptedCfg)
    model_init: ModelInitCfg = field(default_factory=ModelInitCfg)
    rl: RLExpCfg = field(default_factory=RLExpCfg)


def _runtime_cfg(cfg: SwarmExperimentCfg, allow: bool, **kw: Any) -> RuntimeConfig:
    base = dict(max_total_steps=cfg.step_budget, max_orchestrator_steps=cfg.max_orchestrator_steps,
                subagent_max_steps=cfg.subagent_max_steps)
    return RuntimeConfig(allow_subagents=allow, **{**base, **kw})


def _run_grid(rt: SwarmRuntime, tasks: Sequence[SceneTask], repeats: int) -> list[list[Episode]]:
    return [[rt.run(t) for t in tasks] for _ in range(repeats)]


def _summaries(arms: dict[str, list[list[Episode]]], base: str, n_boot: int) -> dict[str, Any]:
    """Per arm and metric: point estimate + 95% CI; per non-base arm: delta vs ``base`` with CI."""
    lower_better = {"critical_steps", "total_steps", "orchestrator_steps", "wall_s", "malformed_turns"}
    out: dict[str, Any] = {}
    for arm, grid in arms.items():
        out[arm] = {m: bootstrap_score(metric_matrix(grid, m), n_boot=n_boot).to_dict() for m in METRICS}
        if arm != base:
            out[arm]["delta_vs_" + base] = {
                m: bootstrap_delta(metric_matrix(grid, m), metric_matrix(arms[base], m), n_boot=n_boot,
                                   higher_is_better=m not in lower_better).to_dict()
                for m in ("critical_steps", "total_steps", "wall_s", "outcome")
            }  # fmt: skip
    return out


def scripted_part(cfg: SwarmExperimentCfg) -> dict[str, Any]:
    s = cfg.scripted
    lat = s.latency_s
    single = SwarmRuntime(Delayed(scripted_single_agent, lat), None, _runtime_cfg(cfg, False))
    swarm = SwarmRuntime(Delayed(ScriptedSwarmOrchestrator(s.workers), lat), Delayed(scripted_worker, lat),
                         _runtime_cfg(cfg, True))  # fmt: skip
    wide = [make_wide_task(cfg.seed * 10_000 + i, n_scenes=s.n_scenes) for i in range(s.n_tasks)]
    arms = {"single": _run_grid(single, wide, s.repeats), "swarm": _run_grid(swarm, wide, s.repeats)}
    sweep = {}
    for k in s.worker_sweep:
        rt = SwarmRuntime(Delayed(ScriptedSwarmOrchestrator(k), lat), Delayed(scripted_worker, lat),
                          _runtime_cfg(cfg, True))  # fmt: skip
        eps = [rt.run(t) for t in wide[: max(4, s.n_tasks // 4)]]
        sweep[str(k)] = {m: float(np.mean([episode_metrics(e)[m] for e in eps])) for m in METRICS}
    deep = [make_deep_task(cfg.seed * 10_000 + i, depth=s.deep_depth, n_scenes=s.deep_scenes) for i in range(16)]
    deep_arms = {"single": _run_grid(single, deep, 1), "swarm": _run_grid(swarm, deep, 1)}
    return {"wide": _summaries(arms, "single", cfg.n_boot), "worker_sweep": sweep,
            "deep_control": _summaries(deep_arms, "single", cfg.n_boot)}  # fmt: skip


def model_init_part(cfg: SwarmExperimentCfg, model: torch.nn.Module, tok: Any) -> dict[str, Any]:
    m = cfg.model_init
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=m.max_new_tokens)
    tasks = [make_wide_task(cfg.seed * 10_000 + i, n_scenes=m.n_scenes) for i in range(m.n_tasks)]
    arms = {}
    for name, allow in (("single", False), ("swarm", True)):
        policy = ModelPolicy(model, tok, sampling, seed=cfg.seed)
        rt = SwarmRuntime(policy, scripted_worker if allow else None,
                          _runtime_cfg(cfg, allow, max_orchestrator_steps=m.max_orchestrator_steps))  # fmt: skip
        arms[name] = _run_grid(rt, tasks, 1)
    out = _summaries(arms, "single", cfg.n_boot)
    out["example_turns"] = [st.text[:200] for st in arms["swarm"][0][0].stages[:2]]
    return out


def _collapse_eval(model: torch.nn.Module, tok: Any, cfg: SwarmExperimentCfg, rl: SwarmRLCfg) -> dict[str, Any]:
    policy = ModelPolicy(model, tok, SamplingConfig(temperature=1.0, max_new_tokens=rl.sampling.max_new_tokens),
                         seed=cfg.seed + 99)  # fmt: skip
    tasks = [make_wide_task(cfg.seed * 10_000 + i, n_scenes=rl.n_scenes) for i in range(cfg.rl.eval_tasks)]
    eps = [row[0][0] for row in run_episodes(policy, scripted_worker, rl.runtime, tasks, 1)]
    out = {m: bootstrap_score(metric_matrix([eps], m), n_boot=cfg.n_boot).to_dict()
           for m in ("serial_collapse", "outcome", "subagent_runs", "malformed_turns", "critical_steps")}  # fmt: skip
    out["_collapse_row"] = metric_matrix([eps], "serial_collapse")[0].tolist()
    return out


def rl_part(cfg: SwarmExperimentCfg, tok: Any) -> dict[str, Any]:
    r = cfg.rl
    model = build_model(tok, cfg.flavor, cfg.seed)
    t0 = time.perf_counter()
    losses = warm_start(model, tok, r.warm, cfg.seed)
    warm_s = time.perf_counter() - t0
    base_rl = SwarmRLCfg(steps=r.steps, tasks_per_step=r.tasks_per_step, k=r.k, lr=r.lr, n_scenes=r.n_scenes,
                         objective=r.objective, sampling=SamplingConfig(max_new_tokens=r.max_new_tokens),
                         runtime=RuntimeConfig(max_orchestrator_steps=8, max_total_steps=24))  # fmt: skip
    out: dict[str, Any] = {"warm_start_loss": [losses[0], losses[-1]], "warm_start_s": warm_s,
                           "after_warm_start": _collapse_eval(model, tok, cfg, base_rl)}  # fmt: skip
    for arm, lam1 in (("with_r_parallel", r.rl_lambda1), ("without_r_parallel", 0.0)):
        arm_model = copy.deepcopy(model)
        rl = copy.deepcopy(base_rl)
        rl.parl = PARLConfig(AnnealSchedule(lam1, 0, r.anneal_steps), AnnealSchedule(r.rl_lambda2, 0, r.anneal_steps),
                             parallel_cap=r.parallel_cap)  # fmt: skip
        policy = ModelPolicy(arm_model, tok, rl.sampling, seed=cfg.seed + 7)
        opt = torch.optim.AdamW(arm_model.parameters(), lr=rl.lr, weight_decay=0.0)
        t0 = time.perf_counter()
        log = [rl_step(arm_model, policy, opt, rl, step, cfg.seed) for step in range(rl.steps)]
        out[arm] = {"train_log": log, "train_s": time.perf_counter() - t0,
                    "after_rl": _collapse_eval(arm_model, tok, cfg, rl)}  # fmt: skip
    a = np.array([out["with_r_parallel"]["after_rl"].pop("_collapse_row")])
    b = np.array([out["without_r_parallel"]["after_rl"].pop("_collapse_row")])
    out["after_warm_start"].pop("_collapse_row")
    out["collapse_delta_with_minus_without"] = bootstrap_delta(a, b, n_boot=cfg.n_boot,
                                                                higher_is_better=False).to_dict()  # fmt: skip
    return out


def run(cfg: SwarmExperimentCfg, command: str) -> dict[str, Any]:
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"config": asdict(cfg), "command": command, "machine": cfg.machine, "date": cfg.date,
                              "torch": torch.__version__, "python": platform.python_version(),
                              "threads": torch.get_num_threads()}  # fmt: skip
    result["scripted"] = scripted_part(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tokenizer(tmp)
        model = build_model(tok, cfg.flavor, cfg.seed).eval()
        result["model_init"] = model_init_part(cfg, model, tok)
        if cfg.rl.enabled:
            result["rl"] = rl_part(cfg, tok)
    result["total_s"] = time.perf_counter() - t0
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from rl.swarm.report import write_report

    parser = argparse.ArgumentParser(prog="python -m rl.swarm.experiment", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = load_config(SwarmExperimentCfg, args.config, args.overrides)
    except ConfigError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    command = "python -m rl.swarm.experiment " + " ".join([f"--config {args.config}", *args.overrides])
    result = run(cfg, command)
    out = Path(cfg.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{cfg.name}.json").write_text(json.dumps(result, indent=1, default=float))
    write_report(result, out, cfg.name)
    print(f"wrote {out / cfg.name}.{{json,md,png}} in {result['total_s']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

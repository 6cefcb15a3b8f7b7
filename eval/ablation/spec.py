"""Experiment specs for the ablation harness: a base run config, named arms, seeds and evaluation tasks.

An experiment YAML is read strictly with :func:`kimi_vl.runconfig.load_config` (unknown keys fail naming the
key and the file; ``_base_`` and ``key=value`` overrides work as for run configs)::

    name: optimizer
    base_config: ../train/debug.yaml        # run config of every stage unless a stage names its own
    base_overrides: [train.steps=50]
    stages: [{name: pretrain}]              # default stage list of every arm
    baseline: adamw
    seeds: [0, 1]
    arms:
      - {name: adamw, overrides: [optim.name=adamw]}
      - {name: muonclip, overrides: [optim.name=muonclip]}
    eval: {tasks: [kimi_text_mc], include_path: [tasks/]}
    curves: [loss, eval/val/loss]

Stage overrides are applied in this order: ``base_overrides``, the stage's ``overrides``, the arm's
``overrides`` (so an arm wins over both), ``stage_overrides[<stage name>]`` (the last word on every stage of that
name, whatever its arm: e.g. a CPU-sized run of a GPU experiment from the command line,
``stage_overrides.pretrain=[model.flavor=debug,max_steps=4]``), then the harness's own
``output_dir``/``seed``/``init_from`` keys. Relative
paths (``base_config``, a stage's ``config``, ``eval.include_path``) resolve against the experiment file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kimi_vl.runconfig import ConfigError, load_config


@dataclass
class StageSpec:
    """One step of an arm: ``kimi-vl <command> --config CONFIG overrides...``; it starts from the previous
    stage's export (``<run_dir>/final``) through the experiment's ``init_key``."""

    name: str
    command: str = "train"
    config: str | None = None
    overrides: list[str] = field(default_factory=list)


@dataclass
class ArmSpec:
    """A named variant: overrides applied to each of its stages, and its own stage list (else the default)."""

    name: str
    overrides: list[str] = field(default_factory=list)
    stages: list[StageSpec] | None = None
    description: str = ""


@dataclass
class EvalSpec:
    """lm-eval tasks run on each arm x seed's final export; ``include_path`` dirs hold the task YAML."""

    tasks: list[str] = field(default_factory=list)
    include_path: list[str] = field(default_factory=list)
    model: Literal["kimi_vl", "hf"] = "kimi_vl"
    model_args: str = ""
    batch_size: int = 8
    limit: int | None = None
    num_fewshot: int | None = None
    # task -> metric to analyse (default: the task's first metric; a "task:metric" pair also works in tasks)
    metrics: dict[str, str] = field(default_factory=dict)
    # > 0: `kimi-vl ablate` writes the kimi_text/kimi_vision suites (this many samples per family) to OUT/tasks
    # and adds that folder to include_path
    suite_samples: int = 0
    suite_preset: str = "tiny"
    # prompt lengths (tokens) of the kimi_text_retrieval_<L> tasks written with the suites (none by default), and
    # the tokenizer that sizes them: a folder or synth:PRESET[:SEED] (the cached dataset's tokenizer; built if
    # missing); empty = a characters-per-token estimate
    retrieval_lengths: list[int] = field(default_factory=list)
    suite_tokenizer: str = ""


@dataclass
class TargetSpec:
    """Curve analysis: how much x (steps or tokens) each arm needs to reach the reference arm's final value."""

    metric: str
    reference_arm: str
    stage: str | None = None
    x: str = "step"
    lower_is_better: bool = True


@dataclass
class Experiment:
    name: str
    arms: list[ArmSpec]
    baseline: str
    description: str = ""
    base_config: str | None = None
    base_overrides: list[str] = field(default_factory=list)
    stages: list[StageSpec] = field(default_factory=lambda: [StageSpec(name="train")])
    seeds: list[int] = field(default_factory=lambda: [0])
    eval: EvalSpec = field(default_factory=EvalSpec)
    curves: list[str] = field(default_factory=lambda: ["loss"])
    curve_x: str = "step"
    targets: list[TargetSpec] = field(default_factory=list)
    # stage name -> overrides applied after the arm's to every stage of that name (see the module docstring)
    stage_overrides: dict[str, list[str]] = field(default_factory=dict)
    # config keys of the stage runs that receive the harness's values
    output_key: str = "output_dir"
    seed_key: str = "seed"
    init_key: str = "init_from"
    n_boot: int = 2000
    # directory of the experiment file; set by load_experiment, used to resolve relative paths
    root: str = "."

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if not names:
            raise ValueError("arms: an experiment needs at least one arm")
        if len(set(names)) != len(names):
            raise ValueError(f"arms: names must be unique, got {names}")
        if self.baseline not in names:
            raise ValueError(f"baseline '{self.baseline}' is not one of the arms {names}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: need at least one seed and no repeats, got {self.seeds}")
        for t in self.targets:
            if t.reference_arm not in names:
                raise ValueError(f"targets: reference_arm '{t.reference_arm}' is not one of the arms {names}")
        for arm in self.arms:
            if not self.arm_stages(arm):
                raise ValueError(f"arm '{arm.name}': empty stage list")
        stage_names = {st.name for arm in self.arms for st in self.arm_stages(arm)}
        unknown = sorted(set(self.stage_overrides) - stage_names)
        if unknown:
            raise ValueError(f"stage_overrides: no stage named {unknown} (stages: {sorted(stage_names)})")

    def arm(self, name: str) -> ArmSpec:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    def arm_stages(self, arm: ArmSpec) -> list[StageSpec]:
        return list(arm.stages if arm.stages is not None else self.stages)

    def resolve(self, path: str | None) -> Path | None:
        if path is None:
            return None
        p = Path(os.path.expandvars(path)).expanduser()
        return p if p.is_absolute() else (Path(self.root) / p).resolve()

    def task_metric(self, task: str) -> tuple[str, str | None]:
        """``"task:metric"`` or a plain task name with an optional ``eval.metrics`` entry."""
        if ":" in task:
            name, metric = task.split(":", 1)
            return name, metric
        return task, self.eval.metrics.get(task)


def load_experiment(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read an experiment YAML strictly (see the module docstring); relative paths resolve against it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file not found: {path}")
    root = str(path.resolve().parent)
    return load_config(Experiment, path, list(overrides) + [f"root={root}"])


__all__ = ["ArmSpec", "EvalSpec", "Experiment", "StageSpec", "TargetSpec", "load_experiment"]

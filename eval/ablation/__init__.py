"""Ablation harness: experiment specs, a runner over arms x seeds, bootstrap analysis and reports.

``kimi-vl ablate EXPERIMENT.yaml --out DIR`` (see :mod:`eval.ablation.cli`) runs it with the training app;
:class:`Runner` takes any stage/eval function, which is how the tests drive it without training.
"""

from eval.ablation.analysis import analyse
from eval.ablation.report import write_report
from eval.ablation.runner import ChainResult, EvalJob, Runner, StageJob, plan_chain
from eval.ablation.spec import ArmSpec, EvalSpec, Experiment, StageSpec, TargetSpec, load_experiment

__all__ = [
    "ArmSpec",
    "ChainResult",
    "EvalJob",
    "EvalSpec",
    "Experiment",
    "Runner",
    "StageJob",
    "StageSpec",
    "TargetSpec",
    "analyse",
    "load_experiment",
    "plan_chain",
    "write_report",
]

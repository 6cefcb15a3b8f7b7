"""The default stage and evaluation functions of ``kimi-vl ablate``: subprocesses of the suite's own commands.

A stage runs ``python -m kimi_vl.cli <command> --config CONFIG overrides... output_dir=RUN seed=S
[init_from=PREV/final]`` (the key names come from the experiment: ``output_key``, ``seed_key``, ``init_key``);
an evaluation runs ``python -m eval`` on the run's ``final/`` export and writes ``samples.json``. Each
subprocess gets the job's environment (``CUDA_VISIBLE_DEVICES`` when the runner spreads chains over GPUs) and
logs to ``stage.log`` / ``eval.log`` in its directory; a non-zero exit raises with the log's tail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from eval.ablation.runner import EvalJob, StageJob


def stage_command(job: StageJob) -> list[str]:
    exp = job.experiment
    if exp is None:
        raise ValueError(f"stage job {job.key} carries no experiment (needed for the config key names)")
    cmd = [sys.executable, "-m", "kimi_vl.cli", job.command]
    if job.config is not None:
        cmd += ["--config", str(job.config)]
    cmd += list(job.overrides) + [f"{exp.output_key}={job.run_dir}", f"{exp.seed_key}={job.seed}"]
    if job.init_from is not None:
        cmd.append(f"{exp.init_key}={job.init_from}")
    return cmd


def eval_command(job: EvalJob) -> list[str]:
    exp = job.experiment
    if exp is None:
        raise ValueError(f"eval job {job.key} carries no experiment")
    spec = exp.eval
    arg = "checkpoint" if spec.model == "kimi_vl" else "pretrained"
    model_args = f"{arg}={job.checkpoint}" + (f",{spec.model_args}" if spec.model_args else "")
    tasks, metrics = [], []
    for t in spec.tasks:
        name, metric = exp.task_metric(t)
        tasks.append(name)
        if metric:
            metrics += ["--metric", f"{name}={metric}"]
    cmd = [sys.executable, "-m", "eval", "--model", spec.model, "--model_args", model_args, "--tasks", ",".join(tasks),
           "--batch_size", str(spec.batch_size), "--bootstrap_iters", "0",
           "--samples_out", str(job.out_dir / "samples.json"), "--output_path", str(job.out_dir / "results.json")]
    for p in spec.include_path:
        cmd += ["--include_path", str(exp.resolve(p))]
    if spec.limit is not None:
        cmd += ["--limit", str(spec.limit)]
    if spec.num_fewshot is not None:
        cmd += ["--num_fewshot", str(spec.num_fewshot)]
    return cmd + metrics


def _run(cmd: list[str], env: dict[str, str], log: Path, what: str) -> None:
    with log.open("a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT,
                              cwd=os.getcwd(), check=False)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{what} exited with {proc.returncode}; last lines of {log}:\n{tail}")


def run_stage_subprocess(job: StageJob) -> None:
    """Default stage function: ``kimi-vl <command>`` in a subprocess (see the module docstring)."""
    _run(stage_command(job), job.env, job.run_dir / "stage.log", f"stage '{job.stage}' (seed {job.seed})")


def run_eval_subprocess(job: EvalJob) -> None:
    """Default evaluation function: ``python -m eval`` on ``job.checkpoint``."""
    _run(eval_command(job), job.env, job.out_dir / "eval.log", f"evaluation of {job.checkpoint}")


__all__ = ["eval_command", "run_eval_subprocess", "run_stage_subprocess", "stage_command"]

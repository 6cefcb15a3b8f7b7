"""``kimi-vl ablate EXPERIMENT.yaml --out DIR [key=value ...]``: run an experiment and write its report.

Runs every arm x seed (skipping runs whose ``DONE`` marker exists), evaluates the final exports, and writes
``DIR/report.md``, ``DIR/results.json`` and the plots. ``--devices 0,1,2,3`` runs one chain per GPU in
parallel (default: every visible GPU when there are two or more, else one chain at a time);
``--report-only`` rebuilds the report from finished runs without starting anything. Exit status 1 when a
chain failed (the report still lists it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from eval.ablation.analysis import analyse
from eval.ablation.report import write_report
from eval.ablation.runner import Runner, is_done
from eval.ablation.spec import load_experiment
from eval.ablation.stages import run_eval_subprocess, run_stage_subprocess
from kimi_vl.runconfig import ConfigError


def default_devices() -> list[str]:
    try:
        import torch

        n = torch.cuda.device_count()
    except ImportError:
        n = 0
    return [str(i) for i in range(n)] if n >= 2 else []


def _report_only(runner: Runner):
    chains = runner.chains()
    for c in chains:
        done = all(is_done(j.run_dir) for j in c.stages)
        eval_dir = runner.out / "evals" / f"{c.stages[-1].stage}-{c.stages[-1].key}"
        c.eval_dir = eval_dir if is_done(eval_dir) else None
        c.status = "done" if done else "failed"
        c.error = "" if done else "not run yet (--report-only)"
    return chains


def _suite_tokenizer(exp, source: str) -> str | None:
    """``eval.suite_tokenizer``: a folder (relative to the experiment file) or ``synth:PRESET[:SEED]``."""
    if not source:
        return None
    if source.startswith("synth:"):
        from kimi_vl.train.build import ensure_synth

        return str(ensure_synth(source) / "tokenizer")
    path = exp.resolve(source)
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"eval.suite_tokenizer={source!r}: no tokenizer files in {path}")
    return str(path)


def _write_suites(exp, tasks_dir: Path) -> None:
    """Write the offline suites once (kept on restart, so every run is scored on the same questions)."""
    from eval.tasks import SuiteSpec, write_suites

    if not (tasks_dir / "suites.json").is_file():
        spec = exp.eval
        write_suites(SuiteSpec(tasks_dir.resolve(), spec.suite_samples, spec.suite_preset,
                               retrieval_lengths=tuple(spec.retrieval_lengths),
                               tokenizer=_suite_tokenizer(exp, spec.suite_tokenizer)))
    exp.eval.include_path = [*exp.eval.include_path, str(tasks_dir.resolve())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kimi-vl ablate", description=__doc__.split("\n")[0])
    parser.add_argument("experiment", help="experiment YAML")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the experiment")
    parser.add_argument("--out", required=True, help="output directory (runs/, evals/, report.md)")
    parser.add_argument("--devices", default=None, help="comma-separated GPU ids to spread chains over")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report from finished runs")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        exp = load_experiment(args.experiment, args.overrides)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    if exp.eval.suite_samples > 0:
        _write_suites(exp, Path(args.out) / "tasks")
    devices = default_devices() if args.devices is None else [d for d in args.devices.split(",") if d]
    runner = Runner(exp, args.out, run_stage_subprocess, run_eval_subprocess, devices=devices)
    chains = _report_only(runner) if args.report_only else runner.run()
    command = "kimi-vl ablate " + " ".join(shlex.quote(a) for a in (list(argv) if argv is not None else sys.argv[1:]))
    report = write_report(exp, chains, analyse(exp, chains), args.out, command=command)
    failed = [c for c in chains if c.status != "done"]
    print(f"report: {report}" + (f" ({len(failed)} chain(s) failed, see the report)" if failed else ""))
    return 1 if failed else 0


__all__ = ["main"]

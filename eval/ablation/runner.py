"""Run every arm x seed of an experiment through pluggable stage and evaluation functions.

Plan: each (arm, seed) becomes a chain of :class:`StageJob` s. A job's ``key`` hashes everything that
determines its output (command, config file path and contents, overrides, seed, parent key), so arms that
share a prefix (the same SFT stage before different RL stages) share one run instead of training it twice.
Runs live in ``<out>/runs/<stage>-<key>/``; a finished run holds ``DONE`` (written atomically after the stage
function returns), and a restart skips it. Evaluations live in ``<out>/evals/<key of the final stage>/`` with
their own ``DONE``.

Scheduling: with ``devices = []`` chains run one after another in this process. With ``devices = ["0", "1"]``
one chain runs per device at a time (threads, each holding a device and passing
``CUDA_VISIBLE_DEVICES=<device>`` in the job's ``env``; the default stage function runs ``kimi-vl`` as a
subprocess with that env). A shared stage needed by two chains at once is trained by one of them while the
other waits on its lock.

A failing stage marks its chain failed (the exception is recorded) and the other chains go on; the report
lists every failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from eval.ablation.spec import Experiment

DONE = "DONE"


@dataclass(frozen=True)
class StageJob:
    """Everything a stage function needs; it must leave ``metrics.jsonl`` and ``final/`` under ``run_dir``."""

    key: str
    stage: str
    command: str
    config: Path | None
    overrides: tuple[str, ...]
    seed: int
    init_from: Path | None
    run_dir: Path
    env: dict[str, str] = field(default_factory=dict, compare=False)
    experiment: Experiment | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EvalJob:
    """Evaluate ``checkpoint`` on the experiment's tasks; write per-question scores to ``out_dir/samples.json``
    in the format of :func:`eval.ablation.collect.write_samples`."""

    key: str
    checkpoint: Path
    out_dir: Path
    env: dict[str, str] = field(default_factory=dict, compare=False)
    experiment: Experiment | None = field(default=None, compare=False, repr=False)


StageFn = Callable[[StageJob], None]
EvalFn = Callable[[EvalJob], None]


@dataclass
class ChainResult:
    arm: str
    seed: int
    stages: list[StageJob]
    eval_dir: Path | None = None
    status: str = "pending"  # done | failed
    error: str = ""
    skipped: list[str] = field(default_factory=list)  # run keys found DONE on (re)start


def _hash(parts: Sequence[str]) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


def _file_digest(path: Path | None) -> str:
    if path is None:
        return "-"
    if not path.is_file():
        raise FileNotFoundError(f"stage config not found: {path}")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def plan_chain(exp: Experiment, arm_name: str, seed: int, out: Path) -> list[StageJob]:
    """The stage jobs of one arm x seed, in order (run dirs are derived from the job keys)."""
    arm = exp.arm(arm_name)
    jobs: list[StageJob] = []
    parent: StageJob | None = None
    for st in exp.arm_stages(arm):
        config = exp.resolve(st.config if st.config is not None else exp.base_config)
        overrides = (tuple(exp.base_overrides) + tuple(st.overrides) + tuple(arm.overrides)
                     + tuple(exp.stage_overrides.get(st.name, ())))
        parent_key = parent.key if parent else ""
        key = _hash([st.command, str(config), _file_digest(config), *overrides, str(seed), parent_key])
        job = StageJob(
            key=key,
            stage=st.name,
            command=st.command,
            config=config,
            overrides=overrides,
            seed=seed,
            init_from=parent.run_dir / "final" if parent else None,
            run_dir=out / "runs" / f"{st.name}-{key}",
            experiment=exp,
        )
        jobs.append(job)
        parent = job
    return jobs


def is_done(directory: Path) -> bool:
    return (directory / DONE).is_file()


def mark_done(directory: Path, info: dict) -> None:
    tmp = directory / (DONE + ".tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str))
    os.replace(tmp, directory / DONE)


class Runner:
    """Run an experiment's chains (see the module docstring) and return one :class:`ChainResult` each."""

    def __init__(self, exp: Experiment, out: str | os.PathLike, stage_fn: StageFn, eval_fn: EvalFn | None,
                 devices: Sequence[str] = ()) -> None:
        self.exp, self.out = exp, Path(out)
        self.stage_fn, self.eval_fn = stage_fn, eval_fn
        self.devices = list(devices)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def chains(self) -> list[ChainResult]:
        return [ChainResult(arm.name, seed, plan_chain(self.exp, arm.name, seed, self.out))
                for arm in self.exp.arms for seed in self.exp.seeds]

    def run(self) -> list[ChainResult]:
        self.out.mkdir(parents=True, exist_ok=True)
        results = self.chains()
        if not self.devices:
            for r in results:
                self._run_chain(r, {})
            return results
        slots: queue.Queue[str] = queue.Queue()
        for d in self.devices:
            slots.put(d)

        def work(r: ChainResult) -> None:
            device = slots.get()
            try:
                self._run_chain(r, {"CUDA_VISIBLE_DEVICES": device})
            finally:
                slots.put(device)

        with ThreadPoolExecutor(max_workers=len(self.devices)) as pool:
            list(pool.map(work, results))
        return results

    def _run_chain(self, r: ChainResult, env: dict[str, str]) -> None:
        try:
            for job in r.stages:
                self._run_stage(job, env, r)
            if self.eval_fn is not None and self.exp.eval.tasks:
                r.eval_dir = self._run_eval(r.stages[-1], env, r)
            r.status = "done"
        except Exception as exc:  # noqa: BLE001 - one failed chain must not stop the others
            r.status, r.error = "failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"

    def _run_stage(self, job: StageJob, env: dict[str, str], r: ChainResult) -> None:
        with self._lock(job.key):
            if is_done(job.run_dir):
                r.skipped.append(job.key)
                return
            job.run_dir.mkdir(parents=True, exist_ok=True)
            (job.run_dir / "stage.json").write_text(json.dumps(_job_info(job), indent=1))
            self.stage_fn(_with_env(job, env))
            if not (job.run_dir / "final").exists():
                raise RuntimeError(f"stage '{job.stage}' finished without an export at {job.run_dir / 'final'}")
            mark_done(job.run_dir, _job_info(job))

    def _run_eval(self, last: StageJob, env: dict[str, str], r: ChainResult) -> Path:
        out_dir = self.out / "evals" / f"{last.stage}-{last.key}"
        with self._lock("eval-" + last.key):
            if is_done(out_dir):
                r.skipped.append("eval-" + last.key)
                return out_dir
            out_dir.mkdir(parents=True, exist_ok=True)
            job = EvalJob(last.key, last.run_dir / "final", out_dir, dict(env), self.exp)
            self.eval_fn(job)
            if not (out_dir / "samples.json").is_file():
                raise RuntimeError(f"evaluation of {job.checkpoint} wrote no {out_dir / 'samples.json'}")
            mark_done(out_dir, {"checkpoint": str(job.checkpoint), "tasks": self.exp.eval.tasks})
        return out_dir


def _with_env(job: StageJob, env: dict[str, str]) -> StageJob:
    return StageJob(**{**job.__dict__, "env": dict(env)})


def _job_info(job: StageJob) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in job.__dict__.items()
            if k not in ("env", "experiment")}


__all__ = ["DONE", "ChainResult", "EvalFn", "EvalJob", "Runner", "StageFn", "StageJob", "is_done", "plan_chain"]

"""``kimi-vl quickstart``: the whole recipe on a CPU in minutes, every artefact under ``--out``.

Stages (each writes ``<out>/<stage>/DONE`` when finished; a re-run skips finished stages):

    data      the `tiny` synthetic world + tokenizer           -> <out>/data
    suites    held-out lm-eval suites kimi_text, kimi_vision   -> <out>/suites
    pretrain  joint early-fusion pretraining (tiny: KDA hybrid, block AttnRes, MuonClip)
    sft       zero-vision SFT from the pretrain export
    rl        vision RL from the SFT export
    eval/*    the suites on the untrained model and after every training stage
    demo      video -> website with the final model, scored against the reference page
    report    report.md + PNG plots, whose path is printed with a one-screen summary

This module sits in ``eval`` because it drives every layer (data, model, RL, evaluation).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimi_vl.logs import print0

TRAIN_STAGES = ("pretrain", "sft", "rl")
EVAL_POINTS = ("init", "pretrain", "sft", "rl")


@dataclass
class QuickstartConfig:
    out: Path
    preset: str = "tiny"
    data_seed: int = 0
    seed: int = 0
    pretrain_steps: int = 120
    sft_steps: int = 40
    rl_steps: int = 20
    eval_limit: int = 12  # questions per task at each evaluation point
    suite_samples: int = 12  # held-out samples per family written into the suites
    overrides: dict[str, list[str]] = field(default_factory=dict)  # stage -> extra key=value overrides


def _done(path: Path) -> bool:
    return (path / "DONE").is_file()


def _mark(path: Path, info: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "DONE").write_text(json.dumps(info, indent=1, default=str) + "\n")


class Pipeline:
    """Runs the stages in order, skipping finished ones; ``timings`` records seconds per stage."""

    def __init__(self, cfg: QuickstartConfig):
        self.cfg = cfg
        self.out = Path(cfg.out).resolve()
        self.timings: dict[str, float] = {}

    def stage(self, name: str, fn: Callable[[Path], dict[str, Any] | None]) -> dict[str, Any]:
        path = self.out / name
        if _done(path):
            print0(f"[quickstart] {name}: done before, skipped")
            return json.loads((path / "DONE").read_text())
        print0(f"[quickstart] {name} ...")
        t0 = time.perf_counter()
        info = fn(path) or {}
        info["seconds"] = round(time.perf_counter() - t0, 1)
        _mark(path, info)
        self.timings[name] = info["seconds"]
        print0(f"[quickstart] {name}: {info['seconds']} s")
        return info

    # -- stages -------------------------------------------------------------------------------------
    def data(self, path: Path) -> dict[str, Any]:
        from data_pipelines.synth.build import build_dataset, default_vocab, split_shards
        from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

        if path.exists():
            import shutil

            shutil.rmtree(path)
        manifest = build_dataset(path, self.cfg.preset, seed=self.cfg.data_seed)
        tok = train_tokenizer(iter_corpus_texts(split_shards(path, "train")), path / "tokenizer",
                              default_vocab(self.cfg.preset))
        return {"samples": manifest["total_samples"], "bytes": manifest["total_bytes"], "vocab": len(tok)}

    def suites(self, path: Path) -> dict[str, Any]:
        from eval.tasks.writer import SuiteSpec, write_suites

        tasks = write_suites(SuiteSpec(path, n_per_family=self.cfg.suite_samples, preset=self.cfg.preset,
                                       seed=self.cfg.data_seed))
        return {"tasks": tasks}

    def train(self, stage: str, config: str, steps: int, init_from: Path | None) -> Callable[[Path], dict]:
        def run(path: Path) -> dict[str, Any]:
            from kimi_vl.runconfig import load_config
            from kimi_vl.train.config import TrainConfig, resolve_config_path
            from kimi_vl.train.loop import Trainer

            overrides = [f"output_dir={path}", f"data.path={self.out / 'data'}", f"max_steps={steps}",
                         f"optim.total_steps={steps}", f"seed={self.cfg.seed}", "resume=auto"]
            if init_from is not None:
                overrides.append(f"init_from={init_from}")
            cfg = load_config(TrainConfig, resolve_config_path(config), overrides + self.cfg.overrides.get(stage, []))
            trainer = Trainer(cfg)
            export = trainer.run()
            trainer.close()
            if trainer.interrupted:
                raise SystemExit(f"[quickstart] {stage} stopped by {trainer.interrupted} at step {trainer.step}; "
                                 "run the same command again to resume")
            return {"export": str(export)}

        return run

    def rl(self, path: Path) -> dict[str, Any]:
        from kimi_vl.runconfig import load_config
        from kimi_vl.train.config import resolve_config_path
        from rl.config import RLRunConfig
        from rl.trainer import run_rl

        overrides = [f"output_dir={path}", f"data.path={self.out / 'data'}", f"max_steps={self.cfg.rl_steps}",
                     f"init_from={self.out / 'sft' / 'final'}", f"seed={self.cfg.seed}"]
        cfg = load_config(RLRunConfig, resolve_config_path("tiny_rl"), overrides + self.cfg.overrides.get("rl", []))
        return {"export": str(run_rl(cfg))}

    def evaluate(self, point: str) -> Callable[[Path], dict]:
        def run(path: Path) -> dict[str, Any]:
            from eval.quickstart.scores import evaluate_checkpoint

            checkpoint = self._checkpoint(point)
            return {"scores": evaluate_checkpoint(checkpoint, self.out / "suites", path, self.cfg.eval_limit)}

        return run

    def _checkpoint(self, point: str) -> Path:
        if point != "init":
            return self.out / point / "final"
        from eval.quickstart.scores import export_untrained

        return export_untrained(self.out / "eval" / "init" / "model", self.out / "data", self.cfg.seed)

    def demo(self, path: Path) -> dict[str, Any]:
        from eval.quickstart.demo_stage import run_demo

        return run_demo(self.out / "rl" / "final", self.out / "data", path)

    def run(self) -> Path:
        c = self.cfg
        self.stage("data", self.data)
        self.stage("suites", self.suites)
        self.stage("eval/init", self.evaluate("init"))
        init: Path | None = None
        for stage, config, steps in (("pretrain", "tiny_pretrain", c.pretrain_steps),
                                     ("sft", "tiny_sft_zero_vision", c.sft_steps)):
            self.stage(stage, self.train(stage, config, steps, init))
            init = self.out / stage / "final"
            self.stage(f"eval/{stage}", self.evaluate(stage))
        self.stage("rl", self.rl)
        self.stage("eval/rl", self.evaluate("rl"))
        self.stage("demo", self.demo)
        from eval.quickstart.report import write_report

        return write_report(self.out, self.timings)

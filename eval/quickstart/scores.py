"""Evaluation points of the quickstart: the local suites on a checkpoint, flattened to task -> metric -> value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PRIMARY = {"acc", "exact_match", "iou", "bits_per_byte"}


def export_untrained(out: Path, data_root: Path, seed: int) -> Path:
    """Save the randomly initialised `tiny` model (the "before training" evaluation point)."""
    from kimi_vl.runconfig import load_config
    from kimi_vl.train.build import build_model, build_tokenizer
    from kimi_vl.train.checkpoint import export_pretrained
    from kimi_vl.train.config import TrainConfig, resolve_config_path

    if (out / "config.json").is_file():
        return out
    cfg = load_config(TrainConfig, resolve_config_path("tiny_pretrain"),
                      [f"output_dir={out.parent}", f"data.path={data_root}", f"seed={seed}"])
    tok = build_tokenizer(cfg)
    return export_pretrained(build_model(cfg, tok), out, tok)


def flatten_results(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """lm-eval's ``results`` section -> ``{task: {metric: value}}`` (primary metrics, no stderr)."""
    flat: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            name = key.split(",")[0]
            if name in PRIMARY and isinstance(value, (int, float)):
                flat.setdefault(task, {})[name] = float(value)
    return flat


def evaluate_checkpoint(checkpoint: Path, suites: Path, out: Path, limit: int) -> dict[str, dict[str, float]]:
    """Run ``kimi_text`` and ``kimi_vision`` on ``checkpoint`` with lm-eval; write and return the scores."""
    from eval.cli import build_parser, run

    args = build_parser().parse_args([
        "--model", "kimi_vl", "--model_args", f"checkpoint={checkpoint}", "--tasks", "kimi_text,kimi_vision",
        "--include_path", str(suites / "kimi_text"), "--include_path", str(suites / "kimi_vision"),
        "--limit", str(limit), "--bootstrap_iters", "0", "--batch_size", "8"])
    scores = flatten_results(run(args))
    out.mkdir(parents=True, exist_ok=True)
    (out / "scores.json").write_text(json.dumps(scores, indent=1, sort_keys=True) + "\n")
    return scores

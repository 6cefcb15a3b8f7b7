"""Collect an experiment's results: per-question scores from evaluations, curves from ``metrics.jsonl``.

``samples.json`` (one per evaluated checkpoint) holds, per task, the analysed metric and one entry per
question::

    {"tasks": {"kimi_text_mc": {"metric": "acc", "higher_is_better": true, "aggregate": 0.61,
                                "doc_ids": [0, 1, ...], "num": [1.0, 0.0, ...], "den": null}}}

``den`` is null for per-question means (accuracy, exact match) and holds per-question weights for
corpus-level ratios: lm-eval's ``bits_per_byte``/``byte_perplexity``/``word_perplexity`` samples are
``(loglikelihood, count)`` pairs, turned here into ``num = -loglikelihood / ln 2`` and ``den = count``
(bits per byte or per word; lower is better).

The scores of one arm on one task form an ``[S, Q]`` matrix over its seeds and the questions every seed
answered (aligned by ``doc_id``), which :mod:`eval.stats` bootstraps.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kimi_vl.logs import read_metrics

RATIO_METRICS = {"bits_per_byte", "byte_perplexity", "word_perplexity"}


@dataclass
class TaskScores:
    """One arm's per-question scores on one task: ``num_SQ`` (and ``den_SQ``) over seeds x aligned questions."""

    metric: str
    higher_is_better: bool
    seeds: list[int]
    doc_ids: list[Any]
    num_SQ: np.ndarray
    den_SQ: np.ndarray | None
    aggregates: list[float]


def write_samples(path: str | os.PathLike, tasks: dict[str, dict]) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tasks": tasks}))
    os.replace(tmp, path)
    return path


def read_samples(path: str | os.PathLike) -> dict[str, dict]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
        raise ValueError(f"{path}: expected {{'tasks': {{...}}}}")
    return data["tasks"]


def _pick_metric(task: str, samples: list[dict], wanted: str | None) -> str:
    available = [m for m in samples[0].get("metrics", []) if m in samples[0]]
    if wanted is not None:
        if wanted not in available:
            raise ValueError(f"task '{task}': metric '{wanted}' not in its samples (has {available})")
        return wanted
    if not available:
        raise ValueError(f"task '{task}': its logged samples carry no metrics")
    ratio = [m for m in ("bits_per_byte", "word_perplexity", "byte_perplexity") if m in available]
    return ratio[0] if ratio else available[0]


def samples_from_lm_eval(results: dict, metrics: dict[str, str] | None = None) -> dict[str, dict]:
    """Per-question scores from lm-eval's ``simple_evaluate`` output (run with ``log_samples=True``)."""
    metrics = metrics or {}
    out: dict[str, dict] = {}
    for task, samples in (results.get("samples") or {}).items():
        if not samples:
            continue
        samples = [s for s in samples if s.get("filter", "none") == samples[0].get("filter", "none")]
        metric = _pick_metric(task, samples, metrics.get(task))
        samples = sorted(samples, key=lambda s: s["doc_id"])
        doc_ids = [s["doc_id"] for s in samples]
        if metric in RATIO_METRICS:
            num = [-float(s[metric][0]) / math.log(2) for s in samples]
            den = [float(s[metric][1]) for s in samples]
            higher, name = False, "bits_per_byte" if metric != "word_perplexity" else "bits_per_word"
        else:
            num, den = [float(s[metric]) for s in samples], None
            higher, name = bool(results.get("higher_is_better", {}).get(task, {}).get(metric, True)), metric
        agg = float(np.sum(num) / (np.sum(den) if den else len(num)))
        out[task] = {"metric": name, "higher_is_better": higher, "aggregate": agg,
                     "doc_ids": doc_ids, "num": num, "den": den}
    return out


def task_matrix(per_seed: dict[int, dict], task: str) -> TaskScores:
    """Stack one task's scores over seeds (``per_seed[seed] = samples.json tasks``), aligned on doc ids."""
    seeds = sorted(s for s in per_seed if task in per_seed[s])
    if not seeds:
        raise ValueError(f"task '{task}': no seed has results")
    entries = [per_seed[s][task] for s in seeds]
    common = set(entries[0]["doc_ids"])
    for e in entries[1:]:
        common &= set(e["doc_ids"])
    doc_ids = [d for d in entries[0]["doc_ids"] if d in common]
    if not doc_ids:
        raise ValueError(f"task '{task}': the seeds share no question")
    num, den = [], []
    for e in entries:
        pos = {d: i for i, d in enumerate(e["doc_ids"])}
        num.append([e["num"][pos[d]] for d in doc_ids])
        den.append([e["den"][pos[d]] for d in doc_ids] if e["den"] is not None else None)
    den_SQ = None if any(d is None for d in den) else np.asarray(den, dtype=np.float64)
    return TaskScores(entries[0]["metric"], bool(entries[0]["higher_is_better"]), seeds, doc_ids,
                      np.asarray(num, dtype=np.float64), den_SQ, [float(e["aggregate"]) for e in entries])


def align_questions(a: TaskScores, b: TaskScores) -> tuple[TaskScores, TaskScores]:
    """Restrict two arms' matrices to their common questions, in one order (for paired deltas)."""
    common = set(a.doc_ids) & set(b.doc_ids)
    order = [d for d in a.doc_ids if d in common]

    def take(t: TaskScores) -> TaskScores:
        pos = {d: i for i, d in enumerate(t.doc_ids)}
        idx = [pos[d] for d in order]
        den = None if t.den_SQ is None else t.den_SQ[:, idx]
        return TaskScores(t.metric, t.higher_is_better, t.seeds, order, t.num_SQ[:, idx], den, t.aggregates)

    return take(a), take(b)


def curve(run_dir: str | os.PathLike, metric: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one metric in a run's ``metrics.jsonl`` (records lacking either are skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return np.zeros(0), np.zeros(0)
    xs, ys = [], []
    for rec in read_metrics(path):
        xv, yv = rec.get(x), rec.get(metric)
        if _is_num(xv) and _is_num(yv):
            xs.append(float(xv))
            ys.append(float(yv))
    return np.asarray(xs), np.asarray(ys)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def x_to_reach(xs: np.ndarray, ys: np.ndarray, target: float, lower_is_better: bool = True) -> float | None:
    """First x at which the curve reaches ``target`` (linear interpolation between logged points), else None."""
    reached = ys <= target if lower_is_better else ys >= target
    if not reached.any():
        return None
    i = int(np.argmax(reached))
    if i == 0:
        return float(xs[0])
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0)) if y1 != y0 else float(x1)


__all__ = [
    "TaskScores",
    "align_questions",
    "curve",
    "read_samples",
    "samples_from_lm_eval",
    "task_matrix",
    "write_samples",
    "x_to_reach",
]

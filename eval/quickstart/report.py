"""The quickstart's report: ``report.md`` + PNG plots + a one-screen summary on stdout."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from kimi_vl.logs import read_metrics

STAGES = ("pretrain", "sft", "rl")
POINTS = ("init", "pretrain", "sft", "rl")


def _records(out: Path, stage: str) -> list[dict]:
    path = out / stage / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def _scores(out: Path) -> dict[str, dict[str, dict[str, float]]]:
    """point -> task -> metric -> value."""
    found = {}
    for point in POINTS:
        path = out / "eval" / point / "scores.json"
        if path.is_file():
            found[point] = json.loads(path.read_text())
    return found


def _moving_mean(ys: list[float], window: int) -> list[float]:
    return [sum(ys[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(ys))]


def _plot_training(out: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    offset = 0
    for stage in ("pretrain", "sft"):
        recs = _records(out, stage)
        xs, ys = _series(recs, "loss")
        line = axes[0].plot([x + offset for x in xs], ys, alpha=0.3)[0]
        axes[0].plot([x + offset for x in xs], _moving_mean(ys, 10), color=line.get_color(),
                     label=f"{stage} loss (mean of 10)")
        xs, ys = _series(recs, "eval/loss")
        axes[0].plot([x + offset for x in xs], ys, "o--", label=f"{stage} held-out loss")
        xs, ys = _series(recs, "qk/max_logit")
        axes[1].plot([x + offset for x in xs], ys, label=stage)
        offset += max((r["step"] for r in recs), default=0)
    axes[0].set_title("loss (train, held-out)")
    axes[1].set_title("max attention logit (QK-Clip)")
    rl = _records(out, "rl")
    for key in ("reward", "eval/reward"):
        xs, ys = _series(rl, key)
        axes[2].plot(xs, ys, "o-" if key.startswith("eval") else "-", label=key)
    axes[2].set_title("RL reward")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _plot_scores(scores: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({(t, m) for s in scores.values() for t, ms in s.items() for m in ms})
    if not tasks:
        return
    fig, ax = plt.subplots(figsize=(max(8, len(tasks) * 0.9), 3.8))
    width = 0.8 / max(1, len(scores))
    for i, (point, s) in enumerate(scores.items()):
        vals = [s.get(t, {}).get(m, 0.0) for t, m in tasks]
        ax.bar([j + i * width for j in range(len(tasks))], vals, width, label=point)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))])
    ax.set_xticklabels([f"{t.replace('kimi_', '')}\n{m}" for t, m in tasks], fontsize=7)
    ax.set_title("held-out scores after each stage (bits_per_byte: lower is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _first_last(records: list[dict], key: str, window: int = 1) -> str:
    """``first -> last`` of a series; with ``window`` > 1 the means of the first and last ``window`` points
    (per-step training values are noisy: each step sees other documents)."""
    _, ys = _series(records, key)
    if not ys:
        return "n/a"
    w = max(1, min(window, len(ys) // 2))
    return f"{sum(ys[:w]) / w:.3f} -> {sum(ys[-w:]) / w:.3f}"


def _score_table(scores: dict) -> list[str]:
    points = list(scores)
    tasks = sorted({(t, m) for s in scores.values() for t, ms in s.items() for m in ms})
    lines = ["| task | metric | " + " | ".join(points) + " |", "|---|---|" + "---|" * len(points)]
    for t, m in tasks:
        cells = [f"{scores[p].get(t, {}).get(m, float('nan')):.3f}" for p in points]
        lines.append(f"| {t} | {m} | " + " | ".join(cells) + " |")
    return lines


def _stage_seconds(out: Path) -> dict[str, float]:
    order = ["data", "suites", "eval/init", "pretrain", "eval/pretrain", "sft", "eval/sft", "rl", "eval/rl", "demo"]
    secs = {}
    for done in out.glob("**/DONE"):
        info = json.loads(done.read_text())
        secs[str(done.parent.relative_to(out))] = info.get("seconds", 0.0)
    return dict(sorted(secs.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def summary_lines(out: Path) -> list[str]:
    pre, sft, rl = (_records(out, s) for s in STAGES)
    demo = json.loads((out / "demo" / "DONE").read_text()) if (out / "demo" / "DONE").is_file() else {}
    secs = _stage_seconds(out)
    return [
        f"pretrain loss {_first_last(pre, 'loss', 10)} (mean of first/last 10 steps), "
        f"held-out {_first_last(pre, 'eval/loss')}",
        f"sft loss {_first_last(sft, 'loss', 10)} (mean of first/last 10 steps), "
        f"held-out {_first_last(sft, 'eval/loss')}",
        f"rl reward {_first_last(rl, 'reward', 5)} (mean of first/last 5 steps), "
        f"held-out reward {_first_last(rl, 'eval/reward')}",
        f"demo (video -> website) overall score: {demo.get('overall', 'n/a')}",
        f"total time {sum(secs.values()):.0f} s over {len(secs)} stages",
    ]


def write_report(out: Path, timings: dict[str, Any] | None = None) -> Path:
    out = Path(out)
    _plot_training(out, out / "training.png")
    scores = _scores(out)
    _plot_scores(scores, out / "scores.png")
    secs = _stage_seconds(out)
    lines = [
        "# Quickstart report", "",
        f"- command: `kimi-vl quickstart --out {out}`",
        f"- machine: {platform.node()} ({platform.machine()}, {torch.get_num_threads()} threads), "
        f"torch {torch.__version__}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        "## Summary", "", *[f"- {s}" for s in summary_lines(out)], "",
        "## Training curves", "", "![training](training.png)", "",
        "## Held-out scores per stage (kimi_text, kimi_vision suites)", "", *_score_table(scores), "",
        "![scores](scores.png)", "",
        "## Stage times (s)", "", "| stage | seconds |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in secs.items()], "",
    ]
    if (out / "demo" / "side_by_side.png").is_file():
        lines += ["## Video -> website demo", "", "![demo](demo/side_by_side.png)", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report

"""``kimi-vl plot RUN_DIR``: draw a run's curves from its ``metrics.jsonl`` to PNG.

Metric names follow one convention (see ``kimi_vl/train/README.md``): ``loss``, ``loss/<modality>``,
``eval/<split>/loss``, ``lr``, ``grad_norm``, ``tokens_per_s``, ``qk/max_logit``,
``qk/clipped_heads``, ``moe/...``, ``attnres/...``. Each panel gathers the keys of one family.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from kimi_vl.logs import read_metrics

SMOOTH = 10  # steps in the trailing mean of the per-source losses: one step's batch holds few documents of a source

class Panel(NamedTuple):
    """One plot: the keys starting with one of ``prefixes`` (or equal to one), containing one of ``needs`` (empty:
    any), not starting with one of ``excludes``; ``smooth``: drawn as a trailing mean of :data:`SMOOTH` steps,
    labelled without their prefix."""

    title: str
    prefixes: tuple[str, ...]
    needs: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    smooth: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("training loss", ("loss",), excludes=("loss/src/",)),
    Panel(f"training loss by data source (mean of {SMOOTH} steps)", ("loss/src/",), smooth=True),
    Panel("held-out loss", ("eval/",), ("loss",)),
    Panel("held-out reward (RL)", ("eval/",), ("reward", "pass@", "unparsed")),
    Panel("max attention logit", ("qk/max_logit",)),
    Panel("clipped heads", ("qk/clipped",)),
    Panel("learning rate", ("lr",)),
    Panel("grad norm", ("grad_norm",)),
    Panel("tokens / s", ("tokens_per_s",)),
    Panel("reward", ("reward",)),
    Panel("KL to the initial policy, entropy", ("kl_to_init", "entropy")),
    Panel("RL step seconds", ("time_rollout_s", "time_update_s")),
    Panel("generated tokens / s", ("gen_tokens_per_s",)),
)


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _keys_for(records: list[dict], panel: Panel) -> list[str]:
    keys = sorted({k for r in records for k in r if any(k == p or k.startswith(p) for p in panel.prefixes)})
    keys = [k for k in keys if (not panel.needs or any(n in k for n in panel.needs))
            and not any(k.startswith(x) for x in panel.excludes)]
    per_layer = [k for k in keys if k.count("/") >= 2 and k.startswith("qk/")]  # per attention module
    return [k for k in keys if k not in per_layer] if len(keys) > 8 else keys


def _trailing_mean(ys: list[float], n: int) -> list[float]:
    """The mean of each value and the ``n - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


def panel_keys(records: list[dict]) -> dict[str, list[str]]:
    """``{panel title: metric keys drawn in it}`` for every panel of :data:`PANELS` that has data."""
    return {panel.title: keys for panel, keys in _panels(records)}


def _panels(records: list[dict]) -> list[tuple[Panel, list[str]]]:
    return [(panel, keys) for panel in PANELS if (keys := _keys_for(records, panel))]


def plot_metrics(metrics_path: str | os.PathLike, out_png: str | os.PathLike, title: str | None = None) -> Path:
    """Plot every panel that has data; return the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    if not records:
        raise ValueError(f"{metrics_path}: no metric records to plot")
    panels = _panels(records)
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, (panel, keys) in zip(axes.flat, panels):
        for key in keys:
            xs, ys = _series(records, key)
            label = key
            if panel.smooth:
                ys, label = _trailing_mean(ys, SMOOTH), key.removeprefix(panel.prefixes[0])
            ax.plot(xs, ys, label=label, marker="." if len(xs) < 30 else None, lw=2.0 if key == "loss" else 1.2)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        if len(keys) > 1:
            ax.legend(fontsize=6, ncol=2 if len(keys) > 6 else 1, framealpha=0.6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title or str(Path(metrics_path).parent))
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="kimi-vl plot", description="draw a run's curves to PNG")
    parser.add_argument("run_dir", help="a run's output_dir (holding metrics.jsonl)")
    parser.add_argument("--out", default=None, help="PNG path (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    run = Path(args.run_dir)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        parser.error(f"{metrics} not found (is {run} a run directory?)")
    out = plot_metrics(metrics, args.out or run / "curves.png", title=run.name)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

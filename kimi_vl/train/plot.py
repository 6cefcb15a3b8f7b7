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

from kimi_vl.logs import read_metrics

# (panel title, key prefixes, required substrings: a key must contain one of them, empty = any)
PANELS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("training loss", ("loss",), ()),
    ("held-out loss", ("eval/",), ("loss",)),
    ("held-out reward (RL)", ("eval/",), ("reward", "pass@", "unparsed")),
    ("max attention logit", ("qk/max_logit",), ()),
    ("clipped heads", ("qk/clipped",), ()),
    ("learning rate", ("lr",), ()),
    ("grad norm", ("grad_norm",), ()),
    ("tokens / s", ("tokens_per_s",), ()),
    ("reward", ("reward",), ()),
    ("KL to the initial policy, entropy", ("kl_to_init", "entropy"), ()),
    ("RL step seconds", ("time_rollout_s", "time_update_s"), ()),
    ("generated tokens / s", ("gen_tokens_per_s",), ()),
)


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _keys_for(records: list[dict], prefixes: tuple[str, ...], needs: tuple[str, ...] = ()) -> list[str]:
    keys = sorted({k for r in records for k in r if any(k == p or k.startswith(p) for p in prefixes)})
    keys = [k for k in keys if not needs or any(n in k for n in needs)]
    per_layer = [k for k in keys if k.count("/") >= 2 and k.startswith("qk/max_logit")]
    return [k for k in keys if k not in per_layer] if len(keys) > 8 else keys


def panel_keys(records: list[dict]) -> dict[str, list[str]]:
    """``{panel title: metric keys drawn in it}`` for every panel of :data:`PANELS` that has data."""
    return {name: keys for name, prefixes, needs in PANELS if (keys := _keys_for(records, prefixes, needs))}


def plot_metrics(metrics_path: str | os.PathLike, out_png: str | os.PathLike, title: str | None = None) -> Path:
    """Plot every panel that has data; return the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    if not records:
        raise ValueError(f"{metrics_path}: no metric records to plot")
    panels = list(panel_keys(records).items())
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for key in keys:
            xs, ys = _series(records, key)
            ax.plot(xs, ys, label=key, marker="." if len(xs) < 30 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
        if len(keys) > 1:
            ax.legend(fontsize=7)
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

"""Write an experiment's ``results.json``, ``report.md`` and PNG plots.

Plots: ``curves_<stage>.png`` (one panel per curve metric; thin line per seed, thick line = mean over seeds,
one colour per arm), ``scores.png`` (per task, each arm's score with its 95% bootstrap interval) and
``deltas.png`` (each arm minus the baseline per task with its interval; red when the interval says worse).
The markdown lists every arm, task and seed, marks results that go the wrong way in bold, and names the
command, machine and date.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from eval.ablation.collect import curve
from eval.ablation.runner import ChainResult
from eval.ablation.spec import Experiment

VERDICT_TEXT = {"better": "better", "worse": "**WORSE**", "inconclusive": "inconclusive (CI spans 0)"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(exp: Experiment, chains: list[ChainResult], out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    stages = list(dict.fromkeys(j.stage for c in chains for j in c.stages))
    colours = {a.name: f"C{i % 10}" for i, a in enumerate(exp.arms)}
    for stage in stages:
        fig, axes = plt.subplots(1, len(exp.curves), figsize=(5 * len(exp.curves), 3.4), squeeze=False)
        drew = False
        for ax, metric in zip(axes[0], exp.curves):
            for arm in exp.arms:
                runs = [curve(j.run_dir, metric, exp.curve_x) for c in chains if c.arm == arm.name
                        for j in c.stages if j.stage == stage]
                runs = [r for r in runs if len(r[0])]
                for xs, ys in runs:
                    ax.plot(xs, ys, color=colours[arm.name], alpha=0.3, linewidth=0.8)
                if runs:
                    drew = True
                    n = min(len(r[0]) for r in runs)
                    ax.plot(runs[0][0][:n], np.mean([r[1][:n] for r in runs], 0), color=colours[arm.name],
                            linewidth=2, label=f"{arm.name} (n={len(runs)})")
            ax.set_title(f"{stage}: {metric}")
            ax.set_xlabel(exp.curve_x)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        if drew:
            path = out / f"curves_{stage.replace('/', '_')}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            paths.append(path)
        plt.close(fig)
    return paths


def plot_scores(exp: Experiment, results: dict, out: Path) -> Path | None:
    tasks = [t for t, arms in results["scores"].items() if arms]
    if not tasks:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(4, 1.1 * len(exp.arms) + 2) * len(tasks), 3.6),
                             squeeze=False)
    for ax, task in zip(axes[0], tasks):
        arms = [a.name for a in exp.arms if a.name in results["scores"][task]]
        est = [results["scores"][task][a] for a in arms]
        vals = np.array([e["value"] for e in est])
        err = np.array([[e["value"] - e["lo"] for e in est], [e["hi"] - e["value"] for e in est]])
        ax.bar(range(len(arms)), vals, yerr=err, capsize=4, color=[f"C{i % 10}" for i in range(len(arms))])
        ax.set_xticks(range(len(arms)), arms, rotation=20, fontsize=8)
        ax.set_title(f"{task} ({est[0]['metric']}, 95% CI)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "scores.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_deltas(exp: Experiment, results: dict, out: Path) -> Path | None:
    rows = [(task, arm, d) for task, arms in results["deltas"].items() for arm, d in arms.items()]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.4))
    colour = {"better": "tab:green", "worse": "tab:red", "inconclusive": "tab:gray"}
    for i, (_, _, d) in enumerate(rows):
        ax.errorbar(d["value"], i, xerr=[[d["value"] - d["lo"]], [d["hi"] - d["value"]]], fmt="o", capsize=4,
                    color=colour[d["verdict"]])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"{t}: {a} ({d['metric']})" for t, a, d in rows], fontsize=8)
    ax.set_xlabel(f"arm - {exp.baseline} (95% CI; green better, red worse, grey inconclusive)")
    ax.invert_yaxis()
    fig.tight_layout()
    path = out / "deltas.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: Any, digits: int = 4) -> str:
    return "—" if v is None else f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def _score_section(exp: Experiment, results: dict) -> list[str]:
    lines = ["## Scores (95% CI: hierarchical bootstrap over seeds, then questions)", ""]
    arms = [a.name for a in exp.arms]
    lines += ["| task | metric | " + " | ".join(arms) + " |", "|---" * (len(arms) + 2) + "|"]
    for task, per_arm in results["scores"].items():
        metric = next(iter(per_arm.values()))["metric"] if per_arm else "—"
        cells = []
        for a in arms:
            e = per_arm.get(a)
            cells.append("no result" if e is None else
                         f"{e['value']:.4g} [{e['lo']:.4g}, {e['hi']:.4g}] (S={e['n_seeds']}, Q={e['n_questions']})")
        lines.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    lines += ["", f"## Deltas vs baseline `{exp.baseline}` (every row shown, whatever its sign)", "",
              "| task | arm | metric | delta | 95% CI | P(opposite sign) | seeds paired | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for task, per_arm in results["deltas"].items():
        for a in arms:
            if a == exp.baseline:
                continue
            d = per_arm.get(a)
            if d is None:
                lines.append(f"| {task} | {a} | — | no result | — | — | — | missing (see runs) |")
                continue
            hib = results["scores"][task][a]["higher_is_better"]
            lines.append(f"| {task} | {a} | {d['metric']} ({'higher' if hib else 'lower'} is better) | "
                         f"{d['value']:+.4g} | [{d['lo']:+.4g}, {d['hi']:+.4g}] | {d['p_flip']:.3f} | "
                         f"{d['paired_seeds']} | {VERDICT_TEXT[d['verdict']]} |")
    return lines + [""]


def _curve_section(exp: Experiment, results: dict) -> list[str]:
    lines = [f"## Final curve values (last logged point per seed; x = `{exp.curve_x}`)", ""]
    arms = [a.name for a in exp.arms]
    lines += ["| stage/metric | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for key, per_arm in results["final_curve_values"].items():
        cells = []
        for a in arms:
            seeds = per_arm.get(a, {})
            vals = [v for v in seeds.values() if v is not None]
            per = ", ".join(_fmt(v) for v in seeds.values())
            cells.append(f"{np.mean(vals):.4g} ({per})" if vals else "not logged")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    for t in results["targets"]:
        lines += ["", f"### {t.get('x', 'step')} to reach `{t['reference_arm']}`'s final {t['metric']} "
                      f"({_fmt(t['target'])})", ""]
        lines += ["| arm | seed | x reached | ratio to reference | own final |", "|---|---|---|---|---|"]
        for r in t["rows"]:
            reached = _fmt(r["x"]) if r["x"] is not None else "**never reached**"
            lines.append(f"| {r['arm']} | {r['seed']} | {reached} | {_fmt(r['ratio_to_reference'])} | "
                         f"{_fmt(r['final'])} |")
    return lines + [""]


def _runs_section(results: dict) -> list[str]:
    lines = ["## Runs", "", "| arm | seed | status | stages (run dirs) |", "|---|---|---|---|"]
    for r in results["runs"]:
        stages = "; ".join(f"{s['stage']}: `{s['run_dir']}`" for s in r["stages"])
        status = r["status"] if r["status"] != "failed" else "**FAILED**"
        lines.append(f"| {r['arm']} | {r['seed']} | {status} | {stages} |")
    failed = [r for r in results["runs"] if r["status"] == "failed"]
    for r in failed:
        lines += ["", f"### failure: {r['arm']} seed {r['seed']}", "", "```", r["error"].strip(), "```"]
    return lines + [""]


def write_report(exp: Experiment, chains: list[ChainResult], results: dict, out: str | os.PathLike,
                 command: str = "") -> Path:
    """Write ``results.json``, the plots and ``report.md`` into ``out``; return the report path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = _machine()
    results = {**results, "command": command, "date": when, "machine": machine}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plots = plot_curves(exp, chains, out)
    plots += [p for p in (plot_scores(exp, results, out), plot_deltas(exp, results, out)) if p is not None]
    few = " Fewer than 5 seeds: the seed-level part of each interval is a rough estimate." if len(exp.seeds) < 5 else ""
    lines = [f"# Experiment `{exp.name}`", "", exp.description.strip(), "",
             f"- command: `{command}`", f"- machine: {machine}", f"- date: {when}",
             f"- arms: {', '.join(a.name for a in exp.arms)} (baseline `{exp.baseline}`); seeds: {exp.seeds}",
             f"- intervals: 95% percentile bootstrap, {exp.n_boot} replicates, seeds and questions resampled "
             f"(paired with the baseline), see `eval/stats.py`.{few}", ""]
    lines += _runs_section(results) + _score_section(exp, results) + _curve_section(exp, results)
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _machine() -> str:
    desc = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)"
    try:
        import torch

        if torch.cuda.is_available():
            desc += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        desc += f", torch {torch.__version__}"
    except ImportError:
        pass
    return desc


__all__ = ["plot_curves", "plot_deltas", "plot_scores", "write_report"]

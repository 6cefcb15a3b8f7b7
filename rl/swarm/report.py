"""The swarm experiment's report: a markdown page and a PNG from the result JSON of :mod:`rl.swarm.experiment`."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any


def _ci(e: dict[str, Any], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(e['value'])} [{fmt.format(e['lo'])}, {fmt.format(e['hi'])}]"


def _arm_table(summary: dict[str, Any], metrics: list[str]) -> list[str]:
    rows = ["| arm | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for arm, stats in summary.items():
        if arm == "example_turns":
            continue
        fmt = {m: "{:.3f}" if m == "wall_s" else "{:.2f}" for m in metrics}
        rows.append(f"| {arm} | " + " | ".join(_ci(stats[m], fmt[m]) for m in metrics) + " |")
    return rows


def _delta_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for arm, stats in summary.items():
        for key, deltas in stats.items() if isinstance(stats, dict) else []:
            if key.startswith("delta_vs_"):
                for m, d in deltas.items():
                    lines.append(f"- {arm} - {key[9:]}, {m}: {_ci(d, '{:.3f}')} ({d['verdict']})")
    return lines


def _markdown(r: dict[str, Any]) -> str:
    c = r["config"]
    s = r["scripted"]
    lines = [
        "# Agent swarm vs single agent on the wide task (PARL runtime)",
        "",
        f"Command: `{r['command']}`  ",
        f"Machine: {r['machine']} (torch {r['torch']}, {r['threads']} threads). Date: {r['date']}. "
        f"Total time {r['total_s']:.0f} s.  ",
        "Intervals: 95% percentile bootstrap (`eval/stats.py`), over repeats x tasks; deltas paired over tasks.",
        "",
        "## 1. Scripted policies (rule-based; the latency metric itself)",
        "",
        f"Wide task: {c['scripted']['n_scenes']} scenes, count one colour over all of them; {c['scripted']['n_tasks']} "
        f"tasks x {c['scripted']['repeats']} repeats. Equal step budget: `max_total_steps = {c['step_budget']}` "
        f"for both arms. Single = `scripted_single_agent` (one `read_scene` per turn). Swarm = "
        f"`ScriptedSwarmOrchestrator(k={c['scripted']['workers']})` + scripted frozen workers. Every policy call "
        f"sleeps {c['scripted']['latency_s']} s (**simulated** decode latency), so wall-clock shows real thread "
        "concurrency, not model speed.",
        "",
        *_arm_table(s["wide"], ["critical_steps", "total_steps", "wall_s", "outcome", "serial_collapse"]),
        "",
        *_delta_lines(s["wide"]),
        "",
        "Worker sweep (scripted swarm, mean over tasks):",
        "",
        "| workers | critical_steps | total_steps | wall_s | outcome |",
        "|---|---|---|---|---|",
        *[f"| {k} | {v['critical_steps']:.2f} | {v['total_steps']:.2f} | {v['wall_s']:.3f} | {v['outcome']:.2f} |"
          for k, v in s["worker_sweep"].items()],
        "",
        f"Deep control (chain of {c['scripted']['deep_depth']} lookups; decomposition cannot help, the scripted "
        "swarm hands the whole chain to one worker):",
        "",
        *_arm_table(s["deep_control"], ["critical_steps", "total_steps", "wall_s", "outcome"]),
        "",
        "## 2. Model orchestrator, randomly initialised "
        f"(`{c['flavor']}` flavor, scripted frozen sub-agents)",
        "",
        "Real wall-clock on this CPU. A random policy's text is scored as it comes: a turn without tool markers is a "
        "final answer (episode over); a turn with markers that do not parse, or calls that fail validation, gets error "
        "observations and the episode goes on (`malformed_turns` counts those turns). Nothing crashed.",
        "",
        *_arm_table(r["model_init"], ["critical_steps", "orchestrator_steps", "wall_s", "outcome", "serial_collapse",
                                      "malformed_turns", "answered"]),
        "",
        "First swarm-arm turns (truncated): " + " / ".join(f"`{t[:80]!r}`" for t in r["model_init"]["example_turns"]),
        "",
    ]
    if "rl" in r:
        lines += _rl_markdown(r)
    return "\n".join(lines) + "\n"


def _rl_markdown(r: dict[str, Any]) -> list[str]:
    rl, c = r["rl"], r["config"]["rl"]
    lines = [
        f"## 3. Serial collapse with and without r_parallel (`{r['config']['flavor']}` model, trained)",
        "",
        f"Imitation warm start ({c['warm']['steps']} steps on scripted transcripts, lr {c['warm']['lr']:g} "
        f"({c['warm'].get('lr_schedule', 'constant')}), "
        f"{c['warm']['swarm_share']:.0%} swarm; loss {rl['warm_start_loss'][0]:.2f} -> "
        f"{rl['warm_start_loss'][1]:.2f}, {rl['warm_start_s']:.0f} s), then {c['steps']} PARL steps "
        f"({c['tasks_per_step']} tasks x {c['k']} episodes, {c['n_scenes']}-scene wide tasks, K2.5 objective via "
        f"`rl.step.accumulate_policy_gradient`, AdamW lr {c['lr']:g}) per arm from the same weights. "
        f"lambda1 = {c['rl_lambda1']} "
        f"(with) or 0 (without), lambda2 = {c['rl_lambda2']}, both linearly annealed to 0 over {c['anneal_steps']} "
        f"steps; parallel_cap = {c['parallel_cap']}. Held-out: {c['eval_tasks']} tasks, one episode each.",
        "",
        "| policy | serial_collapse | outcome | subagent_runs | malformed_turns |",
        "|---|---|---|---|---|",
    ]
    rows = [("after warm start", rl["after_warm_start"]), ("RL with r_parallel", rl["with_r_parallel"]["after_rl"]),
            ("RL without r_parallel", rl["without_r_parallel"]["after_rl"])]  # fmt: skip
    for name, e in rows:
        lines.append(f"| {name} | {_ci(e['serial_collapse'])} | {_ci(e['outcome'])} | {_ci(e['subagent_runs'])} | "
                     f"{_ci(e['malformed_turns'])} |")  # fmt: skip
    d = rl["collapse_delta_with_minus_without"]
    pairs = zip(rl["with_r_parallel"]["train_log"], rl["without_r_parallel"]["train_log"])
    per_step = ", ".join(f"{a['serial_collapse']:.2f}/{b['serial_collapse']:.2f}" for a, b in pairs)
    logs = rl["with_r_parallel"]["train_log"], rl["without_r_parallel"]["train_log"]
    outcome = ", ".join(f"{a['outcome']:.2f}/{b['outcome']:.2f}" for a, b in zip(*logs))
    paid = ", ".join(f"{a['r_parallel']:.2f}" for a in logs[0])
    skipped = [sum(x.get("skipped_update", 0.0) for x in log) for log in logs]
    lines += ["", f"Serial-collapse delta (with - without r_parallel): {_ci(d, '{:.3f}')} ({d['verdict']}).", "",
              f"Training-rollout serial collapse per step (with / without): {per_step}", "",
              f"Training-rollout outcome per step (with / without): {outcome}", "",
              f"Mean r_parallel per step, with arm (credited only for well-formed orchestrator turns): {paid}; "
              f"updates skipped for lack of signal (all advantages 0): {skipped[0]:.0f} / {skipped[1]:.0f}", ""]
    return lines


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 3 if "rl" in r else 2
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4))
    wide = r["scripted"]["wide"]
    for ax, metric, label in ((axes[0], "critical_steps", "critical steps"), (axes[1], "wall_s", "wall-clock (s)")):
        arms = ["single", "swarm"]
        vals = [wide[a][metric]["value"] for a in arms]
        err = [[v - wide[a][metric]["lo"] for a, v in zip(arms, vals)],
               [wide[a][metric]["hi"] - v for a, v in zip(arms, vals)]]  # fmt: skip
        ax.bar(arms, vals, yerr=err, capsize=6, color=["#888", "#3a7"])
        ax.set_title(f"scripted, wide task: {label}")
    sweep = r["scripted"]["worker_sweep"]
    if "rl" in r:
        ax = axes[2]
        for arm, style in (("with_r_parallel", "-o"), ("without_r_parallel", "--s")):
            log = r["rl"][arm]["train_log"]
            ax.plot([x["step"] for x in log], [x["serial_collapse"] for x in log], style, label=arm)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("PARL step")
        ax.set_title("trained model: serial-collapse rate (rollouts)")
        ax.legend()
    ks = list(sweep)
    axes[1].text(0.02, 0.97, "workers -> critical steps: " + ", ".join(f"{k}:{sweep[k]['critical_steps']:.1f}"
                                                                      for k in ks),
                 transform=axes[1].transAxes, fontsize=7, va="top")  # fmt: skip
    title = textwrap.fill(f"{r['command']}  |  {r['machine']}  |  {r['date']}", width=170)
    fig.suptitle(title, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict[str, Any], out_dir: Path, name: str) -> None:
    """``<name>.md`` and ``<name>.png`` in ``out_dir``."""
    (out_dir / f"{name}.md").write_text(_markdown(result))
    _plot(result, out_dir / f"{name}.png")


__all__ = ["write_report"]

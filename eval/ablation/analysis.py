"""Turn finished chains into numbers: per-task scores and deltas with bootstrap intervals, curve summaries.

Every arm and task appears in the output, whatever its sign: a delta whose interval excludes zero in the bad
direction gets the verdict ``worse`` (see :func:`eval.stats.verdict`), never a silent omission. Chains that
failed are listed with their error.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from eval.ablation.collect import align_questions, curve, read_samples, task_matrix, x_to_reach
from eval.ablation.runner import ChainResult
from eval.ablation.spec import Experiment
from eval.stats import bootstrap_delta, bootstrap_score


def per_arm_samples(chains: list[ChainResult]) -> dict[str, dict[int, dict]]:
    """``arm -> seed -> {task: entry}`` from the chains that finished with an evaluation."""
    out: dict[str, dict[int, dict]] = defaultdict(dict)
    for c in chains:
        if c.status == "done" and c.eval_dir is not None:
            out[c.arm][c.seed] = read_samples(c.eval_dir / "samples.json")
    return out


def score_tables(exp: Experiment, chains: list[ChainResult]) -> dict[str, Any]:
    """``{"scores": {task: {arm: ...}}, "deltas": {task: {arm: ...}}}`` (the baseline has no delta row)."""
    samples = per_arm_samples(chains)
    scores: dict[str, dict] = {}
    deltas: dict[str, dict] = {}
    for spec in exp.eval.tasks:
        task, _ = exp.task_metric(spec)
        mats = {arm.name: task_matrix(samples[arm.name], task) for arm in exp.arms
                if any(task in s for s in samples.get(arm.name, {}).values())}
        scores[task] = {}
        for arm, m in mats.items():
            est = bootstrap_score(m.num_SQ, m.den_SQ, n_boot=exp.n_boot, seed=0)
            scores[task][arm] = {**est.to_dict(), "metric": m.metric, "higher_is_better": m.higher_is_better,
                                 "seeds": m.seeds, "per_seed": m.aggregates}
        base = mats.get(exp.baseline)
        deltas[task] = {}
        if base is None:
            continue
        for arm, m in mats.items():
            if arm == exp.baseline:
                continue
            a, b = align_questions(m, base)
            d = bootstrap_delta(a.num_SQ, b.num_SQ, a.den_SQ, b.den_SQ, paired_seeds=a.seeds == b.seeds,
                                higher_is_better=m.higher_is_better, n_boot=exp.n_boot, seed=1)
            deltas[task][arm] = {**d.to_dict(), "metric": m.metric}
    return {"scores": scores, "deltas": deltas}


def curve_summary(exp: Experiment, chains: list[ChainResult]) -> dict[str, Any]:
    """Last logged value of every curve metric per stage, arm and seed (``None`` where never logged)."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(dict))
    for c in chains:
        for job in c.stages:
            for metric in exp.curves:
                _, ys = curve(job.run_dir, metric, exp.curve_x)
                out[f"{job.stage}/{metric}"][c.arm][str(c.seed)] = float(ys[-1]) if len(ys) else None
    return {k: dict(v) for k, v in out.items()}


def _stage_job(c: ChainResult, stage: str | None):
    return c.stages[-1] if stage is None else next((j for j in c.stages if j.stage == stage), None)


def target_tables(exp: Experiment, chains: list[ChainResult]) -> list[dict]:
    """For each target: the reference arm's final value (mean over its seeds) and the x each arm x seed needs
    to reach it, with the ratio to the reference's own x (None = never reached, reported as such)."""
    tables = []
    for t in exp.targets:
        final = {}
        for c in chains:
            job = _stage_job(c, t.stage)
            if job is None:
                continue
            xs, ys = curve(job.run_dir, t.metric, t.x)
            final[(c.arm, c.seed)] = (xs, ys)
        ref = [ys[-1] for (arm, _), (xs, ys) in final.items() if arm == t.reference_arm and len(ys)]
        if not ref:
            tables.append({"metric": t.metric, "reference_arm": t.reference_arm, "target": None, "rows": []})
            continue
        target = float(np.mean(ref))
        ref_x = [x_to_reach(xs, ys, target, t.lower_is_better) for (arm, _), (xs, ys) in final.items()
                 if arm == t.reference_arm]
        ref_x_mean = float(np.mean([x for x in ref_x if x is not None])) if any(x is not None for x in ref_x) else None
        rows = []
        for (arm, seed), (xs, ys) in sorted(final.items()):
            x = x_to_reach(xs, ys, target, t.lower_is_better) if len(ys) else None
            ratio = x / ref_x_mean if x is not None and ref_x_mean else None
            rows.append({"arm": arm, "seed": seed, "x": x, "ratio_to_reference": ratio,
                         "final": float(ys[-1]) if len(ys) else None})
        tables.append({"metric": t.metric, "x": t.x, "reference_arm": t.reference_arm, "target": target,
                       "reference_x": ref_x_mean, "rows": rows})
    return tables


def analyse(exp: Experiment, chains: list[ChainResult]) -> dict[str, Any]:
    runs = [{"arm": c.arm, "seed": c.seed, "status": c.status, "error": c.error,
             "stages": [{"stage": j.stage, "key": j.key, "run_dir": str(j.run_dir)} for j in c.stages],
             "eval_dir": str(c.eval_dir) if c.eval_dir else None, "skipped_on_restart": c.skipped} for c in chains]
    out: dict[str, Any] = {"experiment": exp.name, "description": exp.description, "baseline": exp.baseline,
                           "arms": [a.name for a in exp.arms], "seeds": exp.seeds, "runs": runs}
    out.update(score_tables(exp, chains))
    out["final_curve_values"] = curve_summary(exp, chains)
    out["targets"] = target_tables(exp, chains)
    return out


__all__ = ["analyse", "curve_summary", "per_arm_samples", "score_tables", "target_tables"]

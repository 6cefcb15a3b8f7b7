"""The shipped experiment configs load strictly; their stage configs validate against the training app's schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.ablation import load_experiment, plan_chain
from kimi_vl.runconfig import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs"
EXPERIMENTS = sorted(p for p in (CONFIGS / "experiments").glob("[0-9]_*.yaml")) + [CONFIGS / "ablation_smoke.yaml"]


def missing_configs(exp) -> list[str]:
    paths = {exp.resolve(st.config if st.config is not None else exp.base_config)
             for arm in exp.arms for st in exp.arm_stages(arm)}
    return sorted(p.name for p in paths if not p.is_file())


def test_all_seven_experiments_are_shipped():
    assert len(EXPERIMENTS) == 8


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_loads_and_plans(path: Path, tmp_path: Path):
    exp = load_experiment(path)
    assert exp.eval.tasks and len(exp.seeds) >= 2 and len(exp.arms) >= 2
    assert not missing_configs(exp), f"stage configs {missing_configs(exp)} are referenced but not shipped"
    for arm in exp.arms:
        plan_chain(exp, arm.name, exp.seeds[0], tmp_path)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_train_stage_overrides_validate_against_train_config(path: Path, tmp_path: Path):
    from kimi_vl.train import config as train_config

    exp = load_experiment(path)
    assert not missing_configs(exp), f"stage configs {missing_configs(exp)} are referenced but not shipped"
    checked = 0
    for arm in exp.arms:
        for job in plan_chain(exp, arm.name, exp.seeds[0], tmp_path):
            if job.command != "train" or job.config is None:
                continue
            extra = [f"output_dir={job.run_dir}", f"seed={job.seed}"]
            load_config(train_config.TrainConfig, job.config, list(job.overrides) + extra)
            checked += 1
    assert checked, f"{path.name}: no train stage was validated"

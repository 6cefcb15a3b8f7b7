"""The `small` experiment configs (kimi_vl/configs/experiments/small, run by scripts/gpu_experiments.sh) load
strictly, every stage validates against its command's schema, and the harness's ``stage_overrides`` have the
last word (the script's CPU-sized check relies on it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.ablation import load_experiment, plan_chain
from kimi_vl.runconfig import load_config

SMALL = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs" / "experiments" / "small"
EXPERIMENTS = sorted(SMALL.glob("[0-9]_*.yaml"))
DATA = "base_overrides=[data.path=/data/small_subset]"


def stage_config(job):
    from kimi_vl.train.config import TrainConfig
    from rl.config import RLRunConfig

    cls = {"train": TrainConfig, "rl": RLRunConfig}[job.command]
    extra = [f"output_dir={job.run_dir}", f"seed={job.seed}"]
    extra += [f"init_from={job.init_from}"] if job.init_from else []
    return load_config(cls, job.config, list(job.overrides) + extra)


def test_three_small_experiments():
    assert [p.name for p in EXPERIMENTS] == ["1_vision_rl.yaml", "2_fusion.yaml", "3_optimizer.yaml"]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_stage_validates(path: Path, tmp_path: Path):
    exp = load_experiment(path, [DATA])
    assert len(exp.seeds) >= 2 and len(exp.arms) >= 2 and exp.eval.tasks and exp.eval.suite_preset == "small"
    for arm in exp.arms:
        for job in plan_chain(exp, arm.name, exp.seeds[0], tmp_path):
            cfg = stage_config(job)
            assert cfg.data.path == "/data/small_subset"
            assert cfg.model.flavor == "small"


def test_vision_rl_shares_pretrain_and_sft_and_matches_update_tokens(tmp_path: Path):
    exp = load_experiment(SMALL / "1_vision_rl.yaml", [DATA])
    chains = {arm.name: plan_chain(exp, arm.name, 0, tmp_path) for arm in exp.arms}
    prefix = {tuple(j.key for j in jobs[:2]) for jobs in chains.values()}
    assert len(prefix) == 1, "pretrain + SFT must be one job per seed for all three arms"
    rl = {name: stage_config(jobs[-1]) for name, jobs in chains.items() if jobs[-1].command == "rl"}
    assert {c.data.source for c in rl.values()} == {"text", "vision"}
    caps = {c.max_update_tokens for c in rl.values()}
    assert len(caps) == 1 and None not in caps


def test_fusion_arms_have_equal_tokens_and_vision_share(tmp_path: Path):
    exp = load_experiment(SMALL / "2_fusion.yaml", [DATA])
    cfgs = [stage_config(plan_chain(exp, arm.name, 0, tmp_path)[0]) for arm in exp.arms]
    assert len({(c.max_steps, c.data.batch_size, c.data.seq_len) for c in cfgs}) == 1
    shares = {round(c.data.vision_ratio * (c.max_steps - c.data.vision_inject_step) / c.max_steps, 6) for c in cfgs}
    assert shares == {0.1}


def test_stage_overrides_come_last_and_name_existing_stages(tmp_path: Path):
    over = "stage_overrides.pretrain=[model.flavor=debug,max_steps=3]"
    exp = load_experiment(SMALL / "1_vision_rl.yaml", [DATA, over])
    jobs = plan_chain(exp, "vision_rl", 0, tmp_path)
    pre, sft, rl = (stage_config(j) for j in jobs)
    assert (pre.model.flavor, pre.max_steps) == ("debug", 3)
    assert (sft.model.flavor, rl.model.flavor) == ("small", "small")
    with pytest.raises(ValueError, match="stage_overrides"):
        load_experiment(SMALL / "2_fusion.yaml", [DATA, "stage_overrides.rl=[max_steps=1]"])

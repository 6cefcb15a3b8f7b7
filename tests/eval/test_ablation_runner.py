"""The ablation runner with fake stage/eval functions: plans, dedup, restart, parallel devices, failures, report."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from eval.ablation import Runner, analyse, load_experiment, plan_chain, write_report
from eval.ablation.collect import write_samples
from kimi_vl.runconfig import ConfigError

EXPERIMENT = """
name: fake
description: fake optimiser comparison
base_config: base.yaml
base_overrides: [steps=20]
stages: [{name: sft, overrides: [stage=sft]}, {name: rl}]
baseline: base
seeds: [0, 1]
arms:
  - {name: base, overrides: [quality=0.5]}
  - {name: good, overrides: [quality=0.7]}
  - {name: bad, overrides: [quality=0.3]}
eval: {tasks: [qa, prose]}
curves: [loss]
targets: [{metric: loss, reference_arm: base}]
n_boot: 300
"""


def quality(overrides) -> float:
    return float(next(o for o in overrides if o.startswith("quality=")).split("=")[1])


class FakeApp:
    """Stage: loss curve falls faster for better arms. Eval: accuracy ~ quality on 300 shared questions."""

    def __init__(self, fail_arm_quality: float | None = None, sleep: float = 0.0):
        self.calls: list[tuple[str, int, str]] = []
        self.envs: list[dict] = []
        self.fail, self.sleep = fail_arm_quality, sleep
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def stage(self, job) -> None:
        with self.lock:
            self.calls.append((job.stage, job.seed, job.key))
            self.envs.append(job.env)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self.sleep)
            q = quality(job.overrides)
            if self.fail is not None and q == self.fail and job.stage == "rl":
                raise RuntimeError("diverged")
            if job.stage == "rl":
                assert job.init_from is not None and job.init_from.parent.name.startswith("sft-")
            steps = np.arange(1, 21)
            loss = 3.0 * np.exp(-q * steps / 10) + 0.01 * job.seed
            (job.run_dir / "metrics.jsonl").write_text(
                "".join(json.dumps({"step": int(s), "loss": float(v)}) + "\n" for s, v in zip(steps, loss)))
            (job.run_dir / "final").mkdir()
            (job.run_dir / "final" / "q.json").write_text(json.dumps({"q": q, "seed": job.seed}))
        finally:
            with self.lock:
                self.active -= 1

    def evaluate(self, job) -> None:
        info = json.loads((job.checkpoint / "q.json").read_text())
        rng = np.random.default_rng(info["seed"] * 1000 + int(info["q"] * 10))
        p_q = np.random.default_rng(99).uniform(0.1, 0.9, 300)
        acc = (rng.uniform(size=300) < np.clip(p_q + info["q"] - 0.5, 0, 1)).astype(float)
        ll = -rng.uniform(1, 2, 50) * 100 * (1.5 - info["q"])
        write_samples(job.out_dir / "samples.json", {
            "qa": {"metric": "acc", "higher_is_better": True, "aggregate": float(acc.mean()),
                   "doc_ids": list(range(300)), "num": acc.tolist(), "den": None},
            "prose": {"metric": "bits_per_byte", "higher_is_better": False, "aggregate": 0.0,
                      "doc_ids": list(range(50)), "num": (-ll / np.log(2)).tolist(), "den": [100.0] * 50},
        })


@pytest.fixture
def exp_path(tmp_path: Path) -> Path:
    (tmp_path / "base.yaml").write_text("steps: 10\n")
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT)
    return path


def test_spec_is_strict_and_resolves_paths(exp_path: Path):
    exp = load_experiment(exp_path)
    assert exp.resolve(exp.base_config) == exp_path.parent / "base.yaml"
    with pytest.raises(ConfigError, match="unknown key 'arms\\[0\\]|colour"):
        load_experiment(exp_path, ["colour=red"])
    with pytest.raises(ConfigError, match="baseline"):
        load_experiment(exp_path, ["baseline=nope"])


def test_plan_shares_identical_prefix_stages(exp_path: Path, tmp_path: Path):
    exp = load_experiment(exp_path)
    a, b = plan_chain(exp, "base", 0, tmp_path), plan_chain(exp, "good", 0, tmp_path)
    assert a[0].key != b[0].key  # arm overrides apply to every stage
    assert a[1].overrides == ("steps=20", "quality=0.5")
    assert a[0].overrides == ("steps=20", "stage=sft", "quality=0.5")
    assert a[1].init_from == a[0].run_dir / "final" and a[0].init_from is None
    assert plan_chain(exp, "base", 1, tmp_path)[0].key != a[0].key
    shared = exp_path.parent / "shared.yaml"
    shared.write_text(
        "name: s\nbase_config: base.yaml\nbaseline: vision\narms:\n"
        "  - {name: vision, stages: [{name: sft}, {name: rl, overrides: [data=vision]}]}\n"
        "  - {name: text, stages: [{name: sft}, {name: rl, overrides: [data=text]}]}\n"
    )
    exp2 = load_experiment(shared)
    v, t = plan_chain(exp2, "vision", 0, tmp_path), plan_chain(exp2, "text", 0, tmp_path)
    assert v[0].key == t[0].key and v[0].run_dir == t[0].run_dir and v[1].key != t[1].key
    (exp_path.parent / "base.yaml").write_text("steps: 11\n")  # a changed config file is a new run
    assert plan_chain(exp2, "vision", 0, tmp_path)[0].key != v[0].key


def test_runs_reports_and_skips_on_restart(exp_path: Path, tmp_path: Path):
    exp = load_experiment(exp_path)
    out = tmp_path / "out"
    app = FakeApp()
    chains = Runner(exp, out, app.stage, app.evaluate).run()
    assert all(c.status == "done" for c in chains) and len(app.calls) == 3 * 2 * 2
    results = analyse(exp, chains)
    report = write_report(exp, chains, results, out, command="test")
    text = report.read_text()
    for name in ("results.json", "scores.png", "deltas.png", "curves_sft.png", "curves_rl.png"):
        assert (out / name).stat().st_size > 0, name
    d = results["deltas"]["qa"]
    assert d["good"]["verdict"] == "better" and d["bad"]["verdict"] == "worse"
    assert results["deltas"]["prose"]["bad"]["verdict"] == "worse"  # higher bits/byte, lower is better
    assert "| qa | bad |" in text and "**WORSE**" in text
    rows = {(r["arm"], r["seed"]): r for r in results["targets"][0]["rows"]}
    assert rows[("bad", 0)]["x"] is None and "never reached" in text
    assert rows[("good", 0)]["ratio_to_reference"] < 1.0
    sc = results["scores"]["qa"]["base"]
    assert sc["lo"] < sc["value"] < sc["hi"] and sc["n_seeds"] == 2 and sc["n_questions"] == 300

    again = FakeApp()
    chains2 = Runner(exp, out, again.stage, again.evaluate).run()
    assert again.calls == [] and all(c.status == "done" for c in chains2)
    assert analyse(exp, chains2)["deltas"] == results["deltas"]


def test_unfinished_run_without_done_marker_is_rerun(exp_path: Path, tmp_path: Path):
    exp = load_experiment(exp_path, ["seeds=[0]", "eval.tasks=[]"])
    app = FakeApp()
    chains = Runner(exp, tmp_path, app.stage, app.evaluate).run()
    (chains[0].stages[1].run_dir / "DONE").unlink()
    import shutil

    shutil.rmtree(chains[0].stages[1].run_dir / "final")
    again = FakeApp()
    Runner(exp, tmp_path, again.stage, again.evaluate).run()
    assert [c[0] for c in again.calls] == ["rl"]


def test_parallel_devices_and_failures_are_reported(exp_path: Path, tmp_path: Path):
    exp = load_experiment(exp_path)
    app = FakeApp(fail_arm_quality=0.7, sleep=0.05)
    chains = Runner(exp, tmp_path, app.stage, app.evaluate, devices=["0", "1"]).run()
    assert {e["CUDA_VISIBLE_DEVICES"] for e in app.envs} == {"0", "1"}
    assert app.max_active == 2
    failed = [c for c in chains if c.status == "failed"]
    assert {(c.arm, c.seed) for c in failed} == {("good", 0), ("good", 1)}
    assert "diverged" in failed[0].error
    results = analyse(exp, chains)
    text = write_report(exp, chains, results, tmp_path / "rep").read_text()
    assert "**FAILED**" in text and "| qa | good | — | no result |" in text
    assert "good" not in results["scores"]["qa"]


def test_default_subprocess_commands(exp_path: Path, tmp_path: Path):
    from eval.ablation.runner import EvalJob
    from eval.ablation.stages import eval_command, stage_command

    exp = load_experiment(exp_path, ["eval.tasks=[qa, 'prose:bits_per_byte']", "eval.include_path=[tasks]",
                                     "eval.limit=10"])
    rl = plan_chain(exp, "good", 1, tmp_path)[1]
    cmd = stage_command(rl)
    assert cmd[2:6] == ["kimi_vl.cli", "train", "--config", str(exp_path.parent / "base.yaml")]
    assert cmd[6:] == ["steps=20", "quality=0.7", f"output_dir={rl.run_dir}", "seed=1", f"init_from={rl.init_from}"]
    ev = eval_command(EvalJob(rl.key, rl.run_dir / "final", tmp_path / "ev", experiment=exp))
    assert ev[2] == "eval" and f"checkpoint={rl.run_dir / 'final'}" in ev and "qa,prose" in ev
    assert ev[ev.index("--include_path") + 1] == str(exp_path.parent / "tasks")
    assert ev[-2:] == ["--metric", "prose=bits_per_byte"] and ev[ev.index("--limit") + 1] == "10"

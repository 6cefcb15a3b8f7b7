"""The shipped smoke ablation (2 arms x 2 seeds, debug flavor) runs end to end: train, evaluate, report."""

import json
from pathlib import Path

from eval.ablation.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "kimi_vl" / "configs" / "ablation_smoke.yaml"


def test_smoke_ablation_end_to_end(tmp_path):
    out = tmp_path / "smoke"
    assert main([str(CONFIG), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    assert "## Deltas vs baseline `adamw`" in report and "muonclip" in report
    runs = list((out / "runs").glob("*/DONE"))
    assert len(runs) == 4, f"expected 2 arms x 2 seeds finished, got {len(runs)}"
    for png in ("curves_train.png", "scores.png", "deltas.png"):
        assert (out / png).stat().st_size > 5_000, png
    assert results, "results.json is empty"

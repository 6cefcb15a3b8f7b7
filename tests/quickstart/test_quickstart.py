"""The main job in its reduced CI form: every stage runs, numbers are non-trivial, a re-run skips all."""

import json

from eval.quickstart.cli import CI_SIZES, main
from eval.quickstart.pipeline import Pipeline, QuickstartConfig
from kimi_vl.logs import read_metrics

STAGES = ("data", "suites", "eval/init", "pretrain", "eval/pretrain", "sft", "eval/sft", "rl", "eval/rl", "demo")


def test_quickstart_ci_end_to_end(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["--out", str(out), "--ci"]) == 0
    printed = capsys.readouterr().out
    assert "kimi-vl quickstart: done" in printed and f"report: {out.resolve() / 'report.md'}" in printed
    for stage in STAGES:
        assert (out / stage / "DONE").is_file(), f"stage {stage} did not finish"

    pre = read_metrics(out / "pretrain" / "metrics.jsonl")
    assert len(pre) == CI_SIZES["pretrain_steps"]
    first, last = sum(r["loss"] for r in pre[:5]) / 5, sum(r["loss"] for r in pre[-5:]) / 5
    assert last < first - 0.5, f"pretraining loss did not fall: {first:.2f} -> {last:.2f}"
    held_out = [r["eval/loss"] for r in pre if "eval/loss" in r]
    assert len(held_out) >= 3 and held_out[-1] < held_out[0], f"held-out loss did not fall: {held_out}"
    assert any("qk/max_logit" in r for r in pre)

    rl = read_metrics(out / "rl" / "metrics.jsonl")
    assert any("reward" in r for r in rl) and any("eval/reward" in r for r in rl)

    for point in ("init", "pretrain", "sft", "rl"):
        scores = json.loads((out / "eval" / point / "scores.json").read_text())
        assert {"kimi_text_mc", "kimi_text_ppl", "kimi_vision_shapes"} <= set(scores), point
    init_bpb = json.loads((out / "eval/init/scores.json").read_text())["kimi_text_ppl"]["bits_per_byte"]
    pre_bpb = json.loads((out / "eval/pretrain/scores.json").read_text())["kimi_text_ppl"]["bits_per_byte"]
    assert pre_bpb < init_bpb, "pretraining must lower held-out bits per byte"

    demo = json.loads((out / "demo" / "DONE").read_text())
    assert 0.0 <= demo["overall"] <= 1.0 and (out / "demo" / "side_by_side.png").is_file()
    report = (out / "report.md").read_text()
    for section in ("## Summary", "## Training curves", "## Held-out scores", "## Stage times"):
        assert section in report
    assert (out / "training.png").stat().st_size > 10_000 and (out / "scores.png").stat().st_size > 10_000

    # resumable: a second run skips every finished stage
    again = Pipeline(QuickstartConfig(out=out, **CI_SIZES))
    again.run()
    assert again.timings == {}


def test_interrupt_says_how_to_go_on(tmp_path, capsys, monkeypatch):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Pipeline, "run", interrupted)
    out = tmp_path / "qs"
    assert main(["--out", str(out), "--ci"]) == 130
    printed = capsys.readouterr().out
    assert "interrupted" in printed and f"`kimi-vl quickstart --out {out} --ci` again" in printed

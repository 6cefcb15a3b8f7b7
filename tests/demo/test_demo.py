"""Video/screenshot -> website demos end to end on a debug checkpoint trained here (quality is not asserted; the
files, the scores and the prompt format are). Needs Chromium (``scripts/install_chromium.sh``)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
from PIL import Image
from web_checkpoint import MAX_PATCHES, build_web_data, train_web_checkpoint, web_preset

from data_pipelines.packing import IGNORE, Encoder
from data_pipelines.shards import decode_sample, iter_tar
from data_pipelines.synth.build import split_shards
from eval.demo import WebsiteGenerator, evaluate_heldout, heldout_pages, recover_html, screenshot_to_website
from eval.demo.generator import Generation
from eval.demo.heldout import OtherSettingsError
from vision_encoder.geometry import PatchGeometry

PRESET = web_preset("demo_test", eval_pages=1)
D2C_KEYS = ("overall", "block_match", "text", "position", "color", "visual")


@pytest.fixture(scope="module")
def web_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("web") / "data"
    manifest = build_web_data(root, PRESET)
    assert manifest["splits"]["train"]["counts"] == {"page": 2, "page_video": 2, "prose": 4}
    return root


@pytest.fixture(scope="module")
def checkpoint(web_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    final = train_web_checkpoint(web_data, out)
    assert (final / "config.json").is_file() and (out / "config.yaml").is_file()
    return final


@pytest.fixture(scope="module")
def generator(checkpoint: Path) -> WebsiteGenerator:
    return WebsiteGenerator.from_checkpoint(checkpoint)  # max_patches read from RUN/config.yaml


def _check_files(result: dict, out: Path, reference: bool) -> dict:
    for name in ("generation.txt", "generated.html", "side_by_side.png", "scores.json", "report.html"):
        assert (out / name).is_file(), name
    assert (out / "reference.html").is_file() == reference
    saved = json.loads((out / "scores.json").read_text())
    assert not result or saved["scores"] == json.loads(json.dumps(result["scores"]))
    report = (out / "report.html").read_text()
    assert 'src="side_by_side.png"' in report and 'src="generated.html"' in report
    with Image.open(out / "side_by_side.png") as im:
        assert im.width > 100 and im.height > 100
    for key, value in saved["scores"].items():
        if isinstance(value, float):
            assert 0.0 <= value <= 1.0, (key, value)
    return saved


def test_video_script_end_to_end_with_reference(web_data, checkpoint, tmp_path, monkeypatch):
    page = next(p for p in heldout_pages(str(web_data)) if p.family == "page_video")
    clip, ref = tmp_path / "clip.mp4", tmp_path / "ref.html"
    clip.write_bytes(page.media)
    ref.write_text(page.html)
    out = tmp_path / "out"
    argv = ["video_to_website.py", "--video", str(clip), "--checkpoint", str(checkpoint), "--out", str(out),
            "--reference", str(ref), "--max-new-tokens", "24"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        runpy.run_path("scripts/video_to_website.py", run_name="__main__")
    assert done.value.code == 0
    saved = _check_files({}, out, reference=True)
    scores = saved["scores"]
    assert set(D2C_KEYS) | {"scroll_states", "input_ssim", "reason", "visual_method"} <= set(scores)
    assert scores["overall"] == pytest.approx(sum(scores[k] for k in D2C_KEYS[1:]) / 5)
    assert saved["generation"]["new_tokens"] <= 24 and saved["generation"]["vision_tokens"] > 0
    assert saved["viewport"] == [320, 240]
    assert saved["rendered"] or scores["reason"]


def test_screenshot_cli_without_reference(web_data, checkpoint, tmp_path, capsys):
    from kimi_vl.cli import main as kimi_vl_main

    page = next(p for p in heldout_pages(str(web_data)) if p.family == "page")
    shot = tmp_path / "page.png"
    shot.write_bytes(page.media)
    out = tmp_path / "out"
    code = kimi_vl_main(["demo", "screenshot2web", "--image", str(shot), "--checkpoint", str(checkpoint),
                         "--out", str(out), "--max-new-tokens", "16"])
    assert code == 0 and "report:" in capsys.readouterr().out
    saved = _check_files({}, out, reference=False)
    assert "overall" not in saved["scores"] and 0.0 <= saved["scores"]["input_ssim"] <= 1.0


def test_prompt_is_the_training_prompt(web_data, generator):
    """The demo's prompt ids are the training SFT sample's ids up to the first trained (HTML) token."""
    encoder = Encoder(generator.tokenizer, "sft", PatchGeometry(max_patches=MAX_PATCHES),
                      PatchGeometry(max_patches=MAX_PATCHES))
    seen = set()
    for shard in split_shards(web_data, "eval", "vision"):
        for raw in iter_tar(shard):
            sample = decode_sample(raw)
            doc = encoder.encode(sample)
            start = next(i for i, label in enumerate(doc.labels) if label != IGNORE)
            media = {"image": sample["images"][0]} if sample["images"] else {"video": sample["videos"][0]}
            inputs, vision_tokens = generator.prompt(**media)
            assert inputs["input_ids"][0].tolist() == doc.input_ids[:start]
            assert vision_tokens == doc.vision_tokens > 0
            assert sample["html"] == sample["json"]["messages"][-1]["content"]  # the .html member
            seen.add(next(iter(media)))
    assert seen == {"image", "video"}


def test_heldout_run_writes_summary_and_examples(web_data, checkpoint, tmp_path):
    summary = evaluate_heldout(checkpoint, tmp_path / "heldout", data=str(web_data), max_new_tokens=12)
    assert summary["pages"] == 2 and set(summary["per_family"]) == {"page", "page_video"}
    assert 0.0 <= summary["means"]["overall"] <= 1.0 and "scroll_states" in summary["per_family"]["page_video"]
    assert (tmp_path / "heldout" / "examples.png").is_file()
    assert json.loads((tmp_path / "heldout" / "summary.json").read_text())["pages"] == 2
    # resumable: a second run reads the pages back; a run with other settings in the same folder is refused
    page = next((tmp_path / "heldout").glob("*/scores.json"))
    page.unlink()
    again = evaluate_heldout(checkpoint, tmp_path / "heldout", data=str(web_data), max_new_tokens=12)
    assert again["reused_pages"] == 1 and page.is_file()
    assert {k: again[k] for k in ("pages", "per_family")} == {k: summary[k] for k in ("pages", "per_family")}
    with pytest.raises(OtherSettingsError, match=r"max_new_tokens: \[12\] there, \[13\] now"):
        evaluate_heldout(checkpoint, tmp_path / "heldout", data=str(web_data), max_new_tokens=13)


class FixedText:
    """A generator stub that 'writes' a fixed text (garbage handling without a model)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, **kwargs) -> Generation:
        return Generation(self.text, 10, 3, 4, 0.01, True)


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_generation_scores_zero_with_reason(web_data, tmp_path, text):
    page = next(p for p in heldout_pages(str(web_data)) if p.family == "page")
    shot = tmp_path / "page.png"
    shot.write_bytes(page.media)
    result = screenshot_to_website(shot, "stub", tmp_path / "out", reference_html=page.html,
                                   generator=FixedText(text))
    assert not result["rendered"] and "empty" in result["render_error"]
    assert all(result["scores"][k] == 0.0 for k in (*D2C_KEYS, "input_ssim"))
    assert "empty" in result["scores"]["reason"]
    _check_files(result, tmp_path / "out", reference=True)


def test_garbage_text_is_wrapped_rendered_and_scored(web_data, tmp_path):
    page = next(p for p in heldout_pages(str(web_data)) if p.family == "page")
    shot = tmp_path / "page.png"
    shot.write_bytes(page.media)
    result = screenshot_to_website(shot, "stub", tmp_path / "out", reference_html=page.html,
                                   generator=FixedText("zzz & qqq"))
    assert result["html_recovery"] == "wrapped" and result["rendered"]
    assert "zzz &amp; qqq" in (tmp_path / "out" / "generated.html").read_text()
    assert 0.0 <= result["scores"]["overall"] < 0.9


@pytest.mark.parametrize("text, how, expect", [
    ("junk <!DOCTYPE html><html><body>a</body></html> trailing", "document",
     "<!DOCTYPE html><html><body>a</body></html>"),
    ("x <html lang=en><p>cut off", "document", "<html lang=en><p>cut off"),
    ("here:\n```html\n<div>b</div>\n```\n", "fenced", "<div>b</div>"),
    ("  <p>c</p> tail ", "tags", "<p>c</p> tail"),
    ("a < b > c", "wrapped", None),
    ("", "empty", ""),
])
def test_recover_html(text, how, expect):
    html, got = recover_html(text)
    assert got == how
    if expect is not None:
        assert html == expect
    else:
        assert "a &lt; b &gt; c" in html and html.startswith("<!DOCTYPE html>")


def test_generator_prompts_do_not_load_the_renderer():
    """Generating needs no PyAV (a GPU machine that only generates may lack it): the generator module and its
    page instructions come without the page families' renderer."""
    import subprocess

    code = ("import sys, eval.demo.generator as g; text = g.page_instruction('video'); "
            "assert 'av' not in sys.modules and 'data_pipelines.web.render' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])

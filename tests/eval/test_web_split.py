"""The held-out page run in two halves (``eval/demo/candidates.py``): generation without a browser, scoring apart.

Checks: batched (left-padded) greedy generation writes what one-page generation writes; the generation side
imports nothing of the renderer; the deadline and failure paths; scoring a candidate gives exactly the demo's
scores for the same text; a candidate from another dataset is refused. Needs Chromium for the scoring tests
(``scripts/install_chromium.sh``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from web_checkpoint import build_web_data, train_web_checkpoint, web_preset

from eval.demo.candidates import (
    CANDIDATES,
    META,
    generate_candidates,
    generation_inputs,
    interleave,
    read_candidates,
    score_candidates,
)
from eval.demo.generator import Generation, WebsiteGenerator
from eval.demo.heldout import HeldoutPage, heldout_pages

PRESET = web_preset("split_test", eval_pages=2)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def web_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("web") / "data"
    build_web_data(root, PRESET)
    return root


@pytest.fixture(scope="module")
def checkpoint(web_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_web_checkpoint(web_data, tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def generator(checkpoint: Path) -> WebsiteGenerator:
    return WebsiteGenerator.from_checkpoint(checkpoint)


def _page(key: str, family: str) -> HeldoutPage:
    return HeldoutPage(key, family, "<p>x</p>", "img0.png", b"", "do it")


def test_interleave_alternates_families_and_keeps_their_order():
    pages = [_page("a1", "page"), _page("a2", "page"), _page("a3", "page"), _page("b1", "page_video")]
    assert [p.key for p in interleave(pages)] == ["a1", "b1", "a2", "a3"]
    assert interleave([]) == []


def test_heldout_pages_carry_the_samples_instruction(web_data):
    from data_pipelines.web.family import IMAGE_PROMPT, VIDEO_PROMPT

    pages = heldout_pages(str(web_data))
    assert {p.family: p.prompt for p in pages} == {"page": IMAGE_PROMPT, "page_video": VIDEO_PROMPT}


def test_batched_generation_equals_one_page_at_a_time(web_data, generator):
    pages = interleave(heldout_pages(str(web_data)))[:3]  # screenshots and videos of different prompt lengths
    inputs = [generation_inputs(p) for p in pages]
    assert len({generator.prompt(**kw)[0]["input_ids"].shape[1] for kw in inputs}) > 1  # padding is exercised
    batched = generator.generate_batch(inputs, max_new_tokens=10)
    for kwargs, got in zip(inputs, batched):
        alone = generator.generate_batch([kwargs], max_new_tokens=10)[0]
        assert (got.text, got.new_tokens, got.stopped, got.prompt_tokens, got.vision_tokens) == \
            (alone.text, alone.new_tokens, alone.stopped, alone.prompt_tokens, alone.vision_tokens)
    single = generator.generate(image=inputs[0]["image"], max_new_tokens=10)
    assert single.text == batched[0].text  # generate() is the one-row batch, default instruction = the sample's


def test_static_cache_decoding_writes_what_generate_writes(web_data, checkpoint, generator):
    """``decode="static"`` (``kimi_vl.generation.GraphDecoder`` without the graph, the path a GPU replays): the same
    greedy pages as transformers' ``generate`` for a left-padded batch with media and stop tokens; the decoder is
    reused for a shorter request, another batch size gets its own, and the first is reused when its size returns."""
    pages = interleave(heldout_pages(str(web_data)))[:3]
    inputs = [generation_inputs(p) for p in pages]
    static = WebsiteGenerator.from_checkpoint(checkpoint, decode="static")
    assert generator.decode == "generate" and static.decode == "static"  # "auto" on a CPU: generate
    want = generator.generate_batch(inputs, max_new_tokens=12)
    got = static.generate_batch(inputs, max_new_tokens=12)
    assert [(g.text, g.new_tokens, g.stopped) for g in got] == [(w.text, w.new_tokens, w.stopped) for w in want]
    first = static._decoders.current
    assert static.generate_batch(inputs, max_new_tokens=4)[0].text == \
        generator.generate_batch(inputs, max_new_tokens=4)[0].text
    assert static._decoders.current is first
    static.generate_batch(inputs[:1], max_new_tokens=4)  # another batch size: a new decoder, the first one kept
    assert static._decoders.current is not first and static._decoders.current.batch_size == 1
    static.generate_batch(inputs, max_new_tokens=4)
    assert static._decoders.current is first  # its batch size again: reused, not rebuilt
    with pytest.raises(ValueError, match="decode must be one of"):
        WebsiteGenerator.from_checkpoint(checkpoint, decode="fast")


class StubGenerator:
    """Writes a fixed page; fails on batches of more than one row when ``fail_batches``."""

    device = "cpu"

    def __init__(self, fail_batches: bool = False) -> None:
        self.fail_batches, self.calls = fail_batches, []

    def generate_batch(self, media, max_new_tokens=1024, max_time=None):
        self.calls.append((len(media), max_time))
        if self.fail_batches and len(media) > 1:
            raise RuntimeError("CUDA out of memory (stub)")
        return [Generation("<html><body><h1>Hi</h1></body></html>", 5, 7, 3, 0.5, True) for _ in media]

    def generate(self, max_new_tokens=1024, **media):
        return self.generate_batch([media], max_new_tokens)[0]


def test_generate_writes_every_page_in_batches_with_the_time_left(web_data, tmp_path):
    stub = StubGenerator()
    meta = generate_candidates("ckpt", str(web_data), tmp_path, batch_size=3, deadline_s=600, generator=stub)
    records, saved = read_candidates(tmp_path)
    assert [r["key"] for r in records] == [p.key for p in interleave(heldout_pages(str(web_data)))]
    assert meta == saved and meta["done"] == meta["pages"] == 4 and not meta["skipped"] and not meta["errors"]
    assert [n for n, _ in stub.calls] == [3, 1] and all(0 < t <= 600 for _, t in stub.calls)
    assert records[0]["reference_html"].startswith("<!DOCTYPE html>") and records[0]["generation"]["stopped"]


def test_past_the_deadline_no_batch_starts(web_data, tmp_path):
    meta = generate_candidates("ckpt", str(web_data), tmp_path, batch_size=2, deadline_s=1.0, min_batch_s=5.0,
                               generator=StubGenerator())
    assert meta["done"] == 0 and len(meta["skipped"]) == 4 and not (tmp_path / CANDIDATES).exists()


def test_a_failed_batch_is_retried_page_by_page(web_data, tmp_path):
    stub = StubGenerator(fail_batches=True)
    meta = generate_candidates("ckpt", str(web_data), tmp_path, batch_size=4, generator=stub)
    assert [n for n, _ in stub.calls] == [4, 1, 1, 1, 1] and meta["done"] == 4
    assert len(meta["errors"]) == 1 and "out of memory" in meta["errors"][0]
    assert all(not r["error"] for r in read_candidates(tmp_path)[0])


def test_generation_side_needs_no_renderer(web_data, checkpoint, tmp_path):
    """`generate` runs where PyAV, the browser driver and the metric are missing (a GPU box without Chromium)."""
    blocked = ["av", "data_pipelines.web.render", "data_pipelines.web.browser", "eval.web_metric",
               "eval.demo.pipeline"]
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in {blocked!r}):
            raise ImportError("blocked in this test: " + name)
sys.meta_path.insert(0, Block())
from eval.demo.candidates import main
sys.exit(main(["generate", "--checkpoint", {str(checkpoint)!r}, "--data", {str(web_data)!r},
               "--out", {str(tmp_path)!r}, "--batch-size", "4", "--max-new-tokens", "6", "--device", "cpu"]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records, meta = read_candidates(tmp_path)
    assert len(records) == 4 and meta["device"] == "cpu"
    assert all(0 < r["generation"]["new_tokens"] <= 6 for r in records)


def test_scores_equal_the_demos_scores_for_the_same_text(web_data, tmp_path):
    from eval.demo.pipeline import screenshot_to_website, video_to_website

    generate_candidates("ckpt", str(web_data), tmp_path / "gen", batch_size=4, generator=StubGenerator())
    (tmp_path / "gen" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    summary = score_candidates(tmp_path / "gen", str(web_data), tmp_path / "scored", tmp_path / "pages",
                               examples=1, n_boot=200)
    assert summary["pages"] == 4 and summary["rendered"] == 4 and summary["missing"] == []
    rows = {r["key"]: r for r in summary["per_page"]}
    for page in heldout_pages(str(web_data))[:2]:
        media = tmp_path / page.media_name
        media.write_bytes(page.media)
        run = video_to_website if page.family == "page_video" else screenshot_to_website
        demo = run(media, "ckpt", tmp_path / "demo" / page.key, reference_html=page.html,
                   generator=StubGenerator())
        assert {k: rows[page.key][k] for k in demo["scores"] if k in rows[page.key]} == \
            {k: v for k, v in demo["scores"].items() if k in rows[page.key]}
    ci = summary["ci95"]["all"]["overall"]
    assert ci["lo"] <= ci["value"] <= ci["hi"] and ci["n_questions"] == 4
    assert set(summary["ci95"]) == {"all", "page", "page_video"}
    out = tmp_path / "scored"
    assert json.loads((out / "summary.json").read_text())["pages"] == 4
    assert "| overall |" in (out / "summary.md").read_text() and (out / "examples.png").is_file()
    assert len(list((out / "side_by_side").glob("*.png"))) == 2  # one per family
    assert (out / "gpu" / "metrics.jsonl").is_file() and (out / "gpu" / META).is_file()
    assert not (out / "gpu" / CANDIDATES).exists() and (tmp_path / "pages" / rows.popitem()[0]).is_dir()


def test_candidates_of_another_dataset_are_refused(web_data, tmp_path):
    generate_candidates("ckpt", str(web_data), tmp_path, batch_size=4, generator=StubGenerator())
    meta = json.loads((tmp_path / META).read_text())
    (tmp_path / META).write_text(json.dumps({**meta, "data_hash": "0" * 64}))
    with pytest.raises(ValueError, match="content hash"):
        score_candidates(tmp_path, str(web_data), tmp_path / "scored")
    (tmp_path / META).unlink()
    lines = (tmp_path / CANDIDATES).read_text().splitlines()
    first = json.loads(lines[0])
    (tmp_path / CANDIDATES).write_text(json.dumps({**first, "reference_html": "<p>other</p>"}) + "\n")
    with pytest.raises(ValueError, match="reference HTML differs"):
        score_candidates(tmp_path, str(web_data), tmp_path / "scored")

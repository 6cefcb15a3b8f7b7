"""The synthetic world: determinism, disjoint splits, answers checked against pixels, tool transcripts."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from data_testing import MINI

from data_pipelines.shards import decode_sample, iter_tar
from data_pipelines.synth import FAMILIES, SampleFamily, build_dataset, generate_sample, register_family
from data_pipelines.synth.build import split_shards
from data_pipelines.synth.common import Sample, norm_box, sample_seed, sample_size, split_of_seed
from data_pipelines.synth.image_ops import ImageHandle, run_tool_code
from data_pipelines.synth.scenes import render, shapes_spec
from data_pipelines.synth.tasks import check_answer, eval_items


def test_same_seed_identical_different_seed_differs(mini_dataset, tmp_path):
    root, manifest = mini_dataset
    again = build_dataset(tmp_path / "again", MINI, seed=3, workers=2)
    assert again["content_hash"] == manifest["content_hash"]
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (root / "manifest.json").read_bytes()
    for shard in split_shards(root, "train") + split_shards(root, "eval"):
        rel = shard[len(str(root)) + 1:]
        assert (tmp_path / "again" / rel).read_bytes() == open(shard, "rb").read()
    other = build_dataset(tmp_path / "other", MINI, seed=4)
    assert other["content_hash"] != manifest["content_hash"]
    assert manifest["seed"] == 3 and manifest["generator_version"] and manifest["total_bytes"] > 0


def test_eval_split_never_overlaps_training(mini_dataset):
    root, _ = mini_dataset
    seeds, media = {}, {}
    for split in ("train", "eval"):
        seeds[split], media[split] = set(), set()
        for shard in split_shards(root, split):
            for raw in iter_tar(shard):
                meta = json.loads(raw["json"])["meta"]
                assert split_of_seed(meta["seed"]) == split
                seeds[split].add(meta["seed"])
                media[split] |= {raw[k] for k in raw if k.endswith((".png", ".mp4"))}
    assert seeds["train"] and seeds["eval"] and not seeds["train"] & seeds["eval"]
    assert not media["train"] & media["eval"]
    assert sample_seed(0, "train", "shapes", 5) >> 62 == 0 and sample_seed(0, "eval", "shapes", 5) >> 62 == 1


def test_sizes_and_aspect_ratios_in_range():
    rng = random.Random(0)
    sizes = [sample_size(rng, 56, 900) for _ in range(2000)]
    assert all(56 <= s <= 900 for hw in sizes for s in hw)
    ratios = [max(h / w, w / h) for h, w in sizes]
    assert max(ratios) > 5 and max(ratios) <= 8.1


@pytest.mark.parametrize("seed", range(25))
def test_shape_answers_match_pixels(seed):
    rng = random.Random(seed)
    spec = shapes_spec(rng, rng.randint(56, 400), rng.randint(56, 400))
    handle = ImageHandle(render(spec), spec)
    for color, n in Counter(o["color"] for o in spec["objects"]).items():
        mask = handle.threshold(color)
        assert mask.count_components() == n
        want = sorted((tuple(o["box"]) for o in spec["objects"] if o["color"] == color), key=lambda b: (b[1], b[0]))
        assert mask.component_boxes() == want


def test_qa_answers_from_spec_agree_with_pixels():
    checked = 0
    for i in range(12):
        s = generate_sample(MINI, 0, "train", "shapes", i)
        raw = decode_sample({"__key__": "k", "img0.png": s.media[0].data})
        handle = ImageHandle(raw["images"][0], s.spec)
        w, h = handle.size
        for q in s.qa:
            if q["question"].startswith("How many shapes are in"):
                total = sum(handle.threshold(c).count_components() for c in {o["color"] for o in s.spec["objects"]})
                assert str(total) == q["answer"]
                checked += 1
            if q["category"] == "grounding":
                color = q["question"].split("of the ")[1].split()[0]
                boxes = handle.threshold(color).component_boxes()
                assert any(norm_box(b, h, w) == json.loads(q["answer"]) for b in boxes)
                checked += 1
    assert checked >= 12


def test_tool_transcripts_are_correct():
    for i in range(20):
        s = generate_sample(MINI, 0, "train", "tool_sft", i)
        roles = [m["role"] for m in s.messages]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant" and "tool" in roles
        handle = ImageHandle(render(s.spec), s.spec)
        for call, result in zip(s.messages[2::2], s.messages[3::2]):
            if call.get("tool_calls"):
                code = json.loads(call["tool_calls"][0]["arguments"])["code"]
                assert run_tool_code(code, handle) == result["content"]
        assert s.messages[-1]["content"] == s.qa[0]["answer"]


def test_every_family_generates_and_registry_hook():
    for name in FAMILIES:
        s = generate_sample(MINI, 1, "train", name, 0)
        assert s.family == name and (s.doc or s.messages)
        assert all(m.kind in ("image", "video") for m in s.media)
    fam = SampleFamily("dummy_web", "vision", lambda rng, ctx: Sample("dummy_web", "text", doc=[{"text": "x"}]))
    register_family(fam)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_family(fam)
        assert generate_sample(MINI, 0, "train", "dummy_web", 0).doc == [{"text": "x"}]
    finally:
        FAMILIES.pop("dummy_web")
    with pytest.raises(ValueError, match="unknown sample family"):
        generate_sample(MINI, 0, "train", "nope", 0)


def test_eval_items_and_checker(mini_dataset):
    root, _ = mini_dataset
    items = eval_items(str(root), "vision")
    assert items and {it.family for it in items} <= {"shapes", "ocr", "chart", "document", "video"}
    assert all(check_answer(it.answer, it.answer, it.answer_type) == 1.0 for it in items)
    assert any(it.videos for it in items) and any(it.images for it in items)
    text = eval_items(str(root), "text")
    assert text and all(it.context and not it.images for it in text)
    assert check_answer("[0, 0, 10, 10]", "[0, 0, 10, 20]", "box") == pytest.approx(0.5)
    assert check_answer("There are 3.", "3", "int") == 1.0 and check_answer("Red", "red", "str") == 1.0


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        build_dataset(tmp_path / "x", "huge")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(FileExistsError):
        build_dataset(tmp_path / "full", MINI)
    with pytest.raises(ValueError, match="split"):
        sample_seed(0, "validation", "shapes", 0)

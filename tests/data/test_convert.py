"""``kimi-vl data convert``: the user's text, images, questions, videos and shards -> a dataset folder that training,
RL and the evaluation read (``data_pipelines/convert.py``)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_pipelines.cli import main as data_cli
from data_pipelines.convert import QA_CATEGORIES, convert_dataset
from data_pipelines.packing import Encoder
from data_pipelines.shards import ShardWriter, decode_sample, iter_tar
from data_pipelines.synth.build import split_shards
from data_pipelines.synth.tasks import eval_items
from data_pipelines.tokenizer import load_tokenizer
from data_pipelines.video import encode_mp4


def _png(path: Path, dots: int, size=(48, 40)) -> None:
    im = Image.new("RGB", size, "white")
    for i in range(dots):
        im.putpixel((4 + 6 * i, 10), (255, 0, 0))
    im.save(path)


@pytest.fixture()
def user_data(tmp_path):
    """Every kind of input: text (.txt, .jsonl), an image folder, an image JSONL of questions, a video folder and
    a webdataset shard without records of ours."""
    d = tmp_path / "in"
    (d / "imgs").mkdir(parents=True)
    (d / "a.txt").write_text("\n\n".join(f"Paragraph {i} about dots." for i in range(12)))
    text_questions = [{"context": f"The box holds {i} apples.", "question": "How many apples?", "answer": i}
                      for i in range(4)]
    text_questions[0].update(split="eval", qa=[{"question": "Is the box empty?", "answer": "yes"}])
    del text_questions[0]["question"], text_questions[0]["answer"]
    (d / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        *text_questions]))
    caps = d / "caps"
    caps.mkdir()
    for i in range(3):
        _png(caps / f"c{i}.png", i)
        (caps / f"c{i}.txt").write_text(f"{i} red dots")
    lines = []
    for i in range(10):
        _png(d / "imgs" / f"{i}.png", i % 4)
        lines.append({"image": f"imgs/{i}.png", "question": "How many red dots?", "answer": i % 4})
    lines[0] = {"image": ["imgs/0.png", "imgs/1.png"], "caption": "two pictures", "split": "eval",
                "qa": [{"question": "Any dots in the first?", "answer": "no"},
                       {"question": "Box of the picture?", "answer": [0, 0, 1000, 1000]},
                       {"question": "What colour are the dots?", "answer": "red", "category": "color"}]}
    lines[1]["split"] = "train"
    lines.append({"video": "vids/v.mp4", "question": "What colour is the clip?", "answer": "black", "split": "eval"})
    (d / "vqa.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    vids = d / "vids"
    vids.mkdir()
    (vids / "v.mp4").write_bytes(encode_mp4(np.zeros((8, 64, 64, 3), np.uint8), 8))
    (vids / "v.txt").write_text("a dark clip")
    buf = io.BytesIO()
    Image.new("RGB", (30, 20), (1, 2, 3)).save(buf, "PNG")
    w = ShardWriter(d / "wds", "img")
    w.write({"__key__": "x0", "png": buf.getvalue(), "txt": "a caption"})
    w.write({"__key__": "x1", "txt": "a text-only sample"})
    w.close()
    return d


def _convert(d: Path, out: Path, **kw):
    return convert_dataset(out, text=[d / "a.txt", d / "b.jsonl"], images=[d / "caps", d / "vqa.jsonl"],
                           videos=[d / "vids"], shards=[d / "wds"], vocab_size=kw.pop("vocab_size", 600),
                           eval_fraction=kw.pop("eval_fraction", 0.2), chunk_chars=30, **kw)


def test_convert_writes_a_dataset_folder(user_data, tmp_path):
    m = _convert(user_data, tmp_path / "ds")
    root = tmp_path / "ds"
    train, ev = m["splits"]["train"], m["splits"]["eval"]
    # 12 + 1 text documents and 4 text question lines, 3 captioned images, 10 image and 1 video question lines,
    # 1 video, 2 shard samples
    assert m["total_samples"] == 34 and train["samples"] + ev["samples"] == 34
    assert train["counts"]["user_shards"] == 2 and "user_shards" not in ev["counts"]
    assert ev["streams"]["text"]["samples"] >= 1 and ev["streams"]["vision"]["samples"] >= 2
    assert m["eval_suites"] == {"user_vqa": "vision", "user_textqa": "text"}
    # the explicit splits are kept; the rest is held out evenly: 20% of the 16 text samples without a split (3) and of
    # the 12 vision ones (2: 3 captioned images, 8 question lines, 1 video), plus the lines marked eval (1 and 2)
    assert ev["streams"]["text"]["samples"] == 3 + 1 and ev["streams"]["vision"]["samples"] == 2 + 2
    keys = {split: [raw["json"] for sh in split_shards(root, split) for raw in iter_tar(sh) if "json" in raw]
            for split in ("train", "eval")}
    records = {split: [json.loads(r) for r in keys[split]] for split in keys}
    first = next(r for r in records["eval"] if r.get("caption") == "two pictures")
    assert [q["answer_type"] for q in first["qa"]] == ["yesno", "box", "str"]
    assert [q["category"] for q in first["qa"]] == ["exact", "grounding", "color"]
    assert first["qa"][1]["answer"] == "[0, 0, 1000, 1000]" and len(first["media"]) == 2
    assert any(r.get("source", "").endswith("vqa.jsonl:2") for r in records["train"])
    # every sample decodes and encodes in both modes with the dataset's own tokenizer
    tok = load_tokenizer(root / "tokenizer")
    for mode in ("pretrain", "sft"):
        enc = Encoder(tok, mode)
        docs = [enc.encode(decode_sample(raw)) for split in ("train", "eval") for sh in split_shards(root, split)
                for raw in iter_tar(sh)]
        assert len(docs) == 34 and all(len(doc.input_ids) > 0 for doc in docs)
    clip = next(r for r in records["eval"] if r["media"] and r["media"][0]["kind"] == "video" and r["qa"])
    assert clip["messages"][0]["content"][0] == {"type": "video", "media": 0} and clip["family"] == "user_vqa"
    # the same inputs give the same dataset
    assert _convert(user_data, tmp_path / "again")["content_hash"] == m["content_hash"]


def test_converted_questions_feed_evaluation_rl_and_lm_eval(user_data, tmp_path):
    from eval.tasks.dataset_suite import write_dataset_suite
    from rl.synth_source import CATEGORY_REWARDS, SynthPromptSource, train_items

    root = tmp_path / "ds"
    _convert(user_data, root)
    held = eval_items(str(root), "vision")
    assert held and {it.family for it in held} == {"user_vqa"}
    assert {it.category for it in held} >= {"exact", "grounding", "color"} and any(it.videos for it in held)
    pool = train_items(str(root), "vision", ["user_vqa"], [])
    assert pool and all(it.images for it in pool) and not {it.id for it in pool} & {it.id for it in held}
    assert set(QA_CATEGORIES) == set(CATEGORY_REWARDS)

    class Builder:  # the prompt source only needs build(item)
        def build(self, item):
            return item

    src = SynthPromptSource(str(root), Builder(), "vision", ["user_vqa"])
    assert len(src.heldout(100)) == len(held) and src.sample(3, random.Random(0))[0].family == "user_vqa"
    with pytest.raises(ValueError, match="not families"):
        SynthPromptSource(str(root), Builder(), "vision", ["user_nope"])
    text_held = eval_items(str(root), "text")
    assert text_held and {it.family for it in text_held} == {"user_textqa"}
    assert text_held[0].context == "The box holds 0 apples." and text_held[0].answer == "yes"
    text_src = SynthPromptSource(str(root), Builder(), "text", ["user_textqa"])
    assert {it.category for it in text_src.pool} == {"count"} and len(text_src.heldout(100)) == len(text_held)
    tasks = write_dataset_suite(root, tmp_path / "suites")
    assert tasks == ["kimi_data_qa", "kimi_data_grounding", "kimi_data_text"]
    text_rows = [json.loads(x) for x in (tmp_path / "suites/kimi_data/kimi_data_text.jsonl").read_text().splitlines()]
    assert len(text_rows) == len(text_held) and text_rows[0]["prompt"].startswith("The box holds 0 apples.\n")
    rows = [json.loads(x) for x in (tmp_path / "suites/kimi_data/kimi_data_qa.jsonl").read_text().splitlines()]
    assert len(rows) == sum(it.answer_type != "box" and not it.videos for it in held)  # video questions left out
    assert all(Path(p).is_file() for r in rows for p in r["images"])
    assert rows[0]["prompt"].startswith("<image>") and rows[0]["prompt"].endswith("Answer:")


def test_training_reads_a_converted_dataset(user_data, tmp_path):
    """The bug this command fixes: shards of the user's data had no manifest, so data.path refused them."""
    from kimi_vl.logs import read_metrics
    from kimi_vl.runconfig import load_config
    from kimi_vl.train.config import TrainConfig
    from kimi_vl.train.loop import train

    root = tmp_path / "ds"
    _convert(user_data, root, vocab_size=400)
    cfg = load_config(TrainConfig, "kimi_vl/configs/debug_pretrain.yaml",
                      [f"data.path={root}", f"output_dir={tmp_path / 'run'}", "max_steps=2", "data.seq_len=128",
                       "data.batch_size=2", "data.max_patches=64", "eval_batches=1", "eval_every=2"])
    final = train(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert final.is_dir() and len([r for r in rows if "loss" in r]) == 2 and "eval/loss" in rows[-1]


def _jsonl(tmp_path, obj) -> Path:
    (tmp_path / "imgs").mkdir(exist_ok=True)
    _png(tmp_path / "imgs" / "a.png", 1)
    path = tmp_path / "q.jsonl"
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj) + "\n")
    return path


@pytest.mark.parametrize("kind, line, match", [
    ("images", "{not json", "q.jsonl:1: not valid JSON"),
    ("images", {"caption": "x"}, "give 'image'"),
    ("images", {"image": "imgs/a.png", "video": "v.mp4", "caption": "x"}, "one of the two"),
    ("images", {"video": ["a.mp4", "b.mp4"], "caption": "x"}, "'video' must be one path"),
    ("images", {"video": "imgs/a.png", "caption": "x"}, "is not one of mp4"),
    ("images", {"image": "imgs/missing.png", "caption": "x"}, "imgs/missing.png does not exist"),
    ("images", {"image": "imgs/a.png"}, "give a 'caption', a 'question'"),
    ("images", {"image": "imgs/a.png", "question": "n?", "answer": "two", "answer_type": "int"}, "needs an integer"),
    ("images", {"image": "imgs/a.png", "question": "n?", "answer": "3", "answer_type": "float"}, "answer_type must be"),
    ("images", {"image": "imgs/a.png", "question": "b?", "answer": [0, 0, 2000, 5]}, "0-1000"),
    ("images", {"image": "imgs/a.png", "question": "b?", "answer": "maybe", "answer_type": "yesno"}, "'yes' or 'no'"),
    ("images", {"image": "imgs/a.png", "question": "c?", "answer": "red", "category": "colour"}, "'colour' has no"),
    ("images", {"image": "imgs/a.png", "question": "c?", "answer": "", "split": "train"}, "question 0: needs a"),
    ("images", {"image": "imgs/a.png", "qa": [], "caption": "x"}, "'qa' must be a non-empty list"),
    ("images", {"image": "imgs/a.png", "caption": "x", "split": "test"}, "'split' must be one of"),
    ("text", '{"question": "n?", "answer": 1}', "needs the 'context'"),
    ("text", '{"title": "x"}', "a line needs 'text', 'messages', or a 'question'"),
    ("text", '[1, 2]', "must be a JSON object"),
])
def test_bad_lines_are_named(tmp_path, kind, line, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        convert_dataset(tmp_path / "ds", **{kind: [_jsonl(tmp_path, line)]}, vocab_size=0)
    assert not (tmp_path / "ds").exists()


def test_failures_leave_nothing_behind_and_the_cli_names_them(tmp_path, capsys, monkeypatch):
    path = _jsonl(tmp_path, {"image": "imgs/bad.png", "caption": "x"})
    (tmp_path / "imgs" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"q.jsonl:1: image does not decode"):
        convert_dataset(tmp_path / "ds", images=[path], vocab_size=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs", "q.jsonl"]  # no dataset, no temporary folder
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert data_cli(["convert", "--out", str(tmp_path / "full"), "--images", str(path)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert data_cli(["convert", "--out", str(tmp_path / "none")]) == 2
    assert "nothing to convert" in capsys.readouterr().err
    (tmp_path / "imgs" / "bad.png").unlink()
    assert data_cli(["convert", "--out", str(tmp_path / "ds"), "--images", str(path)]) == 2
    assert "imgs/bad.png does not exist" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"image": "imgs/a.png", "question": "How many?", "answer": 1}) + "\n")
    assert data_cli(["convert", "--out", str(tmp_path / "ds"), "--images", str(good), "--vocab-size", "300"]) == 0
    assert "wrote 1 samples (train 1, eval 0" in capsys.readouterr().out
    assert (tmp_path / "ds" / "tokenizer").is_dir() and (tmp_path / "ds" / "manifest.json").is_file()
    (tmp_path / "empty").mkdir()  # an existing empty folder (e.g. the working directory, `--out .`) is filled in place
    monkeypatch.chdir(tmp_path / "empty")
    assert data_cli(["convert", "--out", ".", "--images", str(good), "--vocab-size", "0"]) == 0
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["eval", "manifest.json", "train"]
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]

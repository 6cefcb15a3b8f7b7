"""Shards, video, tokenizer, packing and the loader: round trips, invariants, resume and bad input."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from data_testing import FakeProcessor
from PIL import Image

from data_pipelines.adapters import ensure_record
from data_pipelines.cli import main as data_cli
from data_pipelines.loader import LoaderConfig, Mixer, VisionRatioSchedule, build_loader
from data_pipelines.packing import IGNORE, Encoder, Packer, collate
from data_pipelines.shards import ShardStream, ShardWriter, list_shards
from data_pipelines.synth.build import split_shards
from data_pipelines.tokenizer import load_tokenizer, render_chat, special_ids
from data_pipelines.video import decode_mp4, encode_mp4, format_timestamp, sample_indices
from vision_encoder.geometry import num_vision_tokens


def _png(color, size=(30, 20)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_video_round_trip():
    frames = np.zeros((12, 64, 80, 3), np.uint8)
    for t in range(12):
        frames[t, 10:30, 4 * t:4 * t + 16] = (220, 40, 40)
    data = encode_mp4(frames, fps=8)
    assert data == encode_mp4(frames, fps=8)
    full = decode_mp4(data)
    assert full.frames_THWC.shape == (12, 64, 80, 3) and full.video_fps == pytest.approx(8)
    assert np.abs(full.frames_THWC.astype(int) - frames).mean() < 4
    assert decode_mp4(data, num_frames=4).frames_THWC.shape[0] == 4
    assert decode_mp4(data, fps=2).timestamps == [0.0, 0.5, 1.0]
    assert sample_indices(10, 10.0, num_frames=3) == [0, 3, 6]
    with pytest.raises(ValueError, match="could not be decoded"):
        decode_mp4(data[: len(data) // 3])
    with pytest.raises(ValueError, match="even"):
        encode_mp4(np.zeros((2, 63, 64, 3), np.uint8), 8)


def test_timestamp_matches_processor():
    proc = pytest.importorskip("vision_encoder.processor")
    for t in (0.0, 0.5, 1.25, 61.999, 3725.4):
        assert format_timestamp(t) == proc.format_timestamp(t)


def test_webdataset_round_trip_with_corrupt_sample(tmp_path):
    w = ShardWriter(tmp_path, "vision", max_count=2)
    for i in range(5):
        png = _png((10 * i, 0, 0), (30 + i, 20)) if i != 2 else b"\x89PNG not really"
        w.write({"__key__": f"s{i}", "json": json.dumps({"family": "t", "doc": [{"media": 0}, {"text": f"c{i}"}],
                                                         "media": [{"kind": "image"}]}), "img0.png": png})
    shards = w.close()
    assert [s.count for s in shards] == [2, 2, 1]
    stream = ShardStream(list_shards(tmp_path), shuffle_shards=False)
    got = list(stream)
    assert [s["__key__"] for s in got] == ["s0", "s1", "s3", "s4"] and stream.stats["corrupt"] == 1
    assert got[3]["images"][0].size == (34, 20)  # native size, no resize
    # a truncated shard: complete samples are kept, the rest is skipped and counted
    data = open(shards[0].path, "rb").read()
    open(shards[0].path, "wb").write(data[:1500])
    stream = ShardStream(list_shards(tmp_path), shuffle_shards=False)
    assert len(list(stream)) >= 2 and stream.stats["corrupt"] >= 2
    # split by reader: disjoint and complete, by sample when there are fewer shards than readers
    for paths in ([s.path for s in shards[1:]], [shards[1].path]):
        parts = [[s["__key__"] for s in ShardStream(paths, r, 2, shuffle_shards=False)] for r in range(2)]
        assert not set(parts[0]) & set(parts[1]) and sorted(parts[0] + parts[1]) == \
            [k for k in ("s3", "s4") if len(paths) == 2 or k == "s3"]


def test_shard_resume_position(mini_dataset):
    root, _ = mini_dataset
    shards = split_shards(root, "train")
    full = [s["__key__"] for s in ShardStream(shards, seed=1)]
    stream = ShardStream(shards, seed=1)
    it = iter(stream)
    head = [next(it) for _ in range(7)]
    resumed = ShardStream(shards, seed=1)
    resumed.position = resumed.position.from_dict(head[-1]["__position__"])
    assert [s["__key__"] for s in head] + [s["__key__"] for s in resumed] == full


def test_tokenizer_round_trip_and_template(tokenizer, tmp_path):
    text = "Count the red circles: 3 of them!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    messages = [{"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "image", "media": 0}, {"type": "text", "text": "How many?"}]},
                {"role": "assistant", "content": "Let me run code.",
                 "tool_calls": [{"name": "python", "arguments": json.dumps({"code": "print(1)"})}]},
                {"role": "tool", "content": "1"}, {"role": "assistant", "content": "1"}]
    rendered = "".join(p[0] for p in render_chat(messages))
    assert tokenizer.apply_chat_template(messages, tokenize=False) == rendered
    assert "<|tool_call_begin|>functions.python:0<|tool_call_argument_begin|>" in rendered
    tokenizer.save_pretrained(tmp_path / "copy")
    again = load_tokenizer(tmp_path / "copy")
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    special_ids(again)


def test_tokenizer_without_media_tokens_is_rejected(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="media tokens"):
        load_tokenizer(tmp_path / "plain")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


def _docs(tokenizer, mini_dataset, mode="pretrain", n=40):
    root, _ = mini_dataset
    enc = Encoder(tokenizer, mode)
    samples = [s for s in ShardStream(split_shards(root, "train"), shuffle_shards=False)][:n]
    return enc, samples, [enc.encode(s) for s in samples]


def test_placeholder_counts_and_label_masks(tokenizer, mini_dataset):
    enc, samples, docs = _docs(tokenizer, mini_dataset)
    ids = enc.ids
    assert any(d.images for d in docs) and any(d.videos for d in docs)
    for s, d in zip(samples, docs):
        want = sum(num_vision_tokens(1, im.size[1], im.size[0]) for im in s["images"])
        want += sum(num_vision_tokens(v.frames_THWC.shape[0], *v.frames_THWC.shape[1:3]) for v in s["videos"])
        t = torch.tensor(d.input_ids)
        lab = torch.tensor(d.labels)
        media = (t == ids.media_pad) | (t == ids.video_placeholder)
        assert int(media.sum()) == want == d.vision_tokens
        assert (lab[media] == IGNORE).all() and (lab[(t == ids.media_begin) | (t == ids.media_end)] == IGNORE).all()
        keep = lab != IGNORE
        assert torch.equal(lab[keep], t[keep]) and d.input_ids[-1] in (ids.eos, ids.im_end)
        assert int((t == ids.media_begin).sum()) == len(s["images"]) + sum(
            -(-v.frames_THWC.shape[0] // 4) for v in s["videos"])


def test_sft_labels_only_on_assistant(tokenizer, mini_dataset):
    enc, samples, docs = _docs(tokenizer, mini_dataset, mode="sft")
    checked = 0
    for s, d in zip(samples, docs):
        messages = s["json"]["messages"]
        if not messages:
            continue
        trained = tokenizer.decode([t for t, lab in zip(d.input_ids, d.labels) if lab != IGNORE])
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert trained.startswith(answers[0]) and "<|im_user|>" not in trained and "<|im_system|>" not in trained
        checked += 1
    assert checked >= 5


def test_packing_invariants(tokenizer, mini_dataset):
    enc, samples, docs = _docs(tokenizer, mini_dataset)
    L, B = 1024, 3
    packer, batches, placed = Packer(L, B), [], []
    pieces = [p for d in docs for p in packer.split_long(d)]
    queue = list(pieces)
    while queue:
        if packer.add(queue[0]):
            placed.append(queue.pop(0))
        else:
            batches.append(collate(packer.take(), L, enc.ids.pad, FakeProcessor(), enc.ids))
    batches.append(collate(packer.take(), L, enc.ids.pad, FakeProcessor(), enc.ids))
    flat_in = torch.cat([b["input_ids"][b["attention_mask"].bool()] for b in batches])
    assert torch.equal(flat_in, torch.tensor([t for p in placed for t in p.input_ids]))  # nothing lost/duplicated
    for b in batches:
        cu = b["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == B * L and (cu[1:] > cu[:-1]).all() and cu.dtype == torch.int32
        starts = torch.zeros(B * L, dtype=torch.bool)
        starts[cu[:-1].long()] = True
        assert torch.equal(starts, b["position_ids"].view(-1) == 0)
        pads = int((b["input_ids"] == enc.ids.media_pad).sum())
        assert pads == int((b["image_grid_thw"][:, 1:].prod(-1) // 4).sum()) if pads else "image_grid_thw" not in b
        assert (b["labels"][b["attention_mask"] == 0] == IGNORE).all()
        assert (b["source_ids"][b["attention_mask"] == 1] >= 0).all()
        assert b["pixel_values"].shape[1:] == (3, 14, 14) if pads else True


def test_mixer_ratio_and_schedule():
    with pytest.raises(ValueError, match="vision ratio"):
        VisionRatioSchedule(1.5)
    with pytest.raises(ValueError, match="vision ratio"):
        VisionRatioSchedule(-0.1)
    sched = VisionRatioSchedule(0.25, inject_step=10)
    assert sched(9) == 0.0 and sched(10) == 0.25
    mixer = Mixer(sched)
    assert all(mixer.pick(s) == "text" for s in range(10))
    for _ in range(400):
        mixer.record(name := mixer.pick(20), 100 if name == "vision" else 50)
    assert abs(mixer.vision / mixer.total - 0.25) < 0.02


def test_loader_resume_and_ratio(tokenizer, mini_dataset):
    root, _ = mini_dataset
    cfg = LoaderConfig(text_shards=split_shards(root, "train", "text"),
                       vision_shards=split_shards(root, "train", "vision"), seq_len=512, batch_size=2,
                       schedule=VisionRatioSchedule(0.5), shuffle_block=8)
    loader = build_loader(cfg, tokenizer, FakeProcessor())
    it = iter(loader)
    first = [next(it) for _ in range(4)]
    state = loader.state_dict()
    tail = [next(it)["input_ids"] for _ in range(3)]
    again = build_loader(cfg, tokenizer, FakeProcessor())
    again.load_state_dict(json.loads(json.dumps(state)))
    resumed = iter(again)
    assert all(torch.equal(a, next(resumed)["input_ids"]) for a in tail)
    share = sum(int((b["modality_ids"] > 0).sum()) for b in first) / sum(int(b["attention_mask"].sum()) for b in first)
    assert 0.3 < share < 0.7 and loader.stats()["corrupt"] == 0


def test_loader_bad_inputs(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="empty"):
        build_loader(LoaderConfig(), tokenizer)
    with pytest.raises(ValueError, match="shard list is empty"):
        list_shards([])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_loader(LoaderConfig(text_shards=[str(tmp_path / "nope.tar")]), tokenizer)


def test_plain_webdataset_samples_get_a_record(tmp_path, tokenizer):
    """The common {png, txt} image-text layout, no record of ours: the encoder builds one (adapters.ensure_record)."""
    w = ShardWriter(tmp_path / "wds", "img")
    w.write({"__key__": "x0", "png": _png((1, 2, 3)), "txt": "a caption"})
    w.write({"__key__": "x1", "json": json.dumps({"alt": "an alt text"}).encode(), "png": _png((3, 2, 1))})
    w.close()
    samples = list(ShardStream(list_shards([tmp_path / "wds"]), shuffle_shards=False))
    docs = [Encoder(tokenizer, "sft").encode(s) for s in samples]
    assert len(docs) == 2 and all(d.modality == 1 for d in docs)
    assert tokenizer.decode([t for t in docs[1].input_ids if t < len(tokenizer)]).count("an alt text") == 1
    with pytest.raises(ValueError, match="no media, caption or text"):
        ensure_record({"__key__": "x2", "json": {}})


def test_cli_inspect_and_errors(mini_dataset, tmp_path, capsys):
    root, _ = mini_dataset
    assert data_cli(["inspect", str(root), "--out", str(tmp_path / "ins")]) == 0
    stats = json.loads((tmp_path / "ins" / "stats.json").read_text())
    assert stats["samples"] > 0 and stats["corrupt"] == 0 and (tmp_path / "ins" / "contact_sheet.png").is_file()
    assert data_cli(["inspect", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("x")
    assert data_cli(["synth", "--out", str(tmp_path / "a_file"), "--preset", "tiny"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_tar_members_are_reproducible(mini_dataset):
    root, _ = mini_dataset
    with tarfile.open(split_shards(root, "train")[0]) as tar:
        assert {(m.mtime, m.uname, m.mode) for m in tar.getmembers()} == {(0, "kvl", 0o444)}

"""A tiny page dataset and a two-step debug checkpoint trained on it, shared by the web demo tests
(tests/demo/test_demo.py, tests/eval/test_web_split.py)."""

from __future__ import annotations

from pathlib import Path

from data_pipelines.synth.build import Preset, build_dataset, split_shards
from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

MAX_PATCHES = 64


def web_preset(name: str, eval_pages: int) -> Preset:
    """Pages at a 320 px viewport (the smallest the page families use), a little prose so every batch has text."""
    return Preset(name, {"page": 2, "page_video": 2, "prose": 4}, {"page": eval_pages, "page_video": eval_pages},
                  image_sides=(56, 320), video_sides=(64, 128), video_frames=(8, 16), shard_max_count=50)


def build_web_data(root: Path, preset: Preset) -> dict:
    """The dataset and its 1024-token tokenizer under ``root``; returns the manifest."""
    manifest = build_dataset(root, preset, seed=0)
    train_tokenizer(iter_corpus_texts(split_shards(root, "train")), root / "tokenizer", vocab_size=1024)
    return manifest


def train_web_checkpoint(data: Path, out: Path) -> Path:
    """Two steps of the training app (debug flavor, debug_pretrain.yaml) on the pages: the export RUN/final."""
    from kimi_vl.runconfig import load_config
    from kimi_vl.train.config import TrainConfig
    from kimi_vl.train.loop import train

    cfg = load_config(TrainConfig, "kimi_vl/configs/debug_pretrain.yaml",
                      [f"data.path={data}", f"output_dir={out}", "max_steps=2", "data.seq_len=512",
                       "data.batch_size=1", f"data.max_patches={MAX_PATCHES}", "data.vision_ratio=0.5",
                       "eval_batches=1"])
    return train(cfg)

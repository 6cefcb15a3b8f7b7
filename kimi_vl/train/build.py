"""Build what a training stage needs from its run config: tokenizer, processor, model, loaders.

The data side comes from ``data_pipelines`` (shards written by ``kimi-vl data synth`` or adapters),
the model from ``kimi_vl``'s flavors; this module is the only place that joins the two (the vocabulary
size and the media token ids flow from the tokenizer into the model config).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from data_pipelines.loader import LoaderConfig, VisionRatioSchedule, build_loader
from data_pipelines.synth.build import read_manifest, split_shards
from data_pipelines.tokenizer import load_tokenizer, special_ids
from kimi_vl.configuration import KimiVLConfig
from kimi_vl.exports import export_folder
from kimi_vl.logs import print0
from kimi_vl.modeling.model import KimiVLForCausalLM
from kimi_vl.runconfig import ConfigError
from kimi_vl.train.config import TrainConfig
from vision_encoder.geometry import PatchGeometry
from vision_encoder.processor import MoonViTProcessor, MoonViTProcessorConfig

SYNTH_PREFIX = "synth:"


def synth_cache_dir() -> Path:
    return Path(os.environ.get("KVL_DATA_CACHE", Path.home() / ".cache" / "kimi-vl" / "synth"))


def parse_synth(spec: str, field: str = "data.path") -> tuple[str, int]:
    """``synth:PRESET[:SEED]`` -> ``(preset, seed)``; a :class:`ConfigError` naming ``field`` for an unknown preset
    or a seed that is not an integer."""
    from data_pipelines.synth import PRESETS

    parts = spec[len(SYNTH_PREFIX):].split(":")
    if parts[0] not in PRESETS or len(parts) > 2 or (len(parts) == 2 and not parts[1].lstrip("-").isdigit()):
        raise ConfigError(f"{field}={spec!r}: expected synth:PRESET[:SEED] with PRESET one of {sorted(PRESETS)} and "
                          "an integer SEED")
    return parts[0], int(parts[1]) if len(parts) == 2 else 0


def ensure_synth(spec: str) -> Path:
    """``synth:PRESET[:SEED]`` -> the built dataset in the cache, generated once (atomically) if missing."""
    preset, seed = parse_synth(spec)
    root = synth_cache_dir() / f"{preset}-seed{seed}"
    if (root / "manifest.json").is_file() and (root / "tokenizer").is_dir():
        return root
    from data_pipelines.synth.build import build_dataset, default_vocab
    from data_pipelines.tokenizer import iter_corpus_texts, train_tokenizer

    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    print0(f"[data] generating the synthetic '{preset}' preset (seed {seed}) into {root}")
    build_dataset(tmp, preset, seed=seed)
    train_tokenizer(iter_corpus_texts(split_shards(tmp, "train")), tmp / "tokenizer", default_vocab(preset))
    try:
        os.replace(tmp, root)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def data_root(cfg: TrainConfig) -> Path:
    """``data.path``: a dataset folder, or ``synth:PRESET[:SEED]`` for the built-in world (cached)."""
    if cfg.data.path.startswith(SYNTH_PREFIX):
        return ensure_synth(cfg.data.path)
    root = Path(cfg.data.path)
    if not cfg.data.path or not (root / "manifest.json").is_file():
        raise FileNotFoundError(
            f"data.path={cfg.data.path!r}: no manifest.json there; create a dataset with "
            "`kimi-vl data synth --out DIR --preset tiny` and pass data.path=DIR (or use data.path=synth:tiny)")
    return root


def check_inputs(cfg: TrainConfig) -> None:
    """The run's input paths (``data.path``, ``data.tokenizer``, ``init_from``), checked before anything is built so
    that a wrong one is a one-line error naming the field. A ``synth:`` dataset is generated later, not here (only its
    spec is checked)."""
    synth = cfg.data.path.startswith(SYNTH_PREFIX)
    if synth:
        parse_synth(cfg.data.path)
    else:
        data_root(cfg)
    if cfg.data.tokenizer or not synth:
        tokenizer_folder(cfg)
    if cfg.init_from:
        export_folder(cfg.init_from, "init_from")


def tokenizer_folder(cfg: TrainConfig) -> str:
    """``data.tokenizer``, else ``<data root>/tokenizer``; an error naming the field when it is not a folder."""
    path = cfg.data.tokenizer or str(data_root(cfg) / "tokenizer")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"data.tokenizer={path!r} is not a folder (train one with `kimi-vl data tokenizer`)")
    return path


def build_tokenizer(cfg: TrainConfig) -> Any:
    path = tokenizer_folder(cfg)
    tok = load_tokenizer(path)
    special_ids(tok, where=path)  # fails with the missing media tokens named
    return tok


def geometry(cfg: TrainConfig) -> PatchGeometry:
    return PatchGeometry(max_patches=cfg.data.max_patches)


def build_processor(cfg: TrainConfig) -> MoonViTProcessor | None:
    if cfg.model.vision_flavor is None:
        return None
    geo = geometry(cfg)
    return MoonViTProcessor(MoonViTProcessorConfig(image_geometry=geo, video_geometry=geo))


def model_config(cfg: TrainConfig, tokenizer: Any) -> KimiVLConfig:
    """The flavor with ``model.overrides``; vocabulary and special ids from the tokenizer."""
    ids = special_ids(tokenizer)
    overrides = dict(cfg.model.overrides)
    overrides.setdefault("vocab_size", len(tokenizer))
    overrides.setdefault("pad_token_id", ids.pad)
    overrides.setdefault("eos_token_id", ids.eos)
    overrides.setdefault("bos_token_id", ids.eos)
    if cfg.model.vision_flavor is not None:
        from kimi_vl.modeling.multimodal import vision_config_dict

        overrides["vision_config"] = vision_config_dict(cfg.model.vision_flavor, ids.media_pad, ids.video_placeholder)
    return KimiVLConfig.from_flavor(cfg.model.flavor, **overrides)


def build_model(cfg: TrainConfig, tokenizer: Any) -> torch.nn.Module:
    """A fresh model, or the weights of ``init_from`` (an export folder) when it is set."""
    config = model_config(cfg, tokenizer)
    if cfg.model.vision_flavor is not None:
        from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration as cls
    else:
        cls = KimiVLForCausalLM
    if cfg.init_from:
        return load_init(cls, cfg.init_from, config)
    torch.manual_seed(cfg.seed)
    return cls(config)


def load_init(cls: type, path: str, config: KimiVLConfig) -> torch.nn.Module:
    """Load an export; a checkpoint of another architecture is an error naming the fields."""
    from kimi_vl.train.checkpoint import architecture, check_compatible

    folder = export_folder(path, "init_from")
    saved = KimiVLConfig.from_pretrained(folder)
    saved_arch, run_arch = architecture(saved), architecture(config)
    saved_arch.pop("vision"), run_arch.pop("vision")  # (told apart below, with its own message)
    check_compatible(saved_arch, run_arch, str(folder))
    if (saved.vision_config is None) != (config.vision_config is None):
        raise ValueError(f"init_from={path!r}: vision tower present={saved.vision_config is not None}, "
                         f"run wants vision={config.vision_config is not None}")
    return cls.from_pretrained(folder, config=config)


def loader_config(cfg: TrainConfig, split: str = "train", max_batches: int | None = None) -> LoaderConfig:
    root = data_root(cfg)
    read_manifest(root)
    zero_vision = cfg.stage == "sft" and cfg.data.sft_preset == "zero_vision"
    vision = split_shards(root, split, "vision") if cfg.model.vision_flavor is not None and not zero_vision else []
    geo = geometry(cfg)
    ratio = cfg.data.vision_ratio if vision else 0.0
    return LoaderConfig(
        text_shards=split_shards(root, split, "text"), vision_shards=vision, seq_len=cfg.data.seq_len,
        batch_size=cfg.data.batch_size, mode="sft" if cfg.stage == "sft" else "pretrain",
        schedule=VisionRatioSchedule(ratio, cfg.data.vision_inject_step), seed=cfg.seed,
        resampled=split == "train", epochs=None if split == "train" else 1, shuffle_block=cfg.data.shuffle_buffer,
        grad_accum=cfg.grad_accum, image_geometry=geo, video_geometry=geo, max_batches=max_batches,
    )


def build_train_loader(cfg: TrainConfig, tokenizer: Any, processor: Any, rank: int, world: int) -> Any:
    lc = loader_config(cfg, "train")
    return build_loader(lc, tokenizer, processor, cfg.data.num_workers, rank=rank, world_size=world)


def eval_batches(cfg: TrainConfig, tokenizer: Any, processor: Any) -> list[dict[str, Any]]:
    """A fixed list of held-out batches (the eval split, read once, in order)."""
    lc = loader_config(cfg, "eval", max_batches=cfg.eval_batches)
    return list(build_loader(lc, tokenizer, processor, 0, rank=0, world_size=1))

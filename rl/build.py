"""Build what an RL run needs from its config: tokenizer, prompt source and the initial policy.

Data and model conventions are the training app's (:mod:`kimi_vl.train.build`): ``data.path`` is a dataset
folder or ``synth:PRESET[:SEED]``; a fresh model is the flavor with the tokenizer's vocabulary and media ids;
``init_from`` is an export folder (``RUN/final`` or ``RUN``) loaded as ``KimiVLForConditionalGeneration`` when it
has a vision tower, else ``KimiVLForCausalLM``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kimi_vl.exports import export_folder
from rl.config import RLRunConfig
from rl.tasks import CharTokenizer, LetterCountSource, PromptSource, Tokenizer

# A random transformers Kimi Linear LM for the letter_count toy (and fast tests).
HF_PRESETS: dict[str, dict[str, Any]] = {
    "debug": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"], linear_head_dim=16,
        linear_num_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
    ),
}  # fmt: skip


def train_view(cfg: RLRunConfig) -> Any:
    """The training app's config with this run's data and model sections (to reuse its builders)."""
    from kimi_vl.train.config import DataSection, ModelSection, TrainConfig

    model = ModelSection(flavor=cfg.model.flavor, overrides=dict(cfg.model.overrides),
                         vision_flavor=cfg.model.vision_flavor if cfg.data.source == "vision" else None)
    data = DataSection(path=cfg.data.path, tokenizer=cfg.data.tokenizer, max_patches=cfg.data.max_patches)
    return TrainConfig(output_dir=cfg.output_dir, max_steps=max(cfg.max_steps, 1), seed=cfg.seed, model=model,
                       data=data)


def check_inputs(cfg: RLRunConfig) -> None:
    """``init_from``, ``data.path`` and the tokenizer folder (:func:`tokenizer_path`) checked before anything is built
    (the ``letter_count`` source reads no dataset; a ``synth:`` one is built later), so that a wrong path is a
    one-line error naming the field."""
    from kimi_vl.train.build import SYNTH_PREFIX, data_root, parse_synth

    if cfg.init_from:
        export_folder(cfg.init_from, "init_from")
    if cfg.data.source == "letter_count":
        return
    synth = cfg.data.path.startswith(SYNTH_PREFIX)
    if synth:
        parse_synth(cfg.data.path)
    else:
        data_root(train_view(cfg))
    if cfg.data.tokenizer or not synth:
        path = tokenizer_path(cfg)
        if not path.is_dir():
            raise FileNotFoundError(f"data.tokenizer={str(path)!r} is not a folder (the tokenizer is data.tokenizer, "
                                    "else the init_from export's, else <data.path>/tokenizer)")


def tokenizer_path(cfg: RLRunConfig) -> Path:
    """``data.tokenizer``, else the tokenizer exported with ``init_from``, else ``<data root>/tokenizer``."""
    from kimi_vl.train.build import data_root

    if cfg.data.tokenizer:
        return Path(cfg.data.tokenizer)
    if cfg.init_from:
        folder = export_folder(cfg.init_from)
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
            return folder
    return data_root(train_view(cfg)) / "tokenizer"


def build_source(cfg: RLRunConfig) -> tuple[Tokenizer, PromptSource]:
    """The tokenizer (with ``eos_ids``, ``pad_token_id``, ``decode``) and the prompt source of ``data.source``."""
    if cfg.data.source == "letter_count":
        tok = CharTokenizer(cfg.data.alphabet) if cfg.data.alphabet else CharTokenizer()
        return tok, LetterCountSource(tok, cfg.data.letters, cfg.data.min_len, cfg.data.max_len, seed=cfg.seed)
    from data_pipelines.tokenizer import load_tokenizer
    from kimi_vl.train.build import data_root
    from rl.synth_source import ChatTokenizer, PromptBuilder, SynthPromptSource
    from vision_encoder.geometry import PatchGeometry
    from vision_encoder.processor import MoonViTProcessor, MoonViTProcessorConfig

    hf_tok = load_tokenizer(tokenizer_path(cfg))
    geo = PatchGeometry(max_patches=cfg.data.max_patches)
    processor = None
    if cfg.data.source == "vision":
        processor = MoonViTProcessor(MoonViTProcessorConfig(image_geometry=geo, video_geometry=geo))
    builder = PromptBuilder(hf_tok, processor, geo)
    root = data_root(train_view(cfg))
    source = SynthPromptSource(str(root), builder, cfg.data.source, cfg.data.reward_families, cfg.data.categories,
                               seed=cfg.seed)
    return ChatTokenizer(hf_tok), source


def load_policy(path: str) -> torch.nn.Module:
    """An export of the suite's model (with or without vision tower)."""
    from kimi_vl.configuration import KimiVLConfig
    from kimi_vl.modeling.model import KimiVLForCausalLM
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration
    from kimi_vl.train.build import load_init

    folder = export_folder(path)
    saved = KimiVLConfig.from_pretrained(folder)
    cls = KimiVLForConditionalGeneration if saved.vision_config is not None else KimiVLForCausalLM
    return load_init(cls, str(folder), saved)


def _fresh_letter_model(cfg: RLRunConfig, tokenizer: Tokenizer) -> torch.nn.Module:
    vocab = max(getattr(tokenizer, "vocab_size", 0), int(cfg.model.overrides.get("vocab_size", 0)))
    overrides = {**cfg.model.overrides, "vocab_size": vocab}
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    if cfg.model.backend == "transformers":
        from transformers import KimiLinearConfig, KimiLinearForCausalLM

        if cfg.model.flavor not in HF_PRESETS:
            raise ValueError(f"model.flavor: '{cfg.model.flavor}' has no transformers preset ({sorted(HF_PRESETS)})")
        return KimiLinearForCausalLM(KimiLinearConfig(**{**HF_PRESETS[cfg.model.flavor], **special, **overrides}))
    from kimi_vl import KimiVLConfig, KimiVLForCausalLM

    return KimiVLForCausalLM(KimiVLConfig.from_flavor(cfg.model.flavor, **special, **overrides))


def build_model(cfg: RLRunConfig, tokenizer: Tokenizer) -> torch.nn.Module:
    """The initial policy: ``init_from`` (an export) or a fresh, seeded model of ``model``."""
    torch.manual_seed(cfg.seed)
    if cfg.init_from:
        model = load_policy(cfg.init_from)
    elif cfg.data.source == "letter_count":
        return _fresh_letter_model(cfg, tokenizer)
    else:
        if cfg.model.backend != "kimi_vl":
            raise ValueError(f"model.backend={cfg.model.backend!r}: the {cfg.data.source} source needs kimi_vl")
        from kimi_vl.train.build import build_model as build_train_model

        model = build_train_model(train_view(cfg), getattr(tokenizer, "tokenizer", tokenizer))
    vocab = getattr(tokenizer, "vocab_size", 0)
    if model.config.vocab_size < vocab:
        raise ValueError(f"init_from={cfg.init_from!r}: model vocab_size {model.config.vocab_size} < "
                         f"the tokenizer's {vocab}")
    if cfg.data.source == "vision" and getattr(model.config, "vision_config", None) is None:
        raise ValueError(f"data.source=vision needs a model with a vision tower; init_from={cfg.init_from!r} has none")
    return model


__all__ = ["HF_PRESETS", "build_model", "build_source", "check_inputs", "load_policy", "tokenizer_path",
           "train_view"]

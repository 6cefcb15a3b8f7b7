"""transformers ``kimi_k25`` (MoonViT + projector + ``kimi_linear`` text model) <-> ``KimiVLForConditionalGeneration``.

The vision keys follow the explicit map in ``vision_encoder/convert.py`` (``model.vision_tower.*`` and
``model.mm_projector.*`` <-> ``vision_tower.*`` / ``vision_tower.projector.*``); the text keys
``model.language_model.*`` become ``model.*`` and then go through ``kimi_vl.convert``'s kimi_linear map.
Checkpoints must be saved with ``save_pretrained(dir, save_original_format=False)`` (transformers' default
"original" layout does not reload with a kimi_linear text model).
"""

from __future__ import annotations

import torch

from vision_encoder.config import MoonViTConfig
from vision_encoder.convert import from_kimi_k25, is_vision_key, to_kimi_k25

HF_TEXT_PREFIX = "model.language_model."


def vision_config_from_kimi_k25(hf_config) -> dict:
    """``KimiVLConfig.vision_config`` dict from a ``Kimi_K25Config``."""
    vc = hf_config.vision_config
    if tuple(vc.merge_kernel_size) != (2, 2) and len(set(vc.merge_kernel_size)) != 1:
        raise ValueError(f"kimi_k25 merge_kernel_size {vc.merge_kernel_size} must be square")
    moonvit = MoonViTConfig(
        hidden_size=vc.hidden_size, num_layers=vc.num_hidden_layers, num_heads=vc.num_attention_heads,
        intermediate_size=vc.intermediate_size, patch_size=vc.patch_size, pos_emb_height=vc.pos_emb_height,
        pos_emb_width=vc.pos_emb_width, pos_emb_time=vc.pos_emb_time, merge_size=vc.merge_kernel_size[0],
        rope_theta=(vc.rope_parameters or {}).get("rope_theta", 10000.0),
        projector_norm_eps=hf_config.projection_layer_norm_eps)
    if vc.hidden_act != "gelu_pytorch_tanh":
        raise ValueError(f"kimi_k25 vision hidden_act {vc.hidden_act!r} is not supported (gelu_pytorch_tanh only)")
    return {**moonvit.to_dict(), "out_hidden_size": None, "image_token_id": hf_config.image_token_id,
            "video_token_id": hf_config.video_token_id}


def state_dict_from_kimi_k25(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A kimi_k25 (kimi_linear text) state dict -> ``KimiVLForConditionalGeneration`` keys."""
    from kimi_vl.convert import state_dict_from_hf

    vision = {"vision_tower." + k: v for k, v in from_kimi_k25(theirs).items()}
    text = {}
    for key, value in theirs.items():
        if is_vision_key(key):
            continue
        if key.startswith(HF_TEXT_PREFIX):
            text["model." + key[len(HF_TEXT_PREFIX):]] = value
        elif key == "lm_head.weight":
            text[key] = value
        else:
            raise ValueError(f"kimi_k25 key {key!r} is neither vision, projector nor text (kimi_vl/convert_vision.py)")
    return {**vision, **state_dict_from_hf(text)}


def state_dict_to_kimi_k25(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``KimiVLForConditionalGeneration`` state dict -> kimi_k25 keys (text through kimi_linear's map)."""
    from kimi_vl.convert import state_dict_to_hf

    vision = to_kimi_k25({k[len("vision_tower."):]: v for k, v in ours.items() if k.startswith("vision_tower.")})
    text = state_dict_to_hf({k: v for k, v in ours.items() if not k.startswith("vision_tower.")})
    renamed = {(HF_TEXT_PREFIX + k[len("model."):] if k.startswith("model.") else k): v for k, v in text.items()}
    return {**vision, **renamed}


def convert_from_kimi_k25(hf_model):
    """A transformers ``Kimi_K25ForConditionalGeneration`` (kimi_linear text) -> ours, same weights."""
    from kimi_vl.convert import config_from_hf
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration

    config = config_from_hf(hf_model.config.text_config)
    config.vision_config = vision_config_from_kimi_k25(hf_model.config)
    config.vision_config.pop("out_hidden_size")
    model = KimiVLForConditionalGeneration(config).to(hf_model.dtype)
    state = state_dict_from_kimi_k25(hf_model.state_dict())
    expected = model.state_dict()
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"convert kimi_k25: key map mismatch; missing {missing[:8]}, unexpected {unexpected[:8]}")
    model.load_state_dict(state, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model

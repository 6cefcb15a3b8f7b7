"""Explicit key maps between MoonViT (+ projector) and transformers' ``kimi_k25`` checkpoints.

transformers names (``Kimi_K25ForConditionalGeneration``, ``save_original_format=False``):
``model.vision_tower.*`` for the encoder and ``model.mm_projector.*`` for the projector. The weights need
no reshaping: the RoPE layout and the separate q/k/v projections are the same on both sides.

``to_kimi_k25(state_dict)`` / ``from_kimi_k25(state_dict)`` rename a MoonViT state dict (keys as in
``MoonViT.state_dict()``; ``projector.*`` included when present) and fail on any key they do not know.
"""

from __future__ import annotations

import re

import torch

HF_VISION_PREFIX = "model.vision_tower."
HF_PROJECTOR_PREFIX = "model.mm_projector."

# (ours, theirs) regex pairs; {i} = layer index. Theirs is relative to the vision tower / projector prefix.
_TOWER_MAP = [
    ("patch_embed.weight", "patch_embed.proj.weight"),
    ("patch_embed.bias", "patch_embed.proj.bias"),
    ("pos_emb.table", "patch_embed.pos_emb.position_embeddings"),
    ("blocks.{i}.norm1.{p}", "layers.{i}.norm1.{p}"),
    ("blocks.{i}.norm2.{p}", "layers.{i}.norm2.{p}"),
    ("blocks.{i}.attn.q_proj.{p}", "layers.{i}.attn.q_proj.{p}"),
    ("blocks.{i}.attn.k_proj.{p}", "layers.{i}.attn.k_proj.{p}"),
    ("blocks.{i}.attn.v_proj.{p}", "layers.{i}.attn.v_proj.{p}"),
    ("blocks.{i}.attn.out_proj.{p}", "layers.{i}.attn.proj.{p}"),
    ("blocks.{i}.fc1.{p}", "layers.{i}.mlp.fc1.{p}"),
    ("blocks.{i}.fc2.{p}", "layers.{i}.mlp.fc2.{p}"),
    ("norm.{p}", "final_layernorm.{p}"),
]
_PROJECTOR_MAP = [
    ("projector.pre_norm.{p}", "pre_norm.{p}"),
    ("projector.fc1.{p}", "in_proj.{p}"),
    ("projector.fc2.{p}", "out_proj.{p}"),
]


def _compile(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(pattern + "$")


def _rules(reverse: bool) -> list[tuple[re.Pattern, str]]:
    rules = []
    for ours, theirs in _TOWER_MAP:
        rules.append((ours, HF_VISION_PREFIX + theirs))
    for ours, theirs in _PROJECTOR_MAP:
        rules.append((ours, HF_PROJECTOR_PREFIX + theirs))
    return [(_compile(b), a) if reverse else (_compile(a), b) for a, b in rules]


def _rename(key: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, target in rules:
        match = pattern.match(key)
        if match:
            return target.format(**match.groupdict())
    return None


def to_kimi_k25(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MoonViT keys -> ``model.vision_tower.*`` / ``model.mm_projector.*``; unknown keys raise."""
    rules, out = _rules(reverse=False), {}
    for key, value in state_dict.items():
        new = _rename(key, rules)
        if new is None:
            raise ValueError(f"MoonViT key {key!r} has no kimi_k25 name (vision_encoder/convert.py)")
        out[new] = value
    return out


def from_kimi_k25(state_dict: dict[str, torch.Tensor], strict: bool = True) -> dict[str, torch.Tensor]:
    """``model.vision_tower.*`` / ``model.mm_projector.*`` keys -> MoonViT keys.

    Keys outside those two prefixes are ignored (the text model is converted elsewhere); with ``strict``,
    an unknown key inside them raises.
    """
    rules, out = _rules(reverse=True), {}
    for key, value in state_dict.items():
        if not key.startswith((HF_VISION_PREFIX, HF_PROJECTOR_PREFIX)):
            continue
        new = _rename(key, rules)
        if new is None:
            if strict:
                raise ValueError(f"kimi_k25 key {key!r} has no MoonViT name (vision_encoder/convert.py)")
            continue
        out[new] = value
    return out


def is_vision_key(key: str) -> bool:
    """True for transformers kimi_k25 keys that this module converts."""
    return key.startswith((HF_VISION_PREFIX, HF_PROJECTOR_PREFIX))

"""Tiny random models for RL tests: a transformers Kimi Linear LM (text) and a Kimi K2.5 VLM on it (images).

They stand in for the suite's own ``kimi_vl`` models where those are not needed; both expose the calls the
rollout engine uses (``model(input_ids=..., past_key_values=..., use_cache=..., pixel_values=..., ...)``)."""

from __future__ import annotations

import torch
from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration, KimiLinearConfig, KimiLinearForCausalLM

VOCAB = 64
IMAGE_TOKEN = 60
EOS = 2
PAD = 0

TEXT = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
    linear_head_dim=16, linear_num_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
    qk_rope_head_dim=8, v_head_dim=16, pad_token_id=PAD, bos_token_id=1, eos_token_id=EOS,
)  # fmt: skip


def tiny_text_lm(seed: int = 0) -> KimiLinearForCausalLM:
    torch.manual_seed(seed)
    return KimiLinearForCausalLM(KimiLinearConfig(**TEXT)).eval()


def tiny_vlm(seed: int = 0) -> Kimi_K25ForConditionalGeneration:
    torch.manual_seed(seed)
    vision = dict(num_attention_heads=2, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                  pos_emb_height=8, pos_emb_width=8)  # fmt: skip
    cfg = Kimi_K25Config(
        text_config=dict(model_type="kimi_linear", **TEXT), vision_config=vision, projection_hidden_size=32,
        image_token_id=IMAGE_TOKEN, video_token_id=61,
    )  # fmt: skip
    return Kimi_K25ForConditionalGeneration(cfg).eval()


def decode(ids: list[int]) -> str:
    """Ids -> one character each (``a``..``z`` cycling; EOS and PAD -> empty)."""
    return "".join("" if i in (EOS, PAD) else chr(ord("a") + i % 26) for i in ids)

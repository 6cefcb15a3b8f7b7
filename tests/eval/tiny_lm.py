"""A tiny byte-level BPE tokenizer and a tiny random ``KimiLinearForCausalLM`` checkpoint for eval tests."""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|pad|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
            "<|kimi_k25_video_placeholder|>"]
CORPUS = [
    "The red square is left of the blue circle. How many circles are there? Answer: 3.",
    "Question: what colour is the triangle? Answer: green. The chart shows sales rising each year.",
    "Count the objects: two cats, one dog and four birds sit on the fence near the river bank.",
] * 20


def make_tokenizer(out_dir: Path | None = None, vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS[2:]})
    if out_dir is not None:
        fast.save_pretrained(out_dir)
    return fast


def make_model(vocab_size: int, seed: int = 0):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    torch.manual_seed(seed)
    cfg = KimiLinearConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
        linear_head_dim=16, linear_num_heads=2, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=16, pad_token_id=1, bos_token_id=0, eos_token_id=0,
        max_position_embeddings=256)
    model = KimiLinearForCausalLM(cfg).eval()
    with torch.no_grad():  # a random init gives near-uniform logits; sharpen them so greedy choices are clear
        model.lm_head.weight.mul_(20.0)
    return model


def make_checkpoint(out_dir: Path) -> Path:
    tok = make_tokenizer(out_dir)
    model = make_model(len(tok))
    model.save_pretrained(out_dir)
    return out_dir

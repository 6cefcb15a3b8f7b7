"""Shared builders for the backbone tests: tiny configs and a transformers kimi_linear twin."""

from __future__ import annotations

import torch

from kimi_vl import KimiVLConfig, KimiVLForCausalLM


def tiny_config(moe: bool = True, **overrides) -> KimiVLConfig:
    """A 4-layer hybrid (KDA, KDA, MLA, KDA... per ``layer_types``) small enough for fp32 CPU tests in seconds."""
    kw = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
              layer_types=["kda", "mla", "kda", "mla"],
              mlp_layer_types=["dense", "sparse", "sparse", "dense"] if moe else ["dense"] * 4,
              num_attention_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
              linear_num_heads=2, linear_head_dim=8, num_experts=6, num_experts_per_tok=2, num_shared_experts=1,
              moe_intermediate_size=16, routed_scaling_factor=1.7, attnres_block_size=3,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_backend="sdpa")
    kw.update(overrides)
    return KimiVLConfig(**kw)


def build(config: KimiVLConfig, seed: int = 0) -> KimiVLForCausalLM:
    torch.manual_seed(seed)
    model = KimiVLForCausalLM(config).eval()
    with torch.no_grad():  # make norms, gates and biases non-trivial so tests can see wiring mistakes
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.1, 0.1)
    return model


def step_under_env(model: KimiVLForCausalLM, ids: torch.Tensor, monkeypatch, var: str, values: tuple[str, ...]
                   ) -> dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """One training forward + backward of ``model`` on ``ids`` per value of the environment variable ``var``:
    ``value -> (logits, {parameter name: gradient})`` (parameters without a gradient left out)."""
    runs = {}
    for value in values:
        monkeypatch.setenv(var, value)
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids, use_cache=False)
        out.loss.backward()
        runs[value] = out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                            if p.grad is not None}
    return runs

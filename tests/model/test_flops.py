"""kimi_vl.modeling.flops: the MFU numerator shared by the backbone benchmark and the training app."""

from __future__ import annotations

import pytest

from kimi_vl import KimiVLConfig, KimiVLForCausalLM
from kimi_vl.modeling.flops import KDA_CHUNK, FlopModel, lm_flops_per_token


def _model(mlp: str = "dense") -> KimiVLForCausalLM:
    layers = KimiVLConfig.from_flavor("debug").num_hidden_layers
    return KimiVLForCausalLM(KimiVLConfig.from_flavor("debug", mlp_layer_types=[mlp] * layers))


def test_dense_lm_flops_are_six_matrix_params_plus_mixing_terms() -> None:
    model = _model()
    cfg = model.config
    params = sum(p.numel() for n, p in model.model.named_parameters() if not n.startswith("embed_tokens."))
    params += model.lm_head.weight.numel()
    mixing = 0.0
    for kind in cfg.layer_types:
        if kind == "full_attention":
            mixing += 3.0 * cfg.num_attention_heads * (cfg.qk_head_dim + cfg.v_head_dim) * 128
        else:
            k = cfg.linear_head_dim
            mixing += 3.0 * cfg.linear_num_heads * (6 * k * k + 3 * KDA_CHUNK * k + KDA_CHUNK**2)
    assert lm_flops_per_token(model, 128) == pytest.approx(6.0 * params + mixing)
    assert lm_flops_per_token(model, 256) > lm_flops_per_token(model, 128)  # the attention term grows with seq


def test_routed_experts_count_at_their_activation_share() -> None:
    dense = _model()
    moe = _model("moe")
    cfg = moe.config
    experts = sum(p.numel() for n, p in moe.model.named_parameters() if ".experts." in n)
    assert experts > 0
    others = sum(p.numel() for n, p in moe.model.named_parameters()
                 if ".experts." not in n and not n.startswith("embed_tokens.")) + moe.lm_head.weight.numel()
    share = cfg.num_experts_per_tok / cfg.num_experts
    want = 6.0 * (others + share * experts)
    got = lm_flops_per_token(moe, 1) - (lm_flops_per_token(dense, 1) - 6.0 * _dense_params(dense))
    assert got == pytest.approx(want)


def _dense_params(model: KimiVLForCausalLM) -> float:
    return sum(p.numel() for n, p in model.model.named_parameters()
               if not n.startswith("embed_tokens.")) + model.lm_head.weight.numel()


def test_vision_patches_add_tower_flops() -> None:
    from kimi_vl.modeling.multimodal import KimiVLForConditionalGeneration, vision_config_dict

    model = KimiVLForConditionalGeneration(
        KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", 500, 501)))
    tower, flops = model.vision_tower, FlopModel.of(model)
    params = sum(p.numel() for n, p in tower.named_parameters() if not n.endswith("table"))
    vcfg = tower.config
    assert flops.vision_per_patch(32) == pytest.approx(6.0 * params + 12.0 * vcfg.hidden_size * 32 * vcfg.num_layers)
    assert flops.vision_per_patch(64) > flops.vision_per_patch(16) > 0
    text_only = flops.step(128, 100)
    assert text_only == pytest.approx(100 * lm_flops_per_token(model, 128))
    assert flops.step(128, 100, n_patches=64, n_images=2) == pytest.approx(text_only + 64 * flops.vision_per_patch(32))

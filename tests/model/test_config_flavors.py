"""KimiVLConfig validation, layout shorthands, flavors (48B shape on the meta device), Auto registration."""

from __future__ import annotations

import pytest
import torch
from backbone_utils import tiny_config
from transformers import AutoConfig

from kimi_vl import KimiVLConfig, KimiVLForCausalLM
from kimi_vl.configuration import layer_types_from_ratio
from kimi_vl.flavors import FLAVORS, count_parameters


@pytest.mark.parametrize(("overrides", "match"), [
    (dict(num_attention_heads=3), "num_attention_heads"),
    (dict(linear_num_heads=5), "linear_num_heads"),
    (dict(layer_types=["kda", "mla", "conv", "kda"]), r"layer_types\[2\]"),
    (dict(layer_types=["kda", "mla"]), "layer_types has 2 entries"),
    (dict(mlp_layer_types=["dense", "moe", "dense", "huge"]), r"mlp_layer_types\[3\]"),
    (dict(num_experts_per_tok=7), "num_experts_per_tok"),
    (dict(n_group=4), "n_group"),
    (dict(residual_mode="attnres"), "residual_mode"),
    (dict(kda_gate_lower_bound=-6.0), "kda_gate_lower_bound"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(mla_cache_mode="paged"), "mla_cache_mode"),
])
def test_bad_configs_fail_at_construction(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


def test_layout_shorthands():
    assert layer_types_from_ratio(8, "3:1") == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    released = KimiVLConfig.from_flavor("kimi-linear-48b-a3b").layer_types
    assert [i + 1 for i, t in enumerate(released) if t == "full_attention"] == [4, 8, 12, 16, 20, 24, 27]
    cfg = KimiVLConfig.from_flavor("debug", num_hidden_layers=6, attn_ratio="2:1")
    assert cfg.layer_types == ["linear_attention", "linear_attention", "full_attention"] * 2
    assert cfg.mlp_layer_types == ["dense"] + ["sparse"] * 5
    assert tiny_config(mlp_layer_types=["moe", "dense", "moe", "dense"]).mlp_layer_types[0] == "sparse"
    with pytest.raises(ValueError, match="attn_ratio"):
        KimiVLConfig.from_flavor("debug", layer_types=None, attn_ratio="three")


def test_from_flavor_and_overrides_and_unknown_flavor():
    cfg = KimiVLConfig.from_flavor("tiny", vocab_size=5000, residual_mode="attnres_block")
    assert (cfg.vocab_size, cfg.residual_mode, cfg.flavor) == (5000, "attnres_block", "tiny")
    with pytest.raises(ValueError, match="unknown flavor"):
        KimiVLConfig.from_flavor("huge")


def test_config_round_trip_through_auto_config(tmp_path):
    cfg = tiny_config(residual_mode="attnres_full", kda_gate_lower_bound=-5.0)
    cfg.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, KimiVLConfig)
    for key in ("layer_types", "mlp_layer_types", "residual_mode", "kda_gate_lower_bound", "attnres_block_size",
                "num_experts", "vision_config"):
        assert getattr(loaded, key) == getattr(cfg, key), key


def _count(name: str) -> dict[str, int]:
    cfg = KimiVLConfig.from_flavor(name)
    with torch.device("meta"):
        model = KimiVLForCausalLM(cfg)
    return count_parameters(model, cfg)


def test_released_shape_is_48b_total_3b_active():
    counts = _count("kimi-linear-48b-a3b")
    assert 47e9 < counts["total"] < 50e9, counts
    assert 2.5e9 < counts["active"] < 3.5e9, counts


@pytest.mark.parametrize(("name", "low", "high"), [("debug", 0.3e6, 2e6), ("tiny", 1e6, 8e6),
                                                   ("small", 100e6, 200e6), ("base", 0.5e9, 1.0e9)])
def test_flavor_sizes(name, low, high):
    assert name in FLAVORS
    assert low < _count(name)["total"] < high


def test_debug_flavor_runs_forward_and_backward():
    model = KimiVLForCausalLM(KimiVLConfig.from_flavor("debug", residual_mode="attnres_block")).train()
    ids = torch.randint(0, 512, (2, 33))
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    assert torch.isfinite(out.loss) and abs(out.loss.item() - torch.log(torch.tensor(512.0)).item()) < 0.5

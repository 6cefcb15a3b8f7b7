"""Named architectures of the Kimi Linear backbone, from a CPU-test model to the released 48B-A3B shape.

``debug`` runs every CPU test in seconds; ``tiny`` trains on a 2-core CPU in minutes (the quickstart);
``small`` (~150M) and ``base`` (~0.8B) are single-GPU research sizes; ``kimi-linear-48b-a3b`` is the
released Kimi Linear config (build it on the meta device). Parameter counts: ``python -m kimi_vl.flavors``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

FLAVORS: dict[str, dict[str, Any]] = {
    "debug": dict(
        vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
        layer_types=["kda", "kda", "kda", "mla"], mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        num_attention_heads=2, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        linear_num_heads=2, linear_head_dim=32, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
        moe_intermediate_size=64, routed_scaling_factor=2.0, attnres_block_size=3,
    ),
    "tiny": dict(
        vocab_size=8192, hidden_size=128, intermediate_size=384, num_hidden_layers=8, attn_ratio="3:1",
        mlp_layer_types=["dense"] * 8, num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, linear_num_heads=4, linear_head_dim=32, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=128, tie_word_embeddings=True, attnres_block_size=4,
    ),
    "small": dict(
        vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, attn_ratio="3:1",
        mlp_layer_types=["dense"] * 12, num_attention_heads=6, kv_lora_rank=256, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, linear_num_heads=6, linear_head_dim=128, attnres_block_size=6,
        num_experts=64, num_experts_per_tok=6, moe_intermediate_size=512,
    ),
    "base": dict(
        vocab_size=32768, hidden_size=1536, intermediate_size=4096, num_hidden_layers=24, attn_ratio="3:1",
        mlp_layer_types=["dense"] * 24, num_attention_heads=12, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, linear_num_heads=12, linear_head_dim=128, attnres_block_size=8,
        num_experts=64, num_experts_per_tok=6, moe_intermediate_size=768,
    ),
    "kimi-linear-48b-a3b": dict(
        vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
        num_hidden_layers=27,
        layer_types=["full_attention" if (i + 1) % 4 == 0 or i == 26 else "linear_attention" for i in range(27)],
        first_k_dense_replace=1, num_attention_heads=32, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, linear_num_heads=32, linear_head_dim=128, num_experts=256,
        num_experts_per_tok=8, num_shared_experts=1, routed_scaling_factor=2.446, rms_norm_eps=1e-5,
        attnres_block_size=6, pad_token_id=163839, bos_token_id=163584, eos_token_id=163586,
    ),
}


def flavor_kwargs(name: str) -> dict[str, Any]:
    """The config keyword arguments of flavor ``name`` (a copy)."""
    if name not in FLAVORS:
        raise ValueError(f"kimi_vl.flavors: unknown flavor {name!r}; known: {sorted(FLAVORS)}")
    return copy.deepcopy(FLAVORS[name])


def count_parameters(model: torch.nn.Module, config: Any) -> dict[str, int]:
    """Total parameters, and active ones per token (routed experts counted ``top_k / num_experts``)."""
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - routed + (routed * config.num_experts_per_tok) // max(config.num_experts, 1)
    embed = model.get_input_embeddings().weight.numel()
    return {"total": total, "active": active, "embedding": embed, "non_embedding": total - embed}


def flavor_table() -> list[dict[str, Any]]:
    """Parameter counts of every flavor, built on the meta device (no memory, no weights)."""
    from kimi_vl.configuration import KimiVLConfig
    from kimi_vl.modeling.model import KimiVLForCausalLM

    rows = []
    for name in FLAVORS:
        cfg = KimiVLConfig.from_flavor(name)
        with torch.device("meta"):
            model = KimiVLForCausalLM(cfg)
        counts = count_parameters(model, cfg)
        n_kda, n_mla = cfg.layer_types.count("linear_attention"), cfg.layer_types.count("full_attention")
        rows.append({"flavor": name, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                     "kda:mla": f"{n_kda}:{n_mla}",
                     "moe_layers": cfg.mlp_layer_types.count("sparse"), **counts})
    return rows


def main() -> None:
    rows = flavor_table()
    print("| flavor | layers | hidden | KDA:MLA | MoE layers | total | active | embedding |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['flavor']} | {r['layers']} | {r['hidden']} | {r['kda:mla']} | {r['moe_layers']} | "
              f"{r['total'] / 1e6:,.2f}M | {r['active'] / 1e6:,.2f}M | {r['embedding'] / 1e6:,.2f}M |")


if __name__ == "__main__":
    main()

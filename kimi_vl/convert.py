"""Conversion between transformers ``kimi_linear`` checkpoints and ``kimi_vl`` ones (``kimi-vl convert``).

One explicit key map, :data:`KEY_MAP`: each rule names our key pattern, the transformers key pattern and
the reshape between them; keys no rule matches are identical in both layouts. The one non-1:1 case, the
MoE expert stacks (theirs ``gate_up_proj [E, 2I, D]``, ours ``gate_proj``/``up_proj [E, I, D]``), is
:data:`EXPERT_SPLIT`. The config map is :data:`CONFIG_FIELDS`. Conversion to transformers refuses
architectures it cannot express (AttnRes, the lower-bound KDA gate).

    kimi-vl convert --from-hf DIR --out DIR      # kimi_linear -> kimi_vl
    kimi-vl convert --to-hf DIR --out DIR        # kimi_vl -> kimi_linear
"""

from __future__ import annotations

import argparse
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Rule:
    """``model.layers.{i}.<ours>`` <-> ``model.layers.{i}.<theirs>`` with the reshape each way."""

    ours: str
    theirs: str
    to_theirs: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    to_ours: Callable[[torch.Tensor], torch.Tensor] = lambda t: t


KEY_MAP: list[Rule] = [
    Rule("self_attn.conv1d_weight", "self_attn.conv1d.weight",
         to_theirs=lambda t: t[:, None, :], to_ours=lambda t: t[:, 0, :]),
    Rule("self_attn.f_a_proj.weight", "self_attn.forget_gate.f_a_proj.weight"),
    Rule("self_attn.f_b_proj.weight", "self_attn.forget_gate.f_b_proj.weight"),
    Rule("self_attn.dt_bias", "self_attn.forget_gate.dt_bias"),
    Rule("self_attn.A_log", "self_attn.forget_gate.A_log",
         to_theirs=lambda t: t.view(1, 1, -1, 1), to_ours=lambda t: t.reshape(-1)),
]
EXPERT_SPLIT = (r"(model\.layers\.\d+\.mlp\.experts)\.gate_up_proj$", ("gate_proj", "up_proj"))

# our field -> transformers KimiLinearConfig field
CONFIG_FIELDS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
    "moe_intermediate_size": "moe_intermediate_size", "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim", "linear_num_heads": "linear_num_heads",
    "linear_head_dim": "linear_head_dim", "linear_conv_kernel_dim": "linear_conv_kernel_dim",
    "num_experts": "num_local_experts", "num_experts_per_tok": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts", "n_group": "n_group", "topk_group": "topk_group",
    "routed_scaling_factor": "routed_scaling_factor", "norm_topk_prob": "norm_topk_prob",
    "layer_types": "layer_types", "mlp_layer_types": "mlp_layer_types", "hidden_act": "hidden_act",
    "rms_norm_eps": "rms_norm_eps", "initializer_range": "initializer_range",
    "tie_word_embeddings": "tie_word_embeddings", "attention_bias": "attention_bias",
    "attention_dropout": "attention_dropout", "pad_token_id": "pad_token_id", "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
}


def state_dict_to_hf(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``KimiVLForCausalLM`` state dict -> transformers ``KimiLinearForCausalLM`` keys and shapes."""
    out: dict[str, torch.Tensor] = {}
    for key, t in ours.items():
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_proj|up_proj)$", key)
        if m:
            if m.group(2) == "gate_proj":
                out[f"{m.group(1)}.gate_up_proj"] = torch.cat([t, ours[f"{m.group(1)}.up_proj"]], dim=1)
            continue
        out.update([_apply(key, t, to_hf=True)])
    return out


def state_dict_from_hf(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers ``KimiLinearForCausalLM`` state dict -> ours."""
    out: dict[str, torch.Tensor] = {}
    for key, t in theirs.items():
        m = re.match(EXPERT_SPLIT[0], key)
        if m:
            gate, up = t.chunk(2, dim=1)
            out[f"{m.group(1)}.{EXPERT_SPLIT[1][0]}"] = gate.contiguous()
            out[f"{m.group(1)}.{EXPERT_SPLIT[1][1]}"] = up.contiguous()
            continue
        out.update([_apply(key, t, to_hf=False)])
    return out


def _apply(key: str, t: torch.Tensor, to_hf: bool) -> tuple[str, torch.Tensor]:
    m = re.match(r"(model\.layers\.\d+)\.(.+)$", key)
    if m:
        for rule in KEY_MAP:
            src, dst = (rule.ours, rule.theirs) if to_hf else (rule.theirs, rule.ours)
            if m.group(2) == src:
                fn = rule.to_theirs if to_hf else rule.to_ours
                return f"{m.group(1)}.{dst}", fn(t).contiguous()
    return key, t


def config_to_hf(config):
    """KimiVLConfig -> transformers KimiLinearConfig; raises when the architecture is not expressible there."""
    from transformers import KimiLinearConfig

    if config.residual_mode != "standard":
        raise ValueError(f"convert --to-hf: residual_mode={config.residual_mode!r} has no kimi_linear equivalent")
    if config.kda_gate_lower_bound is not None:
        raise ValueError("convert --to-hf: kda_gate_lower_bound (sigmoid KDA gate) has no kimi_linear equivalent")
    return KimiLinearConfig(**{theirs: getattr(config, ours) for ours, theirs in CONFIG_FIELDS.items()})


def config_from_hf(hf_config):
    from kimi_vl.configuration import KimiVLConfig

    return KimiVLConfig(**{ours: getattr(hf_config, theirs) for ours, theirs in CONFIG_FIELDS.items()})


def convert_from_hf(hf_model):
    """A transformers ``KimiLinearForCausalLM`` -> our ``KimiVLForCausalLM`` (same weights)."""
    from kimi_vl.modeling.model import KimiVLForCausalLM

    model = KimiVLForCausalLM(config_from_hf(hf_model.config)).to(hf_model.dtype)
    _load_exact(model, state_dict_from_hf(hf_model.state_dict()))
    return model


def convert_to_hf(model):
    """Our ``KimiVLForCausalLM`` -> a transformers ``KimiLinearForCausalLM`` (same weights)."""
    from transformers import KimiLinearForCausalLM

    hf_model = KimiLinearForCausalLM(config_to_hf(model.config)).to(model.dtype)
    _load_exact(hf_model, state_dict_to_hf(model.state_dict()))
    return hf_model


def _load_exact(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = model.state_dict()
    if model.config.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        expected = {k: v for k, v in expected.items() if k != "lm_head.weight"}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"convert: key map mismatch; missing {missing[:8]}, unexpected {unexpected[:8]}")
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise ValueError(f"convert: {k} has shape {tuple(v.shape)}, expected {tuple(expected[k].shape)}")
    model.load_state_dict(state, strict=not model.config.tie_word_embeddings)
    if model.config.tie_word_embeddings:
        model.tie_weights()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="kimi-vl convert", description="convert kimi_linear <-> kimi_vl checkpoints")
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-hf", metavar="DIR", help="a transformers kimi_linear checkpoint directory")
    way.add_argument("--to-hf", metavar="DIR", help="a kimi_vl checkpoint directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    args = parser.parse_args(argv)
    flag, folder = ("--from-hf", args.from_hf) if args.from_hf else ("--to-hf", args.to_hf)
    if not (Path(folder) / "config.json").is_file():
        what = "no such folder" if not Path(folder).exists() else "no config.json there"
        parser.error(f"{flag} {folder}: {what} (expected a checkpoint folder such as RUN/final)")
    import kimi_vl  # noqa: F401  (registers the Auto classes)

    if args.from_hf:
        from transformers import KimiLinearForCausalLM

        src = Path(args.from_hf)
        converted = convert_from_hf(KimiLinearForCausalLM.from_pretrained(src))
        converted.save_pretrained(args.out)
    else:
        from kimi_vl.modeling.model import KimiVLForCausalLM

        src = Path(args.to_hf)
        convert_to_hf(KimiVLForCausalLM.from_pretrained(src)).save_pretrained(args.out)
    _copy_tokenizer(src, Path(args.out))
    print(f"kimi-vl convert: wrote {args.out}")
    return 0


def _copy_tokenizer(src: Path, out: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):
        if (src / name).exists() and not (out / name).exists():
            shutil.copy2(src / name, out / name)

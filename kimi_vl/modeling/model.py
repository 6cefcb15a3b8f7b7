"""KimiVLModel / KimiVLForCausalLM: the Kimi Linear text backbone as a transformers model.

Inputs (``[B, L]`` unless noted): ``input_ids`` or ``inputs_embeds [B, L, D]`` (the multimodal model splices
vision tokens into the embeddings); ``attention_mask`` (1 = token, 0 = padding; with a cache it covers
cached + new tokens, so left-padded batch generation works); ``cu_seqlens`` (int ``[N+1]`` document
boundaries over the flattened ``B*L`` tokens: packed documents never see each other, KDA runs varlen and
MLA gets a block-diagonal causal mask); ``position_ids`` are accepted and unused (NoPE: KDA is the only
positional mechanism). ``labels`` are unshifted; with ``cu_seqlens`` the target of a document's last
token (the next document's first token) is ignored.

Generation: the model builds its own :class:`KimiVLCache` (KDA states + MLA latent/expanded KV) and
``generate()`` threads it through (``_supports_default_dynamic_cache`` is False). Under ``no_grad`` the
AttnRes stream uses the two-phase inference form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from kernels.cross_entropy import cross_entropy
from kernels.host_ints import host_ints
from kimi_vl.configuration import KimiVLConfig
from kimi_vl.modeling.attention import MLAttention
from kimi_vl.modeling.attn_res import AttnResStream, ModuleResQuery, ResProj, StandardStream, queries_sharded
from kimi_vl.modeling.block import DecoderLayer, LayerInputs
from kimi_vl.modeling.cache import CACHE_FIELD, KimiVLCache, StaticKimiVLCache, output_cache, pick_cache
from kimi_vl.modeling.head import IGNORE, LMHead, causal_targets
from kimi_vl.modeling.kda_layer import KDALayer, kda_init_values
from kimi_vl.modeling.masks import MaskSpec, build_mask
from kimi_vl.modeling.moe import Experts, Router
from kimi_vl.modeling.norm import GatedRMSNorm, RMSNorm, TokenEmbedding


class KimiVLPreTrainedModel(PreTrainedModel):
    config_class = KimiVLConfig
    config: KimiVLConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _is_stateful = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, ResProj):
            init.zeros_(module.weight)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (RMSNorm, GatedRMSNorm)):
            init.ones_(module.weight)
        elif isinstance(module, Experts):
            for p in (module.gate_proj, module.up_proj, module.down_proj):
                init.normal_(p, mean=0.0, std=std)
        elif isinstance(module, Router):
            init.normal_(module.weight, mean=0.0, std=std)
            init.zeros_(module.e_score_correction_bias)
            init.zeros_(module.tokens_per_expert)
        elif isinstance(module, MLAttention):
            init.constant_(module.max_logits_H, float("-inf"))
        elif isinstance(module, KDALayer):
            a_log, dt_bias, conv = kda_init_values(module)
            init.copy_(module.A_log, a_log)
            init.copy_(module.dt_bias, dt_bias)
            init.copy_(module.conv1d_weight, conv)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False


class KimiVLModel(KimiVLPreTrainedModel):
    def __init__(self, config: KimiVLConfig) -> None:
        super().__init__(config)
        d = config.hidden_size
        self.embed_tokens = TokenEmbedding(config.vocab_size, d)
        self.layers = nn.ModuleList([DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        attnres = config.residual_mode != "standard"
        self.output_attn_res_proj = ResProj(d) if attnres else None
        self.output_attn_res_norm = RMSNorm(d, config.rms_norm_eps) if attnres else None
        # registered after the output query: ``norm`` must be the last norm child, the one accelerate's FSDP2
        # takes for the final norm and shards with ``lm_head`` in a unit of their own that is gathered only in
        # its modules' forward; the output key norm is never called (the mix reads its weight), so in that unit
        # it stayed sharded (issue 9: mixed Tensor/DTensor in the first forward on 2 H200s)
        self.norm = RMSNorm(d, config.rms_norm_eps)
        if attnres:  # the first sublayer mixes the embedding alone: softmax over one source is 1, so its query and
            # key gain have no effect; frozen so that DDP does not wait for gradients they never get
            self.layers[0].self_attention_res_proj.requires_grad_(False)
            self.layers[0].self_attention_res_norm.requires_grad_(False)
        self.attnres_impl = "auto"  # "auto" | "fused" | "naive" | "two_phase"
        self.record_diagnostics = False
        self.last_diagnostics: dict = {}
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def _stream(self, x: torch.Tensor, token_mask: torch.Tensor | None):
        record = {} if self.record_diagnostics else None
        self.last_diagnostics = record if record is not None else {}
        if self.config.residual_mode == "standard":
            return StandardStream(x, record)
        queries = [q for layer in self.layers for q in layer.res_queries()]
        queries.append(ModuleResQuery(self.output_attn_res_proj, self.output_attn_res_norm))
        size = 1 if self.config.residual_mode == "attnres_full" else self.config.attnres_block_size
        impl = self.attnres_impl
        if impl == "auto":  # two-phase reads a whole block's queries up front: not while FSDP2 shards the layers
            per_use = torch.is_grad_enabled() or record is not None or queries_sharded(queries)
            impl = "fused" if per_use else "two_phase"
        return AttnResStream(x, queries, size, impl, record, token_mask)

    def _masks(self, x: torch.Tensor, attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
               cache: KimiVLCache | None) -> tuple[MaskSpec, torch.Tensor | None]:
        """The MLA mask and the KDA token mask (None when every current token is real) of a dynamic forward."""
        past = cache.get_seq_length() if cache is not None else 0
        kda_mask = None if attention_mask is None else attention_mask[:, -x.shape[1]:]
        if kda_mask is not None and bool(kda_mask.all()):
            kda_mask = None
        use_flex = any(getattr(layer.self_attn, "use_flex", False) for layer in self.layers)
        mask = build_mask(x.shape[1], past + x.shape[1], attention_mask, cu_seqlens, x.device,
                          use_flex and cu_seqlens is not None)
        return mask, kda_mask

    def forward(self, input_ids: torch.LongTensor | None = None, inputs_embeds: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: KimiVLCache | None = None,
                use_cache: bool | None = None, cache: KimiVLCache | None = None, **kwargs) -> BaseModelOutputWithPast:
        past_key_values = pick_cache(past_key_values, cache)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("KimiVLModel.forward: pass exactly one of input_ids and inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, t, d = x.shape
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cu_seqlens is not None:
            _check_packed(cu_seqlens, b * t, past_key_values, use_cache)
            x, attention_mask, use_cache = x.reshape(1, b * t, d), None, False
        if use_cache and past_key_values is None:
            past_key_values = KimiVLCache(self.config)
        if isinstance(past_key_values, StaticKimiVLCache):
            mask, kda_mask = _static_step_mask(past_key_values, x.shape[1], attention_mask), None
        else:
            mask, kda_mask = self._masks(x, attention_mask, cu_seqlens, past_key_values)
        inputs = LayerInputs(mask, kda_mask, cu_seqlens, past_key_values)
        stream = self._stream(x, kda_mask)
        for layer in self.layers:
            layer(stream, inputs)
        if past_key_values is not None:
            past_key_values.advance(x.shape[1])
        hidden = stream.final(self.norm)
        return BaseModelOutputWithPast(last_hidden_state=hidden.reshape(b, t, d), **{CACHE_FIELD: past_key_values})


def _static_step_mask(cache: StaticKimiVLCache, num_tokens: int, attention_mask: torch.Tensor | None) -> MaskSpec:
    """A decode step on a static cache: one token, no attention mask (the cache holds the key mask), no host reads."""
    if num_tokens != 1 or attention_mask is not None:
        raise ValueError(f"KimiVLModel.forward: a StaticKimiVLCache step takes one token per row and no "
                         f"attention_mask (the cache holds the prefill's), got {num_tokens} tokens and "
                         f"attention_mask={'given' if attention_mask is not None else None}")
    return MaskSpec(dense_B1TS=cache.decode_mask_B11S())


def enable_activation_checkpointing(model: nn.Module) -> None:
    """transformers' per-layer activation checkpointing (``activation_checkpointing_enable`` since 5.24, which
    deprecates the older ``gradient_checkpointing_enable``)."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


def _check_packed(cu_seqlens: torch.Tensor, total: int, cache, use_cache: bool | None) -> None:
    bounds = host_ints(cu_seqlens) if cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2 else None
    if bounds is None or bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(f"KimiVLModel.forward: cu_seqlens must be [N+1] from 0 to B*L={total}, got "
                         f"{bounds if bounds is not None and len(bounds) < 20 else tuple(cu_seqlens.shape)}")
    if cache is not None:
        raise ValueError("KimiVLModel.forward: cu_seqlens (packed documents) cannot be combined with past_key_values")


@dataclass
class KimiVLCausalLMOutput(CausalLMOutputWithPast):
    """transformers' causal-LM output plus ``row_losses [B, L]`` fp32: with ``return_logits=False`` (and labels)
    row t's cross entropy against its target (``labels[:, t + 1]``; 0 where ignored), and no logits."""

    row_losses: torch.FloatTensor | None = None


class LMHeadMixin:
    """What every kimi_vl language-model head shares (``self.model`` a :class:`KimiVLModel`, ``self.lm_head``):
    embedding accessors, logits (with ``logits_to_keep``) + loss, and the MoE balancing step."""

    model: KimiVLModel
    lm_head: LMHead

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def _head(self, out: BaseModelOutputWithPast, labels: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
              logits_to_keep: int | torch.Tensor, return_logits: bool = True) -> KimiVLCausalLMOutput:
        hidden = out.last_hidden_state
        if not return_logits:
            return self._row_loss_head(hidden, labels, cu_seqlens, logits_to_keep, output_cache(out))
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden[:, logits_to_keep]
        logits = self.lm_head(hidden)
        loss = None if labels is None else causal_lm_loss(logits, labels, cu_seqlens)
        return KimiVLCausalLMOutput(loss=loss, logits=logits, **{CACHE_FIELD: output_cache(out)})

    def _row_loss_head(self, hidden_BLD: torch.Tensor, labels: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
                       logits_to_keep: int | torch.Tensor, cache) -> KimiVLCausalLMOutput:
        """``return_logits=False``: the loss and per-row losses from the head's fused linear + cross entropy."""
        if labels is None or not isinstance(logits_to_keep, int) or logits_to_keep != 0:
            raise ValueError(f"{type(self).__name__}.forward: return_logits=False computes the loss without the "
                             f"logits, so it needs labels and logits_to_keep=0, got labels="
                             f"{None if labels is None else tuple(labels.shape)}, logits_to_keep={logits_to_keep!r}")
        targets_BL = causal_targets(labels, cu_seqlens)
        if isinstance(self.lm_head, LMHead):
            rows_BL = self.lm_head(hidden_BLD, targets_BL)
        else:  # a plain head set through set_output_embeddings
            rows_BL = cross_entropy(self.lm_head(hidden_BLD), targets_BL, ignore_index=IGNORE, reduction="none")
        loss = rows_BL.sum() / (targets_BL != IGNORE).sum().clamp(min=1)
        return KimiVLCausalLMOutput(loss=loss, row_losses=rows_BL, **{CACHE_FIELD: cache})

    def update_moe_bias(self, rate: float | None = None) -> dict[str, float]:
        """Aux-loss-free balancing step for every MoE layer (call after ``optimizer.step()``); returns stats to log."""
        rate = self.model.config.moe_bias_update_rate if rate is None else rate
        stats = {}
        for i, layer in enumerate(self.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if isinstance(gate, Router):
                stats[f"moe/layer{i}/max_violation"] = gate.update_bias(rate)["max_violation"]
        if stats:
            stats["moe/max_violation"] = max(stats.values())
        return stats


class KimiVLForCausalLM(LMHeadMixin, KimiVLPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: KimiVLConfig) -> None:
        super().__init__(config)
        self.model = KimiVLModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: KimiVLCache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, cu_seqlens: torch.Tensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, cache: KimiVLCache | None = None,
                return_logits: bool = True, **kwargs) -> KimiVLCausalLMOutput:
        out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                         cu_seqlens=cu_seqlens, position_ids=position_ids,
                         past_key_values=pick_cache(past_key_values, cache), use_cache=use_cache)
        return self._head(out, labels, cu_seqlens, logits_to_keep, return_logits)


def causal_lm_loss(logits_BLV: torch.Tensor, labels_BL: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Mean next-token cross entropy (fp32) over targets != -100; packed documents do not predict each other; 0 (with
    zero gradients, not NaN) when no target counts, as the row-loss head's path (``return_logits=False``).

    Row t of ``logits_BLV`` is scored against ``labels_BL[:, t + 1]`` (the last row of each sequence is ignored),
    so the logits are used unsliced and the gradient is written into one logits-shaped buffer."""
    # kernels.cross_entropy: on CUDA a fused kernel that reads the bf16 logits directly (no fp32 copy); on CPU
    # F.cross_entropy on logits.float(); its sum over the count equals its mean bit for bit where a target counts
    targets_BL = causal_targets(labels_BL, cu_seqlens)
    total = cross_entropy(logits_BLV, targets_BL, ignore_index=IGNORE, reduction="sum")
    return total / (targets_BL != IGNORE).sum().clamp(min=1)

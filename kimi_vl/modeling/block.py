"""One decoder layer of the Kimi Linear backbone: two sublayers (token mixer, FFN), each PreNormed.

The residual wiring is not here: each sublayer asks the residual stream for its input and hands back its
raw output (``stream.input(i)`` / ``stream.add(i, out)``, see ``attn_res.py``), so the standard PreNorm sum
and Attention Residuals are swapped in one place. With AttnRes each layer owns its pseudo-queries and key
norms under the checkpoint names of later Kimi releases: ``self_attention_res_{proj,norm}`` and
``mlp_res_{proj,norm}`` (the ``_res_proj`` / ``_res_norm`` suffixes route them to AdamW).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kimi_vl.modeling.attention import MLAttention
from kimi_vl.modeling.attn_res import ModuleResQuery, ResProj, ResQuery
from kimi_vl.modeling.cache import KimiVLCache
from kimi_vl.modeling.kda_layer import KDALayer
from kimi_vl.modeling.masks import MaskSpec
from kimi_vl.modeling.mlp import SwiGLU
from kimi_vl.modeling.moe import MoE
from kimi_vl.modeling.norm import RMSNorm


@dataclass
class LayerInputs:
    """Per-forward context shared by all layers."""

    mask: MaskSpec
    kda_mask_BT: torch.Tensor | None  # 1 = real token (current tokens only), for KDA zeroing and MoE load
    cu_seqlens: torch.Tensor | None
    cache: KimiVLCache | None


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.layer_type = config.layer_types[layer_idx]
        d, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = KDALayer(config, layer_idx) if self.layer_type == "linear_attention" \
            else MLAttention(config, layer_idx)
        self.mlp = MoE(config) if config.mlp_layer_types[layer_idx] == "sparse" \
            else SwiGLU(d, config.intermediate_size)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.attnres = config.residual_mode != "standard"
        if self.attnres:
            self.self_attention_res_proj = ResProj(d)
            self.self_attention_res_norm = RMSNorm(d, eps)
            self.mlp_res_proj = ResProj(d)
            self.mlp_res_norm = RMSNorm(d, eps)
        self.gradient_checkpointing = False

    def res_queries(self) -> list[ResQuery]:
        return [ModuleResQuery(self.self_attention_res_proj, self.self_attention_res_norm),
                ModuleResQuery(self.mlp_res_proj, self.mlp_res_norm)]

    def forward(self, stream, inputs: LayerInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs both sublayers on ``stream``; returns their raw outputs, which the caller may ignore: FSDP2
        (``fully_shard`` per layer, ``reshard_after_forward``) gathers the layer again for backward from a hook on
        the forward's output tensors, so a layer that returned nothing was never re-gathered (its backward read
        freed storage)."""
        first = 2 * self.layer_idx
        mixer_out = self._sublayer(self._mixer, self.input_layernorm, stream, first, inputs)
        ffn_out = self._sublayer(self._ffn, self.post_attention_layernorm, stream, first + 1, inputs)
        return mixer_out, ffn_out

    def _sublayer(self, fn, norm: nn.Module, stream, i: int, inputs: LayerInputs) -> torch.Tensor:
        """``fn(norm(stream input i))``, added to the stream. The stream applies the norm (AttnRes can fuse it into
        its mix), except under activation checkpointing: there the norm is recomputed inside the checkpointed
        function as before, so that the norm's saved input is not kept beside the checkpoint's."""
        if self.gradient_checkpointing and self.training and inputs.cache is None:
            out = self._gradient_checkpointing_func(lambda h, inp: fn(norm(h), inp), stream.input(i), inputs)
        else:
            out = fn(stream.input(i, norm), inputs)
        stream.add(i, out)
        return out

    def _mixer(self, x: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        layer_cache = None if inputs.cache is None else inputs.cache.layers[self.layer_idx]
        if self.layer_type == "linear_attention":
            return self.self_attn(x, inputs.kda_mask_BT, inputs.cu_seqlens, layer_cache)
        return self.self_attn(x, inputs.mask, layer_cache)

    def _ffn(self, x: torch.Tensor, inputs: LayerInputs) -> torch.Tensor:
        if isinstance(self.mlp, MoE):
            return self.mlp(x, inputs.kda_mask_BT)
        return self.mlp(x)

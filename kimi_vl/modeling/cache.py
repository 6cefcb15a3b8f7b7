"""Hybrid inference cache of the Kimi Linear backbone: constant-size KDA state, growing MLA cache.

Per KDA layer: the short-conv state ``[B, 3*H*K, W-1]`` (last W-1 inputs of the fused q|k|v projection)
and the recurrent state ``[B, H, K, V]`` (fp32). Per MLA layer, by ``config.mla_cache_mode``:
``"latent"`` keeps the RMS-normed ``c_kv [B, S, R]`` and the shared ``k_rope [B, S, dr]`` (DeepSeek-V2's
compressed cache, what Kimi Linear serves with), ``"expanded"`` keeps per-head ``k [B, H, S, dq]`` and
``v [B, H, S, V]``. The cache is created by the model's forward when ``use_cache`` is on and returned in the
output's cache field; ``generate()`` passes it back (the model opts out of transformers' DynamicCache).

transformers renamed that field and the forward argument from ``past_key_values`` to ``cache`` during 5.x (5.17
has the old name, 5.24 the new one, keeping the old as a deprecated alias); the models accept both arguments
(:func:`pick_cache`), build outputs with :data:`CACHE_FIELD` (whichever name the installed output classes
have) and callers read it back with :func:`output_cache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def pick_cache(past_key_values: Any, cache: Any) -> Any:
    """The cache a forward was given under either name (passing two different ones is an error)."""
    if past_key_values is not None and cache is not None and past_key_values is not cache:
        raise ValueError("pass the cache once: as cache= or as past_key_values=, not two different objects")
    return cache if cache is not None else past_key_values


def output_cache(out: Any) -> Any:
    """The cache a model output carries, under whichever name this transformers uses."""
    return getattr(out, CACHE_FIELD, None)


@dataclass
class KDALayerCache:
    conv_state: torch.Tensor | None = None  # [B, 3*H*K, W-1]
    recurrent_state: torch.Tensor | None = None  # [B, H, K, V] fp32
    seen_tokens: int = 0

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.conv_state, self.recurrent_state) if t is not None]


@dataclass
class MLALayerCache:
    mode: str = "latent"
    first: torch.Tensor | None = None  # latent: c_kv [B, S, R];  expanded: k [B, H, S, dq]
    second: torch.Tensor | None = None  # latent: k_rope [B, S, dr];  expanded: v [B, H, S, V]

    @property
    def seq_dim(self) -> int:
        return 1 if self.mode == "latent" else 2

    def update(self, first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's entries along the sequence axis; returns the whole cache."""
        if self.first is None:
            self.first, self.second = first, second
        else:
            self.first = torch.cat([self.first, first], dim=self.seq_dim)
            self.second = torch.cat([self.second, second], dim=self.seq_dim)
        return self.first, self.second

    def seq_length(self) -> int:
        return 0 if self.first is None else self.first.shape[self.seq_dim]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.first, self.second) if t is not None]


class KimiVLCache:
    """One entry per layer (:class:`KDALayerCache` or :class:`MLALayerCache`) in layer order."""

    is_compileable = False

    def __init__(self, config) -> None:
        self.layers: list[KDALayerCache | MLALayerCache] = [
            KDALayerCache() if t == "linear_attention" else MLALayerCache(mode=config.mla_cache_mode)
            for t in config.layer_types
        ]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen so far (padding included), the same for every layer."""
        for layer in self.layers:
            if isinstance(layer, MLALayerCache):
                return layer.seq_length()
        return self.layers[0].seen_tokens if self.layers else 0

    def advance(self, num_tokens: int) -> None:
        for layer in self.layers:
            if isinstance(layer, KDALayerCache):
                layer.seen_tokens += num_tokens

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.tensors())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select/reorder the batch rows (beam search, dropping finished requests)."""
        for layer in self.layers:
            if isinstance(layer, KDALayerCache):
                layer.conv_state = layer.conv_state.index_select(0, beam_idx) if layer.conv_state is not None else None
                layer.recurrent_state = (layer.recurrent_state.index_select(0, beam_idx)
                                         if layer.recurrent_state is not None else None)
            elif layer.first is not None:
                layer.first = layer.first.index_select(0, beam_idx)
                layer.second = layer.second.index_select(0, beam_idx)

    def __len__(self) -> int:
        return len(self.layers)

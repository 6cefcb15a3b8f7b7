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
    static: bool = False  # the states are preallocated buffers that keep their storage (StaticKimiVLCache)

    def store(self, conv_state: torch.Tensor | None = None, recurrent_state: torch.Tensor | None = None) -> None:
        """Keep a step's new states: by reference, or copied into the buffers of a static cache (a CUDA graph
        reads and writes fixed addresses)."""
        for name, new in (("conv_state", conv_state), ("recurrent_state", recurrent_state)):
            if new is None:
                continue
            if self.static:
                getattr(self, name).copy_(new)
            else:
                setattr(self, name, new)

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

    def joint(self) -> torch.Tensor | None:
        """Latent mode: ``[c_kv, k_rope]`` ``[B, S, R + dr]`` when ``first`` and ``second`` are views of one such
        tensor (a static cache), else None."""
        return None

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


@dataclass
class StaticMLALayerCache(MLALayerCache):
    """An MLA cache preallocated to ``capacity`` entries along the sequence axis. A decode step writes its one entry
    at the device index ``position`` (shared by every layer of the cache) and attends the whole buffer under the
    cache's key mask, so shapes and addresses never change (the step can be a CUDA graph)."""

    position: torch.Tensor | None = None  # int64 [1]
    _joint: torch.Tensor | None = None  # latent: [B, capacity, R + dr], first and second are its column views

    def joint(self) -> torch.Tensor | None:
        return self._joint

    def update(self, first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if first.shape[self.seq_dim] != 1:
            raise ValueError(f"StaticMLALayerCache.update: a static cache takes one token per step, got "
                             f"{first.shape[self.seq_dim]} (prefill with a KimiVLCache, then "
                             "StaticKimiVLCache.from_prefill)")
        self.first.index_copy_(self.seq_dim, self.position, first)
        self.second.index_copy_(self.seq_dim, self.position, second)
        return self.first, self.second

    def seq_length(self) -> int:
        return self.first.shape[self.seq_dim]  # the attended span: the whole buffer, masked


class StaticKimiVLCache(KimiVLCache):
    """A :class:`KimiVLCache` of fixed shapes for single-token decode steps (``kimi_vl.generation.GraphDecoder``).

    Built from a prefill's dynamic cache by :meth:`from_prefill`: the KDA states are copied into buffers the steps
    update in place; each MLA layer's entries go into a ``[B, capacity, ...]`` buffer at the device index
    ``position``; the MLA key mask is ``key_mask_BS & (s <= position)``, with ``key_mask_BS`` the prefill's
    attention mask (left padding) followed by ones. ``length`` is the host's count of the tokens in the cache;
    a step on the device advances ``position`` by itself (a replayed graph runs no Python), so whoever replays
    steps keeps ``length`` (:meth:`note_replayed`)."""

    def __init__(self, config, batch_size: int, capacity: int, device: torch.device, like: KimiVLCache) -> None:
        """Zeroed buffers shaped like ``like``'s layers (a prefill cache of ``batch_size`` rows); see :meth:`load`."""
        super().__init__(config)
        self.batch_size, self.capacity, self.length = batch_size, capacity, 0
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.key_mask_BS = torch.ones(batch_size, capacity, dtype=torch.bool, device=device)
        self.positions_S = torch.arange(capacity, device=device)
        for i, (layer, src) in enumerate(zip(self.layers, like.layers)):
            if isinstance(layer, KDALayerCache):
                if src.conv_state is None or src.recurrent_state is None:
                    raise ValueError(f"StaticKimiVLCache: KDA layer {i} of the prefill cache has no state")
                layer.conv_state = torch.zeros_like(src.conv_state)
                layer.recurrent_state = torch.zeros_like(src.recurrent_state)
                layer.static = True
            else:
                if src.first is None:
                    raise ValueError(f"StaticKimiVLCache: MLA layer {i} of the prefill cache is empty")
                self.layers[i] = _static_mla(src, capacity, self.position)

    @classmethod
    def from_prefill(cls, config, prefill: KimiVLCache, capacity: int,
                     attention_mask_BL: torch.Tensor | None = None) -> StaticKimiVLCache:
        """A static cache of ``capacity`` tokens holding ``prefill``'s state (see :meth:`load`)."""
        ref = next(t for layer in prefill.layers for t in layer.tensors())
        cache = cls(config, ref.shape[0], capacity, ref.device, prefill)
        cache.load(prefill, attention_mask_BL)
        return cache

    def load(self, prefill: KimiVLCache, attention_mask_BL: torch.Tensor | None = None) -> None:
        """Copy a prefill's dynamic cache into this one's buffers (same batch size, layers and dtypes), so that
        a decode step captured on this cache replays on the new state."""
        length = prefill.get_seq_length()
        if length >= self.capacity:
            raise ValueError(f"StaticKimiVLCache.load: the prefill holds {length} tokens, the capacity is "
                             f"{self.capacity}: no room for a decode step")
        if attention_mask_BL is not None and tuple(attention_mask_BL.shape) != (self.batch_size, length):
            raise ValueError(f"StaticKimiVLCache.load: attention_mask must be [B={self.batch_size}, L={length}], "
                             f"got {tuple(attention_mask_BL.shape)}")
        for i, (layer, src) in enumerate(zip(self.layers, prefill.layers)):
            for dst, new in zip(layer.tensors(), src.tensors()):
                if isinstance(layer, StaticMLALayerCache):
                    dst = dst.narrow(layer.seq_dim, 0, length)
                if dst.shape != new.shape:
                    raise ValueError(f"StaticKimiVLCache.load: layer {i} holds {tuple(new.shape)} where this "
                                     f"cache has {tuple(dst.shape)} (another batch size or model?)")
                dst.copy_(new)
        self.key_mask_BS.fill_(True)
        if attention_mask_BL is not None:
            self.key_mask_BS[:, :length].copy_(attention_mask_BL.bool())
        self.position.fill_(length)
        self.length = length

    def decode_mask_B11S(self) -> torch.Tensor:
        """The MLA mask of this step's token (bool, True = visible), from device tensors only."""
        return (self.key_mask_BS & (self.positions_S <= self.position))[:, None, None, :]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def advance(self, num_tokens: int) -> None:
        self.note_replayed(num_tokens)
        self.position.add_(num_tokens)

    def note_replayed(self, num_tokens: int = 1) -> None:
        """Count ``num_tokens`` steps that ran without Python (a replayed graph already advanced ``position``)."""
        if self.length + num_tokens > self.capacity:
            raise ValueError(f"StaticKimiVLCache: {self.length} + {num_tokens} tokens exceed the capacity "
                             f"{self.capacity}")
        self.length += num_tokens

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch rows in place (the buffers keep their addresses)."""
        for t in [self.key_mask_BS] + [t for layer in self.layers for t in layer.tensors()]:
            t.copy_(t.index_select(0, beam_idx))


def _with_length(t: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = length
    return t.new_zeros(shape)


def _static_mla(src: MLALayerCache, capacity: int, position: torch.Tensor) -> StaticMLALayerCache:
    """Buffers shaped like ``src``'s with ``capacity`` entries; in latent mode ``c_kv`` and ``k_rope`` are column
    views of one ``[B, capacity, R + dr]`` tensor, the absorbed attention's key (no concatenation per step)."""
    if src.mode != "latent":
        return StaticMLALayerCache(mode=src.mode, position=position, first=_with_length(src.first, 2, capacity),
                                   second=_with_length(src.second, 2, capacity))
    r = src.first.shape[-1]
    joint = src.first.new_zeros(src.first.shape[0], capacity, r + src.second.shape[-1])
    return StaticMLALayerCache(mode="latent", position=position, first=joint[..., :r], second=joint[..., r:],
                               _joint=joint)

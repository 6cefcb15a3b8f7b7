"""KimiVLForConditionalGeneration: MoonViT(-3D) + projector + the Kimi Linear backbone (early fusion).

REFERENCE.md sections 5-6; inputs as transformers' ``Kimi_K25ForConditionalGeneration``. Media placeholder
tokens in ``input_ids`` (``image_token_id`` for images, ``video_token_id`` for video chunks) are replaced,
in order, by the projected vision tokens at the embedding level; then the text model runs on
``inputs_embeds``. A mismatch between placeholder count and vision-token count is a ``ValueError``.

Vision settings live in ``KimiVLConfig.vision_config`` (a plain dict, so the config stays JSON):
``MoonViTConfig`` fields (``out_hidden_size`` is forced to the text ``hidden_size``) plus
``image_token_id`` / ``video_token_id``. Example::

    cfg = KimiVLConfig.from_flavor("debug", vision_config=vision_config_dict("debug", 500, 501))
    model = KimiVLForConditionalGeneration(cfg)
    out = model(input_ids, pixel_values=pv, image_grid_thw=grid, labels=labels)

Shapes: ``B`` batch, ``L`` tokens, ``D`` text width, ``P`` packed patches, ``N`` vision tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init

from kimi_vl.configuration import KimiVLConfig
from kimi_vl.modeling.cache import pick_cache
from kimi_vl.modeling.head import LMHead
from kimi_vl.modeling.model import KimiVLCausalLMOutput, KimiVLModel, KimiVLPreTrainedModel, LMHeadMixin
from vision_encoder.config import MoonViTConfig, moonvit_config
from vision_encoder.model import MoonViT, MoonViTPositionEmbedding, sincos_time_table
from vision_encoder.rope_2d import rope_inv_freq

MEDIA_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
_TOKEN_KEYS = ("image_token_id", "video_token_id")


def vision_config_dict(flavor: str, image_token_id: int, video_token_id: int, **overrides: object) -> dict:
    """A ``KimiVLConfig.vision_config`` dict from a MoonViT flavor and the two placeholder token ids."""
    return {**moonvit_config(flavor, **overrides).to_dict(), "image_token_id": image_token_id,
            "video_token_id": video_token_id}


def parse_vision_config(config: KimiVLConfig) -> tuple[MoonViTConfig, int, int]:
    """``(MoonViTConfig with the projector to the text width, image_token_id, video_token_id)``."""
    vc = dict(config.vision_config or {})
    missing = [k for k in _TOKEN_KEYS if k not in vc]
    if missing:
        raise ValueError(f"KimiVLConfig.vision_config needs {missing} (kimi_vl/modeling/multimodal.py)")
    image_id, video_id = int(vc.pop("image_token_id")), int(vc.pop("video_token_id"))
    known = {f.name for f in fields(MoonViTConfig)}
    unknown = sorted(set(vc) - known)
    if unknown:
        raise ValueError(f"KimiVLConfig.vision_config has unknown keys {unknown}; known: {sorted(known)}")
    vc["out_hidden_size"] = config.hidden_size
    return MoonViTConfig(**vc), image_id, video_id


class KimiVLForConditionalGeneration(LMHeadMixin, KimiVLPreTrainedModel, GenerationMixin):
    """Vision tower (``vision_tower.*``, projector at ``vision_tower.projector.*``) + ``model.*`` + ``lm_head``.

    The text keys equal ``KimiVLForCausalLM``'s, so a text checkpoint loads into it unchanged.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _no_split_modules = ["DecoderLayer", "MoonViTBlock"]

    def __init__(self, config: KimiVLConfig) -> None:
        super().__init__(config)
        vision_cfg, self.image_token_id, self.video_token_id = parse_vision_config(config)
        self.vision_tower = MoonViT(vision_cfg)
        self.model = KimiVLModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, MoonViTPositionEmbedding):
            init.trunc_normal_(module.table, std=self.config.initializer_range)
            init.copy_(module.time_table, sincos_time_table(module.max_frames, module.table.shape[-1]))
        elif isinstance(module, MoonViT):
            init.copy_(module.rope_inv_freq, rope_inv_freq(module.config.head_dim, module.config.rope_theta))
            for block in module.blocks:
                init.constant_(block.attn.max_logits_H, float("-inf"))

    def get_image_features(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` projected vision tokens for packed images (or video chunks), in order."""
        return self.vision_tower(pixel_values, image_grid_thw).projected

    get_video_features = get_image_features

    def embed_multimodal(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                         image_grid_thw: torch.Tensor | None = None, pixel_values_videos: torch.Tensor | None = None,
                         video_grid_thw: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, L, D]`` token embeddings with every placeholder replaced by its vision token."""
        ids = input_ids.masked_fill((input_ids == self.image_token_id) | (input_ids == self.video_token_id), 0)
        embeds = self.model.embed_tokens(ids)
        feats = self._joint_features(pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw)
        for token_id, pv, grid, name, f in ((self.image_token_id, pixel_values, image_grid_thw, "image", feats[0]),
                                            (self.video_token_id, pixel_values_videos, video_grid_thw, "video",
                                             feats[1])):
            embeds = self._splice(embeds, input_ids == token_id, pv, grid, name, f)
        return embeds

    def _joint_features(self, pixel_values: torch.Tensor | None, image_grid_thw: torch.Tensor | None,
                        pixel_values_videos: torch.Tensor | None,
                        video_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """With images and video chunks both present: their projected tokens from ONE packed tower call (the
        tower's launches once instead of twice; chunks of any ``t`` share a packed batch and never attend to each
        other), split at the images' token count; else ``(None, None)`` and each is encoded in :meth:`_splice`."""
        if any(x is None for x in (pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw)):
            return None, None
        merge = self.vision_tower.config.merge_size
        n_image = sum((h // merge) * (w // merge) for _, h, w in image_grid_thw.tolist())
        feats_ND = self.get_image_features(torch.cat([pixel_values, pixel_values_videos.to(pixel_values.dtype)]),
                                           torch.cat([image_grid_thw, video_grid_thw.to(image_grid_thw.device)]))
        return feats_ND[:n_image], feats_ND[n_image:]

    def _splice(self, embeds_BLD: torch.Tensor, mask_BL: torch.Tensor, pixel_values: torch.Tensor | None,
                grid_thw: torch.Tensor | None, name: str, feats_ND: torch.Tensor | None = None) -> torch.Tensor:
        if pixel_values is None:
            _check_slots(mask_BL, 0, name,
                         lambda n: f"input_ids has {n} {name} placeholder tokens but no {name} pixel values")
            return embeds_BLD
        if grid_thw is None:
            raise ValueError(f"{name} pixel values of shape {tuple(pixel_values.shape)} need a {name} grid_thw")
        if feats_ND is None:
            feats_ND = self.get_image_features(pixel_values, grid_thw)
        _check_slots(mask_BL, feats_ND.shape[0], name,
                     lambda n: f"{name} tokens do not match: input_ids has {n} {name} placeholders, the vision "
                               f"encoder produced {feats_ND.shape[0]} tokens for grid_thw {grid_thw.tolist()}")
        return scatter_rows(embeds_BLD, mask_BL.to(embeds_BLD.device), feats_ND.to(embeds_BLD.dtype))

    def forward(self, input_ids: torch.LongTensor | None = None, pixel_values: torch.Tensor | None = None,
                image_grid_thw: torch.LongTensor | None = None, pixel_values_videos: torch.Tensor | None = None,
                video_grid_thw: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None, position_ids: torch.LongTensor | None = None,
                past_key_values=None, inputs_embeds: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, use_cache: bool | None = None,
                logits_to_keep: int | torch.Tensor = 0, cache=None, return_logits: bool = True,
                **kwargs) -> KimiVLCausalLMOutput:
        past_key_values = pick_cache(past_key_values, cache)
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("KimiVLForConditionalGeneration.forward: pass input_ids or inputs_embeds")
            decoding = past_key_values is not None and past_key_values.get_seq_length() > 0
            if decoding and pixel_values is None and pixel_values_videos is None:
                # a placeholder the model generated itself during decoding is an ordinary token
                inputs_embeds = self.model.embed_tokens(input_ids)
            else:
                inputs_embeds = self.embed_multimodal(input_ids, pixel_values, image_grid_thw, pixel_values_videos,
                                                      video_grid_thw)
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, cu_seqlens=cu_seqlens,
                         position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache)
        return self._head(out, labels, cu_seqlens, logits_to_keep, return_logits)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs) -> dict:
        """Media enter only on the prefill step; later steps feed one new token against the cache."""
        inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        cache = pick_cache(inputs.get("past_key_values"), inputs.get("cache"))
        if cache is not None and cache.get_seq_length() > 0:
            for key in MEDIA_KEYS:
                inputs[key] = None
        return inputs


def register() -> None:
    """``AutoModelForImageTextToText`` knows ``model_type="kimi_vl"`` (also done on import of this module)."""
    from transformers import AutoModelForImageTextToText

    AutoModelForImageTextToText.register(KimiVLConfig, KimiVLForConditionalGeneration, exist_ok=True)


register()


def _check_slots(mask_BL: torch.Tensor, expected: int, name: str, error: Callable[[int], str]) -> None:
    """``mask_BL`` must have ``expected`` True entries (``name`` placeholders). On the host a ``ValueError`` with
    ``error(count)``, built only then; on a GPU an asynchronous device-side assertion with a short fixed message, so
    a training step never waits for the count."""
    if mask_BL.device.type == "cpu":
        n_slots = int(mask_BL.sum())
        if n_slots != expected:
            raise ValueError(error(n_slots))
    else:
        torch._assert_async(mask_BL.sum() == expected, f"{name} placeholders in input_ids != {expected} vision tokens")


def scatter_rows(embeds_BLD: torch.Tensor, mask_BL: torch.Tensor, rows_ND: torch.Tensor) -> torch.Tensor:
    """``embeds_BLD`` with its ``mask_BL`` positions replaced by the rows of ``rows_ND``, in order (the values of
    ``embeds.masked_scatter(mask[..., None], rows)``). The positions come from ``nonzero_static`` with the known
    row count and the rows go in with ``index_copy``, whose backward is an ``index_select``: unlike
    ``masked_scatter`` (whose backward is a ``masked_select`` of data-dependent size), neither direction
    synchronises the host with the GPU. Assumes exactly N True entries (see :func:`_check_slots`)."""
    b, length, d = embeds_BLD.shape
    idx_N = torch.nonzero_static(mask_BL.reshape(-1), size=rows_ND.shape[0]).squeeze(1)
    return embeds_BLD.reshape(b * length, d).index_copy(0, idx_N, rows_ND).view(b, length, d)

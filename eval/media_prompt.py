"""Prompts with images and video for the ``kimi_vl`` lm-eval model: placeholders -> media tokens + pixels.

lm-eval's multimodal tasks put ``<image>`` in the prompt text where each image goes and hand the images over
as ``{"visual": [PIL images]}``. Here:

- ``<image>`` placeholders are replaced, in order, by the contract's image block (``docs/INTERFACES.md``)
  ``<|media_begin|>image<|media_content|>`` + ``<|media_pad|>`` x n + ``<|media_end|>``, with ``n`` from the
  patch grid (``vision_encoder.geometry.tokens_for_grid``). A prompt without placeholders gets its images in
  front, one block per image followed by a newline. A count mismatch is an error.
- A prompt containing ``<video>`` treats *all* its visuals as the sampled frames of one video (frame ``i`` at
  ``i / video_fps`` seconds): each chunk becomes ``HH:MM:SS.mmm<|media_begin|>video<|media_content|>`` +
  ``<|kimi_k25_video_placeholder|>`` x n + ``<|media_end|>``.

Pixels come from :class:`vision_encoder.processor.MoonViTProcessor`; the result carries the model kwargs
(``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``) in placeholder order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vision_encoder.geometry import tokens_for_grid
from vision_encoder.processor import MoonViTProcessor, chunk_prompt_timestamps

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_END = "<|media_begin|>", "<|media_content|>", "<|media_end|>"
IMAGE_PAD, VIDEO_PAD = "<|media_pad|>", "<|kimi_k25_video_placeholder|>"


@dataclass
class MediaPrompt:
    """Prompt text with media blocks expanded, and the pixel tensors the model needs for it."""

    text: str
    n_image_tokens: int = 0
    n_video_tokens: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def image_block(n_tokens: int) -> str:
    return f"{MEDIA_BEGIN}image{MEDIA_CONTENT}{IMAGE_PAD * n_tokens}{MEDIA_END}"


def video_chunk_block(timestamp: str, n_tokens: int) -> str:
    return f"{timestamp}{MEDIA_BEGIN}video{MEDIA_CONTENT}{VIDEO_PAD * n_tokens}{MEDIA_END}"


def _grid_tokens(grid_thw: torch.Tensor, geo: Any) -> list[int]:
    return [tokens_for_grid(int(t), int(h), int(w), geo) for t, h, w in grid_thw.tolist()]


def build_media_prompt(text: str, visuals: list[Any], processor: MoonViTProcessor, video_fps: float = 1.0
                       ) -> MediaPrompt:
    """Expand ``<image>``/``<video>`` placeholders of ``text`` for ``visuals`` (see the module docstring)."""
    if not visuals:
        if IMAGE_PLACEHOLDER in text or VIDEO_PLACEHOLDER in text:
            raise ValueError(f"prompt has media placeholders but no visuals: {text[:80]!r}")
        return MediaPrompt(text)
    if VIDEO_PLACEHOLDER in text:
        if text.count(VIDEO_PLACEHOLDER) != 1 or IMAGE_PLACEHOLDER in text:
            raise ValueError(f"a video prompt needs exactly one {VIDEO_PLACEHOLDER} and no {IMAGE_PLACEHOLDER}")
        pixels, grid, times = processor.preprocess_video(list(visuals), fps=video_fps)
        counts = _grid_tokens(grid, processor.config.video_geometry)
        blocks = "".join(video_chunk_block(ts, n) for ts, n in zip(chunk_prompt_timestamps(times), counts))
        return MediaPrompt(text.replace(VIDEO_PLACEHOLDER, blocks), n_video_tokens=sum(counts),
                           tensors={"pixel_values_videos": pixels, "video_grid_thw": grid})
    pixels, grid = processor.preprocess_images(list(visuals))
    counts = _grid_tokens(grid, processor.config.image_geometry)
    n_slots = text.count(IMAGE_PLACEHOLDER)
    if n_slots == 0:
        text = "".join(image_block(n) + "\n" for n in counts) + text
    elif n_slots != len(visuals):
        raise ValueError(f"prompt has {n_slots} {IMAGE_PLACEHOLDER} placeholders but {len(visuals)} images")
    else:
        parts = text.split(IMAGE_PLACEHOLDER)
        text = parts[0] + "".join(image_block(n) + rest for n, rest in zip(counts, parts[1:]))
    return MediaPrompt(text, n_image_tokens=sum(counts), tensors={"pixel_values": pixels, "image_grid_thw": grid})


def merge_media(prompts: list[MediaPrompt]) -> dict[str, torch.Tensor]:
    """Concatenate the pixel tensors of a batch's rows, in row order (the model reads placeholders row-major)."""
    out: dict[str, list[torch.Tensor]] = {}
    for p in prompts:
        for k, v in p.tensors.items():
            out.setdefault(k, []).append(v)
    return {k: torch.cat(v) for k, v in out.items()}


__all__ = ["IMAGE_PAD", "VIDEO_PAD", "MediaPrompt", "build_media_prompt", "image_block", "merge_media",
           "video_chunk_block"]

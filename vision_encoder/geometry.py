"""Image geometry shared by the processor, the encoder and the data pipeline (no torch needed).

One place decides how an image of ``(height, width)`` pixels is resized and padded, how many 14-px
patches it becomes, and how many language-model tokens the encoder emits for it, so the prompt-side
placeholder count always equals the encoder's output count (REFERENCE.md section 5).

Rules (navit-style, matching ``transformers.models.kimi_k25``'s ``navit_resize``):

- patches per side = ``side // patch_size`` (at least 1); if their product exceeds ``max_patches``,
  scale both sides by ``sqrt(max_patches / patches)``; never upsample; cap each side at
  ``max_patches_per_side * patch_size`` pixels;
- pad right/bottom to a multiple of ``merge_size * patch_size`` (28 px);
- the padded grid is ``(pad_h / 14, pad_w / 14)`` patches; the 2x2 merger turns it into
  ``(pad_h / 28) * (pad_w / 28)`` tokens; video chunks of up to ``frames_per_chunk`` frames share one
  resize and are averaged over time, so a chunk emits as many tokens as one image of its size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PatchGeometry:
    """The knobs that decide resize, patch grid and token count."""

    patch_size: int = 14
    merge_size: int = 2
    max_patches: int = 4096
    max_patches_per_side: int = 512
    frames_per_chunk: int = 4

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "max_patches", "max_patches_per_side", "frames_per_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"PatchGeometry.{name} must be >= 1, got {getattr(self, name)}")


DEFAULT_GEOMETRY = PatchGeometry()


def resize_and_pad_hw(height: int, width: int, geo: PatchGeometry = DEFAULT_GEOMETRY) -> tuple[int, int, int, int]:
    """``(resized_h, resized_w, padded_h, padded_w)`` in pixels for an image of ``height x width``."""
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got height={height} width={width}")
    p = geo.patch_size
    patches = max(1, height // p) * max(1, width // p)
    side_cap = geo.max_patches_per_side * p
    scale = min(1.0, math.sqrt(geo.max_patches / patches), side_cap / height, side_cap / width)
    new_h = min(max(1, int(height * scale)), side_cap)
    new_w = min(max(1, int(width * scale)), side_cap)
    factor = geo.merge_size * p
    return new_h, new_w, _round_up(new_h, factor), _round_up(new_w, factor)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def patch_grid_hw(height: int, width: int, geo: PatchGeometry = DEFAULT_GEOMETRY) -> tuple[int, int]:
    """The encoder's patch grid ``(grid_h, grid_w)`` for an image, after resize and padding."""
    _, _, pad_h, pad_w = resize_and_pad_hw(height, width, geo)
    return pad_h // geo.patch_size, pad_w // geo.patch_size


def num_chunks(num_frames: int, geo: PatchGeometry = DEFAULT_GEOMETRY) -> int:
    """How many temporal chunks a clip of ``num_frames`` frames is split into (an image is one)."""
    if num_frames < 1:
        raise ValueError(f"a clip needs at least one frame, got {num_frames}")
    return -(-num_frames // geo.frames_per_chunk)


def tokens_for_grid(grid_t: int, grid_h: int, grid_w: int, geo: PatchGeometry = DEFAULT_GEOMETRY) -> int:
    """LLM tokens the encoder emits for one chunk with patch grid ``(t, h, w)`` (t is pooled away)."""
    m = geo.merge_size
    if grid_h % m or grid_w % m or grid_t < 1:
        raise ValueError(f"grid (t={grid_t}, h={grid_h}, w={grid_w}) is not a valid padded grid for merge {m}")
    return (grid_h // m) * (grid_w // m)


def num_vision_tokens(num_frames: int, height: int, width: int, geo: PatchGeometry = DEFAULT_GEOMETRY) -> int:
    """LLM tokens for an image (``num_frames=1``) or a clip of ``num_frames`` frames of ``height x width``.

    This is the single source of truth for the number of media placeholder tokens in a prompt.
    """
    grid_h, grid_w = patch_grid_hw(height, width, geo)
    return num_chunks(num_frames, geo) * tokens_for_grid(1, grid_h, grid_w, geo)

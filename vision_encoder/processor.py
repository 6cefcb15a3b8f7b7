"""MoonViT processor: images and video -> normalised packed patches + ``grid_thw``.

Implements the input side of REFERENCE.md section 5 (MoonViT / MoonViT-3D) and reproduces the pixel
pipeline of ``transformers.models.kimi_k25`` (``Kimi_K25ImageProcessor`` / ``Kimi_K25VideoProcessor``)
so converted checkpoints see the same inputs:

1. RGB conversion (transparency composited onto white, grayscale expanded) - done with PIL;
2. navit resize from ``geometry.resize_and_pad_hw`` (never upsample, patch budget, per-side cap),
   bicubic with antialias on uint8, like torchvision's ``resize``;
3. zero padding right/bottom to multiples of ``merge_size * patch_size`` (28 px), before normalising;
4. ``(x - 127.5) / 127.5`` (mean = std = 0.5 after /255);
5. row-major patchify: ``[C, H, W] -> [gh * gw, C, 14, 14]``; a video chunk of ``t`` frames gives
   ``[t * gh * gw, C, 14, 14]`` (frame-major), with ``grid_thw = (t, gh, gw)``.

Video: frames are sampled at ``fps`` (or a fixed count), split into chunks of up to
``geo.frames_per_chunk`` consecutive frames that share one resize; each chunk gets the timestamp of
its first frame (``HH:MM:SS.mmm``, as the kimi_k25 prompt format wants).

Shapes: ``P`` = total patches, ``n`` = images or chunks, ``T`` = frames.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vision_encoder.geometry import DEFAULT_GEOMETRY, PatchGeometry, num_vision_tokens, resize_and_pad_hw

ImageLike = Any  # PIL.Image.Image | np.ndarray [H, W, C] uint8 | torch.Tensor [C, H, W] uint8 | str | bytes
# The K2.5 image processor uses a 16384-patch budget for images and 4096 for video; the suite's default
# geometry keeps 4096 for both (cheaper), and either can be set per processor.
K25_IMAGE_GEOMETRY = PatchGeometry(max_patches=16384)


@dataclass
class MoonViTProcessorConfig:
    """Settings of the processor (the geometry decides sizes; the rest decides pixel values)."""

    image_geometry: PatchGeometry = field(default_factory=lambda: DEFAULT_GEOMETRY)
    video_geometry: PatchGeometry = field(default_factory=lambda: DEFAULT_GEOMETRY)
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    video_fps: float = 2.0
    max_input_pixels: int = 178_956_970  # PIL's decompression-bomb limit; larger inputs are rejected
    max_video_frames: int = 1024


@dataclass
class VideoClip:
    """Decoded, sampled frames of one video and the time (seconds) of each sampled frame."""

    frames_TCHW: torch.Tensor  # uint8 [T, 3, H, W]
    timestamps: list[float]
    source: str = "<video>"


def format_timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm`` exactly as the kimi_k25 processor writes a chunk's timestamp."""
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}"


def sample_frame_indices(total_frames: int, video_fps: float | None, fps: float | None = None,
                         num_frames: int | None = None) -> np.ndarray:
    """Indices of the frames to keep: ``fps`` frames per second, or ``num_frames`` evenly spaced.

    Same rule as transformers' ``default_sample_indices_fn``: ``n = max(1, int(total / video_fps * fps))``,
    ``indices = arange(n) * total // n``.
    """
    if total_frames < 1:
        raise ValueError(f"video has no frames (total_frames={total_frames})")
    if fps is not None and num_frames is not None:
        raise ValueError("pass either fps or num_frames, not both")
    if num_frames is None and fps is not None:
        if not video_fps or video_fps <= 0:
            raise ValueError(f"sampling at fps={fps} needs the video's own fps, got video_fps={video_fps}")
        num_frames = max(1, int(total_frames / video_fps * fps))
    if num_frames is None:
        return np.arange(total_frames, dtype=int)
    if not 1 <= num_frames <= total_frames:
        raise ValueError(f"num_frames={num_frames} must be in [1, total_frames={total_frames}]")
    return np.arange(num_frames, dtype=int) * total_frames // num_frames


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return getattr(source, "filename", None) or f"<{type(source).__name__}>"


def _open_pil(source: str | os.PathLike | bytes, max_pixels: int) -> Image.Image:
    name = "<bytes>" if isinstance(source, bytes) else _describe(source)
    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        _check_size(image.height, image.width, name, max_pixels)
        image.load()
    except Image.DecompressionBombError as err:
        raise ValueError(f"image {name} exceeds PIL's decompression-bomb limit: {err}") from err
    except FileNotFoundError as err:
        raise ValueError(f"image {name}: no such file") from err
    except (OSError, SyntaxError) as err:
        raise ValueError(f"image {name} could not be decoded (empty, truncated or not an image): {err}") from err
    return image


def to_rgb_uint8(image: ImageLike, max_pixels: int = MoonViTProcessorConfig.max_input_pixels) -> torch.Tensor:
    """Any supported image -> uint8 ``[3, H, W]``; RGBA/LA/P-with-transparency composited onto white."""
    name = _describe(image)
    if isinstance(image, (str, os.PathLike, bytes)):
        image = _open_pil(image, max_pixels)
    if isinstance(image, Image.Image):
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        array = np.asarray(image.convert("RGB"))
        tensor = torch.from_numpy(array.copy()).permute(2, 0, 1)
    elif isinstance(image, np.ndarray):
        tensor = _array_to_chw(torch.from_numpy(np.ascontiguousarray(image)), name, channels_last=True)
    elif isinstance(image, torch.Tensor):
        tensor = _array_to_chw(image, name, channels_last=False)
    else:
        raise ValueError(f"unsupported image type {type(image).__name__} for {name}")
    _check_size(tensor.shape[-2], tensor.shape[-1], name, max_pixels)
    return tensor.contiguous()


def _array_to_chw(t: torch.Tensor, name: str, channels_last: bool) -> torch.Tensor:
    if t.dtype != torch.uint8:
        raise ValueError(f"image {name}: arrays must be uint8, got {t.dtype}")
    if t.ndim == 2:
        t = t[None] if not channels_last else t[..., None]
    if t.ndim != 3:
        raise ValueError(f"image {name}: expected 2 or 3 dims, got shape {tuple(t.shape)}")
    if channels_last:
        t = t.permute(2, 0, 1)
    c = t.shape[0]
    if c == 1:
        return t.expand(3, -1, -1)
    if c == 4:
        rgb, alpha = t[:3].float() / 255, t[3:].float() / 255
        return ((rgb * alpha + (1 - alpha)) * 255).round().clamp(0, 255).to(torch.uint8)
    if c != 3:
        layout = "numpy arrays are HWC" if channels_last else "tensors are CHW"
        raise ValueError(f"image {name}: expected 1, 3 or 4 channels ({layout}), got shape "
                         f"{tuple(t.permute(1, 2, 0).shape) if channels_last else tuple(t.shape)}")
    return t


def _check_size(height: int, width: int, name: str, max_pixels: int) -> None:
    if height < 1 or width < 1:
        raise ValueError(f"image {name} is empty (height={height}, width={width})")
    if height * width > max_pixels:
        raise ValueError(f"image {name} has {height}x{width} pixels, over max_input_pixels={max_pixels}")


def resize_uint8(images_NCHW: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Bicubic antialiased resize of uint8 images (no-op at equal size), matching torchvision's CPU path."""
    if tuple(images_NCHW.shape[-2:]) == (height, width):
        return images_NCHW
    if images_NCHW.device.type == "cpu":
        return F.interpolate(images_NCHW, size=(height, width), mode="bicubic", align_corners=False, antialias=True)
    out = F.interpolate(images_NCHW.float(), size=(height, width), mode="bicubic", align_corners=False,
                        antialias=True)
    return out.clamp_(0, 255).round_().to(torch.uint8)


def pad_bottom_right(images_NCHW: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Zero-pad to ``(height, width)`` on the bottom and right."""
    return F.pad(images_NCHW, (0, width - images_NCHW.shape[-1], 0, height - images_NCHW.shape[-2]))


def patchify(frames_TCHW: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[T, C, H, W] -> [T * gh * gw, C, p, p]``, frame-major then row-major over the patch grid."""
    t, c, h, w = frames_TCHW.shape
    gh, gw = h // patch_size, w // patch_size
    x = frames_TCHW.reshape(t, c, gh, patch_size, gw, patch_size).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(t * gh * gw, c, patch_size, patch_size)


class MoonViTProcessor:
    """Turns images and videos into the packed inputs of ``MoonViT`` (and ``KimiVLForConditionalGeneration``).

    Example::

        proc = MoonViTProcessor()
        pixel_values, image_grid_thw = proc.preprocess_images([Image.open("a.png")])
        # pixel_values float32 [P, 3, 14, 14]; image_grid_thw long [n, 3]; tokens = proc.num_image_tokens(h, w)
    """

    def __init__(self, config: MoonViTProcessorConfig | None = None) -> None:
        self.config = config or MoonViTProcessorConfig()
        mean = torch.tensor(self.config.image_mean, dtype=torch.float32) * 255
        std = torch.tensor(self.config.image_std, dtype=torch.float32) * 255
        self._mean_C11, self._std_C11 = mean.view(3, 1, 1), std.view(3, 1, 1)

    def num_image_tokens(self, height: int, width: int) -> int:
        """LLM tokens for one image of ``height x width`` pixels (delegates to ``geometry``)."""
        return num_vision_tokens(1, height, width, self.config.image_geometry)

    def num_video_tokens(self, num_frames: int, height: int, width: int) -> int:
        """LLM tokens for ``num_frames`` sampled frames of ``height x width`` (all chunks together)."""
        return num_vision_tokens(num_frames, height, width, self.config.video_geometry)

    def normalize(self, frames_TCHW: torch.Tensor) -> torch.Tensor:
        """uint8 -> float32 ``(x - mean*255) / (std*255)``."""
        return (frames_TCHW.to(torch.float32) - self._mean_C11) / self._std_C11

    def _resize_pad_patchify(self, frames_TCHW: torch.Tensor, geo: PatchGeometry) -> tuple[torch.Tensor, list[int]]:
        h, w = frames_TCHW.shape[-2:]
        new_h, new_w, pad_h, pad_w = resize_and_pad_hw(h, w, geo)
        frames = pad_bottom_right(resize_uint8(frames_TCHW, new_h, new_w), pad_h, pad_w)
        patches = patchify(self.normalize(frames), geo.patch_size)
        return patches, [frames.shape[0], pad_h // geo.patch_size, pad_w // geo.patch_size]

    def preprocess_images(self, images: Sequence[ImageLike]) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (PIL, uint8 arrays ``[H, W, C]``, uint8 tensors ``[C, H, W]``, paths or bytes) ->
        ``(pixel_values float32 [P, 3, 14, 14], image_grid_thw long [n, 3])`` with ``t = 1``."""
        geo = self.config.image_geometry
        if len(images) == 0:
            return torch.zeros(0, 3, geo.patch_size, geo.patch_size), torch.zeros(0, 3, dtype=torch.long)
        chunks, grids = [], []
        for image in images:
            rgb_CHW = to_rgb_uint8(image, self.config.max_input_pixels)
            patches, grid = self._resize_pad_patchify(rgb_CHW[None], geo)
            chunks.append(patches)
            grids.append(grid)
        return torch.cat(chunks), torch.tensor(grids, dtype=torch.long)

    def preprocess_video(self, frames: Sequence[ImageLike] | torch.Tensor | np.ndarray,
                         timestamps: Sequence[float] | None = None, fps: float | None = None,
                         source: str = "<video>") -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """Already-sampled frames of one video -> ``(pixel_values_videos [P, 3, 14, 14],
        video_grid_thw long [n_chunks, 3], chunk_timestamps)``.

        ``frames``: a list of images, a uint8 array ``[T, H, W, C]`` or a uint8 tensor ``[T, C, H, W]``.
        Give either ``timestamps`` (seconds, one per frame) or the ``fps`` the frames were sampled at
        (frame ``i`` is then at ``i / fps``); each chunk's timestamp is that of its first frame.
        """
        frames_TCHW = self._stack_frames(frames, source)
        n = frames_TCHW.shape[0]
        if timestamps is None:
            if fps is None or fps <= 0:
                raise ValueError(f"video {source}: pass timestamps or a positive fps, got fps={fps}")
            timestamps = [i / fps for i in range(n)]
        if len(timestamps) != n:
            raise ValueError(f"video {source}: {n} frames but {len(timestamps)} timestamps")
        geo = self.config.video_geometry
        chunks, grids, chunk_times = [], [], []
        for start in range(0, n, geo.frames_per_chunk):
            patches, grid = self._resize_pad_patchify(frames_TCHW[start:start + geo.frames_per_chunk], geo)
            chunks.append(patches)
            grids.append(grid)
            chunk_times.append(float(timestamps[start]))
        return torch.cat(chunks), torch.tensor(grids, dtype=torch.long), chunk_times

    def _stack_frames(self, frames: Sequence[ImageLike] | torch.Tensor | np.ndarray, source: str) -> torch.Tensor:
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(np.ascontiguousarray(frames))
            if frames.ndim == 4:
                frames = frames.permute(0, 3, 1, 2)
        if isinstance(frames, torch.Tensor):
            if frames.ndim != 4 or frames.dtype != torch.uint8:
                raise ValueError(
                    f"video {source}: expected uint8 [T, C, H, W], got {frames.dtype} {tuple(frames.shape)}")
            frames = [f for f in frames]
        if len(frames) == 0:
            raise ValueError(f"video {source} is empty (no frames)")
        if len(frames) > self.config.max_video_frames:
            raise ValueError(f"video {source} has {len(frames)} frames, over max_video_frames="
                             f"{self.config.max_video_frames}; sample at a lower fps")
        rgb = [to_rgb_uint8(f, self.config.max_input_pixels) for f in frames]
        if len({tuple(f.shape) for f in rgb}) != 1:
            raise ValueError(f"video {source}: frames differ in size {sorted({tuple(f.shape) for f in rgb})}")
        return torch.stack(rgb)

    def load_video(self, source: str | os.PathLike | bytes, fps: float | None = None,
                   num_frames: int | None = None) -> VideoClip:
        """Decode a video file (or its bytes) with decord and sample frames at ``fps`` (default
        ``config.video_fps``) or a fixed ``num_frames``; timestamps are ``index / video_fps``."""
        import decord

        name = "<bytes>" if isinstance(source, bytes) else str(source)
        if not isinstance(source, bytes) and not os.path.isfile(source):
            raise ValueError(f"video {name}: no such file")
        try:
            reader = decord.VideoReader(io.BytesIO(source) if isinstance(source, bytes) else str(source))
        except Exception as err:  # decord raises its own DECORDError / RuntimeError subclasses
            raise ValueError(f"video {name} could not be decoded (empty, truncated or unsupported): {err}") from err
        total, video_fps = len(reader), float(reader.get_avg_fps())
        if total < 1:
            raise ValueError(f"video {name} is empty (0 frames)")
        if num_frames is None and fps is None:
            fps = self.config.video_fps
        indices = sample_frame_indices(total, video_fps, fps=fps, num_frames=num_frames)
        if len(indices) > self.config.max_video_frames:
            raise ValueError(f"video {name}: {len(indices)} sampled frames, over max_video_frames="
                             f"{self.config.max_video_frames}")
        frames = torch.from_numpy(reader.get_batch(indices.tolist()).asnumpy()).permute(0, 3, 1, 2).contiguous()
        return VideoClip(frames, [float(i) / video_fps for i in indices], name)

    def preprocess_video_file(self, source: str | os.PathLike | bytes, fps: float | None = None,
                              num_frames: int | None = None) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """``load_video`` then ``preprocess_video``."""
        clip = self.load_video(source, fps=fps, num_frames=num_frames)
        return self.preprocess_video(clip.frames_TCHW, timestamps=clip.timestamps, source=clip.source)


def chunk_prompt_timestamps(chunk_timestamps: Sequence[float]) -> list[str]:
    """The ``HH:MM:SS.mmm`` strings that precede each chunk's media tokens in the prompt."""
    return [format_timestamp(t) for t in chunk_timestamps]


def expected_num_patches(grid_thw: torch.Tensor) -> int:
    """Total patches the packed ``pixel_values`` must have for ``grid_thw [n, 3]``."""
    return int(grid_thw.prod(-1).sum().item()) if grid_thw.numel() else 0


__all__ = [
    "K25_IMAGE_GEOMETRY",
    "MoonViTProcessor",
    "MoonViTProcessorConfig",
    "VideoClip",
    "chunk_prompt_timestamps",
    "expected_num_patches",
    "format_timestamp",
    "patchify",
    "sample_frame_indices",
    "to_rgb_uint8",
]

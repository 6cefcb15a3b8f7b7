"""Video I/O: encode frames to MP4 with PyAV (libx264), decode and sample frames with decord.

Encoding is deterministic, so the same frames give the same bytes: one encoder thread, x264's
``ultrafast`` preset (with ``veryfast`` the bitstream occasionally changed with what the process had
encoded before, while decoding to the same pixels), and RGB -> yuv420p done in numpy, not by swscale.
Decoding samples frames either at a target ``fps`` or as a fixed ``num_frames``
evenly spaced (the rule transformers' video processors use: ``n = max(1, int(total / video_fps * fps))``,
``indices = arange(n) * total // n``). Frames are uint8 ``[T, H, W, 3]`` at native resolution.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


@dataclass
class DecodedVideo:
    frames_THWC: np.ndarray  # uint8 [T, H, W, 3]
    timestamps: list[float]  # seconds, one per sampled frame
    video_fps: float
    total_frames: int


def encode_mp4(frames_THWC: np.ndarray, fps: int, crf: int = 18) -> bytes:
    """uint8 frames ``[T, H, W, 3]`` (H, W even) -> H.264 MP4 bytes."""
    import av

    if frames_THWC.ndim != 4 or frames_THWC.shape[-1] != 3 or frames_THWC.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames_THWC.dtype} {frames_THWC.shape}")
    t, h, w, _ = frames_THWC.shape
    if t < 1 or h % 2 or w % 2:
        raise ValueError(f"need >= 1 frame and even height/width for yuv420p, got T={t} H={h} W={w}")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=int(fps))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.thread_count = 1
        stream.options = {"crf": str(crf), "preset": "ultrafast", "threads": "1"}
        for frame in frames_THWC:
            yuv = av.VideoFrame.from_ndarray(rgb_to_yuv420p(frame), format="yuv420p")
            for packet in stream.encode(yuv):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def rgb_to_yuv420p(frame_HWC: np.ndarray) -> np.ndarray:
    """uint8 RGB ``[H, W, 3]`` -> planar yuv420p ``[H * 3 // 2, W]`` (BT.601 limited range, 2x2 chroma mean).

    Done here in integer-exact numpy rather than by libswscale so the encoder input, and thus the MP4
    bytes, never depend on library state.
    """
    rgb = frame_HWC.astype(np.int32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    h, w = y.shape
    sub = lambda c: (c.reshape(h // 2, 2, w // 2, 2).sum(axis=(1, 3)) + 2) // 4  # noqa: E731
    planes = [y.reshape(-1), sub(u).reshape(-1), sub(v).reshape(-1)]
    return np.concatenate(planes).clip(0, 255).astype(np.uint8).reshape(h * 3 // 2, w)


def sample_indices(total_frames: int, video_fps: float, fps: float | None = None,
                   num_frames: int | None = None) -> list[int]:
    """Frame indices to keep: ``num_frames`` evenly spaced, or ``fps`` frames per second, or all."""
    if total_frames < 1:
        raise ValueError(f"video has no frames (total_frames={total_frames})")
    if fps is not None and num_frames is not None:
        raise ValueError("give fps or num_frames, not both")
    if num_frames is not None:
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        n = min(num_frames, total_frames)
    elif fps is not None:
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        n = max(1, min(total_frames, int(total_frames / video_fps * fps)))
    else:
        n = total_frames
    return [i * total_frames // n for i in range(n)]


def decode_mp4(data: bytes, fps: float | None = None, num_frames: int | None = None,
               name: str = "<bytes>") -> DecodedVideo:
    """Decode video bytes with decord and sample frames; raises ValueError on unreadable data."""
    import decord

    try:
        reader = decord.VideoReader(io.BytesIO(data), num_threads=1)
        total, video_fps = len(reader), float(reader.get_avg_fps())
        indices = sample_indices(total, video_fps, fps=fps, num_frames=num_frames)
        frames = reader.get_batch(indices).asnumpy()
    except ValueError:
        raise
    except Exception as err:  # decord raises DECORDError / RuntimeError for broken files
        raise ValueError(f"video {name} could not be decoded: {err}") from err
    return DecodedVideo(frames, [i / video_fps for i in indices], video_fps, total)


def format_timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm`` (milliseconds truncated): the text before each video chunk's media tokens, as the
    kimi_k25 processor writes it."""
    whole = int(seconds)
    h, rem = divmod(whole, 3600)
    m, s = divmod(rem, 60)
    return f"{h:02d}:{m:02d}:{s:02d}.{int(seconds % 1 * 1000):03d}"

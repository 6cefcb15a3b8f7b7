"""Page rendering: full-page screenshots and scroll-through videos of HTML, with headless Chromium.

Shapes: frames are ``uint8 [H, W, 3]`` RGB arrays; a video is ``[F, H, W, 3]`` before encoding.

Every function takes an optional :class:`~data_pipelines.web.browser.ChromiumBrowser`; without one, a shared
process-wide browser is started on first use and closed at interpreter exit (reusing one process across pages
is what keeps rendering cheap). Determinism: the same HTML gives the same PNG bytes and the same mp4 bytes on the
same machine (tested in ``tests/web/test_render.py``); other Chromium versions or font sets change pixels.
"""

from __future__ import annotations

import atexit
import io
import os
from dataclasses import dataclass

import av
import numpy as np
from PIL import Image

from data_pipelines.web.browser import ChromiumBrowser, Viewport

DEFAULT_VIEWPORT = Viewport(512, 384)
_SHARED: ChromiumBrowser | None = None
_SHARED_PID: int | None = None


@dataclass(frozen=True)
class ScrollVideoConfig:
    """Scroll-through video: one frame per scroll offset, ``step_px`` apart, plus the very bottom."""

    step_px: int = 192
    fps: int = 2
    max_frames: int = 48
    crf: int = 18

    def __post_init__(self) -> None:
        if self.step_px < 1 or self.fps < 1 or self.max_frames < 1 or not 0 <= self.crf <= 51:
            raise ValueError(f"invalid ScrollVideoConfig {self}: step_px, fps, max_frames >= 1; crf in 0..51")


def shared_browser() -> ChromiumBrowser:
    """The process-wide browser (started on first use; raises ChromiumNotFoundError with the install hint).

    A forked child (e.g. a dataset-builder worker) gets its own browser instead of the parent's pipes.
    """
    global _SHARED, _SHARED_PID
    if _SHARED is None or _SHARED_PID != os.getpid():
        _SHARED, _SHARED_PID = ChromiumBrowser(), os.getpid()
        atexit.register(_SHARED.close)
    return _SHARED


def decode_png(png: bytes) -> np.ndarray:
    """PNG bytes -> ``uint8 [H, W, 3]`` RGB."""
    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("RGB"))


def capture_full_page(browser: ChromiumBrowser, viewport: Viewport, max_height: int) -> bytes:
    """Screenshot the loaded page at its full height (at least the viewport's, at most ``max_height``)."""
    height = min(max(browser.content_height(), viewport.height), max_height)
    browser.set_viewport(Viewport(viewport.width, height))
    return browser.screenshot()


def render_screenshot(
    html: str,
    viewport: Viewport = DEFAULT_VIEWPORT,
    max_height: int = 4096,
    browser: ChromiumBrowser | None = None,
) -> bytes:
    """Full-page PNG screenshot of ``html`` at ``viewport.width`` CSS pixels (network off, scripts off).

    Pages taller than ``max_height`` are cut at ``max_height``. Raises ``ChromiumNotFoundError`` (with the install
    hint) when no browser is installed and ``RenderError`` when the page cannot be rendered.

    >>> png = render_screenshot("<h1>Hello</h1>")  # doctest: +SKIP
    """
    browser = browser or shared_browser()
    browser.load_html(html, viewport)
    return capture_full_page(browser, viewport, max_height)


def render_scroll_frames(
    html: str,
    viewport: Viewport = DEFAULT_VIEWPORT,
    config: ScrollVideoConfig = ScrollVideoConfig(),
    browser: ChromiumBrowser | None = None,
) -> tuple[np.ndarray, list[int]]:
    """Viewport screenshots while scrolling from the top to the bottom of ``html``.

    Returns ``frames_FHW3`` (``uint8 [F, H, W, 3]``) and the scroll offsets in CSS pixels (0, step, 2 step, ...,
    then the bottom; at most ``config.max_frames``). Sticky/fixed elements behave as in a real browser.
    """
    browser = browser or shared_browser()
    browser.load_html(html, viewport)
    max_scroll = max(browser.content_height() - viewport.height, 0)
    offsets = list(range(0, max_scroll, config.step_px))[: config.max_frames - 1] + [max_scroll]
    frames = []
    for offset in offsets:
        browser.evaluate(f"window.scrollTo(0, {offset})")
        frames.append(decode_png(browser.screenshot()))
    return np.stack(frames), offsets


def encode_mp4(frames_FHW3: np.ndarray, fps: int = 2, crf: int = 18) -> bytes:
    """Encode ``uint8 [F, H, W, 3]`` frames as H.264 mp4 bytes (yuv420p, single-threaded, so deterministic).

    Odd widths/heights are padded by one white pixel (yuv420p needs even sizes).
    """
    if frames_FHW3.ndim != 4 or frames_FHW3.shape[-1] != 3 or frames_FHW3.dtype != np.uint8:
        raise ValueError(f"frames_FHW3 must be uint8 [F, H, W, 3], got {frames_FHW3.dtype} {frames_FHW3.shape}")
    pad_h, pad_w = frames_FHW3.shape[1] % 2, frames_FHW3.shape[2] % 2
    if pad_h or pad_w:
        frames_FHW3 = np.pad(frames_FHW3, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), constant_values=255)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames_FHW3.shape[2], frames_FHW3.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast", "threads": "1"}
        stream.codec_context.thread_count = 1
        for frame in frames_FHW3:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def render_scroll_video(
    html: str,
    viewport: Viewport = DEFAULT_VIEWPORT,
    config: ScrollVideoConfig = ScrollVideoConfig(),
    browser: ChromiumBrowser | None = None,
) -> bytes:
    """Scroll-through mp4 (H.264) of ``html``: one frame per scroll offset at ``config.fps`` frames per second."""
    frames_FHW3, _ = render_scroll_frames(html, viewport, config, browser)
    return encode_mp4(frames_FHW3, config.fps, config.crf)

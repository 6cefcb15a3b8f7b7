"""Page rendering: full-page screenshots and scroll-through videos of HTML, with headless Chromium.

Shapes: frames are ``uint8 [H, W, 3]`` RGB arrays; a video is ``[F, H, W, 3]`` before encoding.

Scroll videos can optionally show pointer states (``ScrollVideoConfig(interaction="hover" | "click")``): at a scroll
offset where an interactive element (:data:`INTERACTIVE_SELECTOR`: nav links, buttons, cards, footer links) is fully
in view and not yet used, the pointer moves to its centre (``Input.dispatchMouseEvent``) for a hover frame and, for
``"click"``, presses the left button for an ``:active`` frame, then releases it off the page (no ``click`` event,
so nothing navigates) and leaves, so the following frames are plain again. Off by default: default videos are
byte-identical to those made before the option existed. The pages need ``:hover`` / ``:active`` styles for this to
show (``generate_page(..., interactive=True)``). The plain frames of an interactive video equal those of a plain
video up to a few anti-aliased text pixels (a repaint after the pointer leaves can re-raster a tile).

Every function takes an optional :class:`~data_pipelines.web.browser.ChromiumBrowser`; without one, a shared
process-wide browser is started on first use and closed at interpreter exit (reusing one process across pages
is what keeps rendering cheap). Determinism: the same HTML gives the same PNG bytes and the same mp4 bytes on the
same machine (tested in ``tests/web/test_render.py``); other Chromium versions or font sets change pixels.
"""

from __future__ import annotations

import atexit
import io
import json
import os
from dataclasses import dataclass

import av
import numpy as np
from PIL import Image

from data_pipelines.web.browser import ChromiumBrowser, Viewport

DEFAULT_VIEWPORT = Viewport(512, 384)
INTERACTIONS = ("none", "hover", "click")
INTERACTIVE_SELECTOR = "nav a, .btn, .card, footer a, button"
_BOXES_JS = (
    "[...document.querySelectorAll(%s)].map(e => {const r = e.getBoundingClientRect();"
    " return [r.left, r.top, r.right, r.bottom];})"
)
_OFF_PAGE = (-1, -1)  # a pointer position over nothing: clears :hover
_SHARED: ChromiumBrowser | None = None
_SHARED_PID: int | None = None


@dataclass(frozen=True)
class ScrollVideoConfig:
    """Scroll-through video: one frame per scroll offset, ``step_px`` apart, plus the very bottom."""

    step_px: int = 192
    fps: int = 2
    max_frames: int = 48
    crf: int = 18
    interaction: str = "none"  # none | hover | click: pointer states at scroll offsets (frames added after them)
    max_interactions: int = 4  # elements interacted with per video (one per scroll offset at most)

    def __post_init__(self) -> None:
        if self.step_px < 1 or self.fps < 1 or self.max_frames < 1 or not 0 <= self.crf <= 51:
            raise ValueError(f"invalid ScrollVideoConfig {self}: step_px, fps, max_frames >= 1; crf in 0..51")
        if self.interaction not in INTERACTIONS or self.max_interactions < 0:
            raise ValueError(f"invalid ScrollVideoConfig {self}: interaction in {INTERACTIONS}; max_interactions >= 0")


@dataclass(frozen=True)
class FrameState:
    """What one frame of a scroll video shows: the scroll ``offset`` (CSS px) and the pointer ``state``.

    ``state`` is ``scroll`` (pointer off the page), ``hover`` (pointer over the element) or ``active`` (left button
    held on it); ``target`` is the element's index in ``document.querySelectorAll(INTERACTIVE_SELECTOR)`` (-1 for
    ``scroll``) and ``box`` its viewport rectangle ``(x0, y0, x1, y1)`` in CSS px (empty for ``scroll``).
    """

    offset: int
    state: str = "scroll"
    target: int = -1
    box: tuple[float, float, float, float] | tuple[()] = ()


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


def _visible_target(boxes: list[list[float]], used: set[int], viewport: Viewport) -> int | None:
    """Index of the first unused element whose box lies fully inside the viewport (at least 2x2 px), or None."""
    for index, (x0, y0, x1, y1) in enumerate(boxes):
        inside = x0 >= 0 and y0 >= 0 and x1 <= viewport.width and y1 <= viewport.height
        if index not in used and inside and x1 - x0 >= 2 and y1 - y0 >= 2:
            return index
    return None


def _mouse(browser: ChromiumBrowser, kind: str, x: float, y: float) -> None:
    """One ``Input.dispatchMouseEvent``: ``mouseMoved`` (no button), ``mousePressed`` / ``mouseReleased`` (left)."""
    params: dict = {"type": kind, "x": x, "y": y}
    if kind != "mouseMoved":
        params.update(button="left", buttons=1 if kind == "mousePressed" else 0, clickCount=1)
    browser.call("Input.dispatchMouseEvent", params)


def _interact(
    browser: ChromiumBrowser, offset: int, target: int, box: tuple[float, float, float, float], press: bool
) -> list[tuple[np.ndarray, FrameState]]:
    """Hover (and, with ``press``, press) the element at ``box``; return its frames and leave the pointer off the
    page with nothing focused or selected.

    The button is released off the page, so no ``click`` event fires: a link with ``href`` or a form in a candidate
    page cannot navigate away mid-video, and the frames show what a click looks like on a static page (hover, then
    ``:active`` while the button is down)."""
    x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    _mouse(browser, "mouseMoved", x, y)
    shots = [(decode_png(browser.screenshot()), FrameState(offset, "hover", target, box))]
    if press:
        _mouse(browser, "mousePressed", x, y)
        shots.append((decode_png(browser.screenshot()), FrameState(offset, "active", target, box)))
        _mouse(browser, "mouseReleased", *_OFF_PAGE)
    _mouse(browser, "mouseMoved", *_OFF_PAGE)
    browser.evaluate("document.activeElement && document.activeElement.blur(); window.getSelection().removeAllRanges()")
    return shots


def render_scroll_states(
    html: str,
    viewport: Viewport = DEFAULT_VIEWPORT,
    config: ScrollVideoConfig = ScrollVideoConfig(),
    browser: ChromiumBrowser | None = None,
) -> tuple[np.ndarray, list[FrameState]]:
    """Viewport screenshots while scrolling from the top to the bottom of ``html``, with optional pointer states.

    Returns ``frames_FHW3`` (``uint8 [F, H, W, 3]``) and one :class:`FrameState` per frame. Scroll offsets are 0,
    step, 2 step, ..., then the bottom (at most ``config.max_frames``). With ``config.interaction`` other than
    ``none``, each offset where an unused interactive element is fully in view (up to ``max_interactions``) is
    followed by its hover frame (and, for ``click``, its ``:active`` frame), so F <= max_frames + 2 max_interactions.
    """
    browser = browser or shared_browser()
    browser.load_html(html, viewport)
    max_scroll = max(browser.content_height() - viewport.height, 0)
    offsets = list(range(0, max_scroll, config.step_px))[: config.max_frames - 1] + [max_scroll]
    frames, states, used = [], [], set()
    for offset in offsets:
        browser.evaluate(f"window.scrollTo(0, {offset})")
        frames.append(decode_png(browser.screenshot()))
        states.append(FrameState(offset))
        if config.interaction == "none" or len(used) >= config.max_interactions:
            continue
        boxes = browser.evaluate(_BOXES_JS % json.dumps(INTERACTIVE_SELECTOR))
        target = _visible_target(boxes, used, viewport)
        if target is None:
            continue
        used.add(target)
        for frame, state in _interact(browser, offset, target, tuple(boxes[target]), config.interaction == "click"):
            frames.append(frame)
            states.append(state)
    return np.stack(frames), states


def render_scroll_frames(
    html: str,
    viewport: Viewport = DEFAULT_VIEWPORT,
    config: ScrollVideoConfig = ScrollVideoConfig(),
    browser: ChromiumBrowser | None = None,
) -> tuple[np.ndarray, list[int]]:
    """Viewport screenshots while scrolling from the top to the bottom of ``html``.

    Returns ``frames_FHW3`` (``uint8 [F, H, W, 3]``) and the scroll offset of each frame in CSS pixels (0, step,
    2 step, ..., then the bottom; at most ``config.max_frames``; with ``config.interaction`` the offset repeats for
    the hover/active frames, see :func:`render_scroll_states`). Sticky/fixed elements behave as in a real browser.
    """
    frames_FHW3, states = render_scroll_states(html, viewport, config, browser)
    return frames_FHW3, [state.offset for state in states]


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

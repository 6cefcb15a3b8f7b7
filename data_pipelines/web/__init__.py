"""Synthetic web pages and their real-browser renderings (REFERENCE.md section 7).

- :mod:`data_pipelines.web.generator`: seeded HTML+CSS pages from a layout grammar, with the ground truth kept.
- :mod:`data_pipelines.web.browser`: headless Chromium over the DevTools pipe (standard library only).
- :mod:`data_pipelines.web.render`: full-page screenshots and scroll-through mp4 videos (optionally with
  hover/click states).
"""

from data_pipelines.web.browser import (
    INSTALL_HINT,
    ChromiumBrowser,
    ChromiumNotFoundError,
    RenderError,
    Viewport,
    find_chromium,
)
from data_pipelines.web.render import (
    DEFAULT_VIEWPORT,
    INTERACTIVE_SELECTOR,
    FrameState,
    ScrollVideoConfig,
    decode_png,
    encode_mp4,
    render_screenshot,
    render_scroll_frames,
    render_scroll_states,
    render_scroll_video,
    shared_browser,
)

__all__ = [
    "DEFAULT_VIEWPORT",
    "INSTALL_HINT",
    "INTERACTIVE_SELECTOR",
    "ChromiumBrowser",
    "ChromiumNotFoundError",
    "FrameState",
    "RenderError",
    "ScrollVideoConfig",
    "Viewport",
    "decode_png",
    "encode_mp4",
    "find_chromium",
    "render_screenshot",
    "render_scroll_frames",
    "render_scroll_states",
    "render_scroll_video",
    "shared_browser",
]

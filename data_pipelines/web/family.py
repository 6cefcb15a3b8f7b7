"""Sample families for the synthetic world's registry (``data_pipelines.synth.families``): rendered web pages.

- ``page``: full-page screenshot (``img0.png``) -> the page's HTML;
- ``page_video``: scroll-through video (``vid0.mp4``) -> the page's HTML;
- ``page_video_interactive`` (opt-in, in no preset): pages with ``:hover`` / ``:active`` styles and a scroll video
  that also hovers and clicks up to three elements (``ScrollVideoConfig(interaction="click")``) -> the HTML.

The ground-truth HTML is the assistant turn, the ``doc`` text after the media, and ``spec["html"]`` (with the
layout spec under ``spec["layout"]``). Rendering needs Chromium (``scripts/install_chromium.sh``); each worker
process starts one browser on first use and reuses it. The viewport follows the preset's largest image side
(clamped to 320..512 px wide, 4:3), so tiny presets get small pages.

Register with :func:`register_page_families` (idempotent).
"""

from __future__ import annotations

import random

from data_pipelines.page_prompts import IMAGE_PROMPT, INTERACTIVE_VIDEO_PROMPT, VIDEO_PROMPT
from data_pipelines.synth.common import Media, Sample
from data_pipelines.synth.families import FAMILIES, FamilyContext, SampleFamily, register_family
from data_pipelines.web.browser import Viewport
from data_pipelines.web.generator import GeneratedPage, generate_page
from data_pipelines.web.render import ScrollVideoConfig, decode_png, encode_mp4, render_screenshot, render_scroll_frames

MAX_PAGE_HEIGHT = 1536


def page_viewport(ctx: FamilyContext) -> Viewport:
    """Viewport for a preset: width = the largest image side clamped to 320..512 (even), height = 3/4 of it."""
    width = max(320, min(512, ctx.image_sides[1])) // 2 * 2
    return Viewport(width, width * 3 // 4 // 2 * 2)


def _page_sample(family: str, page: GeneratedPage, media: Media, prompt: str, kind: str) -> Sample:
    spec = {"type": "page", "page_seed": page.seed, "html": page.html, "layout": page.spec.to_dict()}
    return Sample(
        family=family, stream="vision", spec=spec, media=[media],
        caption=f"A web page with {len(page.spec.sections)} parts.",
        doc=[{"media": 0}, {"text": page.html}],
        messages=[{"role": "user", "content": [{"type": kind, "media": 0}, {"type": "text", "text": prompt}]},
                  {"role": "assistant", "content": page.html}],
    )


def make_page_screenshot(rng: random.Random, ctx: FamilyContext) -> Sample:
    """Screenshot -> HTML sample."""
    page = generate_page(rng.randrange(2**31))
    png = render_screenshot(page.html, page_viewport(ctx), MAX_PAGE_HEIGHT)
    height, width = decode_png(png).shape[:2]
    return _page_sample("page", page, Media("img0.png", "image", png, height, width), IMAGE_PROMPT, "image")


def _page_video_sample(
    family: str, rng: random.Random, ctx: FamilyContext, interaction: str, prompt: str
) -> Sample:
    page = generate_page(rng.randrange(2**31), interactive=interaction != "none")
    viewport = page_viewport(ctx)
    config = ScrollVideoConfig(step_px=viewport.height // 2, fps=max(1, ctx.video_fps // 4), max_frames=16,
                               interaction=interaction, max_interactions=3)
    frames_FHW3, _ = render_scroll_frames(page.html, viewport, config)
    data = encode_mp4(frames_FHW3, config.fps, config.crf)
    media = Media("vid0.mp4", "video", data, viewport.height, viewport.width, len(frames_FHW3), float(config.fps))
    return _page_sample(family, page, media, prompt, "video")


def make_page_video(rng: random.Random, ctx: FamilyContext) -> Sample:
    """Scroll video -> HTML sample (one frame per half viewport of scrolling, at ``ctx.video_fps``)."""
    return _page_video_sample("page_video", rng, ctx, "none", VIDEO_PROMPT)


def make_page_video_interactive(rng: random.Random, ctx: FamilyContext) -> Sample:
    """Scroll video with hover and click states -> HTML (with its ``:hover`` / ``:active`` rules) sample."""
    return _page_video_sample("page_video_interactive", rng, ctx, "click", INTERACTIVE_VIDEO_PROMPT)


PAGE_FAMILIES = (
    SampleFamily("page", "vision", make_page_screenshot, "synthetic web page screenshot -> HTML (Chromium)"),
    SampleFamily("page_video", "vision", make_page_video, "scroll-through video of a web page -> HTML (Chromium)"),
    SampleFamily("page_video_interactive", "vision", make_page_video_interactive,
                 "scroll-through video with hover/click states -> HTML with :hover/:active rules (Chromium)"),
)


def register_page_families() -> None:
    """Add ``page``, ``page_video`` and ``page_video_interactive`` to the synthetic world's registry (idempotent)."""
    for family in PAGE_FAMILIES:
        if family.name not in FAMILIES:
            register_family(family)

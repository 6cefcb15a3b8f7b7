"""Video -> website and screenshot -> website, end to end: generate, recover HTML, render, score, write files.

:func:`video_to_website` and :func:`screenshot_to_website` write into ``out_dir``:

- ``generation.txt`` (the model's raw text) and ``generated.html`` (the page recovered from it,
  :func:`eval.demo.outputs.recover_html`);
- ``rendered.png`` (full-page Chromium screenshot of the generated page, when it renders);
- ``side_by_side.png`` (input | generated render | reference render);
- ``scores.json`` (the returned dict) and ``report.html`` (open it in a browser).

Scores (all in [0, 1]):

- with ``reference_html``: the Design2Code-style metric of :mod:`eval.web_metric` (``block_match``, ``text``,
  ``position``, ``color``, ``visual``, ``overall``; 0 with ``reason`` for an empty or unrenderable page), and for
  video inputs ``scroll_states``: REFERENCE.md section 7's interaction replay - both pages are scrolled through
  (one state per half viewport, the training videos' step) and the per-state screenshots are compared with the
  metric's visual similarity (a missing state counts as a blank frame);
- always ``input_ssim``: the same visual similarity between the input and the generated page's render (a
  screenshot against the full page; a video frame by frame against the replayed scroll states; text included,
  so it is a rough, reference-free signal, not the metric).

The viewport is the input's width (a video's frame size; a screenshot's width at 4:3), as in the training data.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from data_pipelines.video import DecodedVideo
from data_pipelines.web.browser import ChromiumNotFoundError, RenderError, Viewport
from data_pipelines.web.render import ScrollVideoConfig, decode_png, render_screenshot, render_scroll_frames
from eval.demo.generator import WebsiteGenerator, load_video
from eval.demo.outputs import frames_column, message_image, recover_html, side_by_side, write_report
from eval.web_metric.score import WebMetricConfig, score_html
from eval.web_metric.visual import visual_similarity

MAX_PAGE_HEIGHT = 4096


def viewport_for(width: int, height: int | None = None) -> Viewport:
    """Even sides (Chromium screenshots and yuv420p need nothing odd); a screenshot gets a 4:3 viewport."""
    h = height if height is not None else width * 3 // 4
    return Viewport(max(2, width // 2 * 2), max(2, h // 2 * 2))


def scroll_config(viewport: Viewport, max_frames: int = 16) -> ScrollVideoConfig:
    """The scroll replay of the training videos (``data_pipelines.web.family.make_page_video``)."""
    return ScrollVideoConfig(step_px=max(1, viewport.height // 2), fps=2, max_frames=max_frames)


def scroll_state_similarity(a_FHW3: np.ndarray, b_FHW3: np.ndarray) -> float:
    """Mean visual similarity of per-state screenshots; the shorter replay is padded with blank frames."""
    n = max(len(a_FHW3), len(b_FHW3))
    blank = np.full_like(a_FHW3[0], 255)
    pick = lambda frames, i: frames[i] if i < len(frames) else blank  # noqa: E731
    return float(np.mean([visual_similarity(pick(a_FHW3, i), pick(b_FHW3, i)) for i in range(n)]))


@dataclasses.dataclass
class Rendered:
    png: bytes | None
    error: str = ""

    @property
    def image(self) -> Image.Image | None:
        return Image.fromarray(decode_png(self.png)) if self.png else None


def render_page(html: str, viewport: Viewport) -> Rendered:
    """A full-page screenshot, or the reason there is none (empty page, browser error); never raises for the page."""
    if not html.strip():
        return Rendered(None, "the generation contains no page (empty)")
    try:
        return Rendered(render_screenshot(html, viewport, MAX_PAGE_HEIGHT))
    except ChromiumNotFoundError:
        raise
    except (RenderError, ValueError) as err:
        return Rendered(None, f"render failed: {err}")


def _replay(html: str, viewport: Viewport, n_frames: int) -> np.ndarray | None:
    try:
        frames, _ = render_scroll_frames(html, viewport, scroll_config(viewport, max(n_frames, 1)))
        return frames
    except (RenderError, ValueError):
        return None


def compute_scores(html: str, rendered: Rendered, viewport: Viewport, reference_html: str | None,
                   input_image: Image.Image | None = None, input_frames: np.ndarray | None = None) -> dict[str, Any]:
    """The score dict of the module docstring."""
    scores: dict[str, Any] = {}
    if reference_html is not None:
        config = WebMetricConfig(viewport=viewport, max_height=MAX_PAGE_HEIGHT)
        scores.update(score_html(reference_html, html if rendered.png else "", config).to_dict())
        if not rendered.png:
            scores["reason"] = rendered.error
    candidate_frames = _replay(html, viewport, len(input_frames)) if rendered.png and input_frames is not None \
        else None
    if input_frames is not None and reference_html is not None:
        ref_frames = _replay(reference_html, viewport, len(input_frames))
        scores["scroll_states"] = (scroll_state_similarity(ref_frames, candidate_frames)
                                   if candidate_frames is not None and ref_frames is not None else 0.0)
    if not rendered.png:
        scores["input_ssim"] = 0.0
        scores.setdefault("reason", rendered.error)
    elif input_frames is not None:
        scores["input_ssim"] = scroll_state_similarity(input_frames, candidate_frames) \
            if candidate_frames is not None else 0.0
    else:
        scores["input_ssim"] = visual_similarity(np.asarray(input_image.convert("RGB")), decode_png(rendered.png))
    return scores


def _finish(task: str, source: str, checkpoint: str, out_dir: Path, generator: WebsiteGenerator,
            gen_kwargs: dict[str, Any], input_panel: Image.Image, viewport: Viewport, reference_html: str | None,
            max_new_tokens: int, **inputs: Any) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    generation = generator.generate(**gen_kwargs, max_new_tokens=max_new_tokens)
    html, how = recover_html(generation.text)
    rendered = render_page(html, viewport)
    files = {"generation": out_dir / "generation.txt", "html": out_dir / "generated.html",
             "side_by_side": out_dir / "side_by_side.png", "scores": out_dir / "scores.json",
             "report": out_dir / "report.html"}
    files["generation"].write_text(generation.text, encoding="utf-8")
    files["html"].write_text(html, encoding="utf-8")
    panels = [("input", input_panel),
              ("generated", rendered.image or message_image(rendered.error, viewport.width, viewport.height))]
    if rendered.png:
        files["rendered"] = out_dir / "rendered.png"
        files["rendered"].write_bytes(rendered.png)
    if reference_html is not None:
        files["reference"] = out_dir / "reference.html"
        files["reference"].write_text(reference_html, encoding="utf-8")
        reference = render_page(reference_html, viewport)
        panels.append(("reference", reference.image or message_image(reference.error)))
    side_by_side(panels).save(files["side_by_side"])
    result = {"task": task, "input": source, "checkpoint": checkpoint, "viewport": [viewport.width, viewport.height],
              "generation": dataclasses.asdict(generation), "html_recovery": how, "rendered": rendered.png is not None,
              "render_error": rendered.error,
              "scores": compute_scores(html, rendered, viewport, reference_html, **inputs),
              "files": {k: str(v) for k, v in files.items()}}
    write_report(out_dir, result)
    files["scores"].write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def _generator(checkpoint: str | os.PathLike, generator: WebsiteGenerator | None, max_patches: int | None,
               device: str) -> WebsiteGenerator:
    return generator or WebsiteGenerator.from_checkpoint(checkpoint, max_patches=max_patches, device=device)


def video_to_website(video_path: str | os.PathLike, checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
                     reference_html: str | None = None, max_new_tokens: int = 1024, max_patches: int | None = None,
                     device: str = "cpu", generator: WebsiteGenerator | None = None) -> dict[str, Any]:
    """A scroll-through clip (mp4, ...) -> HTML with ``checkpoint`` (an export ``RUN/final``); see the module
    docstring for the files. Returns the ``scores.json`` dict (``scores``, ``files``, generation stats)."""
    video: DecodedVideo = load_video(video_path)
    t, h, w, _ = video.frames_THWC.shape
    gen = _generator(checkpoint, generator, max_patches, device)
    return _finish("video2web", str(video_path), str(checkpoint), Path(out_dir), gen, {"video": video},
                   frames_column(video.frames_THWC), viewport_for(w, h), reference_html, max_new_tokens,
                   input_frames=video.frames_THWC)


def screenshot_to_website(image_path: str | os.PathLike, checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
                          reference_html: str | None = None, max_new_tokens: int = 1024,
                          max_patches: int | None = None, device: str = "cpu",
                          generator: WebsiteGenerator | None = None) -> dict[str, Any]:
    """A full-page screenshot (png, jpg, ...) -> HTML; same outputs as :func:`video_to_website`."""
    try:
        with Image.open(image_path) as im:
            image = im.convert("RGB")
    except OSError as err:
        raise ValueError(f"image {image_path} could not be read: {err}") from err
    gen = _generator(checkpoint, generator, max_patches, device)
    return _finish("screenshot2web", str(image_path), str(checkpoint), Path(out_dir), gen, {"image": image}, image,
                   viewport_for(image.width), reference_html, max_new_tokens, input_image=image)


__all__ = ["compute_scores", "render_page", "scroll_state_similarity", "screenshot_to_website", "video_to_website",
           "viewport_for"]

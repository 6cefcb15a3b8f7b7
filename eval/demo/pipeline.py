"""Video -> website and screenshot -> website, end to end: generate, recover HTML, render, score, write files.

:func:`video_to_website` and :func:`screenshot_to_website` write into ``out_dir``:

- ``generation.txt`` (the model's raw text) and ``generated.html`` (the page recovered from it,
  :func:`eval.demo.outputs.recover_html`);
- ``rendered.png`` (full-page Chromium screenshot of the generated page, when it renders);
- ``side_by_side.png`` (input | generated render | reference render);
- ``scores.json`` (the returned dict) and ``report.html`` (open it in a browser).

The steps also run apart (generation on a machine without a browser, scoring where Chromium is;
``eval/demo/candidates.py``): :func:`video_input` / :func:`screenshot_input` load an input,
``WebsiteGenerator.generate(**page.gen_kwargs)`` writes the text, and :func:`write_page_result` does the rest.

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
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from data_pipelines.video import DecodedVideo
from data_pipelines.web.browser import ChromiumNotFoundError, RenderError, Viewport
from data_pipelines.web.render import ScrollVideoConfig, decode_png, render_screenshot, render_scroll_frames
from eval.demo.generator import Generation, WebsiteGenerator, load_video
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


@dataclasses.dataclass
class PageInput:
    """A demo input, loaded: what the generator takes (``image=`` or ``video=``), the side-by-side panel, the
    viewport the pages are rendered at, and the input the reference-free scores compare against."""

    task: str  # "video2web" | "screenshot2web"
    source: str
    gen_kwargs: dict[str, Any]
    panel: Image.Image
    viewport: Viewport
    score_inputs: dict[str, Any]


def _source_name(media: str | os.PathLike | bytes, source: str | None) -> str:
    return source or ("<bytes>" if isinstance(media, bytes) else str(media))


def video_input(video: str | os.PathLike | bytes, source: str | None = None) -> PageInput:
    """A scroll-through clip (a path or the mp4 bytes) decoded as in training; the viewport is its frame size."""
    decoded: DecodedVideo = load_video(video)
    _, h, w, _ = decoded.frames_THWC.shape
    return PageInput("video2web", _source_name(video, source), {"video": decoded},
                     frames_column(decoded.frames_THWC), viewport_for(w, h), {"input_frames": decoded.frames_THWC})


def screenshot_input(image: str | os.PathLike | bytes, source: str | None = None) -> PageInput:
    """A full-page screenshot (a path or the encoded bytes); the viewport is its width at 4:3."""
    name = _source_name(image, source)
    try:
        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as im:
            rgb = im.convert("RGB")
    except OSError as err:
        raise ValueError(f"image {name} could not be read: {err}") from err
    return PageInput("screenshot2web", name, {"image": rgb}, rgb, viewport_for(rgb.width), {"input_image": rgb})


def write_page_result(page: PageInput, checkpoint: str, out_dir: str | os.PathLike, generation: Generation,
                      reference_html: str | None = None) -> dict[str, Any]:
    """Recover, render, score and write one generation (the files of the module docstring); returns the
    ``scores.json`` dict. No model needed: the generation may come from another machine."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html, how = recover_html(generation.text)
    viewport = page.viewport
    rendered = render_page(html, viewport)
    files = {"generation": out_dir / "generation.txt", "html": out_dir / "generated.html",
             "side_by_side": out_dir / "side_by_side.png", "scores": out_dir / "scores.json",
             "report": out_dir / "report.html"}
    files["generation"].write_text(generation.text, encoding="utf-8")
    files["html"].write_text(html, encoding="utf-8")
    panels = [("input", page.panel),
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
    result = {"task": page.task, "input": page.source, "checkpoint": checkpoint,
              "viewport": [viewport.width, viewport.height], "generation": dataclasses.asdict(generation),
              "html_recovery": how, "rendered": rendered.png is not None, "render_error": rendered.error,
              "scores": compute_scores(html, rendered, viewport, reference_html, **page.score_inputs),
              "files": {k: str(v) for k, v in files.items()}}
    write_report(out_dir, result)
    partial = files["scores"].with_suffix(".json.tmp")  # written last and whole: a resumed held-out run trusts it
    partial.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, files["scores"])
    return result


def _finish(page: PageInput, checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
            generator: WebsiteGenerator, reference_html: str | None, max_new_tokens: int) -> dict[str, Any]:
    generation = generator.generate(**page.gen_kwargs, max_new_tokens=max_new_tokens)
    return write_page_result(page, str(checkpoint), out_dir, generation, reference_html)


def _generator(checkpoint: str | os.PathLike, generator: WebsiteGenerator | None, max_patches: int | None,
               device: str) -> WebsiteGenerator:
    return generator or WebsiteGenerator.from_checkpoint(checkpoint, max_patches=max_patches, device=device)


def video_to_website(video_path: str | os.PathLike, checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
                     reference_html: str | None = None, max_new_tokens: int = 1024, max_patches: int | None = None,
                     device: str = "cpu", generator: WebsiteGenerator | None = None) -> dict[str, Any]:
    """A scroll-through clip (mp4, ...) -> HTML with ``checkpoint`` (an export ``RUN/final``); see the module
    docstring for the files. Returns the ``scores.json`` dict (``scores``, ``files``, generation stats)."""
    page = video_input(video_path)
    gen = _generator(checkpoint, generator, max_patches, device)
    return _finish(page, checkpoint, out_dir, gen, reference_html, max_new_tokens)


def screenshot_to_website(image_path: str | os.PathLike, checkpoint: str | os.PathLike, out_dir: str | os.PathLike,
                          reference_html: str | None = None, max_new_tokens: int = 1024,
                          max_patches: int | None = None, device: str = "cpu",
                          generator: WebsiteGenerator | None = None) -> dict[str, Any]:
    """A full-page screenshot (png, jpg, ...) -> HTML; same outputs as :func:`video_to_website`."""
    page = screenshot_input(image_path)
    gen = _generator(checkpoint, generator, max_patches, device)
    return _finish(page, checkpoint, out_dir, gen, reference_html, max_new_tokens)


__all__ = ["PageInput", "compute_scores", "render_page", "screenshot_input", "scroll_state_similarity",
           "screenshot_to_website", "video_input", "video_to_website", "viewport_for", "write_page_result"]

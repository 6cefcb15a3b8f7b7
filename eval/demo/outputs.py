"""What the demo writes: HTML recovered from a generation, the side-by-side picture and the HTML report.

- :func:`recover_html`: a model's text -> a page. The part from ``<!DOCTYPE``/``<html`` to ``</html>`` when
  present; else a fenced code block; else, when the text contains tags, the text itself; else the text wrapped in
  a minimal page (``<pre>``, escaped). The returned ``how`` says which rule applied, so a person can tell a
  model's page from a wrapped guess.
- :func:`side_by_side`: input (screenshot, or the sampled video frames stacked top to bottom) | rendered
  generation | rendered reference (when given), scaled to one height, with captions.
- :func:`write_report`: ``report.html`` beside the other files (relative links only), openable offline.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from data_pipelines.synth.common import font

_DOC = re.compile(r"(<!doctype html.*?|<html\b.*?)(</html\s*>|$)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```(?:html)?\s*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(\s[^<>]*)?/?>")
WRAPPED_PAGE = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head><body><pre>{}</pre></body></html>\n"


def recover_html(text: str) -> tuple[str, str]:
    """``(html, how)`` for a generation; ``how`` in ``document``, ``fenced``, ``tags``, ``wrapped``, ``empty``."""
    doc = _DOC.search(text)
    if doc:
        return doc.group(1) + (doc.group(2) or ""), "document"
    fenced = _FENCE.search(text)
    if fenced and fenced.group(1).strip():
        return fenced.group(1).strip(), "fenced"
    if _TAG.search(text):
        return text.strip(), "tags"
    if not text.strip():
        return "", "empty"
    return WRAPPED_PAGE.format(html_lib.escape(text.strip())), "wrapped"


def _caption(image: Image.Image, title: str, height: int) -> Image.Image:
    """``image`` scaled to ``height`` under a 20 px caption bar."""
    scale = height / max(1, image.height)
    body = image.convert("RGB").resize((max(1, round(image.width * scale)), height), Image.BILINEAR)
    out = Image.new("RGB", (max(body.width, 120), height + 20), (255, 255, 255))
    ImageDraw.Draw(out).text((4, 3), title, fill=(20, 20, 20), font=font(13))
    out.paste(body, (0, 20))
    return out


def frames_column(frames_THWC: np.ndarray, gap: int = 4) -> Image.Image:
    """Sampled video frames stacked top to bottom with a grey gap (the way a scroll video covers a page)."""
    t, h, w, _ = frames_THWC.shape
    out = Image.new("RGB", (w, t * h + (t - 1) * gap), (160, 160, 160))
    for i, frame in enumerate(frames_THWC):
        out.paste(Image.fromarray(frame), (0, i * (h + gap)))
    return out


def message_image(text: str, width: int = 320, height: int = 240) -> Image.Image:
    """A grey panel with ``text`` (used where a render failed)."""
    out = Image.new("RGB", (width, height), (235, 235, 235))
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) > width // 8:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    ImageDraw.Draw(out).multiline_text((8, 8), "\n".join([*lines, line][:12]), fill=(150, 20, 20), font=font(12))
    return out


def side_by_side(panels: Sequence[tuple[str, Image.Image]], height: int = 480, gap: int = 8) -> Image.Image:
    """Captioned panels at one height, left to right."""
    if not panels:
        raise ValueError("side_by_side needs at least one (title, image) panel")
    tiles = [_caption(image, title, height) for title, image in panels]
    out = Image.new("RGB", (sum(t.width for t in tiles) + gap * (len(tiles) - 1), height + 20), (255, 255, 255))
    x = 0
    for tile in tiles:
        out.paste(tile, (x, 0))
        x += tile.width + gap
    return out


def stack_rows(images: Sequence[Image.Image], gap: int = 12) -> Image.Image:
    """Images top to bottom on white (several side-by-side examples in one figure)."""
    if not images:
        raise ValueError("stack_rows needs at least one image")
    out = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images) + gap * (len(images) - 1)),
                    (255, 255, 255))
    y = 0
    for image in images:
        out.paste(image, (0, y))
        y += image.height + gap
    return out


def _score_rows(scores: dict[str, Any]) -> str:
    rows = []
    for key, value in scores.items():
        shown = f"{value:.3f}" if isinstance(value, float) else html_lib.escape(json.dumps(value))
        rows.append(f"<tr><td>{html_lib.escape(key)}</td><td>{shown}</td></tr>")
    return "\n".join(rows)


def write_report(out_dir: Path, result: dict[str, Any]) -> Path:
    """``out_dir/report.html``: the picture, the scores, the generation and the recovered page (in an iframe)."""
    files = result["files"]
    generated = Path(files["html"]).name
    source = html_lib.escape(Path(files["html"]).read_text(encoding="utf-8"))
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html_lib.escape(result["task"])}: {html_lib.escape(result["input"])}</title>
<style>body{{font-family:sans-serif;margin:16px}} td{{padding:2px 10px}} pre{{background:#f4f4f4;padding:8px;
white-space:pre-wrap}} iframe{{border:1px solid #999}}</style></head><body>
<h1>{html_lib.escape(result["task"])}</h1>
<p>input <code>{html_lib.escape(result["input"])}</code>,
checkpoint <code>{html_lib.escape(result["checkpoint"])}</code>,
{result["generation"]["new_tokens"]} tokens in {result["generation"]["seconds"]:.1f} s;
HTML recovered as <b>{html_lib.escape(result["html_recovery"])}</b>;
render: {"ok" if result["rendered"] else "failed: " + html_lib.escape(result["render_error"])}</p>
<img src="{Path(files["side_by_side"]).name}" style="max-width:100%">
<h2>Scores</h2><table>{_score_rows(result["scores"])}</table>
<h2>Generated page</h2><iframe sandbox src="{generated}" width="{result["viewport"][0] + 20}" height="480"></iframe>
<h2>Generated HTML</h2><pre>{source}</pre>
</body></html>
"""
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


__all__ = ["frames_column", "message_image", "recover_html", "side_by_side", "stack_rows", "write_report"]

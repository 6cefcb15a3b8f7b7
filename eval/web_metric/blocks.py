"""OCR-free text-block detection by recolouring (the Design2Code protocol, Si et al. 2024, arXiv:2403.03163).

For one page, four renders of the same layout are taken in one browser tab (nothing that changes layout is
touched between them, so every render has the same geometry):

1. ``screenshot``: the page as it is (full page);
2. ``text_free``: every text and list marker made transparent (the input of the visual score);
3. ``recolour A``: backgrounds, borders, shadows and media made invisible, and every element that owns text
   (has a non-blank direct text node) painted in its own colour (fill colour = ``currentcolor``, so list markers,
   which cannot take a fill colour of their own, stay transparent) ``c_i`` from a lattice (channel values
   ``24 * k``, k = 0..9: up to 1000 elements);
4. ``recolour B``: the same with every ``c_i`` shifted by ``+36`` per channel.

A pixel fully covered by glyph ``i`` reads exactly ``c_i`` in A and ``c_i + 36`` in B; background reads white in
both. "Core" pixels are those whose A-to-B difference is ``36 +- 2`` in every channel and whose A value is within
2 of a lattice colour; the lattice value names the element. Anti-aliased glyph edges (difference between 0 and
36) join the block of the nearest core pixel within 4 px. A block is the bounding box of its pixels; its colour
is the per-channel median of the original screenshot over its core pixels; its text is the element's direct text
with whitespace collapsed. Text hidden by ``overflow``, clipping or ``display:none`` yields no pixels and no
block, exactly as in a screenshot.

Shapes: screenshots are ``uint8 [H, W, 3]``; label maps ``int32 [H, W]`` (-1 = no text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from data_pipelines.web.browser import ChromiumBrowser, Viewport
from data_pipelines.web.render import capture_full_page, decode_png

LATTICE_STEP = 24
LATTICE_LEVELS = 10
COLOUR_OFFSET = 36
TOLERANCE = 2
EDGE_RADIUS_PX = 4
MAX_ELEMENTS = LATTICE_LEVELS**3

HIDE_TEXT_CSS = (
    "*,*::before,*::after,*::marker{color:transparent!important;-webkit-text-fill-color:transparent!important;"
    "text-shadow:none!important;text-decoration-color:transparent!important}"
)
RECOLOUR_CSS = (
    "*,*::before,*::after,*::marker{background:transparent!important;border-color:transparent!important;"
    "outline-color:transparent!important;box-shadow:none!important;text-shadow:none!important;"
    "color:transparent!important;-webkit-text-fill-color:currentcolor!important;"
    "text-decoration-color:transparent!important;caret-color:transparent!important}"
    "html{background:#fff!important}"
    "img,svg,video,canvas,iframe,object,embed,picture{opacity:0!important}"
)

_ADD_STYLE_JS = (
    "(()=>{{const s=document.createElement('style');s.id={id};s.textContent={css};"
    "document.documentElement.appendChild(s);}})()"
)
_REMOVE_STYLE_JS = "document.getElementById({id}).remove()"
_TAG_TEXT_OWNERS_JS = """(() => {
  const skip = new Set(['SCRIPT', 'STYLE', 'HEAD', 'TITLE', 'NOSCRIPT', 'TEMPLATE', 'META', 'LINK']);
  const texts = [];
  for (const el of document.querySelectorAll('*')) {
    if (skip.has(el.tagName)) continue;
    let text = '';
    for (const node of el.childNodes) if (node.nodeType === 3) text += node.textContent;
    text = text.replace(/\\s+/g, ' ').trim();
    if (!text) continue;
    el.setAttribute('data-kvl-block', String(texts.length));
    texts.push(text);
  }
  return texts;
})()"""
_PAINT_JS = """((offset, levels, step) => {
  for (const el of document.querySelectorAll('[data-kvl-block]')) {
    const i = Number(el.getAttribute('data-kvl-block'));
    if (i >= levels * levels * levels) continue;
    const rgb = [Math.floor(i / (levels * levels)), Math.floor(i / levels) % levels, i % levels]
      .map(d => d * step + offset);
    const value = `rgb(${rgb.join(',')})`;
    el.style.setProperty('color', value, 'important');
  }
})"""


@dataclass(frozen=True)
class TextBlock:
    """One text block: its text, bounding box in pixels (x0, y0 inclusive; x1, y1 exclusive), RGB colour."""

    text: str
    x0: int
    y0: int
    x1: int
    y1: int
    colour: tuple[int, int, int]

    @property
    def area(self) -> int:
        return (self.x1 - self.x0) * (self.y1 - self.y0)

    def centre(self, width: int, height: int) -> tuple[float, float]:
        """Centre in page-relative coordinates (0..1 on each axis)."""
        return (self.x0 + self.x1) / 2 / width, (self.y0 + self.y1) / 2 / height


@dataclass(frozen=True)
class PageAnalysis:
    """Everything the metric needs from one page's renders."""

    screenshot: np.ndarray  # uint8 [H, W, 3]
    text_free: np.ndarray  # uint8 [H, W, 3]
    blocks: tuple[TextBlock, ...]
    n_text_elements: int

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.screenshot.shape[1], self.screenshot.shape[0]


def _with_style(browser: ChromiumBrowser, style_id: str, css: str) -> None:
    browser.evaluate(_ADD_STYLE_JS.format(id=json.dumps(style_id), css=json.dumps(css)))


def _paint(browser: ChromiumBrowser, offset: int) -> np.ndarray:
    browser.evaluate(f"{_PAINT_JS}({offset}, {LATTICE_LEVELS}, {LATTICE_STEP})")
    return decode_png(browser.screenshot())


def label_text_pixels(recolour_a: np.ndarray, recolour_b: np.ndarray, n_elements: int) -> tuple[np.ndarray, ...]:
    """Per-pixel element labels from the two recoloured renders.

    Returns ``(labels_HW, core_HW)``: ``labels_HW`` int32 ``[H, W]`` with the element index of every text pixel
    (-1 elsewhere), ``core_HW`` bool ``[H, W]`` marking the fully covered pixels the labels were read from.
    """
    if recolour_a.shape != recolour_b.shape:
        raise ValueError(f"recolour renders differ in shape: {recolour_a.shape} vs {recolour_b.shape}")
    a_HW3, b_HW3 = recolour_a.astype(np.int16), recolour_b.astype(np.int16)
    diff_HW3 = b_HW3 - a_HW3
    digits_HW3 = np.rint(a_HW3 / LATTICE_STEP).astype(np.int32)
    core_HW = (np.abs(diff_HW3 - COLOUR_OFFSET) <= TOLERANCE).all(-1)
    core_HW &= (np.abs(a_HW3 - digits_HW3 * LATTICE_STEP) <= TOLERANCE).all(-1)
    core_HW &= (digits_HW3 < LATTICE_LEVELS).all(-1)
    index_HW = (digits_HW3[..., 0] * LATTICE_LEVELS + digits_HW3[..., 1]) * LATTICE_LEVELS + digits_HW3[..., 2]
    core_HW &= index_HW < n_elements
    labels_HW = np.full(core_HW.shape, -1, dtype=np.int32)
    if not core_HW.any():
        return labels_HW, core_HW
    edge_HW = (diff_HW3 > 0).any(-1) & ~core_HW
    distance_HW, (near_y, near_x) = ndimage.distance_transform_edt(~core_HW, return_indices=True)
    take_HW = core_HW | (edge_HW & (distance_HW <= EDGE_RADIUS_PX))
    labels_HW[take_HW] = index_HW[near_y[take_HW], near_x[take_HW]]
    return labels_HW, core_HW


def blocks_from_labels(
    labels_HW: np.ndarray, core_HW: np.ndarray, screenshot_HW3: np.ndarray, texts: list[str]
) -> tuple[TextBlock, ...]:
    """One :class:`TextBlock` per element that has at least one core pixel, in document order."""
    blocks = []
    slices = ndimage.find_objects(labels_HW + 1)  # slices[i] covers label i (labels shifted so -1 -> 0)
    for index, box in enumerate(slices):
        if box is None or index >= len(texts):
            continue
        in_box = labels_HW[box] == index
        core = core_HW[box] & in_box
        if not core.any():
            continue
        colour = np.median(screenshot_HW3[box][core], axis=0)
        blocks.append(TextBlock(
            text=texts[index], x0=box[1].start, y0=box[0].start, x1=box[1].stop, y1=box[0].stop,
            colour=tuple(int(round(c)) for c in colour),
        ))
    return tuple(blocks)


def analyze_page(html: str, browser: ChromiumBrowser, viewport: Viewport, max_height: int) -> PageAnalysis:
    """Render ``html`` four ways (see the module docstring) and extract its text blocks.

    Raises ``RenderError`` when the page cannot be rendered.
    """
    browser.load_html(html, viewport)
    screenshot = decode_png(capture_full_page(browser, viewport, max_height))
    _with_style(browser, "kvl-hide-text", HIDE_TEXT_CSS)
    text_free = decode_png(browser.screenshot())
    browser.evaluate(_REMOVE_STYLE_JS.format(id=json.dumps("kvl-hide-text")))
    texts = browser.evaluate(_TAG_TEXT_OWNERS_JS)
    _with_style(browser, "kvl-recolour", RECOLOUR_CSS)
    recolour_a = _paint(browser, 0)
    recolour_b = _paint(browser, COLOUR_OFFSET)
    if not (screenshot.shape == text_free.shape == recolour_a.shape == recolour_b.shape):
        raise ValueError(f"renders of one page differ in shape: {screenshot.shape}, {recolour_a.shape}")
    labels_HW, core_HW = label_text_pixels(recolour_a, recolour_b, min(len(texts), MAX_ELEMENTS))
    blocks = blocks_from_labels(labels_HW, core_HW, screenshot, texts)
    return PageAnalysis(screenshot=screenshot, text_free=text_free, blocks=blocks, n_text_elements=len(texts))

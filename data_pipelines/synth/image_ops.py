"""The image handle of zero-vision tool use: Python operations on an image that return text results.

``ImageHandle(image, spec)`` exposes what a tool-using assistant may call on ``img``:

- ``img.size`` -> ``(width, height)``; ``img.crop((x0, y0, x1, y1))`` -> a new handle of that region;
- ``img.threshold(color="red")`` -> a :class:`Mask` of the pixels of exactly that palette colour;
  ``mask.count_components()`` (8-connected), ``mask.component_boxes()``, ``mask.area()``;
- ``img.read_text()`` -> ``[(text, (x0, y0, x1, y1)), ...]`` in reading order, for the rendered
  strings whose box lies inside the handle's region (the synthetic world knows what it wrote, so
  "reading" uses the spec, not an OCR model).

Pixel operations run on the pixels (numpy + ``scipy.ndimage.label``), so tests can check that the
spec-derived answers agree with the image. :func:`run_tool_code` executes a short snippet with ``img``
bound and returns what it printed (restricted builtins; a convenience for the synthetic world, not a
security sandbox).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
from PIL import Image
from scipy import ndimage

from data_pipelines.synth.common import COLORS

_EIGHT = np.ones((3, 3), dtype=int)


class Mask:
    """A boolean mask ``[H, W]`` with connected-component helpers."""

    def __init__(self, mask_HW: np.ndarray):
        self.mask_HW = mask_HW

    def area(self) -> int:
        return int(self.mask_HW.sum())

    def count_components(self) -> int:
        return int(ndimage.label(self.mask_HW, structure=_EIGHT)[1])

    def component_boxes(self) -> list[tuple[int, int, int, int]]:
        """``(x0, y0, x1, y1)`` (exclusive ends) of each component, sorted top-to-bottom, left-to-right."""
        labels, _ = ndimage.label(self.mask_HW, structure=_EIGHT)
        boxes = [(s[1].start, s[0].start, s[1].stop, s[0].stop) for s in ndimage.find_objects(labels) if s]
        return sorted(boxes, key=lambda b: (b[1], b[0]))


def _text_items(spec: dict[str, Any]) -> list[tuple[str, list[int]]]:
    kind = spec.get("type")
    if kind == "text":
        return [(i["text"], i["box"]) for i in spec["items"]]
    if kind == "document":
        return [(spec["title"], spec["title_box"])] + [(ln["text"], ln["box"]) for ln in spec["lines"]]
    if kind == "chart":
        items = [(spec["title"], spec["title_box"])]
        for bar in spec["bars"]:
            items += [(str(bar["value"]), bar["value_box"]), (bar["label"], bar["label_box"])]
        return items
    return []


class ImageHandle:
    """See the module docstring. ``origin`` is the top-left of this handle in the original image."""

    def __init__(self, image: Image.Image, spec: dict[str, Any], origin: tuple[int, int] = (0, 0)):
        self.pixels_HWC = np.asarray(image.convert("RGB"))
        self.spec = spec
        self.origin = origin

    @property
    def size(self) -> tuple[int, int]:
        return self.pixels_HWC.shape[1], self.pixels_HWC.shape[0]

    def crop(self, box: tuple[int, int, int, int]) -> ImageHandle:
        w, h = self.size
        x0, y0, x1, y1 = (int(v) for v in box)
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w, x1), min(h, y1)
        if x1 <= x0 or y1 <= y0:
            raise ValueError(f"crop box {box} is empty inside an image of size {w}x{h}")
        sub = Image.fromarray(self.pixels_HWC[y0:y1, x0:x1])
        return ImageHandle(sub, self.spec, (self.origin[0] + x0, self.origin[1] + y0))

    def threshold(self, color: str) -> Mask:
        if color not in COLORS:
            raise ValueError(f"unknown colour {color!r}; known: {sorted(COLORS)}")
        return Mask(np.all(self.pixels_HWC == np.array(COLORS[color], dtype=np.uint8), axis=-1))

    def read_text(self) -> list[tuple[str, tuple[int, int, int, int]]]:
        ox, oy = self.origin
        w, h = self.size
        out = []
        for text, (x0, y0, x1, y1) in _text_items(self.spec):
            if x0 >= ox and y0 >= oy and x1 <= ox + w and y1 <= oy + h:
                out.append((text, (x0 - ox, y0 - oy, x1 - ox, y1 - oy)))
        return sorted(out, key=lambda t: (t[1][1], t[1][0]))


_SAFE_BUILTINS = {name: __builtins__[name] if isinstance(__builtins__, dict) else getattr(__builtins__, name)
                  for name in ("print", "len", "sum", "min", "max", "sorted", "range", "int", "round", "abs",
                               "list", "tuple", "enumerate", "zip", "str")}


def run_tool_code(code: str, handle: ImageHandle) -> str:
    """Run ``code`` with ``img`` (and ``COLORS``, the palette names) bound; return its printed output."""
    out = io.StringIO()
    env = {"__builtins__": _SAFE_BUILTINS, "img": handle, "COLORS": sorted(COLORS)}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<tool>", "exec"), env)  # noqa: S102 - the documented purpose of this function
    return out.getvalue().strip()

"""Scene specs and their renderers: shapes, rendered text (OCR), bar charts, simple documents.

A spec is a JSON-able dict holding everything an answer needs (kinds, colours, pixel boxes, strings,
values); ``render(spec)`` draws it with PIL. Shapes are drawn without anti-aliasing in exact palette
colours and never overlap (a gap of at least 3 px), so counting connected components of one colour in
the pixels gives the spec's count. Boxes are pixel ``(x0, y0, x1, y1)`` with exclusive ends.
"""

from __future__ import annotations

import random
from typing import Any

from PIL import Image, ImageDraw

from data_pipelines.synth.common import (
    BACKGROUNDS,
    CATEGORIES,
    COLORS,
    TEXT_COLORS,
    WORDS,
    font,
    text_box,
)

SHAPE_KINDS = ("circle", "square", "triangle", "diamond", "hexagon")
GAP = 3


def _place(rng: random.Random, height: int, width: int, bw: int, bh: int, taken: list[list[int]],
           tries: int = 40) -> list[int] | None:
    """A free ``bw x bh`` box at least ``GAP`` px away from every box in ``taken`` (None if none found)."""
    if bw + 2 > width or bh + 2 > height:
        return None
    for _ in range(tries):
        x0, y0 = rng.randint(1, width - bw - 1), rng.randint(1, height - bh - 1)
        box = [x0, y0, x0 + bw, y0 + bh]
        if all(box[2] + GAP <= t[0] or t[2] + GAP <= box[0] or box[3] + GAP <= t[1] or t[3] + GAP <= box[1]
               for t in taken):
            return box
    return None


def shapes_spec(rng: random.Random, height: int, width: int, max_objects: int = 8) -> dict[str, Any]:
    """Up to ``max_objects`` non-overlapping shapes of random kind, colour and size."""
    short = min(height, width)
    background = rng.choice(sorted(BACKGROUNDS))
    lo, hi = max(10, short // 10), max(11, int(short * 0.45))
    want = rng.randint(1, max(1, min(max_objects, (height * width) // (((lo + hi) // 2) ** 2 * 3))))
    objects: list[dict[str, Any]] = []
    for _ in range(want):
        size = rng.randint(lo, hi)
        box = _place(rng, height, width, size, size, [o["box"] for o in objects])
        if box is None:
            continue
        objects.append({"kind": rng.choice(SHAPE_KINDS), "color": rng.choice(sorted(COLORS)), "box": box,
                        "size": "small" if size < short * 0.2 else ("large" if size > short * 0.33 else "medium")})
    if not objects:  # the smallest shape always fits: sides are >= 56 px
        objects.append({"kind": rng.choice(SHAPE_KINDS), "color": rng.choice(sorted(COLORS)),
                        "box": [1, 1, 1 + lo, 1 + lo], "size": "small"})
    return {"type": "shapes", "height": height, "width": width, "background": background, "objects": objects}


def shape_polygon(kind: str, box: list[int]) -> list[tuple[float, float]] | None:
    """Vertices of a polygonal shape inside ``box`` (None for circle/square, drawn natively)."""
    x0, y0, x1, y1 = box[0], box[1], box[2] - 1, box[3] - 1
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if kind == "triangle":
        return [(cx, y0), (x1, y1), (x0, y1)]
    if kind == "diamond":
        return [(cx, y0), (x1, cy), (cx, y1), (x0, cy)]
    if kind == "hexagon":
        q = (x1 - x0) / 4
        return [(x0 + q, y0), (x1 - q, y0), (x1, cy), (x1 - q, y1), (x0 + q, y1), (x0, cy)]
    return None


def draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: list[int], color: tuple[int, int, int]) -> None:
    rect = [box[0], box[1], box[2] - 1, box[3] - 1]
    if kind == "circle":
        draw.ellipse(rect, fill=color)
    elif kind == "square":
        draw.rectangle(rect, fill=color)
    else:
        draw.polygon(shape_polygon(kind, box), fill=color)


def render_shapes(spec: dict[str, Any]) -> Image.Image:
    image = Image.new("RGB", (spec["width"], spec["height"]), BACKGROUNDS[spec["background"]])
    draw = ImageDraw.Draw(image)
    for obj in spec["objects"]:
        draw_shape(draw, obj["kind"], obj["box"], COLORS[obj["color"]])
    return image


def text_spec(rng: random.Random, height: int, width: int, max_items: int = 4) -> dict[str, Any]:
    """A few words drawn at random places in random text colours (OCR scenes)."""
    background = rng.choice(sorted(BACKGROUNDS))
    items: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, max_items)):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 2)))
        size = rng.randint(11, max(12, min(40, height // 3)))
        bx0, by0, bx1, by1 = text_box(text, size, 0, 0)
        box = _place(rng, height, width, bx1 + 2, by1 + 2, [i["box"] for i in items])
        if box is None:
            continue
        x, y = box[0], box[1]
        items.append({"text": text, "color": rng.choice(sorted(TEXT_COLORS)), "font_size": size, "xy": [x, y],
                      "box": list(text_box(text, size, x, y))})
    if not items:
        text, size = rng.choice(WORDS)[:6], 11
        items.append({"text": text, "color": "black", "font_size": size, "xy": [1, 1],
                      "box": list(text_box(text, size, 1, 1))})
    return {"type": "text", "height": height, "width": width, "background": background, "items": items}


def render_text(spec: dict[str, Any]) -> Image.Image:
    image = Image.new("RGB", (spec["width"], spec["height"]), BACKGROUNDS[spec["background"]])
    draw = ImageDraw.Draw(image)
    for item in spec["items"]:
        draw.text(tuple(item["xy"]), item["text"], fill=TEXT_COLORS[item["color"]], font=font(item["font_size"]))
    return image


def chart_spec(rng: random.Random, height: int, width: int) -> dict[str, Any]:
    """A bar chart: 2-6 labelled bars with integer values 1..99 printed above each bar."""
    n = rng.randint(2, max(2, min(6, width // 40)))
    labels = rng.sample(CATEGORIES, n)
    values = [rng.randint(1, 99) for _ in range(n)]
    colors = [rng.choice(sorted(COLORS)) for _ in range(n)]
    fs = max(9, min(14, height // 14))
    title = f"{rng.choice(WORDS)} by {rng.choice(['region', 'group', 'team', 'site'])}"
    top, bottom = 2 * fs + 6, height - fs - 6
    slot = width / n
    bars = []
    for i, (label, value, color) in enumerate(zip(labels, values, colors)):
        bar_h = max(1, int((bottom - top - fs - 4) * value / 100))
        x0, x1 = int(i * slot + slot * 0.2), int((i + 1) * slot - slot * 0.2)
        box = [x0, bottom - bar_h, max(x0 + 2, x1), bottom]
        tx = (x0 + x1) // 2
        bars.append({"label": label, "value": value, "color": color, "box": box,
                     "value_xy": [tx, box[1] - fs - 2], "label_xy": [tx, bottom + 2],
                     "value_box": list(text_box(str(value), fs, tx - font(fs).getlength(str(value)) // 2,
                                                box[1] - fs - 2)),
                     "label_box": list(text_box(label, fs, tx - font(fs).getlength(label) // 2, bottom + 2))})
    return {"type": "chart", "height": height, "width": width, "background": "white", "title": title,
            "font_size": fs, "title_box": list(text_box(title, fs + 2, 4, 2)), "bars": bars}


def _centered(draw: ImageDraw.ImageDraw, xy: list[int], text: str, size: int) -> None:
    f = font(size)
    draw.text((xy[0] - f.getlength(text) // 2, xy[1]), text, fill=(20, 20, 20), font=f)


def render_chart(spec: dict[str, Any]) -> Image.Image:
    image = Image.new("RGB", (spec["width"], spec["height"]), BACKGROUNDS[spec["background"]])
    draw = ImageDraw.Draw(image)
    fs = spec["font_size"]
    draw.text((4, 2), spec["title"], fill=(20, 20, 20), font=font(fs + 2))
    base = spec["bars"][0]["box"][3]
    draw.line([(0, base), (spec["width"] - 1, base)], fill=(20, 20, 20), width=1)
    for bar in spec["bars"]:
        x0, y0, x1, y1 = bar["box"]
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=COLORS[bar["color"]])
        _centered(draw, bar["value_xy"], str(bar["value"]), fs)
        _centered(draw, bar["label_xy"], bar["label"], fs)
    return image


def sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n_words)]
    return " ".join(words).capitalize()


def document_spec(rng: random.Random, height: int, width: int) -> dict[str, Any]:
    """A page: a title line and as many body lines as fit, each a short generated sentence."""
    fs = max(9, min(16, height // 12))
    title = sentence(rng, rng.randint(1, 3)).title()
    lines = []
    y = 4 + fs + 10
    while y + fs + 4 < height and len(lines) < 12:
        text = sentence(rng, rng.randint(2, 6))
        while len(text) > 3 and font(fs).getlength(text) > width - 8:
            text = text.rsplit(" ", 1)[0] if " " in text else text[:-1]
        lines.append({"text": text, "xy": [4, y], "box": list(text_box(text, fs, 4, y))})
        y += fs + 4
    return {"type": "document", "height": height, "width": width, "background": "white", "font_size": fs,
            "title": title, "title_box": list(text_box(title, fs + 4, 4, 2)), "lines": lines}


def render_document(spec: dict[str, Any]) -> Image.Image:
    image = Image.new("RGB", (spec["width"], spec["height"]), BACKGROUNDS[spec["background"]])
    draw = ImageDraw.Draw(image)
    draw.text((4, 2), spec["title"], fill=(20, 20, 20), font=font(spec["font_size"] + 4))
    for line in spec["lines"]:
        draw.text(tuple(line["xy"]), line["text"], fill=(20, 20, 20), font=font(spec["font_size"]))
    return image


RENDERERS = {"shapes": render_shapes, "text": render_text, "chart": render_chart, "document": render_document}


def render(spec: dict[str, Any]) -> Image.Image:
    """Draw any scene spec (dispatch on ``spec["type"]``)."""
    if spec.get("type") not in RENDERERS:
        raise ValueError(f"unknown scene type {spec.get('type')!r}; known: {sorted(RENDERERS)}")
    return RENDERERS[spec["type"]](spec)

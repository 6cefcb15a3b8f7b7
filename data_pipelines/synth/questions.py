"""Dense captions and verifiable question/answer pairs computed from scene specs.

Categories: ``count``, ``color``, ``shape``, ``spatial``, ``ocr``, ``chart_value``, ``arithmetic``,
``grounding``, ``motion`` (videos). Every answer is a short string; ``answer_type`` says how to compare it (``int``,
``str``, ``yesno``, ``box`` = ``[x0, y0, x1, y1]`` integers in ``[0, 1000)``).
Questions that would be ambiguous (e.g. "what colour is the circle" with two circles) are never asked.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from data_pipelines.synth.common import format_box, norm_box, plural, position_word

QA_CATEGORIES = ("count", "color", "shape", "spatial", "ocr", "chart_value", "arithmetic", "grounding", "motion")


def qa(category: str, question: str, answer: Any, answer_type: str) -> dict[str, Any]:
    if category not in QA_CATEGORIES:
        raise ValueError(f"unknown QA category {category!r}")
    return {"category": category, "question": question, "answer": str(answer), "answer_type": answer_type}


def _center(box: list[int]) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def describe_object(obj: dict[str, Any]) -> str:
    return f"{obj['color']} {obj['kind']}"


def shapes_caption(spec: dict[str, Any]) -> str:
    objs, h, w = spec["objects"], spec["height"], spec["width"]
    parts = [f"a {o['size']} {describe_object(o)} at the {position_word(*_center(o['box']), h, w)}" for o in objs]
    return (f"A {w}x{h} image with a {spec['background']} background showing {plural(len(objs), 'shape')}: "
            + "; ".join(parts) + ".")


def shapes_qa(rng: random.Random, spec: dict[str, Any], scene_word: str = "image") -> list[dict[str, Any]]:
    """Count, colour, shape, spatial, arithmetic and grounding questions about a shapes scene."""
    objs, h, w = spec["objects"], spec["height"], spec["width"]
    kinds, colors = Counter(o["kind"] for o in objs), Counter(o["color"] for o in objs)
    pairs = Counter(describe_object(o) for o in objs)
    out = [qa("count", f"How many shapes are in the {scene_word}?", len(objs), "int")]
    color = rng.choice(sorted(colors))
    out.append(qa("count", f"How many {color} shapes are in the {scene_word}?", colors[color], "int"))
    kind = rng.choice(sorted(kinds))
    out.append(qa("count", f"How many {kind}s are in the {scene_word}?", kinds[kind], "int"))
    unique_kinds = [k for k, n in kinds.items() if n == 1]
    if unique_kinds:
        k = rng.choice(sorted(unique_kinds))
        out.append(qa("color", f"What colour is the {k}?", next(o["color"] for o in objs if o["kind"] == k), "str"))
    unique_colors = [c for c, n in colors.items() if n == 1]
    if unique_colors:
        c = rng.choice(sorted(unique_colors))
        out.append(qa("shape", f"What shape is the {c} object?", next(o["kind"] for o in objs if o["color"] == c),
                      "str"))
    unique = [o for o in objs if pairs[describe_object(o)] == 1]
    if len(unique) >= 2:
        a, b = rng.sample(unique, 2)
        (ax, ay), (bx, by) = _center(a["box"]), _center(b["box"])
        if abs(ax - bx) >= 4:
            out.append(qa("spatial", f"Is the {describe_object(a)} to the left of the {describe_object(b)}?",
                          "yes" if ax < bx else "no", "yesno"))
        if abs(ay - by) >= 4:
            out.append(qa("spatial", f"Which is higher, the {describe_object(a)} or the {describe_object(b)}?",
                          describe_object(a) if ay < by else describe_object(b), "str"))
    c2 = rng.choice(sorted(colors))
    out.append(qa("arithmetic", f"How many shapes are left if all {c2} shapes are removed?",
                  len(objs) - colors[c2], "int"))
    k1, k2 = rng.choice(sorted(kinds)), rng.choice(sorted(kinds))
    if k1 != k2:
        out.append(qa("arithmetic", f"What is the number of {k1}s plus the number of {k2}s?",
                      kinds[k1] + kinds[k2], "int"))
    if unique:
        o = rng.choice(unique)
        out.append(qa("grounding", f"Give the bounding box of the {describe_object(o)} as [x0, y0, x1, y1] in 0-1000.",
                      format_box(norm_box(o["box"], h, w)), "box"))
    return out


def text_caption(spec: dict[str, Any]) -> str:
    h, w = spec["height"], spec["width"]
    parts = [f'"{i["text"]}" in {i["color"]} at the {position_word(*_center(i["box"]), h, w)}' for i in spec["items"]]
    return f"A {w}x{h} image with a {spec['background']} background and text: " + "; ".join(parts) + "."


def text_qa(rng: random.Random, spec: dict[str, Any]) -> list[dict[str, Any]]:
    items, h, w = spec["items"], spec["height"], spec["width"]
    out = [qa("count", "How many separate pieces of text are in the image?", len(items), "int")]
    if len(items) == 1:
        out.append(qa("ocr", "What does the text in the image say?", items[0]["text"], "str"))
    top = min(items, key=lambda i: (i["box"][1], i["box"][0]))
    out.append(qa("ocr", "What is the topmost text in the image?", top["text"], "str"))
    colors = Counter(i["color"] for i in items)
    unique = [i for i in items if colors[i["color"]] == 1]
    if unique:
        item = rng.choice(unique)
        out.append(qa("ocr", f"What text is written in {item['color']}?", item["text"], "str"))
    item = rng.choice(items)
    out.append(qa("grounding", f'Give the bounding box of the text "{item["text"]}" as [x0, y0, x1, y1] in 0-1000.',
                  format_box(norm_box(item["box"], h, w)), "box"))
    return out


def chart_caption(spec: dict[str, Any]) -> str:
    bars = ", ".join(f"{b['label']} {b['value']}" for b in spec["bars"])
    return f'A bar chart titled "{spec["title"]}" with {len(spec["bars"])} bars: {bars}.'


def chart_qa(rng: random.Random, spec: dict[str, Any], scene_word: str = "chart") -> list[dict[str, Any]]:
    bars = spec["bars"]
    bar = rng.choice(bars)
    out = [qa("chart_value", f"What is the value of {bar['label']} in the {scene_word}?", bar["value"], "int"),
           qa("count", f"How many bars are in the {scene_word}?", len(bars), "int")]
    values = [b["value"] for b in bars]
    if values.count(max(values)) == 1:
        best = max(bars, key=lambda b: b["value"])["label"]
        out.append(qa("chart_value", f"Which category has the highest value in the {scene_word}?", best, "str"))
    a, b = rng.sample(bars, 2)
    out.append(qa("arithmetic", f"What is {a['label']} plus {b['label']} in the {scene_word}?",
                  a["value"] + b["value"], "int"))
    out.append(qa("arithmetic", f"By how much does {a['label']} exceed {b['label']} in the {scene_word}?",
                  a["value"] - b["value"], "int"))
    if "title" in spec:
        out.append(qa("ocr", f"What is the title of the {scene_word}?", spec["title"], "str"))
    return out


def document_caption(spec: dict[str, Any]) -> str:
    body = " / ".join(line["text"] for line in spec["lines"])
    return f'A document titled "{spec["title"]}" with {plural(len(spec["lines"]), "line")} of text: {body}.'


def document_qa(rng: random.Random, spec: dict[str, Any]) -> list[dict[str, Any]]:
    lines, h, w = spec["lines"], spec["height"], spec["width"]
    out = [qa("ocr", "What is the title of the document?", spec["title"], "str"),
           qa("count", "How many lines of body text does the document have?", len(lines), "int")]
    if lines:
        i = rng.randrange(len(lines))
        out.append(qa("ocr", f"What is the first word of body line {i + 1}?", lines[i]["text"].split()[0], "str"))
        out.append(qa("ocr", f"What does body line {i + 1} say?", lines[i]["text"], "str"))
        out.append(qa("grounding", f"Give the bounding box of body line {i + 1} as [x0, y0, x1, y1] in 0-1000.",
                      format_box(norm_box(lines[i]["box"], h, w)), "box"))
    return out


CAPTIONERS = {"shapes": shapes_caption, "text": text_caption, "chart": chart_caption, "document": document_caption}
QUESTIONERS = {"shapes": shapes_qa, "text": text_qa, "chart": chart_qa, "document": document_qa}


def caption_and_qa(rng: random.Random, spec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """``(dense caption, QA list)`` for any scene spec."""
    kind = spec["type"]
    return CAPTIONERS[kind](spec), QUESTIONERS[kind](rng, spec)

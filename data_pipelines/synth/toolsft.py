"""Zero-vision SFT transcripts: the assistant answers a visual question by writing Python on an image handle.

The dialogue is text only. The user names an image loaded as ``img`` (its size, never its pixels); the
assistant calls the ``python`` tool with a short snippet (threshold + count connected components, crop +
read a region, component boxes -> a normalised grounding box); the tool message holds the snippet's
output; the assistant then answers. The output is produced by actually running the snippet through
:func:`data_pipelines.synth.image_ops.run_tool_code` on the scene rendered from its spec, and the final
answer is the spec's answer; generation fails loudly if the two ever disagree, so every transcript is correct.
"""

from __future__ import annotations

import json
import random
from typing import Any

from data_pipelines.synth.common import Sample, format_box, norm_box, sample_size
from data_pipelines.synth.image_ops import ImageHandle, run_tool_code
from data_pipelines.synth.scenes import chart_spec, document_spec, render, shapes_spec, text_spec

TOOL_SYSTEM = (
    "You can run Python on an image through the `python` tool. `img` is the image handle: img.size -> "
    "(width, height); img.crop((x0, y0, x1, y1)) -> handle; img.threshold(color=name) -> mask with "
    "mask.count_components(), mask.component_boxes(), mask.area(); img.read_text() -> [(text, box), ...]. "
    "COLORS lists the palette names. Print what you need."
)


def _call(i: int, code: str, thought: str) -> dict[str, Any]:
    return {"role": "assistant", "content": thought,
            "tool_calls": [{"id": f"call_{i}", "name": "python", "arguments": json.dumps({"code": code})}]}


def _result(i: int, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{i}", "name": "python", "content": output}


def _check(ok: bool, what: str, spec: dict[str, Any]) -> None:
    if not ok:
        raise AssertionError(f"tool transcript disagrees with its spec ({what}); spec={json.dumps(spec)[:300]}")


def _shapes_task(rng: random.Random, spec: dict[str, Any], handle: ImageHandle) -> tuple[str, list, str, str]:
    objs, (w, h) = spec["objects"], handle.size
    colors = sorted({o["color"] for o in objs})
    unique = [c for c in colors if sum(o["color"] == c for o in objs) == 1]
    task = rng.choice(["count_color", "count_all"] + (["ground"] if unique else []))
    if task == "count_color":
        c = rng.choice(colors)
        question, answer = f"How many {c} shapes are in the image?", str(sum(o["color"] == c for o in objs))
        code = f'print(img.threshold(color="{c}").count_components())'
        thought = f"I will count the connected regions of {c} pixels."
    elif task == "count_all":
        question, answer = "How many shapes are in the image?", str(len(objs))
        code = "print(sum(img.threshold(color=c).count_components() for c in COLORS))"
        thought = "I will count the connected regions of every palette colour."
    else:
        c = rng.choice(unique)
        obj = next(o for o in objs if o["color"] == c)
        question = f"Give the bounding box of the {c} {obj['kind']} as [x0, y0, x1, y1] in 0-1000."
        answer = format_box(norm_box(obj["box"], h, w))
        code = (f'x0, y0, x1, y1 = img.threshold(color="{c}").component_boxes()[0]\nw, h = img.size\n'
                "print([min(999, int(v * 1000 / s)) for v, s in ((x0, w), (y0, h), (x1, w), (y1, h))])")
        thought = f"The {c} region is the object; I will take its box and normalise it to 0-1000."
    output = run_tool_code(code, handle)
    _check(output == answer, f"{task}: tool printed {output!r}, spec says {answer!r}", spec)
    return question, [(code, thought, output)], answer, "box" if task == "ground" else "int"


def _text_task(rng: random.Random, spec: dict[str, Any], handle: ImageHandle) -> tuple[str, list, str, str]:
    w, h = handle.size
    items = handle.read_text()
    _, (x0, y0, x1, y1) = rng.choice(items)
    box = (max(0, x0 - 2), max(0, y0 - 2), min(w, x1 + 2), min(h, y1 + 2))
    inside = [t for t, (a, b, c, d) in items if a >= box[0] and b >= box[1] and c <= box[2] and d <= box[3]]
    answer = " ".join(inside)
    question = f"What text is written inside the region x {box[0]}-{box[2]}, y {box[1]}-{box[3]} of the image?"
    code = f'print(" ".join(t for t, _ in img.crop({box}).read_text()))'
    output = run_tool_code(code, handle)
    _check(output == answer, f"read region: {output!r} vs {answer!r}", spec)
    return question, [(code, "I will crop that region and read the text in it.", output)], answer, "str"


def _chart_task(rng: random.Random, spec: dict[str, Any], handle: ImageHandle) -> tuple[str, list, str, str]:
    bars, n = spec["bars"], len(spec["bars"])
    i = rng.randrange(n)
    bar, slot = bars[i], spec["width"] / n
    x0, x1 = int(i * slot), int((i + 1) * slot)
    code1 = "for text, box in img.read_text():\n    print(text, box)"
    out1 = run_tool_code(code1, handle)
    code2 = f"print([t for t, _ in img.crop(({x0}, 0, {x1}, {bar['label_box'][1]})).read_text()])"
    out2 = run_tool_code(code2, handle)
    _check(f"'{bar['value']}'" in out2, f"chart column read {out2!r} lacks {bar['value']}", spec)
    steps = [(code1, "I will read all the text to find the label.", out1),
             (code2, f"The label {bar['label']} is in column x {x0}-{x1}; I will read the text above it.", out2)]
    return f"What is the value of {bar['label']} in the chart?", steps, str(bar["value"]), "int"


TASKS = {"shapes": (shapes_spec, _shapes_task), "text": (text_spec, _text_task),
         "document": (document_spec, _text_task), "chart": (chart_spec, _chart_task)}


def make_tool_sft(rng: random.Random, ctx: Any) -> Sample:
    """One transcript (``ctx`` is a :class:`~data_pipelines.synth.families.FamilyContext`)."""
    kind = rng.choice(sorted(TASKS))
    make_spec, solve = TASKS[kind]
    lo, hi = ctx.image_sides
    height, width = sample_size(rng, max(lo, 112), max(hi, 224), 3.0)
    spec = make_spec(rng, height, width)
    handle = ImageHandle(render(spec), spec)
    question, steps, answer, answer_type = solve(rng, spec, handle)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": TOOL_SYSTEM},
        {"role": "user", "content": f"The image `img` ({width}x{height} pixels) is loaded; you cannot see it, "
                                    f"but you can run Python on it.\n{question}"}]
    for i, (code, thought, output) in enumerate(steps):
        messages += [_call(i, code, thought), _result(i, output)]
    messages.append({"role": "assistant", "content": answer})
    category = {"int": "count", "box": "grounding", "str": "ocr"}[answer_type]
    if kind == "chart":
        category = "chart_value"
    qa_item = {"category": category, "question": question, "answer": answer, "answer_type": answer_type}
    return Sample(family="tool_sft", stream="text", messages=messages, qa=[qa_item], spec=spec)

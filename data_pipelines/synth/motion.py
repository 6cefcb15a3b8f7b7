"""Videos of moving shapes with questions about motion (direction, order of appearance, count over time).

Each object appears at frame ``appear`` and then moves in a straight line (left, right, up or down) at
constant speed, never leaving the frame. The spec gives every position at every frame, so the answers
(and the pixels) follow from it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from data_pipelines.synth.common import BACKGROUNDS, COLORS, plural, sample_size
from data_pipelines.synth.questions import qa
from data_pipelines.synth.scenes import SHAPE_KINDS, draw_shape

DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


def motion_spec(rng: random.Random, min_side: int, max_side: int, frames: int, fps: int = 8) -> dict[str, Any]:
    height, width = sample_size(rng, min_side, max_side, max_ratio=2.0)
    # decord 0.6 mis-sizes frames whose width is not a multiple of 16 (it then fails to copy them out)
    height, width = max(16, height // 16 * 16), max(16, width // 16 * 16)
    n = rng.randint(1, 3)
    used: set[tuple[str, str]] = set()
    objects = []
    for i in range(n):
        kind, color = rng.choice(SHAPE_KINDS), rng.choice(sorted(COLORS))
        if (kind, color) in used:
            continue
        used.add((kind, color))
        size = rng.randint(max(8, min(height, width) // 8), max(9, min(height, width) // 4))
        appear = 0 if i == 0 else rng.randint(0, frames // 2)
        direction = rng.choice(sorted(DIRECTIONS))
        dx, dy = DIRECTIONS[direction]
        steps = max(1, frames - 1 - appear)
        span_x, span_y = width - size - 2, height - size - 2
        speed = max(1.0, min(span_x if dx else span_y, size * 2) / steps)
        travel = speed * steps
        x0 = rng.uniform(1 + (travel if dx < 0 else 0), 1 + span_x - (travel if dx > 0 else 0)) if dx else \
            rng.uniform(1, 1 + span_x)
        y0 = rng.uniform(1 + (travel if dy < 0 else 0), 1 + span_y - (travel if dy > 0 else 0)) if dy else \
            rng.uniform(1, 1 + span_y)
        objects.append({"kind": kind, "color": color, "size": size, "appear": appear, "direction": direction,
                        "start": [round(x0, 2), round(y0, 2)], "speed": round(speed, 3)})
    return {"type": "motion", "height": height, "width": width, "frames": frames, "fps": fps,
            "background": rng.choice(sorted(BACKGROUNDS)), "objects": objects}


def object_box(obj: dict[str, Any], frame: int) -> list[int] | None:
    """Pixel box of ``obj`` at ``frame`` (None before it appears)."""
    if frame < obj["appear"]:
        return None
    dx, dy = DIRECTIONS[obj["direction"]]
    t = frame - obj["appear"]
    x, y = obj["start"][0] + dx * obj["speed"] * t, obj["start"][1] + dy * obj["speed"] * t
    x0, y0 = int(round(x)), int(round(y))
    return [x0, y0, x0 + obj["size"], y0 + obj["size"]]


def render_frames(spec: dict[str, Any]) -> np.ndarray:
    """uint8 ``[T, H, W, 3]``."""
    out = np.empty((spec["frames"], spec["height"], spec["width"], 3), dtype=np.uint8)
    for f in range(spec["frames"]):
        image = Image.new("RGB", (spec["width"], spec["height"]), BACKGROUNDS[spec["background"]])
        draw = ImageDraw.Draw(image)
        for obj in spec["objects"]:
            box = object_box(obj, f)
            if box is not None:
                draw_shape(draw, obj["kind"], box, COLORS[obj["color"]])
        out[f] = np.asarray(image)
    return out


def motion_caption(spec: dict[str, Any]) -> str:
    parts = []
    for o in spec["objects"]:
        when = "from the start" if o["appear"] == 0 else f"from frame {o['appear'] + 1}"
        parts.append(f"a {o['color']} {o['kind']} visible {when}, moving {o['direction']}")
    return (f"A {spec['frames']}-frame {spec['width']}x{spec['height']} video at {spec['fps']} fps on a "
            f"{spec['background']} background with {plural(len(spec['objects']), 'object')}: " + "; ".join(parts) + ".")


def motion_qa(rng: random.Random, spec: dict[str, Any]) -> list[dict[str, Any]]:
    objs = spec["objects"]
    o = rng.choice(objs)
    out = [qa("motion", f"In which direction does the {o['color']} {o['kind']} move?", o["direction"], "str"),
           qa("count", "How many objects appear during the video in total?", len(objs), "int"),
           qa("count", "How many objects are visible in the first frame?", sum(x["appear"] == 0 for x in objs), "int")]
    if len(objs) >= 2:
        a, b = rng.sample(objs, 2)
        if a["appear"] != b["appear"]:
            first = a if a["appear"] < b["appear"] else b
            out.append(qa("motion", f"Which appears first, the {a['color']} {a['kind']} or the {b['color']} "
                          f"{b['kind']}?", f"{first['color']} {first['kind']}", "str"))
    return out

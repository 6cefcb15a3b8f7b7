"""Functions the generated lm-eval task YAML call (``!function utils.NAME``; the suite's ``utils.py`` re-exports
these): media loading for vision tasks and scoring of grounding answers.

Media paths in the JSONL are absolute (lm-eval resolves nothing relative to the YAML). A video doc's frames
are decoded from its mp4 with ``data_pipelines.video.decode_mp4`` and handed over as a list of PIL images; its
prompt carries the ``<video>`` placeholder that :mod:`eval.media_prompt` expands.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from PIL import Image

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
BOX_RE = re.compile(r"\[" + ",".join([_NUM] * 4) + r"\]")


def doc_to_image(doc: dict[str, Any]) -> list[Image.Image]:
    """The doc's images, or the decoded frames of its video (``doc["video"]``)."""
    if doc.get("video"):
        from data_pipelines.video import decode_mp4

        path = Path(doc["video"])
        clip = decode_mp4(path.read_bytes(), name=str(path))
        return [Image.fromarray(f) for f in clip.frames_THWC]
    return [Image.open(p).convert("RGB") for p in doc.get("images", [])]


def parse_box(text: str) -> list[float] | None:
    """First ``[x0, y0, x1, y1]`` in ``text`` (floats), or None."""
    m = BOX_RE.search(text)
    return [float(v) for v in m.groups()] if m else None


def box_iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two ``[x0, y0, x1, y1]`` boxes (0 for degenerate boxes)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def process_grounding(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``iou`` of the first box in the generation with the target box, and ``acc_iou50`` (IoU >= 0.5)."""
    pred, gold = parse_box(results[0]), parse_box(doc["answer"])
    if gold is None:
        raise ValueError(f"doc {doc.get('id')}: target {doc['answer']!r} is not a box")
    iou = box_iou(pred, gold) if pred is not None else 0.0
    return {"iou": iou, "acc_iou50": float(iou >= 0.5)}


__all__ = ["box_iou", "doc_to_image", "parse_box", "process_grounding"]
